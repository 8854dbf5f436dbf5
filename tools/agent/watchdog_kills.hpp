// What the watchdog an elastic-run hosts has killed: told by the watchdog's own thread (its
// on_kill callback), read by the launcher's loop (was this worker's death the watchdog's?) and by
// the summary (when did each hang begin?). Thread-safe.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <mutex>
#include <set>
#include <vector>

#include <elastic/timer/watchdog.hpp>

namespace elastic::agent {

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

 private:
  mutable std::mutex mu_;
  std::set<pid_t> pids_;
  std::vector<double> hangs_;
};

}  // namespace elastic::agent
