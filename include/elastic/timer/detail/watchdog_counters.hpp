// The watchdog's counters: bumped by its scanning thread, read by any thread (stats()).
#pragma once

#include <atomic>
#include <cstdint>

#include <elastic/timer/watchdog_options.hpp>

namespace elastic::inline v1::timer::detail {

struct watchdog_counters {
  std::atomic<std::uint64_t> scans{0};
  std::atomic<std::uint64_t> signals{0};
  std::atomic<std::uint64_t> escalations{0};
  std::atomic<std::uint64_t> reclaimed{0};
  std::atomic<std::int64_t> max_late_ns{0};
  std::atomic<std::uint64_t> refused{0};

  /// A scope signal sent `late_ns` after its deadline.
  void signalled(std::int64_t late_ns) noexcept {
    signals.fetch_add(1, std::memory_order_relaxed);
    std::int64_t prev = max_late_ns.load(std::memory_order_relaxed);
    while (late_ns > prev && !max_late_ns.compare_exchange_weak(prev, late_ns)) {
    }
  }

  [[nodiscard]] watchdog_stats snapshot(std::uint64_t warnings) const noexcept {
    return {scans.load(), signals.load(), escalations.load(), reclaimed.load(), max_late_ns.load(), refused.load(),
            warnings};
  }
};

}  // namespace elastic::inline v1::timer::detail
