// What the watchdog an elastic-run hosts has killed, and the stack dumps it took first: told by
// the watchdog's own thread (its on_kill and on_stack callbacks), read by the launcher's loop
// (was this worker's death the watchdog's? which log gets this dump?) and by the summary (when
// did each hang begin?). Thread-safe.
#pragma once

#include <sys/eventfd.h>
#include <sys/types.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "process_tree.hpp"
#include <fmt/format.h>

#include <elastic/internal/unique_fd.hpp>
#include <elastic/timer/stack_dump.hpp>
#include <elastic/timer/watchdog.hpp>

namespace elastic::agent {

/// A stack dump waiting to be written into its worker's log.
struct stack_text {
  pid_t pid = 0;    ///< the process dumped
  pid_t group = 0;  ///< its process group when dumped: a worker slot's pid, for a wrapped trainer too
  std::string text;
};

/// What the watchdog this launcher hosts has killed, told by the watchdog's own thread.
class watchdog_kills {
 public:
  void add(const timer::watchdog_kill_report& r) {
    const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    std::lock_guard lk(mu_);
    pids_.insert(r.pid);
    // The hang began when the expired scope was entered: the group stalled from then.
    hangs_.push_back(now - std::chrono::duration<double>(r.held).count());
  }
  [[nodiscard]] bool killed(pid_t pid) const {
    std::lock_guard lk(mu_);
    return pids_.count(pid) != 0;
  }
  /// When each hang the watchdog ended began, seconds since the epoch.
  [[nodiscard]] std::vector<double> hangs() const {
    std::lock_guard lk(mu_);
    return hangs_;
  }

  /// A dump the watchdog took before its signal: kept for the loop, which is woken (wake_fd()).
  /// Called before the signal, so the loop has it before it reaps the worker.
  void add_stack(const timer::stack_dump& d) { queue(d.pid, timer::to_text(d)); }

  /// A scope past its warning (the first expiry of an automatic deadline): a line for the
  /// worker's log, queued as a dump is, so it comes before a later kill's.
  void add_warning(const timer::watchdog_warning_report& r) {
    const auto s = [](std::chrono::nanoseconds d) { return std::chrono::duration<double>(d).count(); };
    queue(r.pid, fmt::format("elastic-run: watchdog: {}pid {} (thread {}): scope '{}' still open after {:.3f} s, past "
                             "its warning at {:.3f} s; nothing is done until {:.3f} s, when it is killed if still "
                             "open (watchdog_warning)\n",
                             r.rank >= 0 ? fmt::format("rank {}, ", r.rank) : std::string(), r.pid, r.tid, r.scope,
                             s(r.held), s(r.warn), s(r.limit)));
  }

 private:
  void queue(pid_t pid, std::string text) {
    stack_text s;
    s.pid = pid;
    detail::proc_info info;
    s.group = detail::read_proc_info(pid, info) ? info.pgid : 0;
    s.text = std::move(text);
    {
      std::lock_guard lk(mu_);
      stacks_.push_back(std::move(s));
    }
    const std::uint64_t one = 1;
    (void)!::write(wake_.get(), &one, sizeof one);
  }


 public:
  /// The dumps (and warnings) not yet written, oldest first; clears the wake-up.
  [[nodiscard]] std::vector<stack_text> take_stacks() {
    std::uint64_t count = 0;
    (void)!::read(wake_.get(), &count, sizeof count);
    std::lock_guard lk(mu_);
    return std::exchange(stacks_, {});
  }

  /// Readable while a dump waits in take_stacks() (an eventfd; -1 if none could be made, and
  /// the loop then finds dumps when it wakes for anything else, the worker's death at last).
  [[nodiscard]] int wake_fd() const noexcept { return wake_.get(); }

 private:
  mutable std::mutex mu_;
  std::set<pid_t> pids_;
  std::vector<double> hangs_;
  std::vector<stack_text> stacks_;
  elastic::internal::unique_fd wake_{::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)};
};

}  // namespace elastic::agent
