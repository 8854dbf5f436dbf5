// The worker side of the watchdog: this process's attachment to a watchdog segment, and each
// thread's slot in it.
//
// A process has at most one current client (it has one watchdog). It is attached explicitly
// with client::attach(name) or, on the first timer scope, from ELASTIC_WATCHDOG. Without either,
// scopes are no-ops and one warning event says so: a missing watchdog never throws in the middle
// of training.
#pragma once

#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include <elastic/internal/clock.hpp>
#include <elastic/internal/env.hpp>
#include <elastic/internal/futex.hpp>
#include <elastic/internal/no_destroy.hpp>
#include <elastic/internal/process.hpp>
#include <elastic/internal/warning_hook.hpp>
#include <elastic/error.hpp>
#include <elastic/timer/detail/attached_segment.hpp>
#include <elastic/timer/detail/table.hpp>

namespace elastic::inline v1::timer {

class client;

namespace detail {

/// A thread's hold on one slot of one client's table. Lives in thread-local storage; only its
/// thread touches it, except that a scope left on another thread compares its address.
struct thread_binding {
  client* owner = nullptr;          ///< whose slot this is; nullptr: none held
  slot* held = nullptr;             ///< the slot, in owner's mapping
  segment_header* header = nullptr; ///< owner's header, for the doorbell
  std::uint32_t depth = 0;          ///< mirror of held->head.depth
  std::uint64_t generation = 0;     ///< last generation this thread published
  std::int64_t retry_after_ns = 0;  ///< table was full: do not search again before this

  thread_binding() = default;
  thread_binding(const thread_binding&) = delete;
  thread_binding& operator=(const thread_binding&) = delete;
  ~thread_binding() { release(); }

  /// Gives the slot back (thread exit, or a switch to another client).
  inline void release() noexcept;
};

inline thread_binding& this_thread() noexcept {
  thread_local thread_binding binding;
  return binding;
}

}  // namespace detail

/// This process's attachment to a watchdog segment.
class client {
 public:
  /// Maps the segment `name` (created by a running or previously running watchdog) and makes it
  /// the watchdog of every scope entered after this call. Attaching the current name again is a
  /// no-op. Throws elastic::error (not_found, owner_mismatch, version_mismatch, corrupt, bad_name).
  static client& attach(std::string_view name) {
    auto& r = registry();
    std::lock_guard lock(r.mutex);
    client* cur = current_.load(std::memory_order_acquire);
    if (cur != nullptr && cur->name() == name) return *cur;
    client& c = r.clients.emplace_back(detail::attached_segment::open(name));
    install_fork_handler();
    current_.store(&c, std::memory_order_release);
    env_checked_.store(true, std::memory_order_release);
    return c;
  }

  /// The current client, attaching from ELASTIC_WATCHDOG on first use; nullptr when there is
  /// none (scopes are then no-ops). Never throws: a failed attach is logged once as an event.
  static client* current() noexcept {
    client* c = current_.load(std::memory_order_acquire);
    if (c != nullptr || env_checked_.load(std::memory_order_acquire)) return c;
    return attach_from_env();
  }

  /// Scopes entered after this call are not watched (until the next attach). Scopes already
  /// entered stay watched until they end.
  static void detach() noexcept {
    current_.store(nullptr, std::memory_order_release);
    env_checked_.store(true, std::memory_order_release);
  }

  /// The segment name this client is attached to.
  [[nodiscard]] const std::string& name() const noexcept { return segment_.name(); }

  /// Sets the rank that kill events report for this process (default: ELASTIC_RANK).
  void set_rank(int rank) noexcept {
    rank_.store(rank, std::memory_order_relaxed);
    const auto pid = static_cast<std::uint64_t>(::getpid());
    const auto t = table();
    const std::uint32_t hw = t.header().slots_high_water.load(std::memory_order_acquire);
    for (std::uint32_t i = 0; i < hw && i < t.slot_count(); ++i) {
      if (t.at(i).head.owner.load(std::memory_order_acquire) == pid)
        t.at(i).head.rank.store(rank, std::memory_order_relaxed);
    }
  }

  /// The mapped table (for tests, benchmarks and tools).
  [[nodiscard]] detail::table_view table() const noexcept { return segment_.table(); }

  /// Binds the calling thread to a free slot. False when the table is full (logged once per
  /// process; the thread looks again at most once a second).
  bool bind(detail::thread_binding& b) noexcept {
    const std::int64_t now = internal::monotonic_ns();
    if (b.owner == this && now < b.retry_after_ns) return false;
    b.release();
    const auto t = table();
    auto& h = t.header();
    const auto pid = static_cast<std::uint64_t>(::getpid());
    const std::uint64_t start = internal::process_start_time(static_cast<pid_t>(pid));
    const auto tid = internal::current_tid();
    // First fit keeps the slots in use packed at the bottom, so the watchdog scans only up to
    // the high-water mark.
    for (std::uint32_t i = 0; i < t.slot_count(); ++i) {
      detail::slot& s = t.at(i);
      std::uint64_t expected = 0;
      if (s.head.owner.load(std::memory_order_relaxed) != 0 ||
          !s.head.owner.compare_exchange_strong(expected, pid, std::memory_order_acq_rel)) {
        continue;
      }
      s.head.tid.store(tid, std::memory_order_relaxed);
      s.head.rank.store(rank_.load(std::memory_order_relaxed), std::memory_order_relaxed);
      s.head.depth.store(0, std::memory_order_relaxed);
      s.head.dropped.store(0, std::memory_order_relaxed);
      for (auto& e : s.scopes) e.generation.store(0, std::memory_order_relaxed);
      b.generation = s.head.generation.load(std::memory_order_relaxed);
      s.head.start_time.store(start, std::memory_order_release);
      std::uint32_t hw = h.slots_high_water.load(std::memory_order_relaxed);
      while (hw < i + 1 && !h.slots_high_water.compare_exchange_weak(hw, i + 1, std::memory_order_acq_rel)) {
      }
      b.owner = this;
      b.held = &s;
      b.header = &h;
      b.depth = 0;
      b.retry_after_ns = 0;
      return true;
    }
    h.table_full.fetch_add(1, std::memory_order_relaxed);
    b.owner = this;  // remembered only to rate-limit the next search
    b.retry_after_ns = now + 1'000'000'000;
    if (!warned_full_.exchange(true, std::memory_order_relaxed)) {
      internal::warn("timer_table_full",
                            {{"segment", name()},
                             {"slots", t.slot_count()},
                             {"effect", "scopes of threads without a slot are not watched until one frees up"},
                             {"fix", "start the watchdog with a larger --capacity"}});
    }
    return false;
  }

  /// Notes a scope that could not be recorded because its thread already has
  /// detail::scopes_per_slot scopes open (logged once per process).
  void note_stack_full(detail::thread_binding& b) noexcept {
    b.held->head.dropped.fetch_add(1, std::memory_order_relaxed);
    if (!warned_depth_.exchange(true, std::memory_order_relaxed)) {
      internal::warn("timer_stack_full",
                            {{"segment", name()},
                             {"depth", detail::scopes_per_slot},
                             {"effect", "scopes nested deeper than this are not watched; outer ones still are"}});
    }
  }

  explicit client(detail::attached_segment seg)
      : segment_(std::move(seg)),
        rank_(static_cast<int>(internal::env_index_or_none("ELASTIC_RANK").value_or(-1))) {}
  client(const client&) = delete;
  client& operator=(const client&) = delete;

 private:
  struct registry_t {
    std::mutex mutex;
    std::list<client> clients;  // never shrinks: live scopes point into every mapping
  };
  static registry_t& registry() noexcept {
    static internal::no_destroy<registry_t> r;
    return r.get();
  }

  static client* attach_from_env() noexcept {
    auto& r = registry();
    std::lock_guard lock(r.mutex);
    if (env_checked_.load(std::memory_order_acquire)) return current_.load(std::memory_order_acquire);
    client* out = nullptr;
    std::string why;
    std::optional<std::string> name;
    try {
      name = internal::env_string("ELASTIC_WATCHDOG");
      if (name) {
        out = &r.clients.emplace_back(detail::attached_segment::open(*name));
        install_fork_handler();
      } else {
        why = "ELASTIC_WATCHDOG is not set";
      }
    } catch (const std::exception& e) {
      why = e.what();
    }
    if (out == nullptr) {
      internal::warn("timer_unwatched", {{"segment", name.value_or("")},
                                                {"reason", why},
                                                {"effect", "timer scopes are not enforced in this process"}});
    }
    current_.store(out, std::memory_order_release);
    env_checked_.store(true, std::memory_order_release);
    return out;
  }

  /// A child created by fork() inherits the parent's mappings and thread-local bindings: forget
  /// the forking thread's binding (the slot is the parent's) so the child claims its own.
  static void install_fork_handler() noexcept {
    static std::once_flag once;
    std::call_once(once, [] {
      ::pthread_atfork(nullptr, nullptr, [] {
        auto& b = detail::this_thread();
        b.owner = nullptr;
        b.held = nullptr;
        b.header = nullptr;
        b.depth = 0;
      });
    });
  }

  detail::attached_segment segment_;
  std::atomic<int> rank_;
  std::atomic<bool> warned_full_{false};
  std::atomic<bool> warned_depth_{false};

  static inline std::atomic<client*> current_{nullptr};
  static inline std::atomic<bool> env_checked_{false};
};

inline void detail::thread_binding::release() noexcept {
  if (held == nullptr) {
    owner = nullptr;
    return;
  }
  slot& s = *held;
  for (auto& e : s.scopes) e.generation.store(0, std::memory_order_relaxed);
  s.head.depth.store(0, std::memory_order_relaxed);
  // Carry the generation over to the next owner so a stale scope's compare-and-clear from
  // another thread can never match a future entry.
  s.head.generation.store(generation + 1, std::memory_order_relaxed);
  s.head.start_time.store(0, std::memory_order_relaxed);
  s.head.owner.store(0, std::memory_order_release);
  owner = nullptr;
  held = nullptr;
  header = nullptr;
  depth = 0;
}

}  // namespace elastic::inline v1::timer
