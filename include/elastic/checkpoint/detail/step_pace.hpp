// A training_loop's pace: the automatic step deadlines (loop_options::auto_timeout; the rule is
// step_deadlines.hpp) and the straggler watch (straggler_watch.hpp). Which kind each step is,
// how long this rank computed in it (its step less its waits in collectives), and every
// `update_every` steps one exchange through the group (group_hook::gather) that gives every
// rank all ranks' proposed deadlines (each takes the largest: a round's ranks hold the same)
// and compute means (compared for stragglers): the comparison costs no collective of its own.
//
// Which steps are checkpoint steps, on every rank alike: snapshots come every `interval` steps
// counted from the newest snapshot (or the restored step, which every rank shares), so the
// step at whose end one is taken (phase interval - 1), the step after it (phase 0: the writer's
// before_update() waits for the copy) and the one after that (phase 1: the others wait in its
// collective for the writer) are checkpoint steps; and any step after one this rank snapshotted
// at (intervals by time or by the adaptive policy).
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include <elastic/checkpoint/detail/step_deadlines.hpp>
#include <elastic/checkpoint/detail/straggler_watch.hpp>
#include <elastic/checkpoint/group_hook.hpp>
#include <elastic/checkpoint/loop_options.hpp>
#include <elastic/events.hpp>
#include <elastic/internal/clock.hpp>

namespace elastic::inline v1::checkpoint::detail {

class step_pace {
 public:
  /// `deadlines`: the automatic step timeout is on; `stragglers`: ranks are compared;
  /// `slot_evicted`: this process's worker slot was restarted after an eviction.
  step_pace(const auto_timeout_options& o, bool deadlines, std::optional<straggler_options> stragglers,
            event_log events, bool slot_evicted = false)
      : o_(o), events_(std::move(events)) {
    if (deadlines) deadlines_.emplace(o);
    if (stragglers) stragglers_.emplace(*stragglers, slot_evicted);
  }

  /// The expiries of step `step` about to run (0 ms: none). `last_snapshot`: the step of the
  /// newest snapshot (or the restored step); `interval`: snapshots every that many steps (0:
  /// not by count); `took_snapshot`: this rank snapshotted at the end of the step before;
  /// `generation`: the group's (a new one: its first steps are not observed, ranks are new).
  step_limits begin(std::uint64_t step, std::uint64_t last_snapshot, std::uint64_t interval, bool took_snapshot,
                    std::uint64_t generation) {
    if (generation != generation_) {
      if (generation_ != 0 && deadlines_) deadlines_->skip(o_.rebuild_steps);
      if (stragglers_) stragglers_->reset();
      generation_ = generation;
    }
    checkpoint_ = took_snapshot;
    if (interval > 0) {
      const std::uint64_t phase = (step - std::min(step, last_snapshot)) % interval;
      checkpoint_ = checkpoint_ || phase == 0 || phase == 1 || phase + 1 == interval;
    }
    waited_ns_ = 0;
    unbounded_ = false;
    return deadlines_ ? deadlines_->limits(checkpoint_) : step_limits{};
  }

  /// The step now running had an unbounded region (training_loop::step_context::unbounded):
  /// it is neither observed for the deadlines nor compared for stragglers.
  void unbounded() noexcept { unbounded_ = true; }

  /// This rank enters (true) or leaves (false) a collective: the wait is not its compute.
  void collective(bool inside) noexcept {
    const std::int64_t now = internal::monotonic_ns();
    if (inside) {
      entered_ns_ = now;
    } else if (entered_ns_ != 0) {
      waited_ns_ += now - entered_ns_;
      entered_ns_ = 0;
    }
  }

  /// The step begun last ended after `seconds` (`completed` steps in all now). Returns the
  /// persistent stragglers found at this step's exchange (empty between exchanges); `evicting`:
  /// evictions are on.
  std::vector<straggler_finding> end(std::uint64_t completed, double seconds, group_hook* group, bool evicting) {
    if (deadlines_ && !unbounded_) deadlines_->observe(seconds, checkpoint_);
    if (stragglers_ && !checkpoint_ && !unbounded_) stragglers_->observe(std::max(0.0, seconds - static_cast<double>(waited_ns_) / 1e9));
    if (completed % o_.update_every != 0) return {};
    const auto mine = deadlines_ ? deadlines_->propose() : step_deadline_figures{};
    const int rank = group ? group->rank() : 0;
    const std::vector<double> values{mine.ordinary, mine.checkpoint, stragglers_ ? stragglers_->take_mean() : 0.0,
                                     stragglers_ ? stragglers_->flags(rank) : 0.0};
    std::vector<double> all = values;
    const int ranks = group ? group->size() : 1;
    if (group && ranks > 1) {
      auto got = group->gather(values);
      if (!got || got->size() != values.size() * static_cast<std::size_t>(ranks)) return {};  // the group rebuilds
      all = std::move(*got);
    }
    step_deadline_figures agreed{};
    std::vector<double> means, flags;
    for (std::size_t k = 0; k < all.size(); k += values.size()) {
      agreed.ordinary = std::max(agreed.ordinary, all[k]);
      agreed.checkpoint = std::max(agreed.checkpoint, all[k + 1]);
      means.push_back(all[k + 2]);
      flags.push_back(all[k + 3]);
    }
    if (deadlines_) apply(completed, agreed, ranks);
    if (!stragglers_) return {};
    return stragglers_->compare(completed, means, flags, rank, rank == 0, evicting, events_);
  }

 private:
  /// The agreed figures in force; `timeouts_updated` when they appeared, vanished or moved >10 %.
  void apply(std::uint64_t step, const step_deadline_figures& agreed, int ranks) {
    const auto before = deadlines_->agreed();
    deadlines_->set(agreed);
    const auto changed = [](double a, double b) { return (a == 0) != (b == 0) || std::abs(a - b) > 0.1 * std::max(a, b); };
    if (!changed(before.ordinary, agreed.ordinary) && !changed(before.checkpoint, agreed.checkpoint)) return;
    const auto& w = deadlines_->ordinary();
    events_.emit("timeouts_updated", {{"step", step},
                                      {"step_timeout_ms", agreed.ordinary * 1e3},
                                      {"checkpoint_step_timeout_ms", agreed.checkpoint * 1e3},
                                      {"p50_ms", w.quantile(0.5) * 1e3},
                                      {"p99_ms", w.quantile(0.99) * 1e3},
                                      {"max_ms", w.max() * 1e3},
                                      {"samples", w.size()},
                                      {"checkpoint_max_ms", deadlines_->checkpoint().max() * 1e3},
                                      {"checkpoint_samples", deadlines_->checkpoint().size()},
                                      {"ranks", ranks}});
  }

  auto_timeout_options o_;
  event_log events_;
  std::optional<step_deadlines> deadlines_;
  std::optional<straggler_watch> stragglers_;
  std::uint64_t generation_ = 0;
  bool checkpoint_ = false;       // the kind of the step begun last
  bool unbounded_ = false;        // it had an unbounded region
  std::int64_t entered_ns_ = 0;   // in a collective since (0: not in one)
  std::int64_t waited_ns_ = 0;    // in collectives during this step
};

}  // namespace elastic::inline v1::checkpoint::detail
