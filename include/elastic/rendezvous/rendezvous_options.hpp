// What a rendezvous participant declares: its run, the group's bounds in ranks, its timeouts, its
// id and where its keys and events go. Fields left empty or 0 are filled from the environment
// elastic-run sets (see detail/resolve_options.hpp); rendezvous::options() shows the result.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>

#include <elastic/events.hpp>

namespace elastic::inline v1::rendezvous {

/// How a run's participants find each other. Every participant of a run must declare the same
/// run_id, min_ranks and max_ranks; the timeouts are each participant's own.
struct rendezvous_options {
  std::string run_id{};                  ///< empty: ELASTIC_RUN_ID; [A-Za-z0-9._-], 1..64
  /// A round needs at least this many participants (ranks, not hosts). 0: ELASTIC_MIN_RANKS
  /// (elastic-run's --min-ranks; its older name ELASTIC_MIN_NODES is still honoured), else 1.
  int min_ranks = 0;
  /// A round closes at once at this many participants. 0: ELASTIC_MAX_RANKS (elastic-run's
  /// --nnodes MAX times --nproc-per-node; its older name ELASTIC_MAX_NODES is still honoured),
  /// else min_ranks.
  int max_ranks = 0;
  std::chrono::milliseconds join_timeout{std::chrono::minutes(10)};   ///< for join(), next_round()
  std::chrono::milliseconds last_call_timeout{std::chrono::seconds(30)};  ///< wait past min_ranks
  std::chrono::milliseconds heartbeat_interval{std::chrono::seconds(5)};  ///< lease renewal period
  std::chrono::milliseconds heartbeat_timeout{std::chrono::seconds(30)};  ///< silent this long: dead
  /// Members also beat to each other over UDP (each to the next two in rank order) and declare
  /// one whose beats stopped for peer_silence_timeout gone, so a host that vanished is seen in
  /// seconds rather than at its lease's expiry; a member only starved that long rejoins as a
  /// new incarnation (half the timeout in, a rendezvous_peer_quiet warning says who is late).
  /// 0: off. On by default on stores that span hosts (etcd), off on shm:// (one host).
  std::chrono::milliseconds peer_silence_timeout{std::chrono::seconds(2)};
  std::chrono::milliseconds peer_heartbeat_interval{std::chrono::milliseconds(250)};
  /// The address the peer heartbeats listen on: empty: $ELASTIC_HOST_ADDR (elastic-run sets it),
  /// else this host's address towards the store (store::local_address(); 127.0.0.1 on shm://).
  std::string peer_address{};
  /// empty: ELASTIC_PARTICIPANT_ID, else HOST:PID:RANDOM; [A-Za-z0-9._:@-], 1..128
  std::string participant_id{};
  std::string key_prefix = "/elastic";   ///< where the run's keys live in the store
  std::optional<event_log> events{};     ///< nothing: event_log::from_env()
};

}  // namespace elastic::inline v1::rendezvous
