// Timer scopes: a region of code that must finish before a deadline, or its process is killed
// by the watchdog.
//
//   {
//     auto guard = elastic::expires(30s, "allreduce");
//     do_allreduce();
//   }  // deadline cleared here
//
// Entering and leaving a scope is a handful of stores to this thread's slot in shared memory:
// no lock, no allocation (after the thread's first scope), and no system call, except that a
// scope whose deadline falls before the watchdog's next planned look rings its doorbell (one
// futex wake), so short deadlines are enforced as promptly as long ones.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <limits>
#include <string_view>

#include <elastic/internal/clock.hpp>
#include <elastic/internal/futex.hpp>
#include <elastic/timer/client.hpp>
#include <elastic/timer/detail/table.hpp>

namespace elastic::inline v1::timer {

/// An RAII timer scope. Movable, not copyable. While it lives, its deadline is watched; the
/// earliest deadline among a thread's live scopes governs. A default-constructed or moved-from
/// scope watches nothing.
class [[nodiscard]] scope {
 public:
  scope() noexcept = default;

  /// Enters a scope that expires `timeout_ns` from now. `signal` 0 means the watchdog's default
  /// (SIGKILL unless it was configured otherwise). Names longer than 31 bytes are truncated.
  /// `warn_ns` in (0, timeout_ns): the watchdog first warns (a `watchdog_warning` event, no
  /// signal) when the scope is still open that long from now; 0: no warning.
  scope(std::int64_t timeout_ns, std::string_view name, int signal, std::int64_t warn_ns = 0) noexcept {
    client* c = client::current();
    if (c == nullptr) return;
    detail::thread_binding& b = detail::this_thread();
    if (b.held == nullptr || (b.owner != c && b.depth == 0)) [[unlikely]] {
      if (!c->bind(b)) return;
    }
    if (b.depth >= detail::scopes_per_slot) [[unlikely]] {
      b.owner->note_stack_full(b);
      return;
    }
    const std::int64_t now = internal::monotonic_ns();
    const std::int64_t deadline = internal::deadline_after(now, timeout_ns);
    // The lead of the warning before the deadline, whole milliseconds (at least 1 when asked for).
    std::uint32_t lead_ms = 0;
    if (warn_ns > 0 && warn_ns < timeout_ns) {
      const std::int64_t lead = (timeout_ns - warn_ns + 999'999) / 1'000'000;
      lead_ms = static_cast<std::uint32_t>(std::min<std::int64_t>(lead, std::numeric_limits<std::uint32_t>::max()));
    }
    const std::int64_t first = lead_ms != 0 ? deadline - static_cast<std::int64_t>(lead_ms) * 1'000'000 : deadline;
    detail::scope_entry& e = b.held->scopes[b.depth];
    const std::uint64_t g = ++b.generation;
    // Pairs with the acquire fence in read_entry(): a reader that sees any field written below
    // also sees the generation this entry had before (0), so it cannot mistake a half-written
    // entry for the previous one.
    detail::seqlock_write_fence();
    e.deadline_ns.store(deadline, detail::field_store);
    e.entered_ns.store(now, detail::field_store);
    e.signal.store(signal, detail::field_store);
    e.warn_lead_ms.store(lead_ms, detail::field_store);
    detail::store_name(e, name);
    e.generation.store(g, std::memory_order_release);
    b.held->head.depth.store(++b.depth, std::memory_order_release);
    binding_ = &b;
    slot_ = b.held;
    generation_ = g;
    index_ = b.depth - 1;
    if (first < b.header->next_wake_ns.load(std::memory_order_relaxed)) [[unlikely]] {
      internal::futex_ring(b.header->doorbell);
    }
  }

  scope(scope&& other) noexcept
      : binding_(other.binding_), slot_(other.slot_), generation_(other.generation_), index_(other.index_) {
    other.slot_ = nullptr;
  }
  scope& operator=(scope&& other) noexcept {
    if (this != &other) {
      leave();
      binding_ = other.binding_;
      slot_ = other.slot_;
      generation_ = other.generation_;
      index_ = other.index_;
      other.slot_ = nullptr;
    }
    return *this;
  }
  scope(const scope&) = delete;
  scope& operator=(const scope&) = delete;

  ~scope() { leave(); }

  /// True when a watchdog watches this scope (false without a watchdog, or when the table or
  /// the thread's stack of scopes was full).
  [[nodiscard]] bool watched() const noexcept { return slot_ != nullptr; }

  /// Pushes the deadline to `d` from now, never earlier than it already is: a heartbeat for a
  /// long loop. A warning keeps its lead before the deadline, so it moves as much. No effect on
  /// an unwatched scope.
  template <class Rep, class Period>
  void extend(std::chrono::duration<Rep, Period> d) noexcept {
    if (slot_ == nullptr) return;
    auto& e = slot_->scopes[index_];
    if (e.generation.load(std::memory_order_relaxed) != generation_) return;
    const std::int64_t want =
        internal::deadline_after(internal::monotonic_ns(), internal::saturating_ns(d));
    // One atomic word: the watchdog reads either deadline, each consistent with the entry.
    if (want > e.deadline_ns.load(std::memory_order_relaxed)) e.deadline_ns.store(want, std::memory_order_release);
  }

  /// Time left before the deadline (negative once it has passed); zero for an unwatched scope.
  [[nodiscard]] std::chrono::nanoseconds remaining() const noexcept {
    if (slot_ == nullptr) return std::chrono::nanoseconds(0);
    return std::chrono::nanoseconds(slot_->scopes[index_].deadline_ns.load(std::memory_order_relaxed) -
                                    internal::monotonic_ns());
  }

  /// Time left before the warning (before the deadline when the scope has none; negative once
  /// it has passed); zero for an unwatched scope.
  [[nodiscard]] std::chrono::nanoseconds until_warning() const noexcept {
    if (slot_ == nullptr) return std::chrono::nanoseconds(0);
    const auto& e = slot_->scopes[index_];
    const std::int64_t lead = static_cast<std::int64_t>(e.warn_lead_ms.load(std::memory_order_relaxed)) * 1'000'000;
    return std::chrono::nanoseconds(e.deadline_ns.load(std::memory_order_relaxed) - lead - internal::monotonic_ns());
  }

  /// Ends the scope now (as its destructor would).
  void leave() noexcept {
    if (slot_ == nullptr) return;
    detail::slot* s = slot_;
    slot_ = nullptr;
    detail::scope_entry& e = s->scopes[index_];
    detail::thread_binding& b = detail::this_thread();
    if (&b != binding_) {
      // Left on another thread than it was entered on: clear the entry only if it is still ours;
      // the owning thread drops it from its stack when it next leaves a scope.
      std::uint64_t g = generation_;
      e.generation.compare_exchange_strong(g, 0, std::memory_order_acq_rel);
      return;
    }
    // Same thread, but after fork() in the child (the slot is the parent's), or after the
    // thread moved to another watchdog: nothing of ours to clear.
    if (b.held != s || e.generation.load(std::memory_order_relaxed) != generation_) return;
    e.generation.store(0, std::memory_order_release);
    if (index_ + 1 == b.depth) {
      std::uint32_t d = index_;
      // Scopes left out of order (or on other threads) below us are free already: pop them too.
      while (d > 0 && s->scopes[d - 1].generation.load(std::memory_order_relaxed) == 0) --d;
      b.depth = d;
      s->head.depth.store(d, std::memory_order_release);
    }
  }

 private:
  detail::thread_binding* binding_ = nullptr;
  detail::slot* slot_ = nullptr;
  std::uint64_t generation_ = 0;
  std::uint32_t index_ = 0;
};

/// Enters a timer scope that expires after `timeout`: if the scope is still open then, the
/// watchdog sends its process `signal` (0: the watchdog's default, SIGKILL unless configured).
template <class Rep, class Period>
[[nodiscard]] scope expires(std::chrono::duration<Rep, Period> timeout, std::string_view name = {},
                            int signal = 0) noexcept {
  return scope(internal::saturating_ns(timeout), name, signal);
}

/// A timer scope with two expiries: still open after `warn_after`, the watchdog warns (a
/// `watchdog_warning` event and, under elastic-run, a line in the rank's log) and signals
/// nothing; still open after `timeout`, it signals as expires() does. For deadlines that are a
/// guess: a slow step is told of long before a hung one is killed. A `warn_after` of zero or
/// not below `timeout` gives no warning.
template <class Rep1, class Period1, class Rep2, class Period2>
[[nodiscard]] scope expires_after_warning(std::chrono::duration<Rep1, Period1> warn_after,
                                          std::chrono::duration<Rep2, Period2> timeout, std::string_view name = {},
                                          int signal = 0) noexcept {
  return scope(internal::saturating_ns(timeout), name, signal, internal::saturating_ns(warn_after));
}

}  // namespace elastic::inline v1::timer

namespace elastic::inline v1 {
using timer::expires;
using timer::expires_after_warning;
}  // namespace elastic::inline v1
