// Step deadlines that set themselves (loop_options::auto_timeout): from the step times a loop
// observes, the two expiries its step scope gets: a warning a few step times out, so that a hang
// is told of without the user guessing a number, and a kill much later, so that a healthy step
// that was merely slow (an evaluation pass, a save, a data stall nobody marked) is never killed.
//
// The rule, and why:
// - The first `warmup_steps` steps of a life, and the first `rebuild_steps` after each rebuild
//   of the group, are not observed and not warned of: they compile kernels, fill caches,
//   connect communicators, re-shard their data. They keep the kill (at least the kill floor).
// - Steps are of two kinds. A checkpoint step is one whose end takes a snapshot, or whose
//   before_update() waits for the copy of the previous step's snapshot (the step after it);
//   users also do their own saving there. They may be many times slower than the others, so they
//   are observed apart and get their own deadline; until two snapshots' worth have been
//   observed they get only the ceiling.
// - Over the newest `window` steps of a kind: warning = max(multiple x p99, 2 x max), clamped
//   to [floor, ceiling]; kill = max(kill_multiple x warning, kill_floor). A hung rank is told of
//   at the warning (watchdog_warning, its rank log) and killed at the kill; the group does not
//   wait for it meanwhile: its peers' collectives time out and they rebuild without it. A multiple of a high percentile ignores the odd outlier that a max
//   alone would chase (NVRx uses max x 5); twice the max keeps a step as slow as the slowest
//   seen safe. With step times varying +-50 % around t, p99 ~ 1.5 t: the deadline is ~7.5 t,
//   inside 10 t.
// - Recomputed every `update_every` steps; in a group every rank proposes its figures and all
//   take the largest (a rank that sees slower steps, a newcomer that has seen none: 0), so
//   every rank of a round holds the same deadlines.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <deque>
#include <vector>

#include <elastic/checkpoint/loop_options.hpp>

namespace elastic::inline v1::checkpoint::detail {

/// A window of the newest step times of one kind, seconds.
class step_window {
 public:
  explicit step_window(std::size_t capacity) : capacity_(std::max<std::size_t>(capacity, 1)) {}
  void add(double s) {
    if (times_.size() == capacity_) times_.pop_front();
    times_.push_back(s);
  }
  [[nodiscard]] std::size_t size() const noexcept { return times_.size(); }
  /// The q-quantile (nearest rank) and the max; 0 for an empty window.
  [[nodiscard]] double quantile(double q) const {
    if (times_.empty()) return 0;
    std::vector<double> v(times_.begin(), times_.end());
    const auto k = static_cast<std::size_t>(std::ceil(q * static_cast<double>(v.size()))) - 1;
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(std::min(k, v.size() - 1)), v.end());
    return v[std::min(k, v.size() - 1)];
  }
  [[nodiscard]] double max() const {
    return times_.empty() ? 0 : *std::max_element(times_.begin(), times_.end());
  }

 private:
  std::size_t capacity_;
  std::deque<double> times_;
};

/// What a rank proposes and a round agrees on: seconds (0: no deadline from observations yet).
struct step_deadline_figures {
  double ordinary = 0;
  double checkpoint = 0;
};

/// The two expiries of a step (0 ms: none).
struct step_limits {
  std::chrono::milliseconds warn{0};
  std::chrono::milliseconds kill{0};
};

class step_deadlines {
 public:
  explicit step_deadlines(const auto_timeout_options& o)
      : o_(o), ordinary_(o.window), checkpoint_(o.window), skip_(o.warmup_steps) {}

  /// The next `n` steps are not observed nor warned of (a rebuilt group's first steps).
  void skip(std::uint32_t n) noexcept { skip_ = std::max(skip_, n); }
  /// Whether the next step is one of those.
  [[nodiscard]] bool warming_up() const noexcept { return skip_ > 0; }

  /// A step of `seconds` ended (`checkpoint`: of that kind).
  void observe(double seconds, bool checkpoint) {
    if (skip_ > 0) {
      --skip_;
      return;
    }
    (checkpoint ? checkpoint_ : ordinary_).add(seconds);
  }

  /// This rank's figures from what it observed.
  [[nodiscard]] step_deadline_figures propose() const {
    step_deadline_figures f;
    if (ordinary_.size() >= o_.min_samples) f.ordinary = bound(rule(ordinary_));
    // Two snapshots' worth (each: the step before, the one after, the next) before they have a
    // deadline of their own: which of them is the slow one varies with the trainer.
    const std::size_t need = f.ordinary > 0 ? 6 : o_.min_samples;
    if (checkpoint_.size() >= need) f.checkpoint = bound(std::max(rule(checkpoint_), f.ordinary));
    return f;
  }

  /// The figures the ranks agreed on.
  void set(const step_deadline_figures& f) noexcept { agreed_ = f; }
  [[nodiscard]] const step_deadline_figures& agreed() const noexcept { return agreed_; }

  /// The deadline of a step of this kind now: nothing observed yet -> nothing for an ordinary
  /// step (still warming up) and the ceiling for a checkpoint step once ordinary ones have one.
  [[nodiscard]] std::chrono::milliseconds deadline(bool checkpoint) const {
    double s = checkpoint ? agreed_.checkpoint : agreed_.ordinary;
    if (checkpoint && s == 0 && agreed_.ordinary > 0) s = seconds(o_.ceiling);
    return std::chrono::milliseconds(static_cast<std::int64_t>(std::ceil(s * 1e3)));
  }

  /// Both expiries of the next step of this kind: nothing before a deadline exists; no warning
  /// while warming up.
  [[nodiscard]] step_limits limits(bool checkpoint) const {
    const auto warn = deadline(checkpoint);
    if (warn.count() == 0) return {};
    const auto scaled = std::chrono::milliseconds(
        static_cast<std::int64_t>(std::ceil(static_cast<double>(warn.count()) * o_.kill_multiple)));
    const auto kill = std::max({scaled, o_.kill_floor.value_or(std::chrono::milliseconds(0)), warn});
    return {warming_up() ? std::chrono::milliseconds(0) : warn, kill};
  }

  [[nodiscard]] const step_window& ordinary() const noexcept { return ordinary_; }
  [[nodiscard]] const step_window& checkpoint() const noexcept { return checkpoint_; }

 private:
  static double seconds(std::chrono::milliseconds d) { return static_cast<double>(d.count()) / 1e3; }
  double rule(const step_window& w) const { return std::max(o_.multiple * w.quantile(0.99), 2 * w.max()); }
  double bound(double s) const { return std::clamp(s, seconds(o_.floor), seconds(o_.ceiling)); }

  auto_timeout_options o_;
  step_window ordinary_, checkpoint_;
  std::uint32_t skip_;
  step_deadline_figures agreed_;
};

}  // namespace elastic::inline v1::checkpoint::detail
