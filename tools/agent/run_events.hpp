// What the launcher learns from its run's events file: the lines its workers and it
// appended since the run began (a retried run appends to the same file; what was there
// before is another run's). Read as it grows, through the descriptor the launcher opened (never
// by path again: a path can be swapped for a link, a descriptor cannot).
#pragma once

#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <ctime>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <elastic/internal/env.hpp>
#include <elastic/internal/json.hpp>
#include <elastic/error.hpp>

namespace elastic::agent {

namespace detail {

/// The whole number in `text` up to the first of `ends` (or its end), taken off `text` with that
/// separator; nothing when it is not a number.
inline std::optional<long long> take_number(std::string_view& text, std::string_view ends) {
  const auto stop = std::min(text.find_first_of(ends), text.size());
  const auto n = elastic::internal::parse_integer(text.substr(0, stop));
  text.remove_prefix(std::min(stop + 1, text.size()));
  return n;
}

/// Seconds since the epoch of an events line's "ts" (RFC 3339, UTC, microseconds): 0 when it is
/// not one. The fraction is optional.
inline double parse_ts(std::string_view ts) {
  std::tm tm{};
  int* const fields[] = {&tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour, &tm.tm_min, &tm.tm_sec};
  constexpr std::string_view ends[] = {"-", "-", "T", ":", ":", ".Z"};
  for (std::size_t i = 0; i < std::size(fields); ++i) {
    const auto n = take_number(ts, ends[i]);
    if (!n) return 0;
    *fields[i] = static_cast<int>(*n);
  }
  const long long us = take_number(ts, "Z").value_or(0);
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  return static_cast<double>(::timegm(&tm)) + static_cast<double>(us) / 1e6;
}

}  // namespace detail

class run_events {
 public:
  run_events() = default;
  /// Reads the file open on `fd` (not owned) from byte `offset` on.
  run_events(int fd, std::uint64_t offset) : fd_(fd), offset_(offset) {}

  /// Takes in the lines appended since the last call (whole lines only).
  void update() {
    if (fd_ < 0) return;
    char buf[65536];
    for (;;) {
      const ssize_t n = ::pread(fd_, buf, sizeof buf, static_cast<off_t>(offset_ + partial_.size()));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;
      partial_.append(buf, static_cast<std::size_t>(n));
      std::size_t start = 0;
      for (std::size_t nl; (nl = partial_.find('\n', start)) != std::string::npos; start = nl + 1) {
        take(std::string_view(partial_).substr(start, nl - start));
      }
      offset_ += start;
      partial_.erase(0, start);
      if (partial_.size() > (1u << 20)) {  // not a line of ours: skip it
        offset_ += partial_.size();
        partial_.clear();
      }
    }
  }

  /// checkpoint_commit events so far (progress: one more than before means a step committed).
  [[nodiscard]] std::size_t checkpoints() const noexcept { return checkpoints_; }
  /// The newest committed step, or -1.
  [[nodiscard]] std::int64_t newest_checkpoint() const noexcept { return newest_checkpoint_; }
  /// Whether `pid` logged loop_preempted (it stopped for a preemption notice it got).
  [[nodiscard]] bool preempted(pid_t pid) const { return preempted_.count(pid) != 0; }
  /// Whether `pid`'s loop_preempted said its final checkpoint was committed.
  [[nodiscard]] bool saved_final_checkpoint(pid_t pid) const {
    const auto it = preempted_.find(pid);
    return it != preempted_.end() && it->second;
  }
  /// Whether any process's loop_preempted said it committed the final checkpoint.
  [[nodiscard]] bool final_checkpoint_confirmed() const noexcept { return final_confirmed_; }
  [[nodiscard]] std::int64_t rounds() const noexcept { return rounds_; }
  [[nodiscard]] std::size_t rebuilds() const noexcept { return rebuilt_rounds_.size(); }
  /// The workers whose collective failed (group_failure) since the last call: the others may
  /// wait on a rank that never came (culprit_finder.hpp).
  [[nodiscard]] std::vector<pid_t> take_collective_failures() { return std::exchange(collective_failures_, {}); }
  /// Each straggler a group reported, as a summary line.
  [[nodiscard]] const std::vector<std::string>& stragglers() const noexcept { return stragglers_; }
  /// Workers that left their group as stragglers (--evict-stragglers).
  [[nodiscard]] std::size_t stragglers_evicted() const noexcept { return evicted_pids_.size(); }
  /// Whether process `pid` left its group as a straggler (its exit is then not a failure).
  [[nodiscard]] bool evicted(pid_t pid) const { return evicted_pids_.count(pid) != 0; }
  /// When a group was training again after a rebuild (seconds since the epoch), sorted.
  [[nodiscard]] std::vector<double> resumed() const {
    auto r = resumed_;
    std::sort(r.begin(), r.end());
    return r;
  }

 private:
  static bool is(std::string_view line, std::string_view event) {
    std::string needle = "\"event\":\"";
    needle.append(event).push_back('"');
    return line.find(needle) != std::string_view::npos;
  }

  void take(std::string_view line) {
    if (!is(line, "checkpoint_commit") && !is(line, "loop_preempted") &&
        !is(line, "rendezvous_round_closed") && !is(line, "group_rebuilt") && !is(line, "group_resynced") &&
        !is(line, "group_failure") && !is(line, "straggler") && !is(line, "straggler_evicted")) {
      return;
    }
    try {
      const auto j = elastic::internal::json::parse(line);
      const std::string& ev = j.at("event").as_string();
      if (ev == "checkpoint_commit") {
        ++checkpoints_;
        newest_checkpoint_ = std::max<std::int64_t>(newest_checkpoint_, j.at("step").as_int64());
      } else if (ev == "loop_preempted") {
        const auto* saved = j.find("final_checkpoint");
        const bool yes = saved != nullptr && saved->is_bool() && saved->as_bool();
        preempted_[static_cast<pid_t>(j.at("pid").as_int64())] |= yes;
        final_confirmed_ = final_confirmed_ || yes;
      } else if (ev == "rendezvous_round_closed") {
        rounds_ = std::max(rounds_, j.at("round").as_int64());
      } else if (ev == "group_rebuilt") {
        rebuilt_rounds_.insert(j.at("round").as_int64());
      } else if (ev == "group_resynced") {
        resumed_.push_back(detail::parse_ts(j.at("ts").as_string()));
      } else if (ev == "straggler") {
        stragglers_.push_back(fmt::format("rank {}: its compute {:.1f} ms a step, {:.1f}x the group's median, at step {}",
                                          j.at("straggler_rank").as_int64(), j.at("compute_ms").as_double(),
                                          j.at("ratio").as_double(), j.at("step").as_int64()));
      } else if (ev == "straggler_evicted") {
        evicted_pids_.insert(static_cast<pid_t>(j.at("pid").as_int64()));
      } else if (ev == "group_failure") {
        collective_failures_.push_back(static_cast<pid_t>(j.at("pid").as_int64()));
      }
    } catch (const error&) {
      // a line we cannot read is left out of the figures
    }
  }

  int fd_ = -1;
  std::uint64_t offset_ = 0;
  std::string partial_;
  std::size_t checkpoints_ = 0;
  std::int64_t newest_checkpoint_ = -1;
  std::map<pid_t, bool> preempted_;
  bool final_confirmed_ = false;
  std::int64_t rounds_ = 0;
  std::set<std::int64_t> rebuilt_rounds_;
  std::vector<double> resumed_;
  std::vector<pid_t> collective_failures_;
  std::vector<std::string> stragglers_;
  std::set<pid_t> evicted_pids_;
};

}  // namespace elastic::agent
