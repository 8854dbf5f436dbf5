// A training_loop's automatic step timeout (loop_options::auto_timeout): which kind each step
// is, what it observed, the agreement across a group's ranks and the `timeouts_updated` event.
// The rule itself is step_deadlines.hpp.
//
// Which steps are checkpoint steps, on every rank alike: snapshots come every `interval` steps
// counted from the newest snapshot (or the restored step, which every rank shares), so the
// step at whose end one is taken (phase interval - 1), the step after it (phase 0: the writer's
// before_update() waits for the copy) and the one after that (phase 1: the others wait in its
// collective for the writer) are checkpoint steps; and any step after one this rank snapshotted
// at (intervals by time or by the adaptive policy).
#pragma once

#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <span>

#include <elastic/checkpoint/detail/step_deadlines.hpp>
#include <elastic/checkpoint/group_hook.hpp>
#include <elastic/checkpoint/loop_options.hpp>
#include <elastic/events.hpp>

namespace elastic::inline v1::checkpoint::detail {

class auto_step_timeout {
 public:
  auto_step_timeout(const auto_timeout_options& o, event_log events)
      : o_(o), deadlines_(o), events_(std::move(events)) {}

  /// The deadline of step `step` about to run (0 ms: none yet). `last_snapshot`: the step of
  /// the newest snapshot (or the restored step); `interval`: snapshots every that many steps
  /// (0: not by count); `took_snapshot`: this rank snapshotted at the end of the step before;
  /// `generation`: the group's (a new one: its first steps are not observed).
  std::chrono::milliseconds begin(std::uint64_t step, std::uint64_t last_snapshot, std::uint64_t interval,
                                  bool took_snapshot, std::uint64_t generation) {
    if (generation != generation_) {
      if (generation_ != 0) deadlines_.skip(2);
      generation_ = generation;
    }
    checkpoint_ = took_snapshot;
    if (interval > 0) {
      const std::uint64_t phase = (step - std::min(step, last_snapshot)) % interval;
      checkpoint_ = checkpoint_ || phase == 0 || phase == 1 || phase + 1 == interval;
    }
    return deadlines_.deadline(checkpoint_);
  }

  /// The step begun last ended after `seconds` (`completed` steps in all now). Every
  /// `update_every` steps the deadlines are recomputed, agreed through `group` (may be null).
  void end(std::uint64_t completed, double seconds, group_hook* group) {
    deadlines_.observe(seconds, checkpoint_);
    if (completed % o_.update_every != 0) return;
    const auto mine = deadlines_.propose();
    std::array<double, 2> v{mine.ordinary, mine.checkpoint};
    int ranks = 1;
    if (group && group->size() > 1) {
      if (!group->agree_max(std::span<double>(v))) return;  // the step failed: the group rebuilds
      ranks = group->size();
    }
    const step_deadline_figures agreed{v[0], v[1]};
    const auto before = deadlines_.agreed();
    deadlines_.set(agreed);
    if (!changed(before.ordinary, agreed.ordinary) && !changed(before.checkpoint, agreed.checkpoint)) return;
    const auto& w = deadlines_.ordinary();
    events_.emit("timeouts_updated", {{"step", completed},
                                      {"step_timeout_ms", agreed.ordinary * 1e3},
                                      {"checkpoint_step_timeout_ms", agreed.checkpoint * 1e3},
                                      {"p50_ms", w.quantile(0.5) * 1e3},
                                      {"p99_ms", w.quantile(0.99) * 1e3},
                                      {"max_ms", w.max() * 1e3},
                                      {"samples", w.size()},
                                      {"checkpoint_max_ms", deadlines_.checkpoint().max() * 1e3},
                                      {"checkpoint_samples", deadlines_.checkpoint().size()},
                                      {"ranks", ranks}});
  }

 private:
  /// Worth an event: appeared, vanished, or moved by more than 10 %.
  static bool changed(double a, double b) { return (a == 0) != (b == 0) || std::abs(a - b) > 0.1 * std::max(a, b); }

  auto_timeout_options o_;
  step_deadlines deadlines_;
  event_log events_;
  std::uint64_t generation_ = 0;
  bool checkpoint_ = false;  // the kind of the step begun last
};

}  // namespace elastic::inline v1::checkpoint::detail
