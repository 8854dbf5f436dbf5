// The watchdog's first expiry of a scope with two (expires_after_warning): told of once, at its
// warning, with a `watchdog_warning` event and the host's on_warning; nothing is signalled then.
// Only the scanning thread uses it.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <string>
#include <string_view>
#include <unordered_map>

#include <elastic/events.hpp>
#include <elastic/timer/detail/table.hpp>
#include <elastic/timer/watchdog_options.hpp>

namespace elastic::inline v1::timer::detail {

class scope_warnings {
 public:
  /// Warns through `events` and `opts.on_warning`; both outlive this.
  scope_warnings(const watchdog_options& opts, const event_log& events) : opts_(opts), events_(events) {}

  /// A live scope before its deadline, entry `j` of slot `s` of table `t`, of process `pid`:
  /// warns of it once it is past its warning, and returns when it must be looked at next.
  std::int64_t look(table_view t, const slot& s, std::uint32_t j, pid_t pid, const entry_snapshot& e, std::int64_t now) {
    const std::int64_t warn = e.warn_ns();
    if (warn == e.deadline_ns) return e.deadline_ns;
    const auto index = static_cast<std::uint64_t>(&s - &t.at(0));
    const std::uint64_t key = index * scopes_per_slot + j;
    const auto it = warned_.find(key);
    if (it != warned_.end() && it->second == e.generation) return e.deadline_ns;  // warned of already
    if (warn > now) return warn;
    warned_[key] = e.generation;
    count_.fetch_add(1, std::memory_order_relaxed);
    const int rank = s.head.rank.load(std::memory_order_relaxed);
    const pid_t tid = s.head.tid.load(std::memory_order_relaxed);
    const std::string_view name(e.name, ::strnlen(e.name, sizeof e.name));
    events_.emit("watchdog_warning", {{"segment", opts_.name},
                                      {"target_pid", pid},
                                      {"target_tid", tid},
                                      {"target_rank", rank >= 0 ? event_value(rank) : event_value(nullptr)},
                                      {"scope", name},
                                      {"warn_ms", static_cast<double>(warn - e.entered_ns) / 1e6},
                                      {"limit_ms", static_cast<double>(e.deadline_ns - e.entered_ns) / 1e6},
                                      {"held_ms", static_cast<double>(now - e.entered_ns) / 1e6},
                                      {"effect", "none yet: signalled at limit_ms if the scope is still open"}});
    if (opts_.on_warning) {
      try {
        opts_.on_warning(watchdog_warning_report{pid, tid, rank, name, std::chrono::nanoseconds(warn - e.entered_ns),
                                                 std::chrono::nanoseconds(e.deadline_ns - e.entered_ns),
                                                 std::chrono::nanoseconds(now - e.entered_ns)});
      } catch (...) {
      }
    }
    return e.deadline_ns;
  }

  /// Forgets scopes that ended, so the map stays as small as the live scopes.
  void forget_ended(table_view t) {
    for (auto it = warned_.begin(); it != warned_.end();) {
      const slot& s = t.at(static_cast<std::uint32_t>(it->first / scopes_per_slot));
      const auto& e = s.scopes[it->first % scopes_per_slot];
      it = e.generation.load(std::memory_order_relaxed) == it->second ? std::next(it) : warned_.erase(it);
    }
  }

  /// Scopes warned of so far (any thread).
  [[nodiscard]] std::uint64_t count() const noexcept { return count_.load(std::memory_order_relaxed); }

 private:
  const watchdog_options& opts_;
  const event_log& events_;
  std::unordered_map<std::uint64_t, std::uint64_t> warned_;  // slot x scopes_per_slot + entry -> generation
  std::atomic<std::uint64_t> count_{0};
};

}  // namespace elastic::inline v1::timer::detail
