// An elastic group over Gloo: the CPU path (and the one CI tests every elastic behaviour on).
// Link elastic::gloo.
//
//   elastic::comm::gloo_group group(store, {.rendezvous = {.run_id = "job", .min_nodes = 2, .max_nodes = 4}},
//                                   elastic::comm::gloo_factory(std::chrono::seconds(10)));
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include <elastic/comm/elastic_group.hpp>
#include <elastic/comm/gloo.hpp>

namespace elastic::comm {

using gloo_group = elastic_group<gloo_communicator>;

/// Connects each round's Gloo communicator under the prefix the round's leader published (the
/// rendezvous default bootstrap), every collective bounded by `timeout`. `hostname` is the
/// address this rank listens on: loopback for ranks on one host, the host's address otherwise.
inline communicator_factory<gloo_communicator> gloo_factory(std::chrono::milliseconds timeout,
                                                           std::string hostname = "127.0.0.1") {
  return [timeout, hostname](rendezvous::store& s, const rendezvous::round_info& r) {
    return std::make_unique<gloo_communicator>(s, r.bootstrap, static_cast<int>(r.rank),
                                               static_cast<int>(r.world_size), timeout, hostname);
  };
}

}  // namespace elastic::comm
