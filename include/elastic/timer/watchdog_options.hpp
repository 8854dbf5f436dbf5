// How a watchdog is set up, and what it reports: its options, the report of each kill, its
// counters and what one scan saw. (The stack dump it may take before a kill: stack_dump.hpp.)
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <elastic/error.hpp>
#include <elastic/events.hpp>
#include <elastic/timer/detail/table.hpp>
#include <elastic/timer/stack_dump.hpp>

namespace elastic::inline v1::timer {

/// A signal the watchdog sent to a process whose scope expired (what `watchdog_kill` logs).
struct watchdog_kill_report {
  pid_t pid = 0;
  pid_t tid = 0;
  int rank = -1;                       ///< -1: the process declared none
  std::string_view scope;              ///< valid during the call only
  int signal = SIGKILL;
  std::chrono::nanoseconds limit{0};   ///< the scope's time limit
  std::chrono::nanoseconds held{0};    ///< how long the scope had been open when signalled
  std::chrono::nanoseconds late{0};    ///< from the deadline to the signal
};

/// A scope still open past its warning (expires_after_warning): what `watchdog_warning` logs.
/// Nothing was signalled; the process is signalled at `limit` if the scope is still open then.
struct watchdog_warning_report {
  pid_t pid = 0;
  pid_t tid = 0;
  int rank = -1;                       ///< -1: the process declared none
  std::string_view scope;              ///< valid during the call only
  std::chrono::nanoseconds warn{0};    ///< when the warning was due, from the scope's entry
  std::chrono::nanoseconds limit{0};   ///< when it is signalled, from the scope's entry
  std::chrono::nanoseconds held{0};    ///< how long the scope had been open when warned of
};

/// How a watchdog is set up. Only `name` is required.
struct watchdog_options {
  std::string name{};  ///< segment name: what workers find in ELASTIC_WATCHDOG
  std::uint32_t capacity = detail::default_slot_count;  ///< threads watched at once (new segments)
  std::chrono::milliseconds poll{20};  ///< longest sleep between two scans
  int signal = SIGKILL;                ///< for scopes that name no signal
  /// After a scope's signal other than SIGKILL (say SIGABRT, for a core dump), a process still
  /// alive this much later gets SIGKILL.
  std::chrono::milliseconds escalate_after{5000};
  std::chrono::milliseconds reclaim_interval{1000};  ///< how often slots of dead processes are freed
  bool remove_on_stop = true;  ///< unlink the segment when the watchdog stops cleanly
  bool start_thread = true;    ///< false: the owner calls scan_once()/run() itself
  /// SCHED_FIFO priority for the scanning thread (0: stay at normal priority). It sleeps almost
  /// always and scans in microseconds; real-time priority keeps a loaded machine from delaying
  /// a kill by a scheduler tick or more. Without the privilege (CAP_SYS_NICE or RLIMIT_RTPRIO)
  /// it logs `watchdog_priority` once and runs at normal priority.
  int realtime_priority = 1;
  /// Where events go; nothing: event_log::from_env() (ELASTIC_EVENTS, else stderr), opened when
  /// the watchdog is constructed, so a bad ELASTIC_EVENTS is its elastic::error, not an escape
  /// from a default member initializer.
  std::optional<event_log> events{};
  /// Called on the scanning thread after each signal sent for an expired scope, so that whoever
  /// hosts the watchdog (elastic-run) learns of its kills without reading its events back. Keep
  /// it short and thread-safe; what it throws is dropped.
  std::function<void(const watchdog_kill_report&)> on_kill{};
  /// Called on the scanning thread after each `watchdog_warning` (a scope past its warning, not
  /// yet its deadline): elastic-run writes it into the rank's log. Same rules as on_kill.
  std::function<void(const watchdog_warning_report&)> on_warning{};
  /// Before signalling a process whose scope expired, capture the stack of each of its threads
  /// from outside it (ptrace; function names and file:line where the build has libdw) and log
  /// it: a `watchdog_stack` event, then on_stack. The signal waits for it stack_dump_limit at
  /// most, and no other process's signal waits for it. Off by default in the library: while a
  /// capture holds a process stopped, the kernel reports its ptrace stops to every thread of
  /// the watchdog's host, so a host that reaps children (waitpid, waitid) must tell a stop
  /// (WIFSTOPPED, CLD_TRAPPED) from an exit and only reap exits (README, "Reading a stack
  /// dump"). elastic-run and elastic-watchdog do, and turn it on.
  bool stack_dump = false;
  /// The most a stack dump may delay its process's signal; the capture stops at this bound and
  /// the dump says what it did not get. From 1 ms to 60 s.
  std::chrono::milliseconds stack_dump_limit{2000};
  /// Called on the scanning thread with each stack dump, after its `watchdog_stack` event and
  /// before the signal (elastic-run writes it into the rank's log). Keep it short and
  /// thread-safe; what it throws is dropped.
  std::function<void(const timer::stack_dump&)> on_stack{};
  /// Signal (and trace) only descendants of the process hosting the watchdog: elastic-run sets
  /// it, its clients are the workers it started and what they started. Whatever this says, a
  /// watchdog never signals its own process, pid 1 or its parent, and without it only processes
  /// of its own effective uid (detail/whom_to_signal.hpp).
  bool descendants_only = false;

  /// These options, once their values are known good; errc::invalid_argument otherwise. The
  /// watchdog checks them before its segment exists, so a refusal leaves nothing behind.
  [[nodiscard]] watchdog_options checked() const& { return watchdog_options(*this).checked(); }
  [[nodiscard]] watchdog_options checked() && {
    if (poll <= std::chrono::milliseconds(0)) {
      throw error(errc::invalid_argument, "watchdog poll interval must be positive, got " +
                                              std::to_string(poll.count()) + " ms");
    }
    if (stack_dump_limit < std::chrono::milliseconds(1) || stack_dump_limit > std::chrono::seconds(60)) {
      throw error(errc::invalid_argument, "watchdog stack dump limit must be from 1 ms to 60 s, got " +
                                              std::to_string(stack_dump_limit.count()) + " ms");
    }
    if (signal <= 0 || signal >= NSIG) {
      throw error(errc::invalid_argument, "watchdog signal " + std::to_string(signal) + " is not a signal number");
    }
    return std::move(*this);
  }
};

/// Counters since the watchdog started.
struct watchdog_stats {
  std::uint64_t scans = 0;
  std::uint64_t signals = 0;      ///< scope signals sent (first signal per expiry)
  std::uint64_t escalations = 0;  ///< SIGKILLs sent after a grace
  std::uint64_t reclaimed = 0;    ///< slots freed after their process died
  std::int64_t max_late_ns = 0;   ///< worst delay from a deadline to its signal
  std::uint64_t refused = 0;      ///< signals not sent: the process was not a client
  std::uint64_t warnings = 0;     ///< scopes warned of (expires_after_warning), once each
};

/// What one scan saw.
struct scan_result {
  std::int64_t next_deadline_ns = std::numeric_limits<std::int64_t>::max();
  std::uint32_t owned_slots = 0;
  std::uint32_t live_scopes = 0;
  std::uint32_t signals_sent = 0;
};

}  // namespace elastic::inline v1::timer
