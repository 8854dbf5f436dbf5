// The doorbell between workers and the watchdog: a futex word in the shared segment.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>

namespace elastic::timer::detail {

// Shared (not FUTEX_PRIVATE) operations: the word lives in memory mapped by several processes.

/// Sleeps while `word` still holds `expected`, until `deadline_ns` on CLOCK_MONOTONIC, a wake,
/// or a signal. Returns at once when the word has already changed.
inline void futex_wait_until(std::atomic<std::uint32_t>& word, std::uint32_t expected,
                             std::int64_t deadline_ns) noexcept {
  timespec ts{static_cast<time_t>(deadline_ns / 1'000'000'000), static_cast<long>(deadline_ns % 1'000'000'000)};
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAIT_BITSET, expected, &ts,
            nullptr, FUTEX_BITSET_MATCH_ANY);
}

/// Changes `word` and wakes its waiter (the watchdog).
inline void futex_ring(std::atomic<std::uint32_t>& word) noexcept {
  word.fetch_add(1, std::memory_order_release);
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAKE, 1, nullptr, nullptr, 0);
}

}  // namespace elastic::timer::detail
