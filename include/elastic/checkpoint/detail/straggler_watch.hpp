// Stragglers: a rank whose own compute (its step time less the time it waited in collectives
// for the others) is persistently slower than the group's. Every rank keeps the mean of its
// ordinary steps since the last comparison; the loop hands all ranks' means to every rank
// together with the step deadlines it agrees on (step_pace.hpp), so the comparison costs no
// collective of its own. In synchronous training every rank's step lasts as long as the
// slowest's, so step times alone cannot tell who is slow; compute times can.
//
// Slowness can belong to a rank rather than a process: rank 0 logs, evaluates, writes
// checkpoints. Evicting such a process only hands the work to the next holder of the rank, and
// the run loses process after process. So a straggler is evicted only when its slowness followed
// it across a change of rank: it was found a persistent straggler at another rank before (a
// rebuild renumbered the group). Each rank sends, with its mean, what it knows of itself (flags):
// slow before at another rank, its slot (the launcher's worker slot) restarted after an eviction,
// evictions stopped. A slot that comes back from an eviction and is slow again gained nothing by
// it: evictions stop for the run (report only), and every rank learns so through the flags.
// Every rank decides from the same exchanged figures, so the straggler and the reporter agree.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <set>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <elastic/events.hpp>

namespace elastic::inline v1::checkpoint::detail {

/// How ranks are compared: a rank is a straggler when its mean compute over a window is at
/// least `threshold` times the median of all ranks', `persist` windows in a row.
struct straggler_options {
  double threshold = 1.5;
  std::uint32_t persist = 2;
};

/// What a rank tells the others of itself with its mean (a bit set, sent as a double).
enum straggler_flag : unsigned {
  slow_at_another_rank = 1,  ///< found a persistent straggler before, at a rank it no longer holds
  slot_evicted_before = 2,   ///< its worker slot was restarted after an eviction
  evictions_stopped = 4,     ///< it knows that evictions stopped for this run
};

/// A persistent straggler found at an exchange.
struct straggler_finding {
  int rank = -1;
  bool evict = false;  ///< its slowness followed it across a change of rank, and evictions are on
};

class straggler_watch {
 public:
  /// `slot_evicted`: this process's slot was restarted after an eviction (ELASTIC_SLOT_EVICTIONS).
  explicit straggler_watch(straggler_options o, bool slot_evicted = false) : o_(o), slot_evicted_(slot_evicted) {}

  /// An ordinary step of this rank computed for `seconds` (checkpoint steps are left out: the
  /// writer's snapshot is not slowness).
  void observe(double seconds) noexcept {
    sum_ += seconds;
    ++n_;
  }

  /// This rank's mean since the last comparison (0: no step), and a new window.
  double take_mean() noexcept {
    const double m = n_ ? sum_ / static_cast<double>(n_) : 0;
    sum_ = 0;
    n_ = 0;
    return m;
  }

  /// What this process, now rank `rank`, tells the others of itself.
  [[nodiscard]] double flags(int rank) const {
    unsigned f = 0;
    if (std::any_of(slow_at_.begin(), slow_at_.end(), [&](int r) { return r != rank; })) f |= slow_at_another_rank;
    if (slot_evicted_) f |= slot_evicted_before;
    if (stopped_) f |= evictions_stopped;
    return static_cast<double>(f);
  }

  /// Compares every rank's mean (`means`, rank order; 0: a rank with no step, left out) at
  /// `step`, with what each said of itself (`flags`, the same order). This process is rank
  /// `rank`; it reports (`straggler` events) the ranks that just became persistent stragglers
  /// when `reporter`. `evicting`: evictions are on. Returns the persistent stragglers.
  std::vector<straggler_finding> compare(std::uint64_t step, std::span<const double> means,
                                         std::span<const double> flags, int rank, bool reporter, bool evicting,
                                         const event_log& events) {
    streak_.resize(means.size(), 0);
    const auto flag = [&](std::size_t r, unsigned bit) {
      return r < flags.size() && (static_cast<unsigned>(flags[r]) & bit) != 0;
    };
    for (std::size_t r = 0; r < means.size(); ++r)
      if (flag(r, evictions_stopped)) stopped_ = true;
    std::vector<double> seen;
    for (double m : means)
      if (m > 0) seen.push_back(m);
    std::vector<straggler_finding> out;
    if (seen.size() < 2) return out;  // one rank alone is slower than nobody
    std::nth_element(seen.begin(), seen.begin() + static_cast<std::ptrdiff_t>(seen.size() / 2), seen.end());
    const double median = seen[seen.size() / 2];
    for (std::size_t r = 0; r < means.size(); ++r) {
      const double ratio = median > 0 ? means[r] / median : 0;
      streak_[r] = means[r] > 0 && ratio >= o_.threshold ? streak_[r] + 1 : 0;
      if (streak_[r] < o_.persist) continue;
      const bool first = streak_[r] == o_.persist;
      // An evicted slot slow again: evicting gained nothing, so no more evictions in this run.
      const bool came_back_slow = flag(r, slot_evicted_before);
      const bool stopping = first && came_back_slow && !stopped_;
      if (came_back_slow) stopped_ = true;
      const bool follows = flag(r, slow_at_another_rank);
      out.push_back({static_cast<int>(r), evicting && follows && !stopped_});
      if (static_cast<int>(r) == rank) slow_at_.insert(rank);
      if (reporter && first) {
        events.emit("straggler", {{"straggler_rank", static_cast<int>(r)},
                                  {"step", step},
                                  {"compute_ms", means[r] * 1e3},
                                  {"median_ms", median * 1e3},
                                  {"ratio", ratio},
                                  {"windows", streak_[r]},
                                  {"threshold", o_.threshold},
                                  {"ranks", static_cast<int>(means.size())},
                                  {"follows", came_back_slow ? "slot" : follows ? "process" : "unknown"},
                                  {"evicted", out.back().evict},
                                  {"evictions_stopped", stopped_}});
        if (stopping && evicting) {
          events.emit("straggler_evictions_stopped",
                      {{"straggler_rank", static_cast<int>(r)},
                       {"step", step},
                       {"reason", "its worker slot came back from an eviction no faster: evicting again would gain "
                                  "nothing; stragglers are only reported from now on"}});
        }
      }
    }
    return out;
  }

  /// A new round: ranks are others now (what each process knows of itself stays).
  void reset() noexcept {
    streak_.clear();
    sum_ = 0;
    n_ = 0;
  }

 private:
  straggler_options o_;
  bool slot_evicted_ = false;
  bool stopped_ = false;               // evictions stopped for this run
  std::set<int> slow_at_;              // ranks this process was a persistent straggler at
  double sum_ = 0;
  std::size_t n_ = 0;
  std::vector<std::uint32_t> streak_;  // per rank: windows in a row over the threshold
};

}  // namespace elastic::inline v1::checkpoint::detail
