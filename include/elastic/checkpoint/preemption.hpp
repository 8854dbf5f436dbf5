// Preemption notices. A cloud (GCE, Kubernetes) sends SIGTERM, waits a grace period (~30 s),
// then SIGKILLs. The handler only sets a flag (async-signal-safe); the training loop acts on it
// at the end of the step.
//
// One notice may arrive by several routes: Slurm, systemd and job time limits signal every
// process of the job, and elastic-run forwards the one it got, so a worker sees two SIGTERMs
// within milliseconds. Signals within `same_notice_window` (2 s) of the first are that same
// notice and are ignored. A signal after the window means "now": the process exits 75 at once,
// which is safe because a step becomes visible only by an atomic rename, so the previous one is
// intact.
//
// After a notice the process is on its way out, and a copy of the notice may still be on its way:
// Slurm signals a job's processes one after another, so one copy can come tens of milliseconds
// after the loop that took the first has ended. A handler destroyed after a notice therefore
// leaves one behind that ignores the rest of that notice and, after the window, does what the
// signal did before the loop (for SIG_DFL: ends the process by it).
#pragma once

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdint>

#include <elastic/internal/clock.hpp>
#include <elastic/error.hpp>

namespace elastic::inline v1::checkpoint {
/// Exit status of a worker that stopped for a preemption and can be retried (EX_TEMPFAIL).
inline constexpr int exit_preempted = 75;
}  // namespace elastic::inline v1::checkpoint

namespace elastic::inline v1::internal {
// The process's one signal flag: the signal number of the first notice, 0 for none, and when it
// came (CLOCK_MONOTONIC ns; clock_gettime is async-signal-safe).
inline std::atomic<int> preemption_signal{0};
inline std::atomic<std::int64_t> preemption_ns{0};

/// Signals this soon after the first notice are the same notice, delivered by another route.
inline constexpr std::int64_t same_notice_window_ns = 2'000'000'000;

inline void on_preemption_signal(int sig) noexcept {
  int expected = 0;
  if (preemption_signal.compare_exchange_strong(expected, sig)) {
    preemption_ns.store(monotonic_ns(), std::memory_order_relaxed);
    return;
  }
  // 0: the first notice is being recorded right now (on another thread): the same notice.
  const std::int64_t first = preemption_ns.load(std::memory_order_relaxed);
  if (first == 0 || monotonic_ns() - first < same_notice_window_ns) return;
  static constexpr char msg[] = "elastic: second preemption notice: exiting now; the last committed checkpoint stands\n";
  [[maybe_unused]] auto n = ::write(STDERR_FILENO, msg, sizeof msg - 1);
  ::_exit(checkpoint::exit_preempted);
}

// What SIGTERM and SIGINT did before the preemption handler, kept for the handler that outlives
// it after a notice (the process has one disposition per signal).
inline struct sigaction term_before_notice {};
inline struct sigaction int_before_notice {};
inline std::atomic<bool> before_notice_kept{false};  // published before the handler is installed

// Installed by ~preemption_handler after a notice: the rest of the notice is ignored; a signal
// after the window gets the disposition from before the loop back and is handled by it.
inline void after_notice_signal(int sig, siginfo_t* info, void* context) noexcept {
  const std::int64_t first = preemption_ns.load(std::memory_order_relaxed);
  if (first != 0 && monotonic_ns() - first < same_notice_window_ns) return;
  if (!before_notice_kept.load(std::memory_order_acquire)) return;
  const struct sigaction& before = sig == SIGINT ? int_before_notice : term_before_notice;
  ::sigaction(sig, &before, nullptr);
  if ((before.sa_flags & SA_SIGINFO) != 0) {
    if (before.sa_sigaction != nullptr) before.sa_sigaction(sig, info, context);
  } else if (before.sa_handler == SIG_DFL) {
    ::raise(sig);  // blocked while this handler runs: delivered, by default, when it returns
  } else if (before.sa_handler != SIG_IGN) {
    before.sa_handler(sig);
  }
}

inline bool is_after_notice(const struct sigaction& a) noexcept {
  return (a.sa_flags & SA_SIGINFO) != 0 && a.sa_sigaction == after_notice_signal;
}
}  // namespace elastic::inline v1::internal

namespace elastic::inline v1::checkpoint {

/// Installs the SIGTERM/SIGINT handlers for its lifetime and restores the previous ones after;
/// after a notice, once the rest of that notice has passed (see the top of this file).
class preemption_handler {
 public:
  preemption_handler() {
    struct sigaction sa {};
    sa.sa_handler = internal::on_preemption_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    if (::sigaction(SIGTERM, &sa, &old_term_) != 0 || ::sigaction(SIGINT, &sa, &old_int_) != 0) {
      throw os_error("cannot install the preemption signal handlers");
    }
    // A handler left behind by an earlier loop's notice stands for what came before it.
    if (internal::is_after_notice(old_term_)) old_term_ = internal::term_before_notice;
    if (internal::is_after_notice(old_int_)) old_int_ = internal::int_before_notice;
  }
  preemption_handler(const preemption_handler&) = delete;
  preemption_handler& operator=(const preemption_handler&) = delete;
  ~preemption_handler() {
    if (requested() == 0) {
      ::sigaction(SIGTERM, &old_term_, nullptr);
      ::sigaction(SIGINT, &old_int_, nullptr);
      return;
    }
    // Kept before the handler that reads them is installed.
    internal::term_before_notice = old_term_;
    internal::int_before_notice = old_int_;
    internal::before_notice_kept.store(true, std::memory_order_release);
    struct sigaction sa {};
    sa.sa_sigaction = internal::after_notice_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART | SA_SIGINFO;
    ::sigaction(SIGTERM, &sa, nullptr);
    ::sigaction(SIGINT, &sa, nullptr);
  }

  /// The signal of the first notice, or 0.
  [[nodiscard]] static int requested() noexcept { return internal::preemption_signal.load(std::memory_order_relaxed); }
  /// When the first notice came (CLOCK_MONOTONIC ns), or 0.
  [[nodiscard]] static std::int64_t requested_at_ns() noexcept { return internal::preemption_ns.load(std::memory_order_relaxed); }
  /// Asks for a preemption as if a signal had come (for tests and for a launcher in-process);
  /// like a signal, a second request more than 2 s after the first exits 75 at once.
  static void request(int sig = SIGTERM) noexcept { internal::on_preemption_signal(sig); }
  /// Forgets a notice (a new loop in the same process starts clean).
  static void clear() noexcept {
    internal::preemption_signal.store(0);
    internal::preemption_ns.store(0);
  }

 private:
  struct sigaction old_term_ {};
  struct sigaction old_int_ {};
};

}  // namespace elastic::inline v1::checkpoint

namespace elastic::inline v1 {
// Re-exported at elastic:: (the common entry points, STYLE.md): users write elastic::preemption_handler.
using checkpoint::preemption_handler;
using checkpoint::exit_preempted;
}  // namespace elastic::inline v1
