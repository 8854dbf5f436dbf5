// An elastic group: a rendezvous and the communicator of its current round, rebuilt when the
// membership changes, so the processes of a data-parallel job survive losing (or gaining) ranks.
//
//   elastic::comm::gloo_group group(store, {.rendezvous = {.min_ranks = 2, .max_ranks = 4}},
//                                   elastic::comm::gloo_factory(5s));
//   elastic::training_loop loop({.dir = "ckpt", .steps = 1000, .every_steps = 50, .group = &group}, st);
//   for (auto& step : loop) {
//     compute_gradients(step.index(), group.rank(), group.size());   // this rank's shard
//     if (!group.allreduce(std::span(grads), elastic::comm::reduce_op::avg)) continue;
//     step.before_update();
//     optimizer_update();
//   }
//
// How a failure becomes a rebuild:
// - A collective that throws (a peer died: its connection closed; a peer hangs: the timeout ran
//   out) marks the group failed. With a plain factory (gloo) the communicator is destroyed at
//   once: closing its connections makes every peer blocked on this rank fail too. With a
//   rebuilder (nccl_factory, comm/rebuild.hpp) it is revoked and kept for the next round.
//   Later collectives of the step return false without communicating.
// - A watcher thread polls the rendezvous every poll_interval: a departed member, a newcomer
//   waiting, or a round started by another member marks a change. A member lost (departed, not
//   left on purpose) or our own lapsed heartbeat also revokes the communicator at once, so a
//   collective waiting for the lost peer ends now with errc::peer_lost naming it: within a host
//   NCCL reports no error for it, and a Gloo peer frozen with its sockets open (SIGSTOP, a hung
//   host) would hold it until Gloo's timeout. A rebuilder's communicator is revoked on a round
//   started by another member too (Gloo's is not: that member finished the step's collectives).
// - At the next safe point (training_loop calls safe_point() before each step) the group forms
//   the next round (survivors keep their relative order, newcomers come after them) and gets
//   its communicator: from the factory, or from the rebuilder, which is handed the previous one
//   (NCCL: revoke -> shrink after departures, grow after newcomers, a fresh init otherwise; the
//   group_rebuilt event says which `path`). Every rank then agrees on rank 0's step and state (a
//   broadcast). The loop runs the failed step again on the new group.
// - Newcomers alone wait for a safe point the members agree on (detail/admission.hpp).
// - A preemption notice while the group re-forms (joining a round, waiting for it to close or
//   for the bootstrap, connecting the communicator) ends the wait with errc::interrupted
//   within 100 ms: training_loop then exits 75 with the newest committed checkpoint standing.
// Rank 0's state travels by the communicator (detail/state_resync.hpp), unless every rank's
// step and state hash prove it holds rank 0's already (group_options::resync). A collective is wrapped
// in a timer scope: a process stuck inside one past twice its communicator's timeout (plus a
// second) is killed by the watchdog; the ranks waiting for it gave up at the timeout itself.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <elastic/checkpoint/group_hook.hpp>
#include <elastic/checkpoint/preemption.hpp>
#include <elastic/checkpoint/state.hpp>
#include <elastic/comm/communicator.hpp>
#include <elastic/comm/detail/admission.hpp>
#include <elastic/comm/detail/flight_recorder.hpp>
#include <elastic/comm/detail/group_flight.hpp>
#include <elastic/comm/detail/peer_replicas.hpp>
#include <elastic/comm/detail/state_resync.hpp>
#include <elastic/comm/detail/teardown_queue.hpp>
#include <elastic/comm/group_options.hpp>
#include <elastic/comm/host_address.hpp>
#include <elastic/comm/rebuild.hpp>
#include <elastic/internal/clock.hpp>
#include <elastic/internal/env.hpp>
#include <elastic/internal/periodic_thread.hpp>
#include <elastic/error.hpp>
#include <elastic/events.hpp>
#include <elastic/rendezvous/rendezvous.hpp>
#include <elastic/rendezvous/store.hpp>
#include <elastic/timer/expires.hpp>

namespace elastic::inline v1::comm {

template <class Comm>
class elastic_group final : public group_hook {
 public:
  /// Nothing happens until join() or the first safe_point(). `bootstrap` makes the leader's
  /// blob (default: a fresh Gloo store prefix per round). Each round's communicator comes from
  /// `make`; the previous one is destroyed first.
  elastic_group(rendezvous::store& store, group_options opts, communicator_factory<Comm> make,
                rendezvous::bootstrap_fn bootstrap = {})
      : elastic_group(store, std::move(opts), std::move(bootstrap), detail::as_rebuild_fn(std::move(make)), false) {}

  /// As above, but each round's communicator comes from `rebuilder.rebuild()`, which is handed
  /// the previous one (comm/rebuild.hpp): nccl_factory shrinks and grows it in place.
  template <communicator_rebuilder<Comm> R>
  elastic_group(rendezvous::store& store, group_options opts, R rebuilder, rendezvous::bootstrap_fn bootstrap = {})
      : elastic_group(store, std::move(opts), std::move(bootstrap),
                      [r = std::move(rebuilder)](round_change<Comm>& c) { return r.rebuild(c); }, true) {}

  elastic_group(const elastic_group&) = delete;
  elastic_group& operator=(const elastic_group&) = delete;

  /// Stops watching, closes the communicator and leaves the rendezvous (the others see the
  /// departure at their next poll). A group destroyed healthy and not by an exception leaves
  /// as done: the others do not cut short the collective they may still be completing with it.
  ~elastic_group() override {
    const bool done = !failed_.load(std::memory_order_acquire) && std::uncaught_exceptions() == 0;
    watcher_.stop();
    comm_.reset();
    teardown_.drain();
    rdzv_.leave(done);
  }

  /// Joins the first round and connects its communicator. safe_point() does it when needed.
  const rendezvous::round_info& join() {
    if (!joined_) rebuild("join");
    return rdzv_.current();
  }

  [[nodiscard]] bool joined() const noexcept { return joined_; }
  [[nodiscard]] int rank() const noexcept override { return rdzv_.current().rank; }
  [[nodiscard]] int size() const noexcept override { return rdzv_.current().world_size; }
  [[nodiscard]] std::uint64_t generation() const noexcept override { return rebuilds_ + (joined_ ? 1 : 0); }
  [[nodiscard]] std::uint64_t epoch() const noexcept override {
    return joined_ ? static_cast<std::uint64_t>(rdzv_.current().round) : 0;
  }
  void attach(checkpoint::loop_link link) override { link_ = std::move(link); }
  void snapshot_copied(const checkpoint::staged_snapshot& s) override {
    if (replicas_) replicas_->keep(s);
  }
  /// What the peer replicas did on this rank (nothing before the first resync of partitioned
  /// state, or with group_options::replicas 0).
  [[nodiscard]] std::optional<detail::replica_stats> replica_stats() const {
    if (!replicas_) return std::nullopt;
    return replicas_->stats();
  }
  [[nodiscard]] std::int64_t round() const noexcept { return rdzv_.current().round; }
  [[nodiscard]] const rendezvous::round_info& current() const noexcept { return rdzv_.current(); }
  /// True from a failed collective until the group is rebuilt.
  [[nodiscard]] bool failed() const noexcept { return failed_.load(std::memory_order_acquire); }
  /// Rounds this group has been rebuilt into after its first.
  [[nodiscard]] std::size_t rebuilds() const noexcept { return rebuilds_; }
  [[nodiscard]] const recovery_timings& last_recovery() const noexcept { return last_; }

  /// The current round's communicator; throws when the group is failed or not joined.
  Comm& comm() {
    if (!comm_) {
      if (failed_) {  // retired (aborted) on failure, not the caller's mistake
        throw error(errc::aborted, "elastic_group: the communicator failed; it is rebuilt at the next safe_point()");
      }
      throw error(errc::invalid_argument, "elastic_group: join() first");
    }
    return *comm_;
  }

  /// Collectives on the current communicator: true when done; false when it failed (now or
  /// earlier in this step), the group then needs a safe_point() before it communicates again.
  template <reducible T>
  bool allreduce(std::span<T> buf, reduce_op op) {
    return run("allreduce", [&](Comm& c) { c.allreduce(buf, op); }, buf.size_bytes());
  }
  template <reducible T>
  bool broadcast(std::span<T> buf, int root) {
    return run("broadcast", [&](Comm& c) { c.broadcast(buf, root); }, buf.size_bytes());
  }
  bool barrier() {
    return run("barrier", [](Comm& c) { c.barrier(); });
  }

  /// For loops of one's own: rebuilds when a collective failed or the membership changed.
  /// True when it did: the caller's replicated state must then be resynced (see safe_point).
  bool rebuild_if_needed() {
    if (!joined_) {
      rebuild("join");
      return true;
    }
    admission_.passed();
    std::string cause;
    if (failed_) {
      cause = failure_;
    } else if (change_pending_.load(std::memory_order_acquire)) {
      // Newcomers alone are taken in at the safe point the members agreed on (detail/admission.hpp).
      if (newcomers_only_.load(std::memory_order_acquire) && !admission_.due()) return false;
      std::lock_guard lk(rdzv_mu_);
      cause = change_cause_;
    } else {
      return false;
    }
    rebuild(cause);
    return true;
  }

  std::uint64_t safe_point(std::uint64_t step, checkpoint::state& st) override {
    for (;;) {
      if (!rebuild_if_needed()) return step;
      // A peer may die during the resync itself: then rebuild and resync again.
      if (auto agreed = resync(step, st)) return *agreed;
    }
  }

  std::optional<std::vector<double>> gather(std::span<const double> values) override {
    // Rank r's values at [r n, r n + n) and zeros elsewhere: their sum is every rank's values,
    // through the one reduction every communicator has.
    const std::size_t n = values.size(), r = static_cast<std::size_t>(rank());
    std::vector<double> all(n * static_cast<std::size_t>(size()), 0.0);
    std::copy(values.begin(), values.end(), all.begin() + static_cast<std::ptrdiff_t>(r * n));
    const bool ok = run(
        "gather",
        [&](Comm& c) {
          if constexpr (requires { c.allreduce_host(std::span<double>(all), reduce_op::sum); }) {
            c.allreduce_host(std::span<double>(all), reduce_op::sum);  // a device communicator
          } else {
            c.allreduce(std::span<double>(all), reduce_op::sum);
          }
        },
        all.size() * sizeof(double));
    if (!ok) return std::nullopt;
    return all;
  }

  [[nodiscard]] bool step_failed() const noexcept override { return failed(); }
  [[nodiscard]] bool writes_checkpoints() const noexcept override { return comm_ && rank() == 0; }

  void finish(checkpoint::run_end end) override {
    std::lock_guard lk(rdzv_mu_);
    rdzv_.mark_finished(end.step, end.steps);
  }
  [[nodiscard]] std::optional<checkpoint::run_end> run_ended() const override {
    std::lock_guard lk(rdzv_mu_);
    if (const auto& f = rdzv_.finished()) return checkpoint::run_end{f->step, f->steps};
    return std::nullopt;
  }

 private:
  using clock = std::chrono::steady_clock;
  using rebuild_fn = std::function<rebuilt<Comm>(round_change<Comm>&)>;

  elastic_group(rendezvous::store& store, group_options opts, rendezvous::bootstrap_fn bootstrap, rebuild_fn rebuild,
                bool keeps)
      : store_(store),
        opts_(std::move(opts)),
        events_(opts_.events ? *opts_.events : event_log::from_env()),
        rebuild_(std::move(rebuild)),
        keeps_(keeps),
        bootstrap_(std::move(bootstrap)),
        rdzv_(store, with_events(opts_.rendezvous, events_)) {
    if (!rebuild_) throw error(errc::invalid_argument, "elastic_group: no communicator factory given");
    if (opts_.replicas < 0 || opts_.replicas > 64) {
      throw error(errc::invalid_argument,
                  fmt::format("elastic_group: replicas {} must be 0 (none) to 64", opts_.replicas));
    }
    if (opts_.poll_interval.count() <= 0) {
      throw error(errc::invalid_argument,
                  fmt::format("elastic_group: poll_interval {} ms must be positive", opts_.poll_interval.count()));
    }
    if (opts_.resync != resync_mode::compare && opts_.resync != resync_mode::broadcast) {
      throw error(errc::invalid_argument,
                  fmt::format("elastic_group: resync {} must be resync_mode::compare or resync_mode::broadcast",
                              static_cast<int>(opts_.resync)));
    }
    open_flight_recorder();
  }

  /// Whether the communicator has revoke(): the watcher stops a collective waiting for a lost
  /// member with it, and a rebuilder's group (keeps_) revokes rather than retires on a failure.
  static constexpr bool revocable = requires(Comm& c) { c.revoke(); };

  static rendezvous::rendezvous_options with_events(rendezvous::rendezvous_options o, const event_log& ev) {
    if (!o.events) o.events = ev;
    return o;
  }

  template <class F>
  bool run(std::string_view what, F&& f, std::size_t bytes = 0) {
    if (!joined_) throw error(errc::invalid_argument, fmt::format("elastic_group {}: join() first", what));
    if (failed_ || !comm_) return false;
    timer::scope scope;
    const auto d = deadline();
    if (d.count() > 0) scope = elastic::expires(d, what);
    const bool pause = d.count() > 0 && link_.collective;  // this scope guards the wait, not the step's
    if (pause) link_.collective(true);
    // One clock read on each side serves both records: the ring and the store's report.
    latest_ = {++collectives_, what, detail::flight_outcome::inside, internal::monotonic_ns(), 0};
    if (flight_) flight_->enter(what, bytes, latest_.entered_ns);
    const auto left = [&](bool ok) {
      latest_.outcome = ok ? detail::flight_outcome::done : detail::flight_outcome::failed;
      latest_.left_ns = internal::monotonic_ns();
      if (flight_) flight_->leave(ok, latest_.left_ns);
      scope.leave();
      if (pause) link_.collective(false);
    };
    try {
      f(*comm_);
    } catch (const error& e) {
      left(false);
      fail(what, e);
      return false;
    }
    left(true);
    return true;
  }

  /// The flight recorder of this process, when the group has a run id to name it by; a host
  /// without shared memory to spare says so once and the group goes on unrecorded.
  void open_flight_recorder() {
    const bool on = opts_.flight_recorder ? *opts_.flight_recorder
                                          : internal::env_string("ELASTIC_FLIGHT_RECORDER").value_or("0") == "1";
    if (!on || rdzv_.options().run_id.empty()) return;
    try {
      flight_.emplace(rdzv_.options().run_id);
    } catch (const error& e) {
      events_.emit("flight_recorder_unavailable", {{"message", e.what()}, {"effect", "collectives are not recorded"}});
    }
  }

  /// A collective's watchdog deadline, ordered after the communicator's own timeout: a rank
  /// waiting for a peer that hangs gives up at that timeout (the collective fails, the group
  /// rebuilds without the peer) and is never killed for it; only a rank stuck inside the
  /// collective itself, whose timeout cannot fire, is still there at the deadline. So it is
  /// twice the timeout plus a second, whatever the step deadlines are (a peer's warm-up, an
  /// extended or unbounded step, a slow first step after a rebuild are waited for up to the
  /// timeout, never killed for), and a collective_deadline given below that is raised to it.
  std::chrono::milliseconds deadline() {
    std::chrono::milliseconds floor{0};
    if constexpr (requires(const Comm& c) { c.timeout(); }) {
      if (comm_) floor = 2 * std::chrono::duration_cast<std::chrono::milliseconds>(comm_->timeout()) + std::chrono::seconds(1);
    }
    const auto given = opts_.collective_deadline;
    if (given.count() > 0 && given < floor && !deadline_raised_) {
      deadline_raised_ = true;
      events_.emit("collective_deadline_raised",
                   {{"collective_deadline_ms", static_cast<std::int64_t>(given.count())},
                    {"raised_to_ms", static_cast<std::int64_t>(floor.count())},
                    {"reason", "below twice the communicator's timeout plus a second: the ranks waiting for a hung "
                               "peer would be killed before their communicator gives up on it"}});
    }
    return std::max(given, floor);
  }

  void fail(std::string_view what, const error& e) {
    failed_ = true;
    noticed_ns_ = internal::monotonic_ns();
    // Read before the communicator goes: `e` may share its text with the communicator's own copy
    // of it (last_error()), which the teardown thread destroys.
    const errc code = e.code();
    const std::string message = e.what();
    // A rebuilder gets the communicator back, revoked (in-flight work stopped). Otherwise
    // closing our connections now fails the peers still blocked on us.
    if (keeps_ && revocable) {
      revoke_current();
    } else {
      retire();
    }
    // A revoke by the watcher names what it saw (the lost member), whatever error it caused. A
    // connection that broke may be a peer's revoke for a loss our watcher has yet to see: the
    // store says so now.
    std::string cause = revoked_cause();
    const bool revoked = !cause.empty();
    if (!revoked && code == errc::peer_lost) cause = lost_now();
    failure_ = revoked                 ? fmt::format("{} failed: {} (the communicator was revoked)", what, cause)
               : code == errc::timeout ? fmt::format("{} failed: a peer did not answer in time", what)
               : code == errc::aborted ? fmt::format("{} failed: a member left (the communicator was revoked)", what)
               : cause.empty()         ? fmt::format("{} failed: a peer's connection broke", what)
                                       : fmt::format("{} failed: a peer's connection broke after the {}", what, cause);
    events_.emit("group_failure", {{"round", round()},
                                   {"collective", what},
                                   {"code", to_string(code)},
                                   {"cause", failure_},
                                   {"message", message}});
  }

  /// The members of the round lost (departed, not left on purpose) in `ch`.
  static std::vector<std::string> lost_members(const rendezvous::membership_change& ch) {
    std::vector<std::string> lost;
    for (const auto& id : ch.departed) {
      if (std::find(ch.left.begin(), ch.left.end(), id) == ch.left.end()) lost.push_back(id);
    }
    return lost;
  }

  /// "departure of <ids>" when the store shows members of the round lost now; empty otherwise
  /// (or when the store does not answer: the cause is then only less precise).
  std::string lost_now() {
    std::lock_guard lk(rdzv_mu_);
    try {
      const auto lost = lost_members(rdzv_.poll());
      return lost.empty() ? std::string() : fmt::format("departure of {}", fmt::join(lost, ","));
    } catch (const error&) {
      return {};
    }
  }

  /// Revokes the current communicator; any thread. `cause` (the watcher's) becomes the failed
  /// collective's cause; `why` tells the communicator, whose error says it.
  void revoke_current(const std::string& cause = {}, std::string_view why = {}) noexcept {
    if constexpr (revocable) {
      std::lock_guard lk(comm_ptr_mu_);
      if (!comm_) return;
      if (!cause.empty() && revoked_cause_.empty()) {
        try {
          revoked_cause_ = cause;
        } catch (...) {  // no memory for the words: the revoke matters more
        }
      }
      revoked_.store(true, std::memory_order_release);
      if constexpr (requires(Comm& c, std::string_view w) { c.revoke(w); }) {
        if (!why.empty()) {
          comm_->revoke(why);
          return;
        }
      }
      comm_->revoke();
    }
  }

  /// Why the watcher revoked the current communicator (empty: it did not).
  std::string revoked_cause() {
    std::lock_guard lk(comm_ptr_mu_);
    return revoked_cause_;
  }

  /// The current communicator, moved out for a rebuild.
  std::unique_ptr<Comm> take_communicator() {
    std::lock_guard lk(comm_ptr_mu_);
    return std::move(comm_);
  }

  void install(std::unique_ptr<Comm> c) {
    std::lock_guard lk(comm_ptr_mu_);
    comm_ = std::move(c);
    revoked_cause_.clear();
    revoked_.store(false, std::memory_order_release);
  }

  /// The store keys of round `r`'s communicator rebuild.
  std::string round_keys(std::int64_t r) const { return fmt::format("{}/round/{}/comm/", rdzv_.key_prefix(), r); }

  /// round_change::check: a preemption notice, or (every 50 ms) a departure from the round.
  /// Runs on the rebuilding thread, which holds rdzv_mu_.
  void check_round() {
    if (const int sig = preemption_handler::requested(); sig != 0) {
      throw error(errc::interrupted,
                  fmt::format("elastic_group: a preemption notice (signal {}) came while building the communicator "
                              "of round {}; exit 75, the newest committed checkpoint stands",
                              sig, round()));
    }
    const auto now = clock::now();
    if (now - last_round_check_ < std::chrono::milliseconds(50)) return;
    last_round_check_ = now;
    const auto ch = rdzv_.poll();
    if (!ch.departed.empty()) {
      throw error(errc::peer_lost, fmt::format("elastic_group: {} left round {} while its communicator was being "
                                               "built",
                                               fmt::join(ch.departed, ","), round()));
    }
  }

  /// Destroys the communicator on the teardown thread: closing Gloo's connections takes up to
  /// 10 ms per peer (its event loop's tick), an NCCL abort far longer; the rendezvous need not wait.
  void retire() { teardown_.discard(take_communicator()); }

  /// Forms the next round and gets its communicator (from the factory, or rebuilt from the
  /// previous one); again while a peer dies during the connect, until the rendezvous's join timeout.
  void rebuild(const std::string& cause) {
    const std::int64_t noticed = failed_ ? noticed_ns_ : internal::monotonic_ns();
    // Where this rank was when it left the round: the next round's rank 0 names who held it back.
    if (joined_) detail::publish_last_collective(store_, rdzv_.key_prefix(), round(), rank(), size(), latest_);
    if (!keeps_) retire();
    const auto deadline = clock::now() + opts_.rendezvous.join_timeout;
    std::lock_guard lk(rdzv_mu_);
    for (;;) {
      // A preemption notice ends the wait (errc::interrupted): from the rendezvous, from the
      // communicator's connect (gloo's store waits look at it too), or here between tries.
      if (const int sig = preemption_handler::requested(); sig != 0) {
        throw error(errc::interrupted,
                    fmt::format("elastic_group: a preemption notice (signal {}) came while rebuilding after {}; exit "
                                "75, the newest committed checkpoint stands",
                                sig, cause));
      }
      const rendezvous::round_info previous = rdzv_.current();
      const auto& info = joined_ ? rdzv_.next_round(bootstrap_) : rdzv_.join(bootstrap_);
      const std::int64_t met = internal::monotonic_ns();
      std::string path, reason;
      try {
        round_change<Comm> change{store_,
                                  previous,
                                  info,
                                  take_communicator(),
                                  round_keys(info.round),
                                  [this] { check_round(); },
                                  [this](std::unique_ptr<Comm> c) { teardown_.discard(std::move(c)); }};
        rebuilt<Comm> made = rebuild_(change);
        if (!made.communicator) throw error(errc::invalid_argument, "elastic_group: the factory made no communicator");
        install(std::move(made.communicator));
        path = std::move(made.path);
        reason = std::move(made.reason);
      } catch (const error& e) {
        // A setting no next round can fix (NCCL_COMM_BLOCKING, a device NCCL refuses) ends it now.
        const bool config = e.code() == errc::invalid_argument || e.code() == errc::not_supported;
        if (e.code() == errc::interrupted || config || clock::now() >= deadline) throw;
        events_.emit("group_connect_failed", {{"round", info.round}, {"message", e.what()}});
        joined_ = true;  // a member of that round: the next one is entered as a survivor
        continue;
      }
      const bool first = !joined_ && rebuilds_ == 0 && last_.round == 0;
      joined_ = true;
      failed_ = false;
      change_pending_.store(false, std::memory_order_release);
      newcomers_only_.store(false, std::memory_order_release);
      admission_.reset();
      last_ = {info.round, info.world_size, cause, noticed, met, internal::monotonic_ns(), 0, path, reason};
      if (!first) ++rebuilds_;
      if (flight_) flight_->begin_round(info.round, info.rank, info.world_size);
      collectives_ = 0;
      latest_ = {};
      events_.emit(first ? "group_formed" : "group_rebuilt",
                   {{"round", info.round},
                    {"world_size", info.world_size},
                    {"cause", cause},
                    {"path", path},
                    {"reason", reason},
                    {"rendezvous_ms", (last_.rendezvous_done_ns - noticed) / 1e6},
                    {"connect_ms", (last_.connected_ns - last_.rendezvous_done_ns) / 1e6},
                    {"noticed_ns", noticed}});
      if (!first && info.rank == 0 && previous.round > 0 && previous.world_size > 1) detail::report_culprit(store_, rdzv_.key_prefix(), previous.round, events_);
      break;
    }
    if (!watcher_.started()) {
      watcher_ = internal::periodic_thread(opts_.poll_interval,
                                                  [this, store_down = false]() mutable { return watch(store_down); });
    }
  }

  /// Every rank ends with rank 0's step and state (detail/state_resync.hpp). Nothing when a
  /// collective failed on the way.
  std::optional<std::uint64_t> resync(std::uint64_t step, checkpoint::state& st) {
    auto runner = [this](std::string_view what, auto&& f) { return this->run(what, f); };
    if (st.has_shards() && link_.settle) link_.settle();  // no snapshot copy reads a slice we move
    // Replicas are kept for a loop's partitioned state: it takes the snapshots they copy.
    if (st.has_shards() && link_.settle && opts_.replicas > 0 && !replicas_) {
      replicas_ = std::make_unique<detail::peer_replicas>(
          st, rdzv_.options().run_id, opts_.replica_host.empty() ? default_host_address() : opts_.replica_host,
          opts_.replicas, events_);
    }
    const auto agreed = size() <= 1 && !st.has_shards()
                            ? std::optional<detail::resynced>(detail::resynced{step})
                            : detail::resync_state<Comm>(runner, rank(), size(), step, st, shards_valid_,
                                                         !resynced_ && step > 0, link_.restore, replicas_.get(),
                                                         opts_.resync, &resync_staging_);
    if (!agreed) return std::nullopt;
    resynced_ = true;
    last_.resynced_ns = internal::monotonic_ns();
    if (replicas_) {
      // What came after the step the group goes on from is another history.
      replicas_->drop_after(static_cast<std::int64_t>(agreed->step));
      replicas_->follow(rank(), size(), agreed->shards.peers, agreed->shards.key);
    }
    detail::report_resync(events_, round(), size(), *agreed, last_, st.has_shards());
    return agreed->step;
  }

  /// The watcher's tick: marks a change for the next safe point; a store that does not answer
  /// is reported once and retried (training goes on meanwhile). `store_down` is the watcher's own.
  bool watch(bool& store_down) {
    if (failed_) return true;
    // A pending change that has not revoked Gloo's communicator (newcomers, a round started by
    // another member) is still watched: a loss before the safe point must end the collective too.
    if (change_pending_.load(std::memory_order_acquire) && !newcomers_only_.load(std::memory_order_acquire) &&
        (keeps_ || revoked_.load(std::memory_order_acquire))) {
      return true;
    }
    std::lock_guard lk(rdzv_mu_);
    try {
      const auto ch = rdzv_.poll();
      if (store_down) {
        store_down = false;
        events_.emit("group_store_back", {{"round", round()}});
      }
      if (!ch.any()) return true;
      // Newcomers alone, or the round advanced at an agreed admission this member has yet to
      // reach: wait for the agreed safe point (detail/admission.hpp) and revoke nothing.
      const std::string admit_key = round_keys(round()) + "admit";
      if (keeps_ && ch.departed.empty() && !ch.self_lost &&
          (!ch.round_advanced || admission_.adopt(store_, admit_key))) {
        if (newcomers_only_.load(std::memory_order_acquire)) return true;
        change_cause_ = ch.joining.empty() ? std::string("newcomers")
                                           : fmt::format("newcomer {}", fmt::join(ch.joining, ","));
        if (!ch.round_advanced) admission_.agree(store_, admit_key, opts_.poll_interval);
        newcomers_only_.store(true, std::memory_order_release);
        change_pending_.store(true, std::memory_order_release);
        return true;
      }
      change_cause_ = !ch.departed.empty() ? fmt::format("departure of {}", fmt::join(ch.departed, ","))
                      : !ch.joining.empty() && !ch.round_advanced && !ch.self_lost
                          ? fmt::format("newcomer {}", fmt::join(ch.joining, ","))
                      : ch.self_lost ? std::string("our heartbeat lapsed")
                                     : std::string("round started by another member");
      newcomers_only_.store(false, std::memory_order_release);
      change_pending_.store(true, std::memory_order_release);
      // A lost member means a collective may now wait for a peer that will never come: stop it
      // now rather than at its timeout (within a host NCCL reports no error for it; a Gloo peer
      // frozen with its sockets open breaks no connection). A member that left on purpose is
      // done: it finished its collectives before it left, and a slower rank may still be
      // completing the last of them (revoking would fail it). So is a member that started the
      // next round of a Gloo group (after newcomers): a rebuilder's is revoked, as NCCL needs.
      const std::vector<std::string> lost = lost_members(ch);
      if (!lost.empty() || ch.self_lost || (keeps_ && ch.round_advanced)) {
        const std::string why =
            !lost.empty() ? fmt::format("member {} of round {} departed (its heartbeat lapsed, or it restarted)",
                                        fmt::join(lost, ","), round())
            : ch.self_lost ? fmt::format("this member's heartbeat lapsed: round {} counts it dead", round())
                           : fmt::format("another member started the round after {}", round());
        revoke_current(change_cause_, why);
      }
    } catch (const error& e) {
      if (!store_down) {
        store_down = true;
        events_.emit("group_store_unavailable", {{"round", round()}, {"message", e.what()}});
      }
    }
    return true;
  }

  rendezvous::store& store_;
  group_options opts_;
  event_log events_;
  rebuild_fn rebuild_;
  bool keeps_ = false;  // the rebuilder gets the previous communicator: revoke it, never retire it
  rendezvous::bootstrap_fn bootstrap_;
  mutable std::mutex rdzv_mu_;  // the rendezvous is driven by one thread at a time: us or the watcher
  rendezvous::rendezvous rdzv_;
  std::mutex comm_ptr_mu_;      // comm_ is replaced by the training thread, revoked by the watcher
  std::unique_ptr<Comm> comm_;
  std::string revoked_cause_;            // guarded by comm_ptr_mu_: why the watcher revoked comm_
  std::atomic<bool> revoked_{false};     // comm_ was revoked by the watcher (reset by install())
  clock::time_point last_round_check_{};
  bool joined_ = false;
  std::atomic<bool> failed_{false};  // read by the watcher
  std::string failure_;
  std::int64_t noticed_ns_ = 0;
  std::atomic<bool> change_pending_{false};
  std::atomic<bool> newcomers_only_{false};  // the pending change is newcomers alone (a rebuilder's group)
  detail::admission admission_;              // when they are taken in
  std::string change_cause_;  // guarded by rdzv_mu_
  std::size_t rebuilds_ = 0;
  recovery_timings last_;
  checkpoint::loop_link link_;      // the loop's checkpoints, for slices lost with their rank
  bool shards_valid_ = true;        // false once a move of this rank's slices failed half way
  bool resynced_ = false;           // before the first resync the state is what the loop restored
  // Peer-memory replicas of the partitioned state (made at the first resync that has some);
  // the checkpointer's copier thread hands it snapshots (keep), after it exists.
  std::unique_ptr<detail::peer_replicas> replicas_;
  detail::resync_staging resync_staging_;  // a resync's device and pinned staging: made once, kept
  std::optional<detail::flight_recorder> flight_;  // the training thread's: it issues the collectives
  bool deadline_raised_ = false;  // collective_deadline_raised was said
  std::uint64_t collectives_ = 0;   // entered in this round
  detail::last_collective latest_;  // this rank's newest collective in this round
  // Destroys the communicators given up (off the training thread); each teardown is an event.
  detail::teardown_queue<Comm> teardown_{[this](double ms) noexcept { events_.emit("group_teardown", {{"ms", ms}}); }};
  internal::periodic_thread watcher_;  // last: it stops before the members it uses go away
};

}  // namespace elastic::inline v1::comm
