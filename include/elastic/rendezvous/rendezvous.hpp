// Rendezvous rounds over a store: who is in the group, with which rank, and how the
// communicator is bootstrapped; who has died since; when the next round must form.
//
// Keys, under P = `<key_prefix>/<run_id>` (every participant of a run derives the same ones):
//
//   <key_prefix>/.runs/<run_id> the run's registration (run_keys.hpp). Leased: it lives as
//                             long as one participant of the run does (each re-creates it while
//                             alive). Many runs share a store, each under its own P; a
//                             participant whose run id nobody else uses waits alone, and its
//                             join timeout names the runs that are live in the store. No run id
//                             starts with '.', so no P is ever the registrations' prefix.
//   P/config                  "min_nodes=M max_nodes=N" (min_ranks, max_ranks: the wire names
//                             predate the rename and stay), written once: a participant that
//                             declares other bounds is refused (mismatch).
//   P/round                   the current round number r (1, 2, ...). Only ever moves r -> r+1,
//                             by compare_set, so concurrent bumps make one step.
//   P/round/<r>/join/<id>     "<incarnation> new" or "<incarnation> <prev round>:<prev rank>",
//                             with "+gloo" after either when the joiner makes the default
//                             bootstrap if it leads. Leased: a joiner that dies stops counting.
//   P/closer/<r>              "<id>", leased: the one joiner of round r that follows the joins and
//                             closes it (the first to claim it; another claims it if it dies).
//   P/closed/<r>              the outcome of round r, written once by compare_set from absent, so
//                             of two would-be closers the store picks exactly one:
//                               "members\n<id> <incarnation>\n..."   in rank order, or
//                               "abandoned\n<why>"                    the join timeout ran out;
//                             "members gloo\n..." when the leader's join said "+gloo".
//   P/bootstrap/<r>           the blob rank 0 publishes (NCCL unique id, Gloo store prefix, ...).
//                             With the default bootstrap (its outcome says "gloo") every member
//                             knows the blob, P/round/<r>/gloo/, and takes it without waiting:
//                             a round reaches its members in one wake instead of two.
//   P/alive/<id>              "<incarnation>", leased: the heartbeat. It vanishes at most
//                             heartbeat_timeout after the participant's last keep_alive.
//   P/pending/<id>            "<incarnation>", leased: a late joiner waiting for the next round.
//   P/gone/<id>               "<incarnation>": that life of the participant was declared gone by
//                             a member that stopped hearing its peer heartbeats
//                             (detail/peer_beacon.hpp). Join records and outcomes carry each
//                             participant's heartbeat address as a last field.
//   P/finished                "step=S steps=N by=<id> round=R": the run is over, its last step S
//                             durable (mark_finished(), the training loop's rank 0 at its end).
//                             Not leased. A participant still waiting to join then stops
//                             (errc::run_finished) instead of waiting for members that have
//                             left; elastic-run removes it with the run's other keys.
//   P/left/<id>               "<incarnation>": the participant left on purpose (leave(): it is done,
//                             not dead). Not leased; it names one incarnation, so a restart under
//                             the same id is not taken for it.
//
// An incarnation is random per lease, so a participant restarted under the same id is a new
// member, and its predecessor counts as departed even if the id came back before anyone looked.
//
// A round r closes when max_ranks have joined (at once), or when at least min_ranks have and the
// last call has run out; the last call is measured by each joiner on its own steady clock from
// the moment it saw min_ranks joined, and the first to run out closes the round (no clock is
// compared across hosts). A round after the first also closes at once when every participant the
// group expects (live members of round r-1 plus registered waiters) has joined: recovery does not
// wait for the last call. Ranks: survivors of round r-1 first, in their previous rank order, then
// newcomers by id; the first max_ranks of that order are the members.
//
// Each participant follows the keys from P/bootstrap/ to P/round and the erasures of P/alive/
// keys (detail/run_view.hpp: two feeds; on etcd two watch streams) and answers every question of
// membership from that copy: on etcd a participant asks the store nothing while nothing changes,
// whatever the number of ranks. Only
// the closer of an open round follows its joins. Membership after a round is watched by poll(),
// meant for each safe point of the training loop: a member whose alive key is gone or holds
// another incarnation has departed; a pending key is a join; a round number past ours means
// another member already started the next round. The caller then calls next_round() (a departure must first be
// handled by the communicator: revoke/abort), which bumps r -> r+1 and joins it.
//
// A preemption notice (preemption_handler::requested(), checkpoint/preemption.hpp) cuts every
// wait short: joining a round, waiting for it to close or for the next one, waiting for the
// bootstrap. Each looks at the notice at least every 100 ms (in practice every 50 ms or sooner) and
// throws errc::interrupted: a process waiting for a group that may never re-form exits 75 with
// its newest committed checkpoint standing, instead of being SIGKILLed at the end of the grace.
//
// Store requests per round: each joiner sets its join record and tries once to claim the
// closer; the closer reads the joins once and follows them; one compare_set closes the round,
// one more publishes the bootstrap; the leader erases round r-2's keys in a few requests. Each
// member reads the outcome and (unless it is the default) the bootstrap from its feed.
//
// The store must be safe to call from two threads: a background thread renews the lease.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <elastic/checkpoint/preemption.hpp>
#include <elastic/internal/env.hpp>
#include <elastic/internal/names.hpp>
#include <elastic/error.hpp>
#include <elastic/events.hpp>
#include <elastic/rendezvous/detail/lease_keeper.hpp>
#include <elastic/rendezvous/detail/participant_id.hpp>
#include <elastic/rendezvous/detail/peer_beacon.hpp>
#include <elastic/rendezvous/detail/rank_order.hpp>
#include <elastic/rendezvous/detail/resolve_options.hpp>
#include <elastic/rendezvous/detail/round_records.hpp>
#include <elastic/rendezvous/detail/run_view.hpp>
#include <elastic/rendezvous/rendezvous_options.hpp>
#include <elastic/rendezvous/run_keys.hpp>
#include <elastic/rendezvous/store.hpp>

namespace elastic::inline v1::rendezvous {

/// The outcome of a round, as this participant sees it.
struct round_info {
  std::int64_t round = 0;             ///< 1, 2, ...; 0: not a member of any round yet
  int rank = 0;                       ///< this participant's rank in the round
  int world_size = 0;                 ///< members of the round
  std::vector<std::string> members;   ///< participant ids in rank order
  /// Each member's incarnation (random per life of a participant id), in rank order: a member of
  /// two rounds with the same id AND incarnation is one process that survived between them; the
  /// same id with another incarnation is a restart, a newcomer.
  std::vector<std::string> incarnations;
  std::string leader;                 ///< members[0]: it published the bootstrap
  std::string bootstrap;              ///< the leader's blob
};

/// What happened to the group since the round this participant is in.
struct membership_change {
  std::vector<std::string> departed;  ///< members whose heartbeat stopped (or who left)
  std::vector<std::string> left;      ///< those of `departed` that left on purpose (leave()): done, not dead
  std::vector<std::string> joining;   ///< late joiners waiting for the next round
  bool round_advanced = false;        ///< another member already started the next round
  bool self_lost = false;             ///< our own heartbeat lapsed: the group counts us dead
  [[nodiscard]] bool any() const noexcept {
    return !departed.empty() || !joining.empty() || round_advanced || self_lost;
  }
};

/// How a finished run ended (mark_finished(), P/finished): its last step, durable; the steps
/// the training loop was asked for; who recorded it, in which round.
using finished_run = detail::finished_record;

/// Makes the leader's bootstrap blob for a round (e.g. ncclGetUniqueId's 128 bytes).
using bootstrap_fn = std::function<std::string(const round_info&)>;

/// One participant of a run's rendezvous. Not thread-safe: one thread calls join(), poll(),
/// next_round(); a background thread only renews the lease.
class rendezvous {
 public:
  /// Validates `opts`; talks to the store only in join().
  rendezvous(store& s, rendezvous_options opts) : store_(s), opts_(std::move(opts)), keeper_(s) {
    if (opts_.run_id.empty()) opts_.run_id = internal::env_string("ELASTIC_RUN_ID").value_or("");
    events_ = opts_.events ? *opts_.events : event_log::from_env();
    detail::resolve_options(opts_);
    prefix_ = run_prefix(opts_.key_prefix, opts_.run_id);
    if (prefix_.size() + 40 + opts_.participant_id.size() > 255) {
      detail::refuse_options(fmt::format("key prefix '{}' with participant id '{}' makes store keys longer than "
                                         "255 bytes",
                                         internal::printable(prefix_), opts_.participant_id));
    }
    // How long a participant waiting out its predecessor's heartbeat sleeps between tries, and
    // how often a closer looks again when no join comes (the last call): the waits of a round
    // otherwise wake on the change itself (the feeds).
    using std::chrono::milliseconds;
    step_ = std::clamp(std::min(opts_.last_call_timeout, opts_.heartbeat_interval) / 8, milliseconds(2),
                       milliseconds(4));
  }

  rendezvous(const rendezvous&) = delete;
  rendezvous& operator=(const rendezvous&) = delete;

  /// Leaves the group: the lease is revoked, so the others see the departure at their next poll.
  ~rendezvous() { leave(); }

  /// Joins the current round (or, when it is closed and not full, waits for the next one) and
  /// returns its outcome once the leader's bootstrap is there. The leader (rank 0) calls
  /// `make_bootstrap` (default: the Gloo store prefix `P/round/<r>/gloo/`).
  ///
  /// Throws errc::mismatch for other min/max than the run's; errc::capacity_exhausted when
  /// the run already has max_ranks live members; errc::timeout when no round formed within
  /// join_timeout (the group stayed below min_ranks); errc::interrupted when a preemption
  /// notice came while waiting; errc::run_finished when the run is over (mark_finished(): a
  /// participant the last round never admitted, or one started again under a finished run's
  /// id; finished() says how it ended); errc::corrupt naming a damaged key.
  round_info join(const bootstrap_fn& make_bootstrap = {}) {
    default_bootstrap_ = !make_bootstrap;
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + opts_.join_timeout;
    try {
      bool announced = false;
      for (;;) {
        try {
          // Nothing while our lease lives; a new life after it lapsed. A fresh lease may lapse
          // before its first use too (a process starved for longer than the heartbeat timeout).
          start_session();
          if (!std::exchange(announced, true)) {
            events_.emit("rendezvous_join", {{"participant", opts_.participant_id},
                                             {"min_nodes", opts_.min_ranks},  // event fields keep their names
                                             {"max_nodes", opts_.max_ranks},
                                             {"previous_round", current_.round}});
          }
          check_notice("joining");
          check_finished("joining");
          if (auto info = join_turn(make_bootstrap, start, deadline)) return *info;
        } catch (const error& e) {
          // Our lease ran out under us (a store too loaded to renew it in time): the keys it
          // held are gone, so this life is over; join as a new one while the join timeout lasts.
          if (e.code() != errc::not_found || std::chrono::steady_clock::now() >= deadline) throw;
          events_.emit("rendezvous_lease_lost", {{"participant", opts_.participant_id}, {"message", e.what()}});
          declared_gone_ = true;
          std::this_thread::sleep_for(step_);  // a lapse that keeps coming does not spin on the store
        }
      }
    } catch (const error& e) {
      if (e.code() == errc::mismatch || e.code() == errc::capacity_exhausted) {
        events_.emit("rendezvous_refused",
                     {{"participant", opts_.participant_id}, {"code", to_string(e.code())}, {"message", e.what()}});
      } else if (e.code() == errc::timeout) {
        events_.emit("rendezvous_timeout", {{"participant", opts_.participant_id}, {"message", e.what()}});
      } else if (e.code() == errc::interrupted) {
        events_.emit("rendezvous_interrupted", {{"participant", opts_.participant_id}, {"message", e.what()}});
      } else if (e.code() == errc::run_finished && finished_) {
        events_.emit("rendezvous_run_finished", {{"participant", opts_.participant_id},
                                                 {"step", finished_->step},
                                                 {"steps", finished_->steps},
                                                 {"by", finished_->by},
                                                 {"round", finished_->round}});
      }
      throw;
    }
  }

  /// What changed since this participant's round closed: departures (a member's heartbeat key
  /// expired, at most heartbeat_timeout after its last renewal), late joiners, a round started
  /// by another member, or our own lease lapsing. Call it at safe points.
  membership_change poll() {
    membership_change ch;
    ch.self_lost = keeper_.lost();
    if (current_.round == 0) return ch;
    view_.refresh();
    if (view_.stale()) view_.read_alive(members_);
    if (!is_alive(self())) {
      ch.self_lost = true;  // a peer declared us gone (we were frozen or cut off): rejoin anew
      declared_gone_ = true;
    } else {
      check_peers();
    }
    ch.round_advanced = read_round() > current_.round;
    // Who departed and who waits follow from the view and the members alone: looked at again
    // only when either changed. A watcher polls every 50 ms, and at 1,024 members a look is
    // 1,024 lookups, in each participant.
    if (!polled_ || polled_->version != view_.version()) {
      membership_change seen;
      for (const auto& m : members_) {
        if (is_alive(m)) continue;
        seen.departed.push_back(m.id);
        const bool on_purpose = view_.get(prefix_ + "/left/" + m.id) == m.incarnation;
        if (on_purpose) seen.left.push_back(m.id);
        if (reported_.insert(m.id).second) {
          events_.emit("rendezvous_departure", {{"participant", m.id}, {"round", current_.round}, {"left", on_purpose}});
        }
      }
      for (auto& [id, v] : view_.under(prefix_ + "/pending/")) {
        if (!contains(members_, {id, v}) && is_alive({id, v})) seen.joining.push_back(id);
      }
      polled_ = {view_.version(), std::move(seen)};
    }
    ch.departed = polled_->seen.departed;
    ch.left = polled_->seen.left;
    ch.joining = polled_->seen.joining;
    return ch;
  }

  /// Starts the next round (r -> r+1; when another member already did, joins that one) and
  /// joins it as a survivor, keeping this participant's place in the rank order.
  round_info next_round(const bootstrap_fn& make_bootstrap = {}) {
    if (current_.round > 0) bump(current_.round);
    return join(make_bootstrap);
  }

  /// Leaves the group now: stops the heartbeat and revokes the lease (its keys vanish). With
  /// `done` it first says so (P/left/<id>): the others see a departure on purpose
  /// (membership_change::left), one that owes them no collective; without, a death.
  void leave(bool done = false) noexcept {
    beacon_.reset();
    if (collector_.joinable()) collector_.join();
    if (done && current_.round > 0) {
      try {
        store_.set(prefix_ + "/left/" + opts_.participant_id, incarnation_);
      } catch (...) {  // a store that is gone: the departure is seen all the same, as a death
      }
    }
    if (const lease_id l = keeper_.stop(); l != 0) {
      try {
        store_.revoke(l);
      } catch (...) {
      }
    }
  }

  /// Records that the run is over (P/finished): its last step `step` of `steps` is durable. Rank
  /// 0 of the last round calls it (the training loop does, at its end), before it leaves: a
  /// participant still waiting to join (a restarted rank no round admitted before the end)
  /// stops waiting for members that have left, with errc::run_finished. Not leased: the run's
  /// id stays finished until its keys are removed (remove_finished_run, which elastic-run calls
  /// when every worker of its host exited 0).
  void mark_finished(std::uint64_t step, std::uint64_t steps) {
    store_.set(prefix_ + "/finished",
               detail::format_finished({step, steps, opts_.participant_id, current_.round}));
  }

  /// How the run ended, once join() threw errc::run_finished; nothing before.
  [[nodiscard]] const std::optional<finished_run>& finished() const noexcept { return finished_; }

  /// The last round this participant was a member of (round 0: none yet).
  [[nodiscard]] const round_info& current() const noexcept { return current_; }
  [[nodiscard]] const std::string& participant_id() const noexcept { return opts_.participant_id; }
  /// The options as resolved: run id, participant id and bounds filled in from the environment.
  [[nodiscard]] const rendezvous_options& options() const noexcept { return opts_; }
  /// Random per lease: distinguishes this life of the participant id from a restarted one.
  [[nodiscard]] const std::string& incarnation() const noexcept { return incarnation_; }
  [[nodiscard]] const std::string& key_prefix() const noexcept { return prefix_; }

 private:
  using clock = std::chrono::steady_clock;

  /// One turn of join(): the round as the view has it, joined, waited for or left to the next;
  /// its outcome when we are a member with the bootstrap, else nothing (another turn).
  std::optional<round_info> join_turn(const bootstrap_fn& make_bootstrap, clock::time_point start,
                                      clock::time_point deadline) {
    view_.refresh();
    if (!is_alive(self())) {
      // A peer declared this life gone while it was stalled: join as a new one.
      declared_gone_ = true;
      start_session();
      return std::nullopt;
    }
    const std::int64_t r = read_round();
    const auto outcome = read_outcome(r);
    if (outcome->kind == detail::round_outcome::state::abandoned) {
      bump(r);
      return std::nullopt;
    }
    if (outcome->kind == detail::round_outcome::state::open) {
      auto members = join_round(r, deadline);
      if (!members) return std::nullopt;  // closed without us: wait for the next one
      if (auto info = finish(r, *members, make_bootstrap, start, deadline)) return info;
      bump(r);  // the leader died before publishing: form the next round
      return std::nullopt;
    }
    if (contains(outcome->members, self())) {
      if (auto info = finish(r, outcome->members, make_bootstrap, start, deadline)) return info;
      bump(r);
      return std::nullopt;
    }
    wait_for_next_round(r, outcome->members, deadline);
    return std::nullopt;
  }

  std::string key_round() const { return prefix_ + "/round"; }
  std::string key_round(std::int64_t r, std::string_view leaf) const {
    return fmt::format("{}/round/{}/{}", prefix_, r, leaf);
  }
  /// P/<kind>/<r>: a round's closer, outcome ("closed") or bootstrap, in the view's range.
  std::string key_of(std::string_view kind, std::int64_t r) const { return fmt::format("{}/{}/{}", prefix_, kind, r); }
  std::string key_alive(std::string_view id) const {
    return elastic::rendezvous::alive_key(opts_.key_prefix, opts_.run_id, id);
  }
  std::string key_pending() const { return prefix_ + "/pending/" + opts_.participant_id; }

  detail::member self() const { return {opts_.participant_id, incarnation_}; }

  /// Throws errc::interrupted when a preemption notice has come: called in every wait, each
  /// of whose turns lasts at most 50 ms, so a notice is honoured well within 100 ms.
  void check_notice(std::string_view doing) const {
    if (const int sig = preemption_handler::requested(); sig != 0) {
      throw error(errc::interrupted,
                  fmt::format("participant '{}' of run '{}' stopped {}: a preemption notice (signal {}) came; exit "
                              "75, the newest committed checkpoint stands",
                              opts_.participant_id, opts_.run_id, doing, sig));
    }
  }
  /// Throws errc::run_finished when the run is over (P/finished, from the view): called in every
  /// wait for a round, so a participant that no round admitted before the end stops waiting
  /// for members that have left.
  void check_finished(std::string_view doing) {
    const std::string key = prefix_ + "/finished";
    const auto v = view_.get(key);
    if (!v) return;
    const auto f = detail::parse_finished(*v);
    if (!f) throw detail::corrupt_key(key, *v, "'step=S steps=N by=<id> round=R'", prefix_);
    finished_ = *f;
    if (pending_) {
      store_.erase(key_pending());
      pending_ = false;
    }
    throw error(errc::run_finished,
                fmt::format("participant '{}' of run '{}' stopped {}: the run already finished, its step {} of {} "
                            "durable (recorded by '{}' in round {}); nothing is left for this participant to do. To "
                            "train the run further, start it under another run id, or remove its keys first",
                            opts_.participant_id, opts_.run_id, doing, f->step, f->steps, f->by, f->round));
  }
  static bool contains(const std::vector<detail::member>& ms, const detail::member& m) {
    return std::find(ms.begin(), ms.end(), m) != ms.end();
  }

  /// A lease, the heartbeat thread, the run's claims and our alive key; again after our lease
  /// lapsed (the group declared us dead: we come back as a new incarnation).
  void start_session() {
    if (keeper_.lease() != 0 && !keeper_.lost() && !declared_gone_) return;
    declared_gone_ = false;
    const lease_id fresh = store_.grant(opts_.heartbeat_timeout);
    if (const lease_id old = keeper_.replace(fresh); old != 0) {
      try {
        store_.revoke(old);
      } catch (const error&) {
      }
    }
    previous_incarnation_ = std::exchange(incarnation_, detail::random_hex(8));
    keeper_.start(opts_.heartbeat_interval, run_key(opts_.key_prefix, opts_.run_id));
    register_run(fresh);
    if (!view_.open()) view_.open(store_, prefix_);
    check_config();
    publish_alive(fresh);
    start_beacon();
  }

  /// The peer heartbeats (rendezvous_options::peer_silence_timeout), once per participant; a
  /// socket that cannot be had leaves them off, said in an event: the lease still notices.
  void start_beacon() {
    if (opts_.peer_silence_timeout.count() == 0 || store_.local()) return;
    if (!beacon_) {
      try {
        // Asks the store for a route (local_address(): a resolve and a connect per endpoint, and
        // it may throw) only when neither the options nor the environment named the address.
        std::string host = opts_.peer_address;
        if (host.empty()) host = internal::env_string("ELASTIC_HOST_ADDR").value_or(std::string());
        if (host.empty()) host = store_.local_address();
        beacon_ = std::make_unique<detail::peer_beacon>(host, opts_.run_id, opts_.peer_heartbeat_interval,
                                                        opts_.peer_silence_timeout);
      } catch (const error& e) {
        events_.emit("rendezvous_peer_heartbeats_off", {{"participant", opts_.participant_id}, {"message", e.what()}});
        return;
      }
    }
    beacon_->identify(opts_.participant_id, incarnation_);
  }

  /// Peers whose heartbeats stopped: a warning at half the silence timeout, and at all of it
  /// the store is told (P/gone/<id>), so every member sees the departure at once.
  void check_peers() {
    if (!beacon_) return;
    std::vector<detail::beacon_peer> quiet, silent, unheard;
    beacon_->take(quiet, silent, unheard);
    for (const auto& p : unheard) {
      events_.emit("rendezvous_peer_unheard",
                   {{"participant", opts_.participant_id},
                    {"peer", p.id},
                    {"address", p.address},
                    {"message", fmt::format("no peer heartbeat from '{}' at {} reached {} within {} ms: it is "
                                            "not watched (check peer_address / ELASTIC_HOST_ADDR and firewalls "
                                            "for UDP); its lease still notices its death",
                                            p.id, p.address, beacon_->address(),
                                            opts_.peer_silence_timeout.count())}});
    }
    for (const auto& p : quiet) {
      events_.emit("rendezvous_peer_quiet", {{"participant", opts_.participant_id},
                                             {"peer", p.id},
                                             {"round", current_.round},
                                             {"silent_ms", opts_.peer_silence_timeout.count() / 2}});
    }
    for (const auto& p : silent) {
      if (!is_alive({p.id, p.incarnation})) continue;
      events_.emit("rendezvous_peer_gone", {{"participant", opts_.participant_id},
                                            {"peer", p.id},
                                            {"round", current_.round},
                                            {"silent_ms", opts_.peer_silence_timeout.count()}});
      unwritten_gone_.push_back({p.id, p.incarnation});
    }
    // The beacon reports a silence once: a write that failed (a store slow to answer, whose
    // write may still have landed) is tried again at the next poll, or the freeze would wait
    // for the lease. The first failure is thrown, as any store error of poll() is.
    while (!unwritten_gone_.empty()) {
      const auto m = unwritten_gone_.front();
      if (is_alive(m)) store_.set(prefix_ + "/gone/" + m.id, m.incarnation);
      view_.mark_ended(m.id, m.incarnation);
      unwritten_gone_.erase(unwritten_gone_.begin());
    }
  }

  /// The run's registration: other runs' participants see it (live_runs), and a participant
  /// that waits alone names it when its join times out.
  void register_run(lease_id lease) {
    store_.compare_set(run_key(opts_.key_prefix, opts_.run_id), std::nullopt, "", lease);
  }

  /// ", while run 'a', 'b' are live in this store" when runs other than ours are: a participant
  /// alone in its run may have the wrong run id.
  std::string other_runs_hint() {
    std::vector<std::string> others;
    try {
      for (auto& id : live_runs(store_, opts_.key_prefix)) {
        if (id != opts_.run_id) others.push_back(fmt::format("'{}'", internal::printable(id)));
      }
    } catch (const error&) {
      return {};  // the hint is a courtesy: the timeout stands without it
    }
    if (others.empty()) return {};
    return fmt::format("; run{} {} {} live in this store: is ELASTIC_RUN_ID (--run-id) right?",
                       others.size() > 1 ? "s" : "", fmt::join(others, ", "), others.size() > 1 ? "are" : "is");
  }

  /// P/config: written by the first participant; every other must declare the same bounds
  /// (read from the view, which the store is asked only when it holds none or others).
  void check_config() {
    const std::string key = prefix_ + "/config";
    const std::string mine = detail::format_config(opts_.min_ranks, opts_.max_ranks);
    // The view holds the run's config once anyone wrote it: the same bounds cost no request.
    if (view_.get(key) == mine) return;
    std::optional<std::string> actual;
    if (store_.compare_set(key, std::nullopt, mine, 0, &actual) || actual == mine) return;
    const std::string_view v = actual ? std::string_view(*actual) : std::string_view();
    const auto run = detail::parse_config(v);
    if (!run) throw detail::corrupt_key(key, v, "'min_nodes=M max_nodes=N'", prefix_);
    throw error(errc::mismatch,
                fmt::format("participant '{}' of run '{}' refused: the run has min_ranks={} max_ranks={}, this "
                            "participant declares min_ranks={} max_ranks={}: start every participant with the same "
                            "bounds",
                            opts_.participant_id, opts_.run_id, run->min_ranks, run->max_ranks, opts_.min_ranks,
                            opts_.max_ranks));
  }

  /// Our heartbeat key; a live predecessor with our id (a restart faster than its lease) is
  /// waited out, bounded by one heartbeat timeout. Our own previous life in this process is
  /// not: its key outlives it only when its lease's revoke failed (a loaded store), and it is
  /// over, so the key is taken over at once.
  void publish_alive(lease_id lease) {
    const std::string key = key_alive(opts_.participant_id);
    const auto until = clock::now() + opts_.heartbeat_timeout + opts_.heartbeat_interval;
    for (;;) {
      check_notice("waiting for its predecessor's heartbeat to lapse");
      std::optional<std::string> actual;
      if (store_.compare_set(key, std::nullopt, incarnation_, lease, &actual)) return;
      if (actual && !previous_incarnation_.empty() && *actual == previous_incarnation_ &&
          store_.compare_set(key, *actual, incarnation_, lease, &actual)) {
        return;
      }
      if (clock::now() >= until) {
        throw error(errc::already_running,
                    fmt::format("participant id '{}' of run '{}' is in use by a live participant (incarnation {}): "
                                "give each participant its own id",
                                opts_.participant_id, opts_.run_id, internal::printable(actual.value_or(""))));
      }
      std::this_thread::sleep_for(step_);
    }
  }

  /// The round number, as the view has it (created as 1 when the run has none yet), and never
  /// below what this participant has seen the store hold: a view that lags behind our own bump
  /// must not send us back into the round we just left.
  std::int64_t read_round() {
    const std::string key = key_round();
    auto v = view_.get(key);
    if (!v) {
      std::optional<std::string> actual;
      if (store_.compare_set(key, std::nullopt, "1", 0, &actual)) {
        return round_floor_ = std::max<std::int64_t>(round_floor_, 1);
      }
      v = actual;
      if (!v) return read_round();
    }
    const auto r = internal::parse_integer(*v);
    if (!r || *r < 1) throw detail::corrupt_key(key, *v, "a round number (a positive integer)", prefix_);
    return round_floor_ = std::max<std::int64_t>(round_floor_, *r);
  }

  /// Round r's outcome, as the view has it, parsed once per value: with 1,024 members it is
  /// ~46 KB, and a joiner looks at it several times while its round closes (and 1,024 joiners do
  /// at the same moment).
  std::shared_ptr<const detail::round_outcome> read_outcome(std::int64_t r) {
    const std::string key = key_of("closed", r);
    auto v = view_.get(key);
    for (const auto& c : outcomes_) {
      if (v && c.key == key && c.raw == *v) return c.parsed;
    }
    auto parsed = std::make_shared<const detail::round_outcome>(detail::parse_outcome(key, v, prefix_));
    if (v) {
      // The two newest: round r and the one before it (a closer compares the two).
      if (outcomes_.size() == 2) outcomes_.erase(outcomes_.begin());
      outcomes_.push_back({key, std::move(*v), parsed});
    }
    return parsed;
  }

  /// Moves the round r -> r+1 (done already when the store holds another number: then it is
  /// past r, since rounds only advance).
  void bump(std::int64_t r) {
    store_.compare_set(key_round(), std::to_string(r), std::to_string(r + 1));
    round_floor_ = std::max(round_floor_, r + 1);
  }

  bool is_alive(const detail::member& m) const { return view_.alive(m.id, m.incarnation); }

  /// How long a wait on the view may last: until `deadline`, and at most 250 ms without a look
  /// at a preemption notice (one that another thread took does not end the wait). At 1,024
  /// participants on one machine, 50 ms turns were 20,000 wake-ups a second while a round formed.
  static std::chrono::milliseconds look_until(clock::time_point deadline) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - clock::now());
    return std::clamp(left, std::chrono::milliseconds(1), std::chrono::milliseconds(250));
  }

  /// Whether everyone the group expects in round r has joined: the live members of round r-1
  /// and the live waiters. Lets a recovery round close without waiting for the last call.
  bool expected_all_joined(std::int64_t r, const std::vector<detail::join_entry>& joins,
                           const detail::round_outcome& prev) {
    if (r < 2 || prev.kind != detail::round_outcome::state::members) return false;
    std::set<std::pair<std::string_view, std::string_view>> joined;
    for (const auto& j : joins) joined.emplace(j.who.id, j.who.incarnation);
    const auto in = [&](const detail::member& m) { return joined.contains({m.id, m.incarnation}); };
    for (const auto& m : prev.members) {
      if (is_alive(m) && !in(m)) return false;
    }
    for (auto& [id, v] : view_.under(prefix_ + "/pending/")) {
      if (!in({id, v})) return false;
    }
    return true;
  }

  /// Joins open round r and waits for it to close. Returns its members when we are one of
  /// them; nothing when it closed without us.
  std::optional<std::vector<detail::member>> join_round(std::int64_t r, clock::time_point deadline) {
    const std::string mine = publish_join(r);
    // When min_ranks had joined (max(): not yet). Not an optional: GCC 12 warns of a maybe-
    // uninitialized optional<time_point> here at -O2, which users building with -Werror would hit.
    clock::time_point quorum_since = clock::time_point::max();
    closer c;
    for (;;) {
      if (preemption_handler::requested()) {
        store_.erase(mine);
        check_notice(fmt::format("waiting for round {} to close", r));
      }
      view_.refresh();
      if (!is_alive(self())) return std::nullopt;  // declared gone: join() starts a new life
      if (auto end = round_end(r, mine)) return end->members;
      if (view_.get(prefix_ + "/finished")) {
        store_.erase(mine);
        check_finished(fmt::format("waiting for round {} to close", r));
      }
      const auto now = clock::now();
      if (!c.joins) claim_closer(r, c, now);
      if (c.joins) {
        const auto joins = follow_joins(r, c);
        if (time_to_close(r, joins, c.previous, now, quorum_since)) {
          // Of all would-be closers (a closer and one that thinks it died) the store lets
          // exactly one write; the others read its list.
          std::map<std::string, std::string, std::less<>> addresses;
          for (const auto& j : joins) addresses.emplace(j.who.id, j.address);
          const std::string key = key_of("closed", r);
          const auto members = detail::rank_order(joins, r, static_cast<std::size_t>(opts_.max_ranks));
          const auto leader = std::find_if(joins.begin(), joins.end(), [&](const detail::join_entry& j) {
            return !members.empty() && j.who == members.front();
          });
          std::string value =
              detail::format_members(members, addresses, leader != joins.end() && leader->default_bootstrap);
          std::optional<std::string> actual;
          if (store_.compare_set(key, std::nullopt, value, 0, &actual)) {
            view_.learn(key, std::move(value));
          } else if (actual) {
            view_.learn(key, std::move(*actual));
          }
          continue;
        }
      }
      if (now >= deadline) {
        abandon_round(r, mine);
        continue;
      }
      // The closer wakes on a join and looks again within 50 ms (the last call running out);
      // the others wake on the outcome, a closer gone, or a life ended.
      if (c.joins) {
        c.joins->wait(std::chrono::milliseconds(std::min<std::int64_t>(50, step_.count() * 4)));
      } else {
        view_.wait(look_until(deadline));
      }
    }
  }

  /// The closer's side of an open round: the join records, kept by a feed and parsed once
  /// each, and the previous round's outcome (read once).
  struct closer {
    std::unique_ptr<key_feed> joins;
    std::map<std::string, detail::join_entry, std::less<>> records;
    detail::round_outcome previous;
    clock::time_point tried{};
  };

  /// Takes in round r's join changes; returns the joins of lives not declared gone.
  std::vector<detail::join_entry> follow_joins(std::int64_t r, closer& c) {
    const std::string prefix = key_round(r, "join/");
    bool reset = false;
    auto events = c.joins->take(reset);
    if (reset) c.records.clear();
    for (auto& e : events) {
      if (e.value) {
        c.records.insert_or_assign(e.key, detail::parse_join(e.key, std::string_view(e.key).substr(prefix.size()),
                                                             *e.value, prefix_));
      } else {
        c.records.erase(e.key);
      }
    }
    std::vector<detail::join_entry> out;
    out.reserve(c.records.size());
    for (const auto& [k, j] : c.records) {
      if (is_alive(j.who)) out.push_back(j);  // a life declared gone does not count
    }
    return out;
  }

  /// Claims round r's closer key when the view shows none (the first joiner, or the closer
  /// died): the winner follows the joins. A claim the view has not caught up with yet is not
  /// tried again within half a second.
  void claim_closer(std::int64_t r, closer& c, clock::time_point now) {
    const std::string key = key_of("closer", r);
    if (view_.get(key) || now - c.tried < std::chrono::milliseconds(500)) return;
    c.tried = now;
    if (!store_.compare_set(key, std::nullopt, opts_.participant_id, keeper_.lease())) return;
    // Whether the previous round's members still live decides when this one may close early:
    // a closer that was not one of them learns it with one read.
    if (r >= 2) {
      c.previous = *read_outcome(r - 1);
      if (current_.round != r - 1 && c.previous.kind == detail::round_outcome::state::members) {
        view_.read_alive(c.previous.members);
      }
    }
    // Keys under P/round/<r>/join/ up to the next byte after '/' ('0'): ids never hold a '/'.
    c.joins = store_.watch(key_round(r, "join/"), key_round(r, "join0"));
  }

  /// Our join record for round r, leased, saying where we stood in the round before; its key.
  std::string publish_join(std::int64_t r) {
    const std::string mine = key_round(r, "join/" + opts_.participant_id);
    const std::string prev =
        (current_.round > 0 ? fmt::format("{}:{}", current_.round, current_.rank) : std::string("new")) +
        (default_bootstrap_ ? "+gloo" : "");
    store_.set(mine, incarnation_ + " " + prev + (beacon_ ? " " + beacon_->address() : std::string()),
               keeper_.lease());
    return mine;
  }

  /// How round r ended for a joiner: its members when we are one of them, else nothing.
  struct ended {
    std::optional<std::vector<detail::member>> members;
  };

  /// Whether round r is over for us (our join record `mine` is erased when it ended without
  /// us); throws errc::timeout when it was abandoned.
  std::optional<ended> round_end(std::int64_t r, const std::string& mine) {
    // From the view: refreshed by the caller.
    const auto outcome = read_outcome(r);
    if (outcome->kind == detail::round_outcome::state::members) {
      if (contains(outcome->members, self())) return ended{outcome->members};
      store_.erase(mine);
      return ended{};
    }
    if (outcome->kind == detail::round_outcome::state::abandoned) {
      store_.erase(mine);
      throw error(errc::timeout, outcome->why);
    }
    if (read_round() > r) {
      // Rounds only advance from a closed one: r closed and its keys were collected while we
      // looked away. Start over from the current round.
      store_.erase(mine);
      return ended{};
    }
    return std::nullopt;
  }

  /// Whether round r should close now: max_ranks joined, or min_ranks joined and the last call
  /// (counted from `quorum_since`, which this keeps) ran out or everyone expected is in.
  bool time_to_close(std::int64_t r, const std::vector<detail::join_entry>& joins,
                     const detail::round_outcome& previous, clock::time_point now, clock::time_point& quorum_since) {
    const auto joined = joins.size();
    bool close = joined >= static_cast<std::size_t>(opts_.max_ranks);
    if (!close && joined >= static_cast<std::size_t>(opts_.min_ranks)) {
      if (quorum_since == clock::time_point::max()) quorum_since = now;
      close = now - quorum_since >= opts_.last_call_timeout || expected_all_joined(r, joins, previous);
    } else if (joined < static_cast<std::size_t>(opts_.min_ranks)) {
      quorum_since = clock::time_point::max();
    }
    return close;
  }

  /// The join timeout ran out in round r: abandons it, and when the store takes our verdict
  /// throws it (errc::timeout). Returns when another outcome was written first.
  void abandon_round(std::int64_t r, const std::string& mine) {
    const std::size_t joined = store_.list(key_round(r, "join/")).size();
    std::string why =
        current_.round > 0
            ? fmt::format("round {} of run '{}': the group fell to {} participants, below min_ranks {}, and no "
                          "one else joined within {} ms: stop, or start more participants",
                          r, opts_.run_id, joined, opts_.min_ranks, opts_.join_timeout.count())
            : fmt::format("round {} of run '{}': only {} of min_ranks {} participants joined within {} ms: "
                          "start more participants, or lower min_ranks{}",
                          r, opts_.run_id, joined, opts_.min_ranks, opts_.join_timeout.count(), other_runs_hint());
    // Abandoning is decided by the store as closing is: either everyone gets members, or
    // everyone stops with the same reason.
    std::optional<std::string> actual;
    if (store_.compare_set(key_of("closed", r), std::nullopt, "abandoned\n" + why, 0, &actual)) {
      store_.erase(mine);
      throw error(errc::timeout, why);
    }
    if (actual) view_.learn(key_of("closed", r), std::move(*actual));
  }

  /// Round r is closed without us: refuse when it is full of live members, else wait (as a
  /// registered waiter the members see at their next poll) until the round number moves.
  void wait_for_next_round(std::int64_t r, const std::vector<detail::member>& members, clock::time_point deadline) {
    view_.read_alive(members);  // they may have ended before our feeds began
    std::size_t live = 0;
    for (const auto& m : members) live += is_alive(m) ? 1 : 0;
    if (members.size() >= static_cast<std::size_t>(opts_.max_ranks) && live == members.size()) {
      store_.erase(key_pending());
      throw error(errc::capacity_exhausted,
                  fmt::format("participant '{}' refused: run '{}' is full, round {} has max_ranks {} live members; "
                              "retry after one leaves, or raise max_ranks for the next run",
                              opts_.participant_id, opts_.run_id, r, opts_.max_ranks));
    }
    store_.set(key_pending(), incarnation_, keeper_.lease());
    pending_ = true;
    for (;;) {
      if (preemption_handler::requested()) {
        store_.erase(key_pending());
        check_notice(fmt::format("waiting for round {} to end", r));
      }
      view_.refresh();
      if (read_round() != r) return;
      check_finished(fmt::format("waiting for round {} to end", r));
      if (live == 0) bump(r);  // no member left to start the next round: we do
      if (clock::now() >= deadline) {
        store_.erase(key_pending());
        throw error(errc::timeout,
                    fmt::format("participant '{}' of run '{}' waited {} ms for round {} to end, and its members "
                                "never started the next one: do they call poll() and next_round() at safe points?",
                                opts_.participant_id, opts_.run_id, opts_.join_timeout.count(), r));
      }
      view_.wait(look_until(deadline));
      live = 0;
      for (const auto& m : members) live += is_alive(m) ? 1 : 0;
    }
  }

  /// We are a member of round r: the leader publishes the bootstrap, the others wait for it.
  /// Nothing when the leader died before publishing it.
  std::optional<round_info> finish(std::int64_t r, const std::vector<detail::member>& members,
                                   const bootstrap_fn& make_bootstrap, clock::time_point start,
                                   clock::time_point deadline) {
    round_info info;
    info.round = r;
    info.world_size = static_cast<int>(members.size());
    for (std::size_t i = 0; i < members.size(); ++i) {
      info.members.push_back(members[i].id);
      info.incarnations.push_back(members[i].incarnation);
      if (members[i] == self()) info.rank = static_cast<int>(i);
    }
    info.leader = members.front().id;
    const std::string key = key_of("bootstrap", r);
    if (info.rank == 0) {
      // The blob is made once per round (NCCL's starts a bootstrap root: never one for a blob the
      // store holds) and published by a compare_set, one request: the store's first blob stands,
      // never two. Only a join() again in the same round asks the store what it holds.
      std::optional<std::string> have;
      if (bootstrap_tried_ == r) have = store_.get(key);
      if (have) {
        info.bootstrap = std::move(*have);
      } else {
        bootstrap_tried_ = r;
        info.bootstrap = make_bootstrap ? make_bootstrap(info) : key_round(r, "gloo/");
        if (!store_.compare_set(key, std::nullopt, info.bootstrap, 0, &have) && have) info.bootstrap = std::move(*have);
      }
      collect_garbage(r, members);
    } else if (read_outcome(r)->default_bootstrap) {
      // The leader's join said it makes the default: the blob is known, its publication is not
      // waited for (a leader that died meanwhile is a departure the next poll() sees).
      info.bootstrap = key_round(r, "gloo/");
    } else {
      for (;;) {
        if (preemption_handler::requested()) check_notice(fmt::format("waiting for the bootstrap of round {}", r));
        view_.refresh();
        if (auto v = view_.get(key)) {
          info.bootstrap = *v;
          break;
        }
        // A leader that published and left at once: the view may show its departure before
        // its bootstrap (they come by two feeds, and on etcd by two watches), so the store's
        // word decides whether it died before publishing.
        if (!is_alive(members.front())) {
          auto v = store_.get(key);
          if (!v) return std::nullopt;
          info.bootstrap = std::move(*v);
          break;
        }
        if (clock::now() >= deadline) {
          throw error(errc::timeout, fmt::format("round {} of run '{}': leader '{}' published no bootstrap within {} "
                                                 "ms of the join",
                                                 r, opts_.run_id, info.leader, opts_.join_timeout.count()));
        }
        view_.wait(look_until(deadline));
      }
    }
    if (std::exchange(pending_, false)) store_.erase(key_pending());  // only when we set it
    if (beacon_) {
      const auto outcome = read_outcome(r);
      beacon_->follow(outcome->members.size(), static_cast<std::size_t>(info.rank), [&](std::size_t i) {
        return detail::beacon_peer{outcome->members[i].id, outcome->members[i].incarnation, outcome->addresses[i]};
      });
    }
    const bool again = current_.round == r;
    current_ = info;
    members_ = members;
    reported_.clear();
    polled_.reset();
    events_.set_rank(static_cast<long>(info.rank));
    if (!again) {
      const std::string names = detail::join_names(info.members);
      events_.emit("rendezvous_round_closed",
                   {{"round", r},
                    {"world_size", info.world_size},
                    {"members", names},
                    {"leader", info.leader},
                    {"participant", opts_.participant_id},
                    {"seconds", std::chrono::duration<double>(clock::now() - start).count()}});
    }
    return info;
  }

  /// Rounds before r-1 are history nobody reads: the leader erases them (r-1 stays, as the
  /// previous rank order newcomers are compared against): round r-2's own keys in one
  /// erase_prefix, and the closers, outcomes and bootstraps of every round before r-1 the view
  /// still holds (abandoned rounds' among them) in one batch; and the declarations of lives gone
  /// that are not members of round r. On a thread of its own: the leader's first step of the
  /// round, which every member's first collective waits for, does not wait for this (at 1,024
  /// members under load it took seconds). The keys are chosen here, from the view.
  void collect_garbage(std::int64_t r, const std::vector<detail::member>& members) {
    std::vector<write_request> erase;
    for (const auto& [id, v] : view_.under(prefix_ + "/gone/")) {
      if (!contains(members, {id, v})) erase.push_back(write_request::erasing(prefix_ + "/gone/" + id));
    }
    std::string old_round;
    if (r >= 3) {
      old_round = fmt::format("{}/round/{}/", prefix_, r - 2);
      for (const std::string_view kind : {"closer", "closed", "bootstrap"}) {
        const std::string dir = fmt::format("{}/{}/", prefix_, kind);
        for (const auto& [round, v] : view_.under(dir)) {
          const auto n = internal::parse_integer(round);
          if (n && *n < r - 1) erase.push_back(write_request::erasing(dir + round));
        }
      }
    }
    if (erase.empty() && old_round.empty()) return;
    try {
      // The previous collection, if still going, finishes first (joined by the assignment).
      collector_ = std::jthread([this, erase = std::move(erase), old_round = std::move(old_round)] {
        try {
          if (!old_round.empty()) store_.erase_prefix(old_round);
          if (!erase.empty()) store_.apply(erase);
        } catch (...) {  // history left behind: the next round's leader erases it
        }
      });
    } catch (const std::system_error&) {  // no thread to be had: the next round's leader tries again
    }
  }

  store& store_;
  rendezvous_options opts_;
  event_log events_;
  std::string prefix_;
  std::chrono::milliseconds step_{10};
  std::int64_t round_floor_ = 0;  // the highest round number the store is known to have held
  bool declared_gone_ = false;    // a peer declared this life gone: the next join starts a new one
  bool pending_ = false;          // we set P/pending/<id> and have not erased it since
  std::string incarnation_;
  std::string previous_incarnation_;  // this process's life before incarnation_, if any
  std::int64_t bootstrap_tried_ = 0;  // the last round whose bootstrap we made as its leader
  bool default_bootstrap_ = true;     // this join() makes the default bootstrap if it leads
  round_info current_;
  std::optional<finished_run> finished_;  // P/finished, once a wait met it
  std::vector<detail::member> members_;
  std::set<std::string> reported_;
  struct polled {
    std::uint64_t version = 0;  // the view's, when `seen` was derived
    membership_change seen;     // departures, departures on purpose and joiners of members_
  };
  std::optional<polled> polled_;  // poll()'s last look at members_; reset with them
  detail::run_view view_;        // the run's membership keys, as a feed keeps them
  struct parsed_outcome {
    std::string key, raw;
    std::shared_ptr<const detail::round_outcome> parsed;
  };
  std::vector<parsed_outcome> outcomes_;  // read_outcome()'s, the two newest
  std::unique_ptr<detail::peer_beacon> beacon_;  // peer heartbeats (stores that span hosts)
  std::vector<detail::member> unwritten_gone_;     // silent peers whose P/gone write has yet to succeed
  std::jthread collector_;       // collect_garbage()'s erasures, off the leader's way
  detail::lease_keeper keeper_;  // last: its thread stops before the members it uses go away
};

}  // namespace elastic::inline v1::rendezvous
