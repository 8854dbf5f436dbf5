// When an elastic group takes newcomers in. A member that went to rebuild the moment it saw a
// newcomer would leave the others in the step's collective, waiting for it; the revoke that frees
// them breaks the communicator a grow needs. So the members count their safe points (every member
// of a round passes the same ones, in step), the first to see newcomers proposes one about half a
// second ahead, the store keeps the first proposal (compare_set from absent), and every member
// rebuilds at that safe point. A member that missed it (its watcher was late) finds its collective
// stuck, revokes, and the rebuild falls back to a fresh init.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include <elastic/error.hpp>
#include <elastic/internal/env.hpp>
#include <elastic/rendezvous/store.hpp>

namespace elastic::inline v1::comm::detail {

class admission {
 public:
  /// A safe point passed (training thread): counted and timed.
  void passed() {
    boundary_.fetch_add(1, std::memory_order_relaxed);
    const auto now = std::chrono::steady_clock::now();
    if (last_ != std::chrono::steady_clock::time_point{}) {
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(now - last_).count();
      const auto old = step_ns_.load(std::memory_order_relaxed);
      step_ns_.store(old == 0 ? ns : (7 * old + ns) / 8, std::memory_order_relaxed);
    }
    last_ = now;
  }

  /// Whether the agreed safe point has come (training thread). Before any agreement: no.
  [[nodiscard]] bool due() const noexcept {
    const std::uint64_t at = at_.load(std::memory_order_acquire);
    return at != 0 && boundary_.load(std::memory_order_relaxed) >= at;
  }

  /// Agrees on the safe point under store key `key` (watcher thread): two steps, and as many as
  /// fill ten polls or half a second (a loaded machine delays watchers), ahead of this member's
  /// count; or the proposal already there. Without a store: the next safe point.
  void agree(rendezvous::store& store, const std::string& key, std::chrono::milliseconds poll_interval) {
    const auto step_ns = std::max<std::int64_t>(step_ns_.load(std::memory_order_relaxed), 100'000);
    const auto margin_ns = std::max<std::int64_t>(10 * std::chrono::nanoseconds(poll_interval).count(), 500'000'000);
    const auto ahead = std::min<std::uint64_t>(2 + static_cast<std::uint64_t>((margin_ns + step_ns - 1) / step_ns), 100000);
    const std::uint64_t proposal = boundary_.load(std::memory_order_relaxed) + ahead;
    std::uint64_t at = proposal;
    try {
      std::optional<std::string> actual;
      if (!store.compare_set(key, std::nullopt, std::to_string(proposal), 0, &actual) && actual) {
        at = static_cast<std::uint64_t>(internal::parse_integer(*actual).value_or(0));
      }
    } catch (const error&) {
      at = 1;
    }
    at_.store(std::max<std::uint64_t>(at, 1), std::memory_order_release);
  }

  /// For a member that sees the round advanced under it (watcher thread): whether that was the
  /// agreed admission, under store key `key`, and this member has not reached it yet (then it
  /// waits for it, and no collective of its can be waiting for the member that advanced: that
  /// one has finished every step before the agreed safe point, so all members have entered them).
  bool adopt(rendezvous::store& store, const std::string& key) {
    std::optional<std::string> v;
    try {
      v = store.get(key);
    } catch (const error&) {
      return false;
    }
    if (!v) return false;
    const auto at = internal::parse_integer(*v);
    if (!at || *at <= 0) return false;
    at_.store(static_cast<std::uint64_t>(*at), std::memory_order_release);
    return boundary_.load(std::memory_order_relaxed) < static_cast<std::uint64_t>(*at);
  }

  /// A new round: nothing agreed, the count from zero.
  void reset() noexcept {
    at_.store(0, std::memory_order_release);
    boundary_.store(0, std::memory_order_relaxed);
  }

 private:
  std::atomic<std::uint64_t> at_{0};        // the agreed safe point of this round (0: none yet)
  std::atomic<std::uint64_t> boundary_{0};  // safe points passed in this round
  std::atomic<std::int64_t> step_ns_{0};    // the time between them (moving average)
  std::chrono::steady_clock::time_point last_{};  // training thread only
};

}  // namespace elastic::inline v1::comm::detail
