// The doorbell between workers and the watchdog: a futex word in the shared segment.
#pragma once

#include <atomic>
#include <cstdint>

#include <elastic/detail/futex.hpp>

namespace elastic::timer::detail {

using elastic::detail::futex_wait_until;

/// Changes `word` and wakes its waiter (the watchdog).
inline void futex_ring(std::atomic<std::uint32_t>& word) noexcept {
  word.fetch_add(1, std::memory_order_release);
  elastic::detail::futex_wake(word, 1);
}

}  // namespace elastic::timer::detail
