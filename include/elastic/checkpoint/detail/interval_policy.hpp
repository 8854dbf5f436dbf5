// The adaptive checkpoint interval of training_loop (loop_options::max_overhead > 0), after
// CheckFreq: checkpoint every k steps where cost / (k * step) <= max_overhead, the cost being
// the snapshot call plus the excess time of the steps it overlapped; and no more often than
// persistence keeps up with. With max_overhead 0 the interval is every_steps, fixed.
//
// The loop tells it, in order: each step's duration (on_step), each snapshot it took
// (on_snapshot), and, when the tracked checkpoint is done, asks it for the new interval
// (update). It measures one checkpoint at a time: a snapshot taken while the tracked one is
// still in flight is not measured.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace elastic::inline v1::checkpoint::detail {

class interval_policy {
 public:
  /// `every_steps`: the fixed interval (0: not by count), the adaptive policy's first guess (0:
  /// 10); `max_overhead` > 0 enables the adaptive policy.
  interval_policy(std::uint64_t every_steps, double max_overhead) noexcept
      : max_overhead_(max_overhead), interval_(max_overhead > 0 && every_steps == 0 ? 10 : every_steps) {}

  /// The checkpoint interval in steps now in force (0: not by count).
  [[nodiscard]] std::uint64_t interval() const noexcept { return interval_; }
  [[nodiscard]] bool adaptive() const noexcept { return max_overhead_ > 0; }
  /// The undisturbed step time (an exponential moving average), seconds.
  [[nodiscard]] double step_seconds() const noexcept { return step_ema_; }
  /// What the tracked checkpoint has cost the loop so far, seconds.
  [[nodiscard]] double cost_seconds() const noexcept { return inflight_cost_; }
  /// Whether the tracked checkpoint is done, so update() would pick a new interval.
  [[nodiscard]] bool update_pending() const noexcept { return pending_update_; }

  /// A step ran for `step_s` seconds. A checkpoint costs more than its stall: the copy and the
  /// write compete with training for cores, memory bandwidth and the disk. Steps run while one
  /// is in flight are charged their excess over the undisturbed step time (CheckFreq's
  /// measurement of interference). `done_count()` (committed + failed snapshots so far) is
  /// called only while a checkpoint is tracked.
  template <class DoneCount>
  void on_step(double step_s, DoneCount&& done_count) {
    if (in_flight_) {
      inflight_cost_ += std::max(0.0, step_s - step_ema_);
      if (done_count() > tracked_done_) {
        in_flight_ = false;
        pending_update_ = adaptive();
      }
    } else {
      step_ema_ = step_ema_ == 0 ? step_s : 0.9 * step_ema_ + 0.1 * step_s;
    }
  }

  /// A snapshot was taken: its call blocked the loop `call_s` seconds, and `snapshots_before`
  /// were taken before it (persisted in order, it is done once done_count exceeds that).
  void on_snapshot(double call_s, std::uint64_t snapshots_before) noexcept {
    if (in_flight_) return;  // the cost of one checkpoint at a time is tracked
    inflight_cost_ = call_s;
    tracked_done_ = snapshots_before;
    in_flight_ = true;
  }

  /// With update_pending(): picks the interval from the tracked checkpoint's whole cost and
  /// `persist_s`, the time the newest one took to persist. True when the interval changed.
  bool update(double persist_s) noexcept {
    if (!pending_update_) return false;
    pending_update_ = false;
    if (step_ema_ <= 0) return false;
    const double by_cost = inflight_cost_ / (max_overhead_ * step_ema_);
    const double by_persist = persist_s / step_ema_;
    const auto k = static_cast<std::uint64_t>(std::max(1.0, std::ceil(std::max(by_cost, by_persist))));
    if (k == interval_) return false;
    interval_ = k;
    return true;
  }

 private:
  double max_overhead_;
  std::uint64_t interval_;
  double step_ema_ = 0;       // undisturbed step time
  double inflight_cost_ = 0;  // seconds the tracked checkpoint has cost the loop so far
  bool in_flight_ = false;
  std::uint64_t tracked_done_ = 0;  // the tracked checkpoint is done when done_count exceeds this
  bool pending_update_ = false;
};

}  // namespace elastic::inline v1::checkpoint::detail
