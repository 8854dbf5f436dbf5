// How a training_loop ends, defined out of the class (training_loop.hpp says what each ending
// means for the exit code): the final checkpoint alone or at the step the ranks agreed on
// (detail/final_step.hpp), the grace timer after a notice, and the loop_end / loop_preempted
// event. Also what the loop lends its group: checkpoints to reload, the collective callbacks of
// its step pace (detail/step_pace.hpp), and a straggler's eviction.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <string_view>

#include <elastic/checkpoint/training_loop.hpp>

namespace elastic::inline v1::checkpoint {

inline void training_loop::attach_group() {
  refuse_fixed_slices(state_);  // before any rank waits for the others
  // Every rank must snapshot the same steps: a fixed interval in steps, nothing timed or adaptive.
  if (opts_.every_steps == 0 || opts_.every_seconds.count() > 0 || opts_.max_overhead > 0) {
    throw error(errc::invalid_argument,
                "training_loop: with sharded state in a group every rank writes its part of the same steps, so "
                "checkpoints go by every_steps alone: set every_steps, and neither every_seconds nor max_overhead");
  }
  opts_.group->attach({.restore =
                           [this](std::optional<std::uint64_t> step, int rank) -> std::optional<std::uint64_t> {
                             if (step) return ckpt_.load_step(*step, rank).step;
                             const auto m = ckpt_.load_newest(rank);
                             return m ? std::optional<std::uint64_t>(m->step) : std::nullopt;
                           },
                       .settle = [this] { ckpt_.wait_copied(); },
                       .collective = [this](bool inside) { in_collective(inside); }});
  ckpt_.on_copied([g = opts_.group](const staged_snapshot& s) { g->snapshot_copied(s); });
}

inline void training_loop::start_pace() {
  const bool compare = opts_.group && opts_.straggler_threshold > 0;
  if (!*opts_.auto_timeout.enabled && !compare) return;
  std::optional<detail::straggler_options> so;
  if (compare) so = detail::straggler_options{opts_.straggler_threshold, 2};
  const bool slot_evicted = compare && internal::env_int("ELASTIC_SLOT_EVICTIONS", 0, 1'000'000'000).value_or(0) > 0;
  pace_.emplace(opts_.auto_timeout, *opts_.auto_timeout.enabled, so, events_, slot_evicted);
}

// A step timeout, given or automatic, bounds this rank's own work: its waits for the others are
// bounded by the communicator's timeout and the collective's deadline after it, so a rank waiting
// for a hung peer is never the one killed.
inline void training_loop::in_collective(bool inside) {
  if (pace_) pace_->collective(inside);
  pause_step(inside);
}

inline void training_loop::pause_step(bool pause) {
  if (pause) {
    if (pauses_++ != 0 || !scope_) return;
    paused_kill_ = scope_->remaining();
    const auto warn = scope_->until_warning();
    paused_warn_ = warn < paused_kill_ && warn.count() > 0 ? warn : std::chrono::nanoseconds(0);  // passed: warned
    scope_.reset();
    paused_ = true;
  } else if (pauses_ > 0 && --pauses_ == 0 && paused_) {
    paused_ = false;
    scope_.emplace(step_scope(paused_warn_, paused_kill_));
  }
}

inline void training_loop::extend_step(std::chrono::milliseconds d) {
  if (!paused_ && !scope_) return;
  if (!paused_ && !step_auto_) {
    scope_->extend(d);  // a fixed deadline: one atomic store
    return;
  }
  // What each expiry has left, in a pause or live, moved by the one rule, and put back.
  const std::chrono::nanoseconds want(d);
  auto warn = paused_ ? paused_warn_ : scope_->until_warning();
  auto kill = paused_ ? paused_kill_ : scope_->remaining();
  if (step_auto_) {
    warn = std::max(warn, want);
    kill = std::max(kill, warn + std::chrono::nanoseconds(step_margin_));
  } else {
    kill = std::max(kill, want);
  }
  if (paused_) {
    paused_warn_ = warn;
    paused_kill_ = kill;
  } else {
    scope_.emplace(step_scope(warn, kill));
  }
}

inline void training_loop::evict() {
  const int rank = opts_.group->rank();
  events_.emit("straggler_evicted", {{"step", next_}, {"round", opts_.group->epoch()}, {"group_rank", rank}});
  reason_ = loop_reason::stopped;  // no final checkpoint: the group goes on without this rank
  throw error(errc::aborted, fmt::format("training_loop: rank {} was a straggler (its compute persistently at least {}x "
                                         "the group's median, at two ranks in turn) and leaves the group "
                                         "(evict_stragglers): restart it, on a healthier device if it has one",
                                         rank, opts_.straggler_threshold));
}

inline void training_loop::follow_group() {
  generation_ = opts_.group->generation();
  const int rank = opts_.group->rank(), world = opts_.group->size();
  ckpt_.set_world(rank, world, opts_.group->epoch());
  agreement_.emplace(opts_.dir, rank, world, next_, agreement_stale_after());
}

inline void training_loop::final_checkpoint(loop_reason why) {
  reason_ = why;
  if (!writer() || (why != loop_reason::preempted && !opts_.checkpoint_at_end)) {
    settle(why);
  } else {
    if (why == loop_reason::preempted) start_grace(preemption_handler::requested_at_ns());
    write_final(next_);
    grace_.reset();
  }
  record_finish();
  emit_end();
  rethrow_unless_preempted();
}

inline void training_loop::record_finish() {
  if (reason_ != loop_reason::finished || !opts_.group || opts_.steps == 0 || final_failure_ ||
      !opts_.group->writes_checkpoints()) {
    return;
  }
  try {
    opts_.group->finish({next_, opts_.steps});
  } catch (const error& e) {
    events_.emit("loop_finish_record_failed", {{"step", next_}, {"error", e.what()}});
  }
}

inline void training_loop::ended_without_us(const error& e) {
  scope_.reset();
  const auto end = opts_.group->run_ended();
  if (!end || end->steps != opts_.steps) {
    throw error(errc::mismatch,
                fmt::format("training_loop: {} That record is of a launch asked for {} steps, this loop for {}: the "
                            "run's keys outlived an earlier run under its id",
                            e.message(), end ? end->steps : 0, opts_.steps));
  }
  settle(loop_reason::finished);  // what this rank had in flight
  if (!sharded_group_) {
    // The run's final state where this rank can read it (a directory the ranks share); a
    // sharded state's parts belong to the last round's ranks, which this one is not among.
    if (const auto m = ckpt_.restore()) next_ = m->step;
  }
  reason_ = loop_reason::finished;
  emit_end();
  rethrow_unless_preempted();
}

inline bool training_loop::agree_on_final_step(loop_reason why) {
  // A rank that only saw another's proposal starts no grace of its own: the decision says
  // whether this is a preemption (the proposers' graces bound them).
  if (why == loop_reason::preempted && !peer_notice_) start_grace(preemption_handler::requested_at_ns());
  const auto deadline = agreement_deadline();
  std::optional<checkpoint::detail::final_decision> decision;
  std::string failure;
  try {
    agreement_->propose(next_, peer_notice_ ? "joined" : to_string(why));
    // A notice that comes while we wait (for a finished or stopped run) starts the grace.
    decision = agreement_->wait_for_proposals(deadline, opts_.steps, [&] {
      if (!grace_ && preemption_handler::requested() && signals_) start_grace(preemption_handler::requested_at_ns());
    });
  } catch (const error& e) {
    failure = e.what();  // the directory failed us: as if no agreement came
  }
  if (!decision) {
    events_.emit("final_step_unagreed", {{"step", next_},
                                         {"proposals", agreement_->proposals_seen()},
                                         {"world_size", ckpt_.world_size()},
                                         {"dir", agreement_->path().string()},
                                         {"error", failure.empty() ? event_value() : event_value(failure)}});
    if (why == loop_reason::preempted || grace_) {
      // Some rank is dead or hung: its part of any new step would never come.
      reason_ = loop_reason::preempted;
      final_error_ = !failure.empty() ? failure
                                      : "the ranks did not agree on a final step within the grace: " +
                                            std::to_string(agreement_->proposals_seen()) + " of " +
                                            std::to_string(ckpt_.world_size()) + " proposals";
      settle(reason_);
      grace_.reset();
      emit_end();
      return false;
    }
    final_checkpoint(why);  // as a loop alone would: rank 0's commit then says who is missing
    return false;
  }
  agreed_final_ = decision->step;
  agreed_reason_ = decision->reason == "finished"    ? loop_reason::finished
                   : decision->reason == "preempted" ? loop_reason::preempted
                                                     : loop_reason::stopped;
  if (agreed_reason_ == loop_reason::preempted && !grace_) start_grace(0);
  events_.emit("final_step_agreed", {{"step", next_},
                                     {"final_step", *agreed_final_},
                                     {"reason", to_string(agreed_reason_)},
                                     {"world_size", ckpt_.world_size()}});
  return true;
}

inline void training_loop::finish_agreed() {
  reason_ = agreed_reason_;
  write_final(next_);
  std::string failure;
  bool acknowledged = false;
  try {
    acknowledged = agreement_->acknowledge(agreement_deadline());
  } catch (const error& e) {
    failure = e.what();
  }
  if (!acknowledged) {
    // Our step is as durable as it is; only the namespace may be left behind (it goes stale).
    events_.emit("final_step_unacknowledged", {{"step", next_},
                                               {"dir", agreement_->path().string()},
                                               {"error", failure.empty() ? event_value() : event_value(failure)}});
  }
  grace_.reset();
  record_finish();
  emit_end();
  rethrow_unless_preempted();
}

inline void training_loop::write_final(std::uint64_t step) {
  try {
    if (last_snapshot_step_ != step) {
      ckpt_.snapshot(step, {}, opts_.stream);
      last_snapshot_step_ = step;
    }
    ckpt_.wait_durable();  // throws when the newest snapshot failed (an older failure does not count)
    const auto s = ckpt_.stats();
    final_written_ = ckpt_.rank() == 0 && s.last_durable_step == step;
  } catch (const error& e) {
    final_error_ = e.what();
    final_failure_ = std::current_exception();
  }
}

inline void training_loop::settle(loop_reason why) {
  try {
    ckpt_.wait_durable();
  } catch (const error& e) {
    final_error_ = e.what();
    if (why != loop_reason::preempted) final_failure_ = std::current_exception();
  }
}

inline void training_loop::interrupted_while_regrouping(const error& e) {
  scope_.reset();
  reason_ = loop_reason::preempted;
  final_error_ = e.what();
  start_grace(preemption_handler::requested_at_ns());
  settle(reason_);  // what was in flight before the failure may still commit
  grace_.reset();
  emit_end("regroup");
}

inline void training_loop::start_grace(std::int64_t since) {
  if (grace_) return;
  const std::int64_t now = internal::monotonic_ns();
  if (since <= 0 || since > now) since = now;
  const auto left = std::chrono::nanoseconds(
      std::max<std::int64_t>(0, std::chrono::nanoseconds(*opts_.grace).count() - (now - since)));
  grace_deadline_ = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(left);
  grace_.emplace(left, events_, next_);
}

inline void training_loop::emit_end(std::string_view interrupted) {
  const auto s = ckpt_.stats();
  events_.emit(reason_ == loop_reason::preempted ? "loop_preempted" : "loop_end",
               {{"reason", to_string(reason_)},
                {"step", next_},
                {"signal", preemption_handler::requested()},
                {"final_checkpoint", final_written_},
                {"final_checkpoint_error", final_error_.empty() ? event_value() : event_value(final_error_)},
                {"interrupted", interrupted.empty() ? event_value() : event_value(interrupted)},
                {"snapshots", s.snapshots},
                {"stall_s", s.stall_seconds},
                {"deferred", deferred_},
                {"durable_step", s.last_durable_step ? static_cast<long long>(*s.last_durable_step) : -1LL}});
}

}  // namespace elastic::inline v1::checkpoint
