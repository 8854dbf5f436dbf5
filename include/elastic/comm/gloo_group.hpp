// An elastic group over Gloo: the CPU path (and the one CI tests every elastic behaviour on).
// Link elastic::gloo.
//
//   elastic::comm::gloo_group group(store, {.rendezvous = {.run_id = "job", .min_ranks = 2, .max_ranks = 4}},
//                                   elastic::comm::gloo_factory(std::chrono::seconds(10)));
#pragma once

#include <signal.h>

#include <chrono>
#include <memory>
#include <string>

#include <elastic/comm/elastic_group.hpp>
#include <elastic/comm/gloo.hpp>
#include <elastic/comm/host_address.hpp>
#include <elastic/error.hpp>

namespace elastic::inline v1::comm {

using gloo_group = elastic_group<gloo_communicator>;

namespace detail {

/// Gloo writes to its TCP peers without MSG_NOSIGNAL: a write to a peer that just died raises
/// SIGPIPE, whose default action kills the survivor that was about to recover. The disposition
/// is the process's own, so it is changed only while it is the default (a handler the program
/// installed is left alone); the write then fails with EPIPE and the collective throws.
inline void ignore_sigpipe() noexcept {
  struct sigaction old {};
  if (::sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) ::signal(SIGPIPE, SIG_IGN);
}

}  // namespace detail

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
