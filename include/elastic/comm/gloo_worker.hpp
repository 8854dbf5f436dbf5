// The one-line worker over Gloo (comm/worker.hpp): link elastic::gloo.
//
//   elastic::comm::gloo_worker w({.run_id = "digits"});
//   elastic::training_loop loop(w.loop_options({.dir = "ckpt", .steps = 600, .every_steps = 25}), st);
#pragma once

#include <chrono>
#include <string>

#include <elastic/comm/gloo_group.hpp>
#include <elastic/comm/worker.hpp>

namespace elastic::inline v1::comm {

class gloo_worker : public worker<gloo_communicator> {
 public:
  /// `hostname`: where this rank's Gloo listens (default_host_address(): elastic-run's choice).
  explicit gloo_worker(worker_options o = {}, std::string hostname = default_host_address())
      : worker<gloo_communicator>(std::move(o), [hostname](std::chrono::milliseconds timeout) {
          return gloo_factory(timeout, hostname);
        }) {}
};

}  // namespace elastic::inline v1::comm
