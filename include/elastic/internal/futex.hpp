// Futex words shared between processes (not FUTEX_PRIVATE): the word lives in memory that
// several processes map. The watchdog's doorbell and the shm:// store's change counter are both
// one of these.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstdint>

namespace elastic::inline v1::internal {

/// Sleeps while `word` still holds `expected`, until `deadline_ns` on CLOCK_MONOTONIC, a wake,
/// or a signal. Returns at once when the word has already changed.
inline void futex_wait_until(std::atomic<std::uint32_t>& word, std::uint32_t expected, std::int64_t deadline_ns) noexcept {
  timespec ts{static_cast<time_t>(deadline_ns / 1'000'000'000), static_cast<long>(deadline_ns % 1'000'000'000)};
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAIT_BITSET, expected, &ts, nullptr,
            FUTEX_BITSET_MATCH_ANY);
}

/// Wakes up to `count` waiters of `word`.
inline void futex_wake(std::atomic<std::uint32_t>& word, int count = INT_MAX) noexcept {
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAKE, count, nullptr, nullptr, 0);
}

/// Changes `word` and wakes every waiter: a doorbell whose ring is never lost, because a waiter
/// that has not gone to sleep yet sees the word differ from what it expected.
inline void futex_ring(std::atomic<std::uint32_t>& word) noexcept {
  word.fetch_add(1, std::memory_order_release);
  futex_wake(word);
}

}  // namespace elastic::inline v1::internal
