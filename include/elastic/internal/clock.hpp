// The clock every deadline in the library is expressed in.
#pragma once

#include <time.h>

#include <chrono>
#include <cstdint>

namespace elastic::inline v1::internal {

/// CLOCK_MONOTONIC in nanoseconds. It is shared by all processes of a host (so a deadline
/// written by a worker means the same to the watchdog), never jumps with wall-clock changes, and
/// is read through the vDSO: no system call, ~20 ns.
inline std::int64_t monotonic_ns() noexcept {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return std::int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

/// A std::chrono duration as whole nanoseconds, saturating instead of overflowing so that
/// `expires(std::chrono::years(1000))` means "practically never" rather than "in the past".
template <class Rep, class Period>
constexpr std::int64_t saturating_ns(std::chrono::duration<Rep, Period> d) noexcept {
  using namespace std::chrono;
  constexpr auto max_ns = duration<long double, std::nano>(static_cast<long double>(INT64_MAX) / 4);
  auto as_ld = duration_cast<duration<long double, std::nano>>(d);
  if (as_ld >= max_ns) return static_cast<std::int64_t>(max_ns.count());
  if (as_ld <= -max_ns) return -static_cast<std::int64_t>(max_ns.count());
  return static_cast<std::int64_t>(as_ld.count());
}

/// `now + d` without overflow.
inline std::int64_t deadline_after(std::int64_t now_ns, std::int64_t d_ns) noexcept {
  std::int64_t out;
  if (__builtin_add_overflow(now_ns, d_ns, &out)) return d_ns > 0 ? INT64_MAX : INT64_MIN;
  return out;
}

}  // namespace elastic::inline v1::internal
