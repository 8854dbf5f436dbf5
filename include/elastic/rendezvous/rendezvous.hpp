// Rendezvous rounds over a store: who is in the group, with which rank, and how the
// communicator is bootstrapped; who has died since; when the next round must form.
//
// Keys, under P = `<key_prefix>/<run_id>` (every participant of a run derives the same ones):
//
//   <key_prefix>/active_run   run id of the run the store serves now. Leased: it lives as long
//                             as one participant of that run does (each re-creates it while
//                             alive), so a participant of another run is refused (mismatch) and
//                             the store is free again once the run has ended.
//   P/config                  "min_nodes=M max_nodes=N", written once: a participant that
//                             declares other bounds is refused (mismatch).
//   P/round                   the current round number r (1, 2, ...). Only ever moves r -> r+1,
//                             by compare_set, so concurrent bumps make one step.
//   P/round/<r>/join/<id>     "<incarnation> new" or "<incarnation> <prev round>:<prev rank>".
//                             Leased: a joiner that dies stops counting.
//   P/round/<r>/closed        the outcome of round r, written once by compare_set from absent, so
//                             of two would-be closers (leaders) the store picks exactly one:
//                               "members\n<id> <incarnation>\n..."   in rank order, or
//                               "abandoned\n<why>"                    the join timeout ran out.
//   P/round/<r>/bootstrap     the blob rank 0 publishes (NCCL unique id, Gloo store prefix, ...).
//   P/alive/<id>              "<incarnation>", leased: the heartbeat. It vanishes at most
//                             heartbeat_timeout after the participant's last keep_alive.
//   P/waiting/<id>            "<incarnation>", leased: a late joiner waiting for the next round.
//
// An incarnation is random per lease, so a participant restarted under the same id is a new
// member, and its predecessor counts as departed even if the id came back before anyone looked.
//
// A round r closes when max_nodes have joined (at once), or when at least min_nodes have and the
// last call has run out; the last call is measured by each joiner on its own steady clock from
// the moment it saw min_nodes joined, and the first to run out closes the round (no clock is
// compared across hosts). A round after the first also closes at once when every participant the
// group expects (live members of round r-1 plus registered waiters) has joined: recovery does not
// wait for the last call. Ranks: survivors of round r-1 first, in their previous rank order, then
// newcomers by id; the first max_nodes of that order are the members.
//
// Membership after a round is watched by poll(), meant for each safe point of the training loop
// (one or three store reads): a member whose alive key is gone or holds another incarnation has
// departed; a waiting key is a pending join; a round number past ours means another member
// already started the next round. The caller then calls next_round() (a departure must first be
// handled by the communicator: revoke/abort), which bumps r -> r+1 and joins it.
//
// A preemption notice (preemption_handler::requested(), checkpoint/preemption.hpp) cuts every
// wait short: joining a round, waiting for it to close or for the next one, waiting for the
// bootstrap. Each looks at the notice at least every 100 ms (in practice every few ms) and
// throws errc::interrupted: a process waiting for a group that may never re-form exits 75 with
// its newest committed checkpoint standing, instead of being SIGKILLed at the end of the grace.
//
// The store must be safe to call from two threads: a background thread renews the lease.
#pragma once

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <span>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <unistd.h>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <elastic/checkpoint/preemption.hpp>
#include <elastic/detail/env.hpp>
#include <elastic/detail/names.hpp>
#include <elastic/error.hpp>
#include <elastic/events.hpp>
#include <elastic/rendezvous/store.hpp>

namespace elastic::rendezvous {

/// How a run's participants find each other. Every participant of a run must declare the same
/// run_id, min_nodes and max_nodes; the timeouts are each participant's own.
struct rendezvous_options {
  std::string run_id{};                  ///< empty: ELASTIC_RUN_ID; [A-Za-z0-9._-], 1..64
  /// A round needs at least this many participants. 0: ELASTIC_MIN_NODES (elastic-run's
  /// --min-ranks), else 1.
  std::size_t min_nodes = 0;
  /// A round closes at once at this many. 0: ELASTIC_MAX_NODES (elastic-run's --nnodes MAX times
  /// --nproc-per-node), else min_nodes.
  std::size_t max_nodes = 0;
  std::chrono::milliseconds join_timeout{std::chrono::minutes(10)};   ///< for join(), next_round()
  std::chrono::milliseconds last_call_timeout{std::chrono::seconds(30)};  ///< wait past min_nodes
  std::chrono::milliseconds heartbeat_interval{std::chrono::seconds(5)};  ///< lease renewal period
  std::chrono::milliseconds heartbeat_timeout{std::chrono::seconds(30)};  ///< silent this long: dead
  std::string participant_id{};          ///< empty: ELASTIC_PARTICIPANT_ID, else HOST:PID:RANDOM; [A-Za-z0-9._:@-], 1..128
  std::string key_prefix = "/elastic";   ///< where the run's keys live in the store
  std::optional<event_log> events{};     ///< nothing: event_log::from_env()
};

/// The outcome of a round, as this participant sees it.
struct round_info {
  std::int64_t round = 0;             ///< 1, 2, ...; 0: not a member of any round yet
  std::size_t rank = 0;               ///< this participant's rank in the round
  std::size_t world_size = 0;         ///< members of the round
  std::vector<std::string> members;   ///< participant ids in rank order
  std::string leader;                 ///< members[0]: it published the bootstrap
  std::string bootstrap;              ///< the leader's blob
};

/// What happened to the group since the round this participant is in.
struct membership_change {
  std::vector<std::string> departed;  ///< members whose heartbeat stopped (or who left)
  std::vector<std::string> joining;   ///< late joiners waiting for the next round
  bool round_advanced = false;        ///< another member already started the next round
  bool self_lost = false;             ///< our own heartbeat lapsed: the group counts us dead
  [[nodiscard]] bool any() const noexcept {
    return !departed.empty() || !joining.empty() || round_advanced || self_lost;
  }
};

/// Makes the leader's bootstrap blob for a round (e.g. ncclGetUniqueId's 128 bytes).
using bootstrap_fn = std::function<std::string(const round_info&)>;

namespace detail {

/// A member of a closed round: participant id and the incarnation that joined.
struct member {
  std::string id;
  std::string incarnation;
  friend bool operator==(const member&, const member&) = default;
};

/// P/round/<r>/closed, parsed.
struct round_outcome {
  enum class state { open, members, abandoned };
  state kind = state::open;
  std::vector<member> members;
  std::string why;  ///< abandoned: the reason
};

/// A P/round/<r>/join/<id> entry, parsed.
struct join_entry {
  member who;
  std::int64_t prev_round = 0;  ///< 0: a newcomer
  std::size_t prev_rank = 0;
};

inline bool run_id_char(char c) noexcept {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
         c == '-';
}
inline bool participant_char(char c) noexcept { return run_id_char(c) || c == ':' || c == '@'; }
inline bool hex_char(char c) noexcept { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }

inline std::optional<std::int64_t> parse_i64(std::string_view s) noexcept {
  std::int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

inline std::string random_hex(std::size_t bytes) {
  std::random_device rd;
  std::mt19937_64 gen((static_cast<std::uint64_t>(rd()) << 32) ^ rd() ^ static_cast<std::uint64_t>(::getpid()));
  std::string out;
  constexpr char hex[] = "0123456789abcdef";
  for (std::size_t i = 0; i < bytes; ++i) {
    const auto b = static_cast<unsigned>(gen() & 0xff);
    out += hex[b >> 4];
    out += hex[b & 15];
  }
  return out;
}

inline error corrupt_key(std::string_view key, std::string_view value, std::string_view expected,
                         std::string_view run_prefix) {
  return error(errc::corrupt,
               fmt::format("store key '{}' holds '{}', not {}: the run's keys are damaged; erase the keys under "
                           "'{}/' or use another run id",
                           elastic::detail::printable(key), elastic::detail::printable(value.substr(0, 80)), expected,
                           elastic::detail::printable(run_prefix)));
}

inline bool valid_incarnation(std::string_view s) noexcept {
  return !s.empty() && s.size() <= 32 && std::all_of(s.begin(), s.end(), hex_char);
}
inline bool valid_participant(std::string_view s) noexcept {
  return !s.empty() && s.size() <= 128 && std::all_of(s.begin(), s.end(), participant_char);
}

inline std::string format_members(const std::vector<member>& members) {
  std::string out = "members";
  for (const auto& m : members) out += "\n" + m.id + " " + m.incarnation;
  return out;
}

inline round_outcome parse_outcome(std::string_view key, const std::optional<std::string>& value,
                                   std::string_view run_prefix) {
  round_outcome out;
  if (!value) return out;
  const std::string_view v = *value;
  if (v.starts_with("abandoned\n")) {
    out.kind = round_outcome::state::abandoned;
    out.why = std::string(v.substr(10));
    return out;
  }
  if (!v.starts_with("members\n")) throw corrupt_key(key, v, "a round outcome ('members' or 'abandoned')", run_prefix);
  out.kind = round_outcome::state::members;
  std::string_view rest = v.substr(8);
  std::set<std::string, std::less<>> seen;
  while (!rest.empty()) {
    const auto nl = rest.find('\n');
    const std::string_view line = rest.substr(0, nl);
    rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
    const auto sp = line.find(' ');
    if (sp == std::string_view::npos || !valid_participant(line.substr(0, sp)) ||
        !valid_incarnation(line.substr(sp + 1)) || !seen.emplace(line.substr(0, sp)).second) {
      throw corrupt_key(key, v, "a member list ('<participant id> <incarnation>' per line)", run_prefix);
    }
    out.members.push_back({std::string(line.substr(0, sp)), std::string(line.substr(sp + 1))});
  }
  if (out.members.empty()) throw corrupt_key(key, v, "a member list (it is empty)", run_prefix);
  return out;
}

inline join_entry parse_join(std::string_view key, std::string_view id, std::string_view value,
                             std::string_view run_prefix) {
  auto bad = [&] { return corrupt_key(key, value, "a join record ('<incarnation> new|<round>:<rank>')", run_prefix); };
  const auto sp = value.find(' ');
  if (sp == std::string_view::npos || !valid_participant(id) || !valid_incarnation(value.substr(0, sp))) throw bad();
  join_entry e{{std::string(id), std::string(value.substr(0, sp))}, 0, 0};
  const std::string_view prev = value.substr(sp + 1);
  if (prev == "new") return e;
  const auto colon = prev.find(':');
  if (colon == std::string_view::npos) throw bad();
  const auto r = parse_i64(prev.substr(0, colon));
  const auto k = parse_i64(prev.substr(colon + 1));
  if (!r || !k || *r < 1 || *k < 0) throw bad();
  e.prev_round = *r;
  e.prev_rank = static_cast<std::size_t>(*k);
  return e;
}

/// The rank order of round `round`: survivors of round-1 by their previous rank, then
/// newcomers by id; at most `max` of them.
inline std::vector<member> rank_order(std::vector<join_entry> joins, std::int64_t round, std::size_t max) {
  auto survivor = [&](const join_entry& e) { return e.prev_round == round - 1 && e.prev_round > 0; };
  std::sort(joins.begin(), joins.end(), [&](const join_entry& a, const join_entry& b) {
    const bool sa = survivor(a), sb = survivor(b);
    if (sa != sb) return sa;
    if (sa && a.prev_rank != b.prev_rank) return a.prev_rank < b.prev_rank;
    return a.who.id < b.who.id;
  });
  std::vector<member> out;
  for (auto& e : joins) {
    if (out.size() == max) break;
    out.push_back(std::move(e.who));
  }
  return out;
}

inline std::string join_names(const std::vector<std::string>& ids) {
  std::string out;
  for (const auto& id : ids) out += (out.empty() ? "" : ",") + id;
  return out;
}

}  // namespace detail

/// The key that says participant `participant_id` of run `run_id` is alive (leased). Erasing it
/// retires the participant at once: the others see a departure at their next poll instead of
/// waiting out its heartbeat (elastic-run does so the moment it reaps a dead worker).
inline std::string alive_key(std::string_view key_prefix, std::string_view run_id, std::string_view participant_id) {
  return fmt::format("{}/{}/alive/{}", key_prefix, run_id, participant_id);
}

/// One participant of a run's rendezvous. Not thread-safe: one thread calls join(), poll(),
/// next_round(); a background thread only renews the lease.
class rendezvous {
 public:
  /// Validates `opts`; talks to the store only in join().
  rendezvous(store& s, rendezvous_options opts) : store_(s), opts_(std::move(opts)) {
    if (opts_.run_id.empty()) opts_.run_id = elastic::detail::env_string("ELASTIC_RUN_ID").value_or("");
    events_ = opts_.events ? *opts_.events : event_log::from_env();
    auto bad = [](const std::string& why) { throw error(errc::invalid_argument, "rendezvous: " + why); };
    if (opts_.run_id.empty() || opts_.run_id.size() > 64 ||
        !std::all_of(opts_.run_id.begin(), opts_.run_id.end(), detail::run_id_char)) {
      bad(fmt::format("run id '{}' is not 1 to 64 characters of A-Z a-z 0-9 . _ - (set run_id or ELASTIC_RUN_ID)",
                      elastic::detail::printable(opts_.run_id)));
    }
    if (opts_.participant_id.empty()) {
      // elastic-run names each worker slot (HOST:LOCAL_RANK) so it can retire the slot's alive key
      // the moment it reaps a dead worker.
      opts_.participant_id = elastic::detail::env_string("ELASTIC_PARTICIPANT_ID").value_or("");
    }
    if (opts_.participant_id.empty()) {
      char host[256] = {};
      if (::gethostname(host, sizeof host - 1) != 0 || host[0] == '\0') std::snprintf(host, sizeof host, "host");
      std::string h = host;
      for (char& c : h)
        if (!detail::participant_char(c)) c = '_';
      opts_.participant_id = fmt::format("{}:{}:{}", h.substr(0, 64), ::getpid(), detail::random_hex(4));
    }
    if (!detail::valid_participant(opts_.participant_id)) {
      bad(fmt::format("participant id '{}' is not 1 to 128 characters of A-Z a-z 0-9 . _ - : @ (set participant_id "
                      "or ELASTIC_PARTICIPANT_ID)",
                      elastic::detail::printable(opts_.participant_id)));
    }
    // The group's bounds come from the launcher, as the run id does, unless the code sets them.
    const bool min_from_env = opts_.min_nodes == 0, max_from_env = opts_.max_nodes == 0;
    if (min_from_env) {
      opts_.min_nodes = static_cast<std::size_t>(elastic::detail::env_int("ELASTIC_MIN_NODES", 1, 65536).value_or(1));
    }
    if (max_from_env) {
      opts_.max_nodes = static_cast<std::size_t>(
          elastic::detail::env_int("ELASTIC_MAX_NODES", 1, 65536).value_or(static_cast<long long>(opts_.min_nodes)));
    }
    if (opts_.max_nodes < opts_.min_nodes) {
      bad(fmt::format("min_nodes {}{} and max_nodes {}{}: need min_nodes <= max_nodes", opts_.min_nodes,
                      min_from_env ? " (ELASTIC_MIN_NODES, or the default 1)" : "", opts_.max_nodes,
                      max_from_env ? " (ELASTIC_MAX_NODES)" : ""));
    }
    using std::chrono::milliseconds;
    if (opts_.join_timeout <= milliseconds(0) || opts_.last_call_timeout < milliseconds(0) ||
        opts_.heartbeat_interval <= milliseconds(0) || opts_.heartbeat_timeout <= opts_.heartbeat_interval) {
      bad(fmt::format("timeouts join {} ms, last call {} ms, heartbeat every {} ms, dead after {} ms: need positive "
                      "timeouts and heartbeat_interval < heartbeat_timeout",
                      opts_.join_timeout.count(), opts_.last_call_timeout.count(), opts_.heartbeat_interval.count(),
                      opts_.heartbeat_timeout.count()));
    }
    prefix_ = opts_.key_prefix + "/" + opts_.run_id;
    if (prefix_.size() + 40 + opts_.participant_id.size() > 255) {
      bad(fmt::format("key prefix '{}' with participant id '{}' makes store keys longer than 255 bytes",
                      elastic::detail::printable(prefix_), opts_.participant_id));
    }
    // How often a joiner looks at the round again: its waits wake on the round's outcome only,
    // and the last member to join is seen at the next look, so this bounds a recovery's
    // rendezvous. A few store reads per look, for the short while a round is open.
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
  /// Throws errc::mismatch for another run id or other min/max; errc::capacity_exhausted when
  /// the run already has max_nodes live members; errc::timeout when no round formed within
  /// join_timeout (the group stayed below min_nodes); errc::interrupted when a preemption
  /// notice came while waiting; errc::corrupt naming a damaged key.
  round_info join(const bootstrap_fn& make_bootstrap = {}) {
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + opts_.join_timeout;
    try {
      start_session();
      events_.emit("rendezvous_join", {{"participant", opts_.participant_id},
                                       {"min_nodes", opts_.min_nodes},
                                       {"max_nodes", opts_.max_nodes},
                                       {"previous_round", current_.round}});
      for (;;) {
        check_notice("joining");
        const std::int64_t r = read_round();
        const auto outcome = read_outcome(r);
        if (outcome.kind == detail::round_outcome::state::abandoned) {
          bump(r);
          continue;
        }
        if (outcome.kind == detail::round_outcome::state::open) {
          auto members = join_round(r, deadline);
          if (!members) continue;  // closed without us: wait for the next one
          if (auto info = finish(r, *members, make_bootstrap, start, deadline)) return *info;
          bump(r);  // the leader died before publishing: form the next round
          continue;
        }
        if (contains(outcome.members, self())) {
          if (auto info = finish(r, outcome.members, make_bootstrap, start, deadline)) return *info;
          bump(r);
          continue;
        }
        wait_for_next_round(r, outcome.members, deadline);
      }
    } catch (const error& e) {
      if (e.code() == errc::mismatch || e.code() == errc::capacity_exhausted) {
        events_.emit("rendezvous_refused",
                     {{"participant", opts_.participant_id}, {"code", to_string(e.code())}, {"message", e.what()}});
      } else if (e.code() == errc::timeout) {
        events_.emit("rendezvous_timeout", {{"participant", opts_.participant_id}, {"message", e.what()}});
      } else if (e.code() == errc::interrupted) {
        events_.emit("rendezvous_interrupted", {{"participant", opts_.participant_id}, {"message", e.what()}});
      }
      throw;
    }
  }

  /// What changed since this participant's round closed: departures (a member's heartbeat key
  /// expired, at most heartbeat_timeout after its last renewal), late joiners, a round started
  /// by another member, or our own lease lapsing. Call it at safe points.
  membership_change poll() {
    membership_change ch;
    ch.self_lost = lost_.load();
    if (current_.round == 0) return ch;
    ch.round_advanced = read_round() > current_.round;
    std::map<std::string, std::string, std::less<>> alive;
    for (auto& [k, v] : store_.list(prefix_ + "/alive/")) alive.emplace(k.substr(prefix_.size() + 7), v);
    for (const auto& m : members_) {
      auto it = alive.find(m.id);
      if (it != alive.end() && it->second == m.incarnation) continue;
      ch.departed.push_back(m.id);
      if (reported_.insert(m.id).second) {
        events_.emit("rendezvous_departure", {{"participant", m.id}, {"round", current_.round}});
      }
    }
    for (auto& [k, v] : store_.list(prefix_ + "/waiting/")) {
      const std::string id = k.substr(prefix_.size() + 9);
      if (contains(members_, {id, v})) continue;
      auto it = alive.find(id);
      if (it != alive.end() && it->second == v) ch.joining.push_back(id);
    }
    return ch;
  }

  /// Starts the next round (r -> r+1; when another member already did, joins that one) and
  /// joins it as a survivor, keeping this participant's place in the rank order.
  round_info next_round(const bootstrap_fn& make_bootstrap = {}) {
    if (current_.round > 0) bump(current_.round);
    return join(make_bootstrap);
  }

  /// Leaves the group now: stops the heartbeat and revokes the lease (its keys vanish).
  void leave() noexcept {
    heartbeat_.request_stop();
    cv_.notify_all();
    if (heartbeat_.joinable()) heartbeat_.join();
    if (const lease_id l = lease_.exchange(0); l != 0) {
      try {
        store_.revoke(l);
      } catch (...) {
      }
    }
  }

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

  std::string key_round() const { return prefix_ + "/round"; }
  std::string key_round(std::int64_t r, std::string_view leaf) const {
    return fmt::format("{}/round/{}/{}", prefix_, r, leaf);
  }
  std::string key_alive(std::string_view id) const {
    return elastic::rendezvous::alive_key(opts_.key_prefix, opts_.run_id, id);
  }
  std::string key_waiting() const { return prefix_ + "/waiting/" + opts_.participant_id; }

  detail::member self() const { return {opts_.participant_id, incarnation_}; }

  /// Throws errc::interrupted when a preemption notice has come: called in every wait, each
  /// of whose turns lasts a few ms (step_), so a notice is honoured well within 100 ms.
  void check_notice(std::string_view doing) const {
    if (const int sig = preemption_handler::requested(); sig != 0) {
      throw error(errc::interrupted,
                  fmt::format("participant '{}' of run '{}' stopped {}: a preemption notice (signal {}) came; exit "
                              "75, the newest committed checkpoint stands",
                              opts_.participant_id, opts_.run_id, doing, sig));
    }
  }
  static bool contains(const std::vector<detail::member>& ms, const detail::member& m) {
    return std::find(ms.begin(), ms.end(), m) != ms.end();
  }

  /// A lease, the heartbeat thread, the run's claims and our alive key; again after our lease
  /// lapsed (the group declared us dead: we come back as a new incarnation).
  void start_session() {
    if (lease_.load() != 0 && !lost_.load()) return;
    const lease_id fresh = store_.grant(opts_.heartbeat_timeout);
    if (const lease_id old = lease_.exchange(fresh); old != 0) {
      try {
        store_.revoke(old);
      } catch (const error&) {
      }
    }
    lost_ = false;
    incarnation_ = detail::random_hex(8);
    if (!heartbeat_.joinable()) heartbeat_ = std::jthread([this](std::stop_token st) { heartbeat_loop(st); });
    claim_store(fresh);
    check_config();
    publish_alive(fresh);
  }

  void claim_store(lease_id lease) {
    const std::string key = opts_.key_prefix + "/active_run";
    std::optional<std::string> actual;
    if (store_.compare_set(key, std::nullopt, opts_.run_id, lease, &actual) || actual == opts_.run_id) return;
    if (!actual) return claim_store(lease);  // it expired in between
    throw error(errc::mismatch,
                fmt::format("participant '{}' of run '{}' refused: the store serves run '{}' ({}): give this "
                            "participant ELASTIC_RUN_ID={}, or use another store for run '{}'",
                            opts_.participant_id, opts_.run_id, elastic::detail::printable(*actual), key,
                            elastic::detail::printable(*actual), opts_.run_id));
  }

  void check_config() {
    const std::string key = prefix_ + "/config";
    const std::string mine = fmt::format("min_nodes={} max_nodes={}", opts_.min_nodes, opts_.max_nodes);
    std::optional<std::string> actual;
    if (store_.compare_set(key, std::nullopt, mine, 0, &actual) || actual == mine) return;
    const std::string_view v = actual ? std::string_view(*actual) : std::string_view();
    std::size_t mn = 0, mx = 0;
    int used = 0;
    if (std::sscanf(std::string(v).c_str(), "min_nodes=%zu max_nodes=%zu%n", &mn, &mx, &used) != 2 ||
        static_cast<std::size_t>(used) != v.size()) {
      throw detail::corrupt_key(key, v, "'min_nodes=M max_nodes=N'", prefix_);
    }
    throw error(errc::mismatch,
                fmt::format("participant '{}' of run '{}' refused: the run has min_nodes={} max_nodes={}, this "
                            "participant declares min_nodes={} max_nodes={}: start every participant with the same "
                            "bounds",
                            opts_.participant_id, opts_.run_id, mn, mx, opts_.min_nodes, opts_.max_nodes));
  }

  /// Our heartbeat key; a live predecessor with our id (a restart faster than its lease) is
  /// waited out, bounded by one heartbeat timeout.
  void publish_alive(lease_id lease) {
    const std::string key = key_alive(opts_.participant_id);
    const auto until = clock::now() + opts_.heartbeat_timeout + opts_.heartbeat_interval;
    for (;;) {
      check_notice("waiting for its predecessor's heartbeat to lapse");
      std::optional<std::string> actual;
      if (store_.compare_set(key, std::nullopt, incarnation_, lease, &actual)) return;
      if (clock::now() >= until) {
        throw error(errc::already_running,
                    fmt::format("participant id '{}' of run '{}' is in use by a live participant (incarnation {}): "
                                "give each participant its own id",
                                opts_.participant_id, opts_.run_id, elastic::detail::printable(actual.value_or(""))));
      }
      std::this_thread::sleep_for(step_);
    }
  }

  void heartbeat_loop(std::stop_token st) {
    std::mutex m;
    std::unique_lock lk(m);
    while (!st.stop_requested()) {
      cv_.wait_for(lk, st, opts_.heartbeat_interval, [] { return false; });
      if (st.stop_requested()) return;
      const lease_id l = lease_.load();
      if (l == 0) continue;
      try {
        store_.keep_alive(l);
        std::optional<std::string> actual;
        store_.compare_set(opts_.key_prefix + "/active_run", std::nullopt, opts_.run_id, l, &actual);
      } catch (const error& e) {
        // Only the lease we renewed counts: join() may have replaced it meanwhile.
        if (e.code() == errc::not_found && lease_.load() == l) lost_ = true;
      } catch (...) {
      }
    }
  }

  std::int64_t read_round() {
    const std::string key = key_round();
    auto v = store_.get(key);
    if (!v) {
      std::optional<std::string> actual;
      if (store_.compare_set(key, std::nullopt, "1", 0, &actual)) return 1;
      v = actual;
      if (!v) return read_round();
    }
    const auto r = detail::parse_i64(*v);
    if (!r || *r < 1) throw detail::corrupt_key(key, *v, "a round number (a positive integer)", prefix_);
    return *r;
  }

  detail::round_outcome read_outcome(std::int64_t r) {
    const std::string key = key_round(r, "closed");
    return detail::parse_outcome(key, store_.get(key), prefix_);
  }

  void bump(std::int64_t r) { store_.compare_set(key_round(), std::to_string(r), std::to_string(r + 1)); }

  bool is_alive(const detail::member& m) { return store_.get(key_alive(m.id)) == m.incarnation; }

  std::vector<detail::join_entry> read_joins(std::int64_t r) {
    const std::string prefix = key_round(r, "join/");
    std::vector<detail::join_entry> out;
    for (auto& [k, v] : store_.list(prefix)) out.push_back(detail::parse_join(k, k.substr(prefix.size()), v, prefix_));
    return out;
  }

  /// Whether everyone the group expects in round r has joined: the live members of round r-1
  /// and the live waiters. Lets a recovery round close without waiting for the last call.
  bool expected_all_joined(std::int64_t r, const std::vector<detail::join_entry>& joins) {
    if (r < 2) return false;
    const auto prev = read_outcome(r - 1);
    if (prev.kind != detail::round_outcome::state::members) return false;
    std::vector<detail::member> expected;
    for (auto& [k, v] : store_.list(prefix_ + "/alive/")) {
      detail::member m{k.substr(prefix_.size() + 7), v};
      if (contains(prev.members, m)) expected.push_back(m);
    }
    for (auto& [k, v] : store_.list(prefix_ + "/waiting/")) expected.push_back({k.substr(prefix_.size() + 9), v});
    return std::all_of(expected.begin(), expected.end(), [&](const detail::member& m) {
      return std::any_of(joins.begin(), joins.end(), [&](const detail::join_entry& j) { return j.who == m; });
    });
  }

  /// Joins open round r and waits for it to close. Returns its members when we are one of
  /// them; nothing when it closed without us.
  std::optional<std::vector<detail::member>> join_round(std::int64_t r, clock::time_point deadline) {
    const std::string mine = key_round(r, "join/" + opts_.participant_id);
    const std::string prev =
        current_.round > 0 ? fmt::format("{}:{}", current_.round, current_.rank) : std::string("new");
    store_.set(mine, incarnation_ + " " + prev, lease_.load());
    const std::string closed_key = key_round(r, "closed");
    // When min_nodes had joined (max(): not yet). Not an optional: GCC 12 warns of a maybe-
    // uninitialized optional<time_point> here at -O2, which users building with -Werror would hit.
    clock::time_point quorum_since = clock::time_point::max();
    for (;;) {
      if (preemption_handler::requested()) {
        store_.erase(mine);
        check_notice(fmt::format("waiting for round {} to close", r));
      }
      const auto outcome = read_outcome(r);
      if (outcome.kind == detail::round_outcome::state::members) {
        if (contains(outcome.members, self())) return outcome.members;
        store_.erase(mine);
        return std::nullopt;
      }
      if (outcome.kind == detail::round_outcome::state::abandoned) {
        store_.erase(mine);
        throw error(errc::timeout, outcome.why);
      }
      if (read_round() > r) {
        // Rounds only advance from a closed one: r closed and its keys were collected while we
        // looked away. Start over from the current round.
        store_.erase(mine);
        return std::nullopt;
      }
      const auto joins = read_joins(r);
      const auto now = clock::now();
      bool close = joins.size() >= opts_.max_nodes;
      if (!close && joins.size() >= opts_.min_nodes) {
        if (quorum_since == clock::time_point::max()) quorum_since = now;
        close = now - quorum_since >= opts_.last_call_timeout || expected_all_joined(r, joins);
      } else if (joins.size() < opts_.min_nodes) {
        quorum_since = clock::time_point::max();
      }
      if (close) {
        // Of all would-be closers the store lets exactly one write; the others read its list.
        store_.compare_set(closed_key, std::nullopt,
                           detail::format_members(detail::rank_order(joins, r, opts_.max_nodes)));
        continue;
      }
      if (now >= deadline) {
        std::string why =
            current_.round > 0
                ? fmt::format("round {} of run '{}': the group fell to {} participants, below min_nodes {}, and no "
                              "one else joined within {} ms: stop, or start more participants",
                              r, opts_.run_id, joins.size(), opts_.min_nodes, opts_.join_timeout.count())
                : fmt::format("round {} of run '{}': only {} of min_nodes {} participants joined within {} ms: "
                              "start more participants, or lower min_nodes",
                              r, opts_.run_id, joins.size(), opts_.min_nodes, opts_.join_timeout.count());
        // Abandoning is decided by the store as closing is: either everyone gets members, or
        // everyone stops with the same reason.
        if (store_.compare_set(closed_key, std::nullopt, "abandoned\n" + why)) {
          store_.erase(mine);
          throw error(errc::timeout, why);
        }
        continue;
      }
      try {
        const std::string k = closed_key;
        store_.wait(std::span<const std::string>(&k, 1), step_);
      } catch (const error& e) {
        if (e.code() != errc::timeout) throw;
      }
    }
  }

  /// Round r is closed without us: refuse when it is full of live members, else wait (as a
  /// registered waiter the members see at their next poll) until the round number moves.
  void wait_for_next_round(std::int64_t r, const std::vector<detail::member>& members, clock::time_point deadline) {
    std::size_t live = 0;
    for (const auto& m : members) live += is_alive(m) ? 1 : 0;
    if (members.size() >= opts_.max_nodes && live == members.size()) {
      store_.erase(key_waiting());
      throw error(errc::capacity_exhausted,
                  fmt::format("participant '{}' refused: run '{}' is full, round {} has max_nodes {} live members; "
                              "retry after one leaves, or raise max_nodes for the next run",
                              opts_.participant_id, opts_.run_id, r, opts_.max_nodes));
    }
    store_.set(key_waiting(), incarnation_, lease_.load());
    for (;;) {
      if (preemption_handler::requested()) {
        store_.erase(key_waiting());
        check_notice(fmt::format("waiting for round {} to end", r));
      }
      if (read_round() != r) return;
      if (live == 0) bump(r);  // no member left to start the next round: we do
      if (clock::now() >= deadline) {
        store_.erase(key_waiting());
        throw error(errc::timeout,
                    fmt::format("participant '{}' of run '{}' waited {} ms for round {} to end, and its members "
                                "never started the next one: do they call poll() and next_round() at safe points?",
                                opts_.participant_id, opts_.run_id, opts_.join_timeout.count(), r));
      }
      std::this_thread::sleep_for(step_);
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
    info.world_size = members.size();
    for (std::size_t i = 0; i < members.size(); ++i) {
      info.members.push_back(members[i].id);
      if (members[i] == self()) info.rank = i;
    }
    info.leader = members.front().id;
    const std::string key = key_round(r, "bootstrap");
    if (info.rank == 0) {
      if (auto have = store_.get(key)) {
        info.bootstrap = *have;  // join() again in the same round
      } else {
        info.bootstrap = make_bootstrap ? make_bootstrap(info) : key_round(r, "gloo/");
        store_.set(key, info.bootstrap);
      }
      collect_garbage(r);
    } else {
      for (;;) {
        if (preemption_handler::requested()) check_notice(fmt::format("waiting for the bootstrap of round {}", r));
        if (auto v = store_.get(key)) {
          info.bootstrap = *v;
          break;
        }
        // Liveness first, then the key again: a leader that published and left at once is
        // not a leader that died before publishing.
        if (!is_alive(members.front()) && !store_.get(key)) return std::nullopt;
        if (clock::now() >= deadline) {
          throw error(errc::timeout, fmt::format("round {} of run '{}': leader '{}' published no bootstrap within {} "
                                                 "ms of the join",
                                                 r, opts_.run_id, info.leader, opts_.join_timeout.count()));
        }
        try {
          store_.wait(std::span<const std::string>(&key, 1), step_);
        } catch (const error& e) {
          if (e.code() != errc::timeout) throw;
        }
      }
    }
    store_.erase(key_waiting());
    const bool again = current_.round == r;
    current_ = info;
    members_ = members;
    reported_.clear();
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
  /// previous rank order newcomers are compared against).
  void collect_garbage(std::int64_t r) {
    if (r < 3) return;
    try {
      for (auto& [k, v] : store_.list(fmt::format("{}/round/{}/", prefix_, r - 2))) store_.erase(k);
    } catch (const error&) {
    }
  }

  store& store_;
  rendezvous_options opts_;
  event_log events_;
  std::string prefix_;
  std::chrono::milliseconds step_{10};
  std::string incarnation_;
  std::atomic<lease_id> lease_{0};
  std::atomic<bool> lost_{false};
  round_info current_;
  std::vector<detail::member> members_;
  std::set<std::string> reported_;
  std::condition_variable_any cv_;
  std::jthread heartbeat_;  // last: it stops before the members it uses go away
};

}  // namespace elastic::rendezvous
