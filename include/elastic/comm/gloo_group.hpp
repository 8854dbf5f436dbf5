// An elastic group over Gloo: the CPU path (and the one CI tests every elastic behaviour on).
// Link elastic::gloo.
//
//   elastic::comm::gloo_group group(store, {.rendezvous = {.run_id = "job", .min_ranks = 2, .max_ranks = 4}},
//                                   elastic::comm::gloo_factory(std::chrono::seconds(10)));
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include <elastic/comm/elastic_group.hpp>
#include <elastic/comm/gloo.hpp>
#include <elastic/comm/host_address.hpp>
#include <elastic/error.hpp>

namespace elastic::inline v1::comm {

using gloo_group = elastic_group<gloo_communicator>;

/// Connects each round's Gloo communicator under the prefix the round's leader published (the
/// rendezvous default bootstrap), every collective bounded by `timeout`. `hostname` is the
/// address this rank listens on: loopback for ranks on one host, the host's address otherwise
/// (by default what elastic-run worked out; see default_host_address()).
inline communicator_factory<gloo_communicator> gloo_factory(std::chrono::milliseconds timeout,
                                                           std::string hostname = default_host_address()) {
  detail::ignore_sigpipe();
  return [timeout, hostname](rendezvous::store& s, const rendezvous::round_info& r) {
    return std::make_unique<gloo_communicator>(s, r.bootstrap, r.rank,
                                               r.world_size, timeout, hostname);
  };
}

}  // namespace elastic::inline v1::comm
