// How a training_loop runs a step, defined out of the class (training_loop.hpp): the safe point
// before it and the step's deadline, its end (the step pace, the checkpoint interval, a due
// snapshot), a step run again after its collective failed, and whether the loop ends after it.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>

#include <elastic/checkpoint/training_loop.hpp>

namespace elastic::inline v1::checkpoint {

inline bool training_loop::begin_step() {
  if (opts_.group) {
    // A safe point: no collective in flight, the state is whole. The group may hand us
    // another step (rank 0's) together with its state.
    std::uint64_t agreed = next_;
    try {
      agreed = opts_.group->safe_point(next_, state_);
    } catch (const error& e) {
      if (e.code() == errc::run_finished) {
        ended_without_us(e);
        return false;
      }
      if (e.code() != errc::interrupted) throw;
      interrupted_while_regrouping(e);
      return false;
    }
    if (agreed != next_) {
      events_.emit("loop_resynced", {{"from_step", next_}, {"to_step", agreed}});
      next_ = agreed;
    }
    last_snapshot_step_ = std::min(last_snapshot_step_, next_);
    if (sharded_group_ && opts_.group->generation() != generation_) follow_group();
  }
  step_started_ = std::chrono::steady_clock::now();
  checkpoint::detail::step_limits limits{.warn = {}, .kill = opts_.step_timeout};
  step_auto_ = false;
  pauses_ = 0;
  paused_ = false;
  if (pace_) {
    const auto own = pace_->begin(next_, last_snapshot_step_, policy_.interval(), snapshot_at_ == next_,
                                  opts_.group ? opts_.group->generation() : 0);
    if (limits.kill.count() == 0) {
      limits = own;
      step_auto_ = true;
    }
  }
  step_margin_ = limits.warn.count() > 0 ? limits.kill - limits.warn : std::chrono::milliseconds(0);
  if (limits.kill.count() > 0) scope_.emplace(step_scope(limits.warn, limits.kill));
  return true;
}

inline bool training_loop::end_step() {
  scope_.reset();
  paused_ = false;
  pauses_ = 0;
  if (opts_.group && opts_.group->step_failed()) return redo_failed_step();
  ++next_;
  const auto now = std::chrono::steady_clock::now();
  if (pace_) {
    const auto slow =
        pace_->end(next_, std::chrono::duration<double>(now - step_started_).count(), opts_.group, *opts_.evict_stragglers);
    for (const auto& f : slow)
      if (f.evict && f.rank == opts_.group->rank()) evict();
  }
  policy_.on_step(std::chrono::duration<double>(now - step_started_).count(), [&] {
    const auto st = ckpt_.stats();
    return st.committed + st.failed;
  });
  if (ended_after_step(now)) return false;
  if (policy_.update_pending()) update_interval();  // the newest checkpoint is durable: its whole cost is known
  if (due(now) && writer()) snapshot_due(now);
  return begin_step();
}

inline bool training_loop::redo_failed_step() {
  if (preemption_handler::requested() && signals_) {
    final_checkpoint(loop_reason::preempted);
    return false;
  }
  if (stop_requested_) {
    final_checkpoint(loop_reason::stopped);
    return false;
  }
  ++redone_;
  if (!begin_step()) return false;
  if (opts_.steps && next_ >= opts_.steps) {  // rank 0 had finished this step after all
    scope_.reset();
    final_checkpoint(loop_reason::finished);
    return false;
  }
  return true;
}

inline bool training_loop::ended_after_step(std::chrono::steady_clock::time_point now) {
  if (!agreed_final_) {
    const auto why = notice(now);
    if (!why) return false;
    if (!agreement_ || (*why != loop_reason::preempted && !opts_.checkpoint_at_end)) {
      final_checkpoint(*why);
      return true;
    }
    if (!agree_on_final_step(*why)) return true;
  }
  // Training on to the final step the ranks agreed on.
  if (next_ < *agreed_final_) return false;
  finish_agreed();
  return true;
}

inline void training_loop::snapshot_due(std::chrono::steady_clock::time_point now) {
  const auto before = ckpt_.stats();
  const auto t0 = std::chrono::steady_clock::now();
  if (!take_snapshot()) {
    ++deferred_;  // due still: tried again at the end of the next step
    return;
  }
  policy_.on_snapshot(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), before.snapshots);
  last_snapshot_step_ = next_;
  snapshot_at_ = next_;
  last_snapshot_time_ = now;
}

inline std::optional<loop_reason> training_loop::notice(std::chrono::steady_clock::time_point now) {
  if (preemption_handler::requested() && signals_) return loop_reason::preempted;
  if (stop_requested_) return loop_reason::stopped;
  if (opts_.steps && next_ >= opts_.steps) return loop_reason::finished;
  // Another rank's proposal is a notice too (it may have been signalled alone, or first).
  // Looked for at most every 20 ms: usually one fstatat, nothing measurable.
  if (agreement_ && now - last_peek_ >= std::chrono::milliseconds(20)) {
    last_peek_ = now;
    if (agreement_->peer_proposed()) {
      peer_notice_ = true;
      return loop_reason::preempted;  // what the peers stopped for is in their proposals
    }
  }
  return std::nullopt;
}

}  // namespace elastic::inline v1::checkpoint
