// What an elastic group is set up with (group_options) and what it reports of its newest
// rebuild (recovery_timings): the vocabulary of comm/elastic_group.hpp, apart from the group.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include <elastic/events.hpp>
#include <elastic/rendezvous/rendezvous_options.hpp>

namespace elastic::inline v1::comm {

/// How an elastic_group's ranks come to hold rank 0's replicated state after a rebuild.
enum class resync_mode {
  /// Every rank hashes its replicated state (device buffers through pinned host staging) and
  /// the group compares step and hash with rank 0's in one small collective: the state moves
  /// only where some rank differs (a newcomer, a rank that diverged).
  compare,
  /// Rank 0's state is broadcast after every rebuild, unhashed: for a device state so large,
  /// on a fabric so fast, that hashing it on the host costs more than moving it.
  broadcast,
};

/// How an elastic_group forms its rounds and watches its members.
struct group_options {
  rendezvous::rendezvous_options rendezvous{};  ///< run id, min/max ranks, join and heartbeat timeouts
  /// How often the watcher thread looks for departures and newcomers (store reads: three).
  std::chrono::milliseconds poll_interval{std::chrono::milliseconds(50)};
  /// Each collective runs in a timer scope of this length: a process stuck past it is killed.
  /// Never below twice the communicator's timeout plus a second (the default; none for a
  /// communicator without a timeout): ranks waiting for a hung peer give up at that timeout and
  /// rebuild, and must not be killed first. A value below is raised (collective_deadline_raised).
  /// Other ranks' step deadlines play no part.
  std::chrono::milliseconds collective_deadline{0};
  /// Partitioned state (state::add_partitioned) under a training_loop: at every snapshot each
  /// rank's slices are also sent, in the background, to this many ring successors, which keep
  /// them in host memory; a slice lost with its rank then comes back from a successor's memory,
  /// not from disk, unless the rank and all of them were lost together. 0: no replicas.
  int replicas = 1;
  /// Where this rank's replica listener listens (empty: default_host_address(), as Gloo does).
  std::string replica_host{};
  /// Record this rank's recent collectives in shared memory (detail/flight_recorder.hpp), so
  /// that elastic-run can name the rank that never entered collective #k when the group hangs;
  /// tens of ns per collective. Nothing: as ELASTIC_FLIGHT_RECORDER says (elastic-run sets 1:
  /// it reads them; without a reader a killed process's record would only be left behind).
  std::optional<bool> flight_recorder{};
  /// After a rebuild: move the replicated state only where a rank's differs from rank 0's
  /// (compare), or always (broadcast). One rank set to broadcast makes the group broadcast.
  resync_mode resync = resync_mode::compare;
  std::optional<event_log> events{};  ///< nothing: event_log::from_env()
};

/// What the newest rebuild cost, each phase timed on this rank (CLOCK_MONOTONIC nanoseconds, so
/// another process on the host can put them next to its own clock readings).
struct recovery_timings {
  std::int64_t round = 0;
  int world_size = 0;
  std::string cause;                 ///< "collective failed: ...", "departure", "newcomer", ...
  std::int64_t noticed_ns = 0;       ///< the failed collective returned / the watcher saw the change
  std::int64_t rendezvous_done_ns = 0;
  std::int64_t connected_ns = 0;     ///< the new communicator is up
  std::int64_t resynced_ns = 0;      ///< the state is rank 0's (0 when no resync ran)
  std::string path;                  ///< how the communicator was made: "reinit", "shrink", "grow", "shrink+grow"
  std::string reason;                ///< why a rebuilder that can work in place did not (empty otherwise)
};

}  // namespace elastic::inline v1::comm
