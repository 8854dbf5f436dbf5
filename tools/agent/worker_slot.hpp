// One worker slot of the launcher: the worker of its current life, the slot's log, and what the
// supervision loop (launcher.hpp) remembers across its lives: restarts, the backoff of exits 75
// with no notice, the erase of the previous life's alive key a restart waits for.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>

#include "async_store.hpp"
#include "log_pump.hpp"
#include "worker_process.hpp"

namespace elastic::agent {

namespace detail {

/// Restarts of a worker that exits 75 on its own wait this long, doubling up to the cap.
inline constexpr std::chrono::milliseconds first_backoff{100};
inline constexpr std::chrono::milliseconds max_backoff{30000};

}  // namespace detail

struct worker_slot {
  using clock = std::chrono::steady_clock;

  std::size_t index = 0;
  worker_process proc;
  std::unique_ptr<log_pump> log;
  std::size_t starts = 0;
  std::size_t evictions = 0;      ///< lives that ended as evicted stragglers (not failures)
  bool done = false;
  int last_code = -1;             ///< exit code, or -signal
  pid_t draining_group = 0;       ///< a group whose leader exited during the grace, still running
  pid_t last_pid = 0;             ///< its last reaped worker: a stack dump finished after the reap still finds its log
  std::optional<clock::time_point> restart_at;  ///< a restart waiting out its backoff
  /// The erase of the previous life's alive key: the next life starts after it (it would
  /// otherwise erase the new worker's key, which has the same name), or after retire_by.
  async_store::ticket retire = 0;
  clock::time_point retire_by{};
  std::chrono::milliseconds backoff = detail::first_backoff;
  std::chrono::milliseconds delay{0};  ///< the backoff the pending restart waits
  std::size_t tempfail_streak = 0;  ///< exits 75 with no notice in a row, with no progress between
  std::size_t checkpoints_at_start = 0;
};

}  // namespace elastic::agent
