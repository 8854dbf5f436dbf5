// A hostile client's move, for the tests of whom a watchdog may signal: an expired scope written
// into a free slot of the table in the name of another process (test_worker forge, hung_worker
// forge).
#pragma once

#include <signal.h>

#include <chrono>
#include <cstdint>
#include <thread>

#include <elastic/internal/clock.hpp>
#include <elastic/internal/futex.hpp>
#include <elastic/timer/detail/table.hpp>

namespace elastic::test {

/// Claims a free slot of `t` for process (pid, start) with an expired SIGKILL scope
/// "forged-scope" and rings the watchdog; the slot, or nullptr when the table is full.
inline timer::detail::slot* forge_expired_scope(timer::detail::table_view t, std::uint64_t pid, std::uint64_t start) {
  namespace td = timer::detail;
  auto& h = t.header();
  for (std::uint32_t index = 0; index < t.slot_count(); ++index) {
    std::uint64_t expected = 0;
    td::slot& s = t.at(index);
    if (!s.head.owner.compare_exchange_strong(expected, pid)) continue;
    const std::int64_t now = internal::monotonic_ns();
    auto& e = s.scopes[0];
    e.deadline_ns.store(now - 1'000'000);
    e.entered_ns.store(now - 2'000'000);
    e.signal.store(SIGKILL);
    td::store_name(e, "forged-scope");
    e.generation.store(s.head.generation.load() + 1);
    s.head.tid.store(static_cast<std::int32_t>(pid));
    s.head.depth.store(1);
    s.head.start_time.store(start);
    std::uint32_t hw = h.slots_high_water.load();
    while (hw < index + 1 && !h.slots_high_water.compare_exchange_weak(hw, index + 1)) {
    }
    internal::futex_ring(h.doorbell);
    return &s;
  }
  return nullptr;
}

/// Waits (30 s at most) until the watchdog freed forged slot `s`; false if it did not.
inline bool forged_slot_freed(const timer::detail::slot& s, std::uint64_t pid, std::uint64_t start) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (s.head.owner.load() == pid && s.head.start_time.load() == start) {
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

}  // namespace elastic::test
