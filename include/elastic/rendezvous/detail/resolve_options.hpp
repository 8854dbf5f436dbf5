// Filling in and checking rendezvous_options: what the code left empty or 0 comes from the
// environment elastic-run sets (ELASTIC_RUN_ID, ELASTIC_PARTICIPANT_ID, ELASTIC_MIN_RANKS and
// ELASTIC_MAX_RANKS, or their older names ELASTIC_MIN_NODES and ELASTIC_MAX_NODES), then every
// field is checked. A refusal is errc::invalid_argument saying which field or variable to fix.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <string>

#include <fmt/format.h>

#include <elastic/internal/env.hpp>
#include <elastic/internal/host_name.hpp>
#include <elastic/internal/names.hpp>
#include <elastic/error.hpp>
#include <elastic/rendezvous/detail/participant_id.hpp>
#include <elastic/rendezvous/rendezvous_options.hpp>

namespace elastic::inline v1::rendezvous::detail {

/// Refuses options: errc::invalid_argument, "rendezvous: <why>".
[[noreturn]] inline void refuse_options(const std::string& why) {
  throw error(errc::invalid_argument, "rendezvous: " + why);
}

/// The participant id: the options', else elastic-run's, else HOST:PID:RANDOM.
inline void resolve_participant_id(rendezvous_options& opts) {
  if (opts.participant_id.empty()) {
    // elastic-run names each worker slot (HOST:LOCAL_RANK) so it can retire the slot's alive key
    // the moment it reaps a dead worker.
    opts.participant_id = internal::env_string("ELASTIC_PARTICIPANT_ID").value_or("");
  }
  if (opts.participant_id.empty()) {
    opts.participant_id = fmt::format("{}:{}:{}", internal::host_name_for_ids(), ::getpid(), random_hex(4));
  }
  if (!valid_participant(opts.participant_id)) {
    refuse_options(fmt::format("participant id '{}' is not 1 to 128 characters of A-Z a-z 0-9 . _ - : @ (set "
                               "participant_id or ELASTIC_PARTICIPANT_ID)",
                               internal::printable(opts.participant_id)));
  }
}

/// Of a bound's two variables, the one to read: the current name when it is set, else the
/// older one when that is, else the current one.
inline const char* bound_variable(const char* name, const char* older_name) {
  if (internal::env_string(name) || !internal::env_string(older_name)) return name;
  return older_name;
}

/// The group's bounds, in ranks. They come from the launcher, as the run id does, unless the
/// code sets them (min_ranks/max_ranks).
inline void resolve_bounds(rendezvous_options& opts) {
  if (opts.min_ranks < 0 || opts.max_ranks < 0) {
    refuse_options(fmt::format("min_ranks {} and max_ranks {}: give a number of ranks, or 0 to take it from the "
                               "environment",
                               opts.min_ranks, opts.max_ranks));
  }
  const bool min_from_env = opts.min_ranks == 0, max_from_env = opts.max_ranks == 0;
  const char* min_variable = bound_variable("ELASTIC_MIN_RANKS", "ELASTIC_MIN_NODES");
  const char* max_variable = bound_variable("ELASTIC_MAX_RANKS", "ELASTIC_MAX_NODES");
  if (min_from_env) {
    opts.min_ranks = static_cast<int>(internal::env_int(min_variable, 1, 65536).value_or(1));
  }
  if (max_from_env) {
    opts.max_ranks = static_cast<int>(internal::env_int(max_variable, 1, 65536).value_or(opts.min_ranks));
  }
  if (opts.max_ranks < opts.min_ranks) {
    refuse_options(fmt::format("min_ranks {}{} and max_ranks {}{}: need min_ranks <= max_ranks", opts.min_ranks,
                               min_from_env ? fmt::format(" ({}, or the default 1)", min_variable) : "", opts.max_ranks,
                               max_from_env ? fmt::format(" ({})", max_variable) : ""));
  }
}

/// The timeouts: positive, and a heartbeat more often than a participant is declared dead.
inline void check_timeouts(const rendezvous_options& opts) {
  using std::chrono::milliseconds;
  if (opts.join_timeout <= milliseconds(0) || opts.last_call_timeout < milliseconds(0) ||
      opts.heartbeat_interval <= milliseconds(0) || opts.heartbeat_timeout <= opts.heartbeat_interval) {
    refuse_options(fmt::format("timeouts join {} ms, last call {} ms, heartbeat every {} ms, dead after {} ms: need "
                               "positive timeouts and heartbeat_interval < heartbeat_timeout",
                               opts.join_timeout.count(), opts.last_call_timeout.count(),
                               opts.heartbeat_interval.count(), opts.heartbeat_timeout.count()));
  }
  if (opts.peer_silence_timeout < milliseconds(0) ||
      (opts.peer_silence_timeout > milliseconds(0) &&
       (opts.peer_heartbeat_interval <= milliseconds(0) || opts.peer_heartbeat_interval * 2 > opts.peer_silence_timeout))) {
    refuse_options(fmt::format("peer heartbeats every {} ms, gone after {} ms of silence: need a positive interval at "
                               "most half the silence timeout (or a silence timeout of 0: off)",
                               opts.peer_heartbeat_interval.count(), opts.peer_silence_timeout.count()));
  }
}

/// Fills in `opts` from the environment and checks it, in the order a user fixes them: run id,
/// participant id, bounds, timeouts.
inline void resolve_options(rendezvous_options& opts) {
  if (!valid_run_id(opts.run_id)) {
    refuse_options(fmt::format("run id '{}' is not 1 to 64 characters of A-Z a-z 0-9 . _ -, not starting with '.' "
                               "or '-' (set run_id or ELASTIC_RUN_ID)",
                               internal::printable(opts.run_id)));
  }
  resolve_participant_id(opts);
  resolve_bounds(opts);
  check_timeouts(opts);
}

}  // namespace elastic::inline v1::rendezvous::detail
