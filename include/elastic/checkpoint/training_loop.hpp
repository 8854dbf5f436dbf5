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
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <iterator>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include <elastic/checkpoint/checkpointer.hpp>
#include <elastic/checkpoint/group_hook.hpp>
#include <elastic/checkpoint/preemption.hpp>
#include <elastic/checkpoint/state.hpp>
#include <elastic/detail/clock.hpp>
#include <elastic/detail/env.hpp>
#include <elastic/error.hpp>
#include <elastic/events.hpp>
#include <elastic/timer/expires.hpp>

namespace elastic {

/// Why a loop ended.
enum class loop_reason { running, finished, preempted, stopped };

constexpr std::string_view to_string(loop_reason r) noexcept {
  switch (r) {
    case loop_reason::running: return "running";
    case loop_reason::finished: return "finished";
    case loop_reason::preempted: return "preempted";
    case loop_reason::stopped: return "stopped";
  }
  return "running";
}

struct loop_options {
  std::filesystem::path dir{};               ///< checkpoint directory
  std::uint64_t steps = 0;                   ///< total steps; 0: until preempted or stopped
  std::uint64_t every_steps = 0;             ///< checkpoint every N steps (0: not by count)
  std::chrono::seconds every_seconds{0};     ///< and/or every S seconds (0: not by time)
  std::size_t keep_last = 3;                 ///< committed checkpoints kept
  /// Each step runs in a timer scope of this; 0: ELASTIC_STEP_TIMEOUT (seconds, set by
  /// elastic-run --step-timeout), else none.
  std::chrono::milliseconds step_timeout{0};
  /// > 0: pick the checkpoint interval so that the time the loop is blocked by checkpoints
  /// stays under this fraction of training time (CheckFreq); every_steps is the first guess.
  double max_overhead = 0;
  /// Final checkpoint budget after a notice; nothing: ELASTIC_GRACE (seconds, set by elastic-run
  /// --grace), else 25 s.
  std::optional<std::chrono::milliseconds> grace{};
  bool checkpoint_at_end = true;             ///< a durable checkpoint of the last step
  bool handle_signals = true;                ///< SIGTERM/SIGINT mean preemption
  checkpoint::stream_handle stream = nullptr;  ///< the compute stream snapshots follow (CUDA)
  std::size_t staging_budget = 0;            ///< see checkpointer_options
  int rank = -1;                             ///< -1: ELASTIC_RANK
  int world_size = -1;                       ///< -1: ELASTIC_WORLD_SIZE
  std::string run_id{};                      ///< empty: ELASTIC_RUN_ID
  std::chrono::milliseconds commit_timeout{std::chrono::minutes(2)};
  std::optional<event_log> events{};         ///< nothing: event_log::from_env()
  /// An elastic group the loop resyncs with at each safe point. The state is then replicated:
  /// only the group's rank 0 writes checkpoints, as a world of one (rank/world_size are ignored).
  group_hook* group = nullptr;
};

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
    /// Pushes this step's timer deadline further (a heartbeat for long steps).
    void extend(std::chrono::milliseconds d) {
      if (loop_->scope_) loop_->scope_->extend(d);
    }

   private:
    friend class training_loop;
    explicit step_context(training_loop* l) noexcept : loop_(l) {}
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

  /// Restores the newest valid checkpoint of `opts.dir` into `st` (if any).
  training_loop(loop_options opts, checkpoint::state& st)
      : opts_(std::move(opts)),
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
        ctx_(this) {
    if (opts_.max_overhead < 0 || opts_.max_overhead >= 1) {
      throw error(errc::invalid_argument, "training_loop: max_overhead is a fraction in [0, 1)");
    }
    if (opts_.step_timeout.count() == 0) {
      opts_.step_timeout = elastic::detail::env_seconds("ELASTIC_STEP_TIMEOUT").value_or(std::chrono::milliseconds(0));
    }
    if (!opts_.grace) opts_.grace = elastic::detail::env_seconds("ELASTIC_GRACE").value_or(std::chrono::seconds(25));
    interval_ = opts_.every_steps;
    if (opts_.max_overhead > 0 && interval_ == 0) interval_ = 10;
    if (opts_.handle_signals) signals_.emplace();
    const auto m = ckpt_.restore();
    start_ = next_ = last_snapshot_step_ = m ? m->step : 0;
    events_.emit("loop_start", {{"step", next_},
                                {"resumed", m.has_value()},
                                {"steps", opts_.steps},
                                {"every_steps", interval_},
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
    begin_step();
    return iterator(this);
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
  [[nodiscard]] std::uint64_t interval_steps() const noexcept { return interval_; }
  [[nodiscard]] checkpoint::checkpointer& checkpointer() noexcept { return ckpt_; }

 private:
  /// Whether this process writes checkpoints: always alone, rank 0 of the round in a group.
  bool writer() const noexcept { return !opts_.group || opts_.group->writes_checkpoints(); }

  void begin_step() {
    if (opts_.group) {
      // A safe point: no collective in flight, the state is whole. The group may hand us
      // another step (rank 0's) together with its state.
      const std::uint64_t agreed = opts_.group->safe_point(next_, state_);
      if (agreed != next_) {
        events_.emit("loop_resynced", {{"from_step", next_}, {"to_step", agreed}});
        next_ = agreed;
      }
      last_snapshot_step_ = std::min(last_snapshot_step_, next_);
    }
    step_started_ = std::chrono::steady_clock::now();
    if (opts_.step_timeout.count() > 0) scope_.emplace(elastic::expires(opts_.step_timeout, "step"));
  }

  /// Ends the current step; false when the loop is over.
  bool end_step() {
    scope_.reset();
    if (opts_.group && opts_.group->step_failed()) {
      // The update of this step is not everywhere: run it again on the rebuilt group.
      if (preemption_handler::requested() && signals_) {
        final_checkpoint(loop_reason::preempted);
        return false;
      }
      if (stop_requested_) {
        final_checkpoint(loop_reason::stopped);
        return false;
      }
      ++redone_;
      begin_step();
      if (opts_.steps && next_ >= opts_.steps) {  // rank 0 had finished this step after all
        scope_.reset();
        final_checkpoint(loop_reason::finished);
        return false;
      }
      return true;
    }
    ++next_;
    const auto now = std::chrono::steady_clock::now();
    const double step_s = std::chrono::duration<double>(now - step_started_).count();
    // A checkpoint costs more than its stall: the copy and the write compete with training for
    // cores, memory bandwidth and the disk. Steps run while one is in flight are charged their
    // excess over the undisturbed step time (CheckFreq's measurement of interference).
    if (in_flight_) {
      inflight_cost_ += std::max(0.0, step_s - step_ema_);
      const auto st = ckpt_.stats();
      if (st.committed + st.failed > tracked_done_) {
        in_flight_ = false;
        pending_policy_update_ = opts_.max_overhead > 0;
      }
    } else {
      step_ema_ = step_ema_ == 0 ? step_s : 0.9 * step_ema_ + 0.1 * step_s;
    }

    if (preemption_handler::requested() && signals_) {
      final_checkpoint(loop_reason::preempted);
      return false;
    }
    if (stop_requested_ || (opts_.steps && next_ >= opts_.steps)) {
      final_checkpoint(stop_requested_ ? loop_reason::stopped : loop_reason::finished);
      return false;
    }
    if (pending_policy_update_) {
      // The newest checkpoint is durable: its whole cost is known.
      update_policy();
      pending_policy_update_ = false;
    }
    if (due(now) && writer()) {
      const auto before = ckpt_.stats();
      const auto t0 = std::chrono::steady_clock::now();
      if (take_snapshot()) {
        if (!in_flight_) {  // the cost of one checkpoint at a time is tracked
          inflight_cost_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          tracked_done_ = before.snapshots;  // persisted in order: done once all before it and it are
          in_flight_ = true;
        }
        last_snapshot_step_ = next_;
        last_snapshot_time_ = now;
      } else {
        ++deferred_;  // due still: tried again at the end of the next step
      }
    }
    begin_step();
    return true;
  }

  // Under a fixed interval the loop waits for a staging slot (the interval is a promise of how
  // little work a failure loses); under the adaptive policy it never waits on the disk: with no
  // slot free it takes nothing now, and the snapshot comes at the first step after one frees up.
  bool take_snapshot() {
    if (opts_.max_overhead > 0) return ckpt_.try_snapshot(next_, {}, opts_.stream);
    ckpt_.snapshot(next_, {}, opts_.stream);
    return true;
  }

  bool due(std::chrono::steady_clock::time_point now) const {
    if (interval_ && next_ - last_snapshot_step_ >= interval_) return true;
    if (opts_.every_seconds.count() > 0 && now - last_snapshot_time_ >= opts_.every_seconds) return true;
    return false;
  }

  /// CheckFreq's rule: checkpoint every k steps where cost / (k * step) <= max_overhead, the
  /// cost being the snapshot call plus the excess time of the steps it overlapped; and no
  /// more often than persistence keeps up with.
  void update_policy() {
    const auto s = ckpt_.stats();
    if (step_ema_ <= 0) return;
    const double by_cost = inflight_cost_ / (opts_.max_overhead * step_ema_);
    const double by_persist = s.last_persist_seconds / step_ema_;
    const auto k = static_cast<std::uint64_t>(std::max(1.0, std::ceil(std::max(by_cost, by_persist))));
    if (k != interval_) {
      interval_ = k;
      events_.emit("checkpoint_policy", {{"every_steps", k},
                                         {"cost_ms", inflight_cost_ * 1e3},
                                         {"stall_ms", s.last_stall_seconds * 1e3},
                                         {"step_ms", step_ema_ * 1e3},
                                         {"persist_ms", s.last_persist_seconds * 1e3},
                                         {"max_overhead", opts_.max_overhead}});
    }
  }

  void final_checkpoint(loop_reason why) {
    reason_ = why;
    if (!writer() || (why != loop_reason::preempted && !opts_.checkpoint_at_end)) {
      ckpt_.wait_durable();
      emit_end();
      return;
    }
    std::optional<grace_timer> grace;
    if (why == loop_reason::preempted) {
      const std::int64_t since = preemption_handler::requested_at_ns();
      const auto left = std::chrono::nanoseconds(
          std::max<std::int64_t>(0, std::chrono::nanoseconds(*opts_.grace).count() - (detail::monotonic_ns() - since)));
      grace.emplace(left, events_, next_);
    }
    if (last_snapshot_step_ != next_) ckpt_.snapshot(next_, {}, opts_.stream);
    ckpt_.wait_durable();  // a failure here propagates: the user must know the last state is not saved
    emit_end();
  }

  void emit_end() {
    const auto s = ckpt_.stats();
    events_.emit(reason_ == loop_reason::preempted ? "loop_preempted" : "loop_end",
                 {{"reason", to_string(reason_)},
                  {"step", next_},
                  {"signal", preemption_handler::requested()},
                  {"snapshots", s.snapshots},
                  {"stall_s", s.stall_seconds},
                  {"deferred", deferred_},
                  {"durable_step", s.last_durable_step ? static_cast<long long>(*s.last_durable_step) : -1LL}});
  }

  /// Exits 75 if the final checkpoint is not durable within the grace: the orchestrator's
  /// SIGKILL is coming, and an orderly exit keeps the logs; the previous step stays committed.
  class grace_timer {
   public:
    grace_timer(std::chrono::nanoseconds left, const event_log& events, std::uint64_t step)
        : thread_([this, left, events, step](std::stop_token) {
            std::unique_lock lk(mu_);
            if (cv_.wait_for(lk, left, [&] { return done_; })) return;
            events.emit("checkpoint_grace_exceeded", {{"step", step}, {"grace_ms", left.count() / 1e6}});
            std::_Exit(exit_preempted);
          }) {}
    ~grace_timer() {
      {
        std::lock_guard lk(mu_);
        done_ = true;
      }
      cv_.notify_all();
    }

   private:
    std::mutex mu_;
    std::condition_variable cv_;
    bool done_ = false;
    std::jthread thread_;
  };

  loop_options opts_;
  event_log events_;
  checkpoint::state& state_;
  std::optional<preemption_handler> signals_;
  checkpoint::checkpointer ckpt_;
  step_context ctx_;
  std::optional<timer::scope> scope_;
  loop_reason reason_ = loop_reason::running;
  std::uint64_t start_ = 0, next_ = 0, interval_ = 0, last_snapshot_step_ = 0, redone_ = 0;
  std::uint64_t deferred_ = 0;  // steps at which a due snapshot was put off (adaptive policy)
  std::chrono::steady_clock::time_point step_started_{}, last_snapshot_time_{std::chrono::steady_clock::now()};
  double step_ema_ = 0;       // undisturbed step time
  double inflight_cost_ = 0;  // seconds the newest checkpoint has cost the loop so far
  bool in_flight_ = false;
  std::uint64_t tracked_done_ = 0;  // the tracked checkpoint is done when committed + failed exceed this
  bool pending_policy_update_ = false;
  bool stop_requested_ = false;
};

}  // namespace elastic
