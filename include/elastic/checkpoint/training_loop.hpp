// The checkpointable training loop.
//
//   elastic::training_loop loop({.dir = "ckpt", .steps = 10000, .every_steps = 100,
//                                .keep_last = 3, .step_timeout = 120s}, st);
//   for (auto& step : loop) {        // resumes after the newest valid checkpoint
//     forward_backward();
//     step.before_update(stream);    // fence for an in-flight snapshot
//     optimizer_update();
//   }
//   return loop.exit_code();         // 0 finished, 75 preempted (retry me)
//
// With an elastic group (loop_options::group, see group_hook.hpp) the loop also calls the group at
// each safe point, where it rebuilds after a failure and resyncs the state from rank 0; a step
// whose collective failed is run again instead of counted:
//
//   for (auto& step : loop) {
//     compute_gradients(step.index(), group.rank(), group.size());
//     if (!group.allreduce(grads, elastic::comm::reduce_op::avg)) continue;  // redone after rebuild
//     step.before_update();
//     optimizer_update();
//   }
//
// Step numbers count completed steps: the checkpoint `step-000000000100` holds the state after
// 100 steps, and a run resumed from it starts with step index 100.
//
// How a loop ends, and what its exit code says (it follows the newest outcome only: a snapshot
// that failed earlier and was superseded by a later commit changes nothing):
//   finished / stopped   the final step is durable: 0. Its final checkpoint failed: the loop
//                        throws elastic::error (the last state is not saved).
//   preempted            75, the newest committed step standing; loop_preempted says whether
//                        this process made the final step durable (final_checkpoint). A failed
//                        final checkpoint, or a notice while the group was re-forming (no new
//                        checkpoint then), still ends with 75: retrying is right.
// Ranks that checkpoint together without a group (world_size > 1, each writing its part) agree
// on the final step through the checkpoint directory first (checkpoint/detail/final_step.hpp).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include <elastic/checkpoint/checkpointer.hpp>
#include <elastic/checkpoint/detail/step_pace.hpp>
#include <elastic/checkpoint/detail/final_step.hpp>
#include <elastic/checkpoint/detail/grace_timer.hpp>
#include <elastic/checkpoint/detail/interval_policy.hpp>
#include <elastic/checkpoint/detail/loop_settings.hpp>
#include <elastic/checkpoint/loop_options.hpp>
#include <elastic/checkpoint/group_hook.hpp>
#include <elastic/checkpoint/preemption.hpp>
#include <elastic/checkpoint/state.hpp>
#include <elastic/internal/clock.hpp>
#include <elastic/internal/env.hpp>
#include <elastic/error.hpp>
#include <elastic/events.hpp>
#include <elastic/timer/client.hpp>
#include <elastic/timer/expires.hpp>

namespace elastic::inline v1::checkpoint {

class training_loop {
 public:
  /// What the body of the loop sees.
  class step_context {
   public:
    /// Index of this step (0-based; equals the number of steps completed before it).
    [[nodiscard]] std::uint64_t index() const noexcept { return loop_->next_; }
    /// The fence before the optimizer update: an in-flight snapshot must have copied the
    /// state first. CUDA: the wait is queued on `stream`, the host does not block.
    void before_update(checkpoint::stream_handle stream = nullptr) { loop_->ckpt_.before_update(stream); }
    /// Pushes this step's timer deadline further (a heartbeat for long steps): to at least `d`
    /// from now. Under automatic deadlines it moves the warning to at least `d` from now and
    /// keeps the kill as far after the warning as before. The ranks waiting for this one in a
    /// collective are never killed for it (their wait is bounded by their communicator's timeout,
    /// after which they rebuild without this rank).
    void extend(std::chrono::milliseconds d) { loop_->extend_step(d); }

    /// A region of the step with no deadline, not observed: an evaluation pass, a save of the
    /// user's own, any work whose length says nothing about a hang. While the returned guard
    /// lives the step's deadline (automatic, or a step_timeout) is paused, with the time it had
    /// left kept; a step that had such a region is neither observed by the automatic deadlines
    /// nor compared for stragglers. At the top of the body it covers the whole step. Peers that
    /// wait for this rank in a collective still give up at their communicator's timeout.
    [[nodiscard]] auto unbounded() { return unbounded_region(loop_); }

   private:
    friend class training_loop;
    explicit step_context(training_loop* l) noexcept : loop_(l) {}
    training_loop* loop_;
  };

  /// What step_context::unbounded() returns: the step's deadline is paused while it lives.
  class [[nodiscard]] unbounded_region {
   public:
    explicit unbounded_region(training_loop* l) : loop_(l) {
      loop_->pause_step(true);
      if (loop_->pace_) loop_->pace_->unbounded();
    }
    unbounded_region(unbounded_region&& o) noexcept : loop_(std::exchange(o.loop_, nullptr)) {}
    unbounded_region(const unbounded_region&) = delete;
    unbounded_region& operator=(const unbounded_region&) = delete;
    unbounded_region& operator=(unbounded_region&&) = delete;
    ~unbounded_region() {
      if (loop_) loop_->pause_step(false);
    }

   private:
    training_loop* loop_;
  };

  class iterator {
   public:
    using difference_type = std::ptrdiff_t;
    using value_type = step_context;
    step_context& operator*() const noexcept { return loop_->ctx_; }
    iterator& operator++() {
      if (!loop_->end_step()) loop_ = nullptr;
      return *this;
    }
    void operator++(int) { ++*this; }
    bool operator==(std::default_sentinel_t) const noexcept { return loop_ == nullptr; }

   private:
    friend class training_loop;
    explicit iterator(training_loop* l) noexcept : loop_(l) {}
    training_loop* loop_;
  };

  /// Restores the newest valid checkpoint of `opts.dir` into `st` (if any). Throws
  /// errc::invalid_argument naming the option or variable that is malformed or out of range.
  training_loop(loop_options opts, checkpoint::state& st)
      : opts_(checkpoint::detail::resolve_loop_options(std::move(opts))),
        events_(opts_.events ? *opts_.events : event_log::from_env()),
        state_(st),
        ckpt_(st, {.dir = opts_.dir,
                   .keep_last = opts_.keep_last,
                   .rank = opts_.group ? 0 : opts_.rank,
                   .world_size = opts_.group ? 1 : opts_.world_size,
                   .run_id = opts_.run_id,
                   .staging_budget = opts_.staging_budget,
                   .commit_timeout = opts_.commit_timeout,
                   .events = events_}),
        ctx_(this),
        sharded_group_(opts_.group && st.has_shards()) {
    checkpoint::detail::check_watchdog(opts_.step_timeout, *opts_.auto_timeout.enabled);
    start_pace();
    if (sharded_group_) {
      attach_group();
    } else if (opts_.group) {
      opts_.group->attach({.restore = {}, .settle = {}, .collective = [this](bool inside) { in_collective(inside); }});
    }
    if (opts_.handle_signals) signals_.emplace();
    const auto m = ckpt_.restore();
    start_ = next_ = last_snapshot_step_ = m ? m->step : 0;
    if (!opts_.group && ckpt_.world_size() > 1) {
      if (ckpt_.in_object_storage()) {
        throw error(errc::not_supported,
                    fmt::format("training_loop: {} ranks without an elastic group agree on their final step through a "
                                "shared POSIX directory, and {} is in object storage: give the ranks an elastic group "
                                "(elastic-run's workers have one), or a directory every rank shares",
                                ckpt_.world_size(), opts_.dir.string()));
      }
      agreement_.emplace(opts_.dir, ckpt_.rank(), ckpt_.world_size(), start_, agreement_stale_after());
    }
    events_.emit("loop_start", {{"step", next_},
                                {"resumed", m.has_value()},
                                {"steps", opts_.steps},
                                {"every_steps", policy_.interval()},
                                {"dir", opts_.dir.string()}});
  }

  training_loop(const training_loop&) = delete;
  training_loop& operator=(const training_loop&) = delete;
  ~training_loop() = default;

  iterator begin() {
    if (reason_ != loop_reason::running) return iterator(nullptr);
    if (opts_.steps && next_ >= opts_.steps) {
      reason_ = loop_reason::finished;
      return iterator(nullptr);
    }
    return begin_step() ? iterator(this) : iterator(nullptr);
  }
  std::default_sentinel_t end() const noexcept { return {}; }

  /// Ends the loop after the current step, with a durable checkpoint and reason `stopped`.
  void stop() noexcept { stop_requested_ = true; }

  [[nodiscard]] loop_reason reason() const noexcept { return reason_; }
  /// What the process should exit with: 0 finished or stopped, 75 preempted.
  [[nodiscard]] int exit_code() const noexcept { return reason_ == loop_reason::preempted ? exit_preempted : 0; }
  /// The step the loop resumed at (0 for a fresh start).
  [[nodiscard]] std::uint64_t start_step() const noexcept { return start_; }
  /// Steps completed so far, across restarts.
  [[nodiscard]] std::uint64_t completed_steps() const noexcept { return next_; }
  /// Steps run again because a collective of theirs failed (elastic groups only).
  [[nodiscard]] std::uint64_t redone_steps() const noexcept { return redone_; }
  /// Steps at which the adaptive policy put a due snapshot off because persistence was behind
  /// (both staging slots still being written); one snapshot put off three steps counts three.
  [[nodiscard]] std::uint64_t deferred_snapshots() const noexcept { return deferred_; }
  /// The checkpoint interval in steps now in force (the adaptive policy's choice, if enabled).
  [[nodiscard]] std::uint64_t interval_steps() const noexcept { return policy_.interval(); }
  [[nodiscard]] checkpoint::checkpointer& checkpointer() noexcept { return ckpt_; }
  /// Whether this process made the final step durable as its writer (standalone rank 0 after its
  /// commit, or the group's writer): what loop_preempted / loop_end report as final_checkpoint.
  [[nodiscard]] bool final_checkpoint_written() const noexcept { return final_written_; }

 private:
  /// Whether this process writes checkpoints: always alone, rank 0 of the round in a group, and
  /// every rank (its part) in a group with sharded state.
  bool writer() const noexcept { return !opts_.group || sharded_group_ || opts_.group->writes_checkpoints(); }

  /// Starts a step; false when the loop ended instead (a notice while the group re-formed).
  bool begin_step();

  /// The step's timer scope: killed at `kill`, warned of first at `warn` (0: no warning).
  static timer::scope step_scope(std::chrono::nanoseconds warn, std::chrono::nanoseconds kill) {
    kill = std::max(kill, std::chrono::nanoseconds(std::chrono::milliseconds(1)));
    if (warn.count() > 0 && warn < kill) return elastic::expires_after_warning(warn, kill, "step");
    return elastic::expires(kill, "step");
  }

  /// The automatic step deadline counts this rank's own time: paused while it waits in a
  /// collective (whose own deadline guards the wait), resumed with the time it had left.
  void in_collective(bool inside);

  /// Pauses (true) or resumes (false) the step's deadline; pauses nest (an unbounded region,
  /// a collective inside it). Resumed with the time each expiry had left.
  void pause_step(bool pause);

  /// step_context::extend().
  void extend_step(std::chrono::milliseconds d);

  /// Ends the current step; false when the loop is over.
  bool end_step();

  /// A step whose collective failed: its update is not everywhere, so it is run again on the
  /// rebuilt group (unless a notice or stop() ends the loop). False when the loop is over.
  bool redo_failed_step();

  /// Ends the loop if it must end after the step just completed (see notice()), with its final
  /// checkpoint, alone or at the step the ranks agreed on. True when the loop is over.
  bool ended_after_step(std::chrono::steady_clock::time_point now);

  /// Takes the snapshot that is due; under the adaptive policy one that cannot be taken now is
  /// deferred to the end of the next step.
  void snapshot_due(std::chrono::steady_clock::time_point now);

  /// Why the loop must end after this step, if it must: a preemption notice (ours, or another
  /// rank's proposal), stop(), or the last step.
  std::optional<loop_reason> notice(std::chrono::steady_clock::time_point now);
  // Under a fixed interval the loop waits for a staging slot (the interval is a promise of how
  // little work a failure loses); under the adaptive policy it never waits on the disk: with no
  // slot free it takes nothing now, and the snapshot comes at the first step after one frees up.
  bool take_snapshot() {
    if (policy_.adaptive()) return ckpt_.try_snapshot(next_, {}, opts_.stream);
    ckpt_.snapshot(next_, {}, opts_.stream);
    return true;
  }

  bool due(std::chrono::steady_clock::time_point now) const {
    const auto interval = policy_.interval();
    if (sharded_group_) return next_ % interval == 0;  // the same steps on every rank, whatever each joined at
    if (interval && next_ - last_snapshot_step_ >= interval) return true;
    if (opts_.every_seconds.count() > 0 && now - last_snapshot_time_ >= opts_.every_seconds) return true;
    return false;
  }

  /// The adaptive policy's new interval (detail/interval_policy.hpp), announced when it changes.
  void update_interval() {
    const auto s = ckpt_.stats();
    if (!policy_.update(s.last_persist_seconds)) return;
    events_.emit("checkpoint_policy", {{"every_steps", policy_.interval()},
                                       {"cost_ms", policy_.cost_seconds() * 1e3},
                                       {"stall_ms", s.last_stall_seconds * 1e3},
                                       {"step_ms", policy_.step_seconds() * 1e3},
                                       {"persist_ms", s.last_persist_seconds * 1e3},
                                       {"max_overhead", opts_.max_overhead}});
  }

  /// A group with sharded state: every rank writes its part of the same steps, and the group
  /// can reload the state from the checkpoints when a slice is lost (detail/loop_ending.hpp).
  void attach_group();
  /// After the group was rebuilt: parts of the new world, and a final-step agreement among it.
  void follow_group();
  /// This rank is a persistent straggler and evict_stragglers is on: errc::aborted.
  [[noreturn]] void evict();
  /// The step pace, when deadlines set themselves or a group's ranks are compared.
  void start_pace();

  /// The final checkpoint of a loop that ends alone (no agreement needed): the writer
  /// snapshots the step it stopped at and waits until it is durable.
  void final_checkpoint(loop_reason why);

  /// Ranks without a group that checkpoint together: propose the step this rank stopped at and
  /// wait for every rank's proposal (final_step.hpp). False when the loop ended instead (no
  /// agreement in time: the previous step stands).
  bool agree_on_final_step(loop_reason why);

  /// At the agreed final step: snapshot it, wait until durable, then acknowledge.
  void finish_agreed();

  /// An incarnation's agreement is over within twice its longest wait (the grace after a notice,
  /// the commit timeout otherwise): older files from another host are stale.
  std::chrono::milliseconds agreement_stale_after() const {
    return 2 * std::max<std::chrono::milliseconds>(*opts_.grace, opts_.commit_timeout) + std::chrono::minutes(1);
  }

  std::chrono::steady_clock::time_point agreement_deadline() const {
    if (grace_deadline_) return *grace_deadline_;
    // No notice: rank 0 would wait this long for a missing part anyway.
    return std::chrono::steady_clock::now() + opts_.commit_timeout;
  }

  /// Snapshots `step` (unless the newest snapshot is of it) and waits until it is durable. A
  /// failure is kept for emit_end() and rethrow_unless_preempted(), never thrown from here.
  void write_final(std::uint64_t step);

  /// Waits for what is in flight (no new snapshot); a failure is kept as in write_final().
  void settle(loop_reason why);

  /// A finished or stopped loop whose final checkpoint failed must not look like success: the
  /// user must know the last state is not saved. A preempted one exits 75 all the same: its
  /// previous committed step stands and retrying is right.
  void rethrow_unless_preempted() {
    if (final_failure_ && reason_ != loop_reason::preempted) std::rethrow_exception(std::exchange(final_failure_, nullptr));
    final_failure_ = nullptr;
  }

  /// A preemption notice while the group was re-forming: exit 75 with the newest committed step
  /// standing; no new checkpoint (this rank's state may not be the group's).
  void interrupted_while_regrouping(const error& e);

  /// The run ended without this rank (safe_point threw errc::run_finished: no round admitted it
  /// before the last step): it loads the newest checkpoint and ends as finished, exit 0.
  /// errc::mismatch when the run's record is of a launch asked for other steps (its keys outlived
  /// an earlier run under this id).
  void ended_without_us(const error& e);

  /// Rank 0 of a group at a finished loop's end, its last step durable: tells the group the run
  /// is over (group_hook::finish), for the ranks still waiting to join. A store that does not
  /// answer is an event, not a failure: the run did finish.
  void record_finish();

  /// Starts the grace timer: `since` is when the notice came (CLOCK_MONOTONIC ns; 0: now).
  void start_grace(std::int64_t since);

  /// loop_end or loop_preempted. final_checkpoint: this process made the final step durable as
  /// its writer; final_checkpoint_error: why the final checkpoint failed or was not taken
  /// (null: it did not fail); interrupted: what a notice cut short ("regroup"), else null.
  void emit_end(std::string_view interrupted = {});

  loop_options opts_;
  event_log events_;
  checkpoint::state& state_;
  std::optional<preemption_handler> signals_;
  checkpoint::checkpointer ckpt_;
  step_context ctx_;
  std::optional<timer::scope> scope_;
  // Ranks without a group that checkpoint together: the final-step agreement, and once made,
  // the step and reason every rank ends with.
  std::optional<checkpoint::detail::final_step_agreement> agreement_;
  std::optional<std::uint64_t> agreed_final_;
  loop_reason agreed_reason_ = loop_reason::preempted;
  std::chrono::steady_clock::time_point last_peek_{};
  bool peer_notice_ = false;  // the notice was another rank's proposal, not our own
  // After a preemption notice: exits 75 when the grace runs out (see grace_timer).
  std::optional<std::chrono::steady_clock::time_point> grace_deadline_;
  std::optional<checkpoint::detail::grace_timer> grace_;
  // The outcome of the final checkpoint (see emit_end); the failure is kept only to rethrow it.
  bool final_written_ = false;
  std::string final_error_;
  std::exception_ptr final_failure_;
  loop_reason reason_ = loop_reason::running;
  std::uint64_t start_ = 0, next_ = 0, last_snapshot_step_ = 0, redone_ = 0;
  std::uint64_t deferred_ = 0;  // steps at which a due snapshot was put off (adaptive policy)
  std::chrono::steady_clock::time_point step_started_{}, last_snapshot_time_{std::chrono::steady_clock::now()};
  checkpoint::detail::interval_policy policy_{opts_.every_steps, opts_.max_overhead};
  bool stop_requested_ = false;
  bool sharded_group_ = false;    // a group, and sharded state: every rank writes its part
  std::uint64_t generation_ = 0;  // the group's generation the checkpointer follows
  std::optional<checkpoint::detail::step_pace> pace_;  // automatic deadlines, stragglers
  std::optional<std::uint64_t> snapshot_at_;  // the step this rank snapshotted at last
  // The step's deadline: paused (scope_ empty) while pauses_ > 0, with the time each expiry had
  // left; whether it is automatic (extend() moves its warning), and its kill's margin past the
  // warning.
  std::uint32_t pauses_ = 0;
  bool paused_ = false;
  std::chrono::nanoseconds paused_kill_{0}, paused_warn_{0};
  bool step_auto_ = false;
  std::chrono::milliseconds step_margin_{0};
};

}  // namespace elastic::inline v1::checkpoint

// The out-of-class definitions of how a loop runs a step and how it ends.
#include <elastic/checkpoint/detail/loop_steps.hpp>
#include <elastic/checkpoint/detail/loop_ending.hpp>

namespace elastic::inline v1 {
// Re-exported at elastic:: (the common entry points, STYLE.md): users write elastic::training_loop.
using checkpoint::training_loop;
}  // namespace elastic::inline v1
