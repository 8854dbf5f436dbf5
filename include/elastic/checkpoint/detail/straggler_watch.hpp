// Stragglers: a rank whose own compute (its step time less the time it waited in collectives
// for the others) is persistently slower than the group's. Every rank keeps the mean of its
// ordinary steps since the last comparison; the loop hands all ranks' means to every rank
// together with the step deadlines it agrees on (step_pace.hpp), so the comparison costs no
// collective of its own. In synchronous training every rank's step lasts as long as the
// slowest's, so step times alone cannot tell who is slow; compute times can.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
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

class straggler_watch {
 public:
  explicit straggler_watch(straggler_options o) : o_(o) {}

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

  /// Compares every rank's mean (`means`, rank order; 0: a rank with no step, left out) at
  /// `step`; rank `rank` reports (`straggler` events) the ranks that just became persistent
  /// stragglers when `reporter`. Returns the persistent stragglers.
  std::vector<int> compare(std::uint64_t step, std::span<const double> means, bool reporter, const event_log& events) {
    streak_.resize(means.size(), 0);
    std::vector<double> seen;
    for (double m : means)
      if (m > 0) seen.push_back(m);
    std::vector<int> out;
    if (seen.size() < 2) return out;  // one rank alone is slower than nobody
    std::nth_element(seen.begin(), seen.begin() + static_cast<std::ptrdiff_t>(seen.size() / 2), seen.end());
    const double median = seen[seen.size() / 2];
    for (std::size_t r = 0; r < means.size(); ++r) {
      const double ratio = median > 0 ? means[r] / median : 0;
      streak_[r] = means[r] > 0 && ratio >= o_.threshold ? streak_[r] + 1 : 0;
      if (streak_[r] < o_.persist) continue;
      out.push_back(static_cast<int>(r));
      if (reporter && streak_[r] == o_.persist) {
        events.emit("straggler", {{"straggler_rank", static_cast<int>(r)},
                                  {"step", step},
                                  {"compute_ms", means[r] * 1e3},
                                  {"median_ms", median * 1e3},
                                  {"ratio", ratio},
                                  {"windows", streak_[r]},
                                  {"threshold", o_.threshold},
                                  {"ranks", static_cast<int>(means.size())}});
      }
    }
    return out;
  }

  /// A new round: ranks are others now.
  void reset() noexcept {
    streak_.clear();
    sum_ = 0;
    n_ = 0;
  }

 private:
  straggler_options o_;
  double sum_ = 0;
  std::size_t n_ = 0;
  std::vector<std::uint32_t> streak_;  // per rank: windows in a row over the threshold
};

}  // namespace elastic::inline v1::checkpoint::detail
