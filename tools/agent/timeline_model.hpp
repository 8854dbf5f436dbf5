// Events into what a run timeline shows (timeline_types.hpp): each event kind the runtime emits
// has its place (a life, a mark on a lane, a round of the group, a checkpoint), and an event this
// code does not know is still drawn, as a plain mark on its process's lane with all its fields in
// the tooltip: events are added faster than renderers are taught them.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "timeline_events.hpp"
#include "timeline_finish.hpp"
#include "timeline_lanes.hpp"
#include "timeline_rounds.hpp"
#include "timeline_stacks.hpp"
#include "timeline_text.hpp"
#include "timeline_types.hpp"

namespace elastic::agent::timeline {

namespace detail {

/// Events drawn by what they feed (a life, a round, the header) or not drawn at all; counted.
inline bool silent(std::string_view name) {
  static constexpr std::string_view names[] = {"rendezvous_join", "watchdog_start", "watchdog_stop", "watchdog_adopt",
                                               "watchdog_swept",  "run_keys_removed", "loop_end",     "timer_unwatched"};
  return std::find(std::begin(names), std::end(names), name) != std::end(names);
}

/// Whether an unknown event's name says something went wrong.
inline bool sounds_wrong(std::string_view name) {
  for (std::string_view w : {"fail", "error", "timeout", "refused", "lost", "unavailable", "exceeded", "abandon",
                             "quarantine", "unagreed", "unacknowledged", "interrupted", "full"}) {
    if (name.find(w) != std::string_view::npos) return true;
  }
  return false;
}

}  // namespace detail

/// Builds a model from events (sorted by time); see build_model().
class model_builder {
 public:
  explicit model_builder(const event_set& set) : set_(set), lanes_(set.events), stacks_(set.events) {
    if (!set.events.empty()) {
      m_.t_first = set.events.front().t;
      m_.t_last = set.events.back().t;
    }
  }

  model build() && {
    for (const auto& e : set_.events) take(e);
    finish_lives();
    draw_rounds(m_, std::move(rounds_).finish(), lanes_, worker_times_);
    draw_launchers(m_, lanes_);
    m_.kills = stacks_.entries(lanes_.rows(), m_.t_first);
    if (data_left_out_ > 0) {
      m_.caps.push_back(fmt::format("{} events are not embedded in the page (it embeds {} at most): their marks "
                                    "show a tooltip but no details on click",
                                    data_left_out_, max_data));
    }
    count_facts(m_, set_, lanes_);
    m_.rows = std::move(lanes_.rows());
    tidy(m_);
    return std::move(m_);
  }

 private:
  void take(const event& e) {
    if (e.rank && e.pid > 0 && e.name == "rendezvous_round_closed") note_rank(e);
    if (auto* l = lanes_.find_launcher(e.host, e.pid)) {
      l->last = std::max(l->last, e.t);
      l->spoke = true;
    }
    if (e.rank || e.name == "worker_exit") worker_times_[run(e)].push_back(e.t);
    const std::string& n = e.name;
    if (n == "launcher_start") {
      ++m_.facts.launchers;
    } else if (n == "launcher_end") {
      auto* l = lanes_.find_launcher(e.host, e.pid);
      if (l != nullptr) {
        l->outcome = text_field(e.fields, "outcome");
        l->exit_code = int_field(e.fields, "exit_code");
      }
    } else if (n == "launcher_signal") {
      const std::string how = bool_field(e.fields, "kill_now")      ? " again: kill now"
                              : bool_field(e.fields, "same_notice") ? " (the same notice)"
                                                                    : ": a preemption notice";
      add_mark(e, lanes_.row_of(e), mark_kind::signal, text_field(e.fields, "signal"),
               text_field(e.fields, "signal") + how);
    } else if (n == "launcher_crash_loop") {
      add_mark(e, lanes_.row_of(e), mark_kind::failure, "crash loop", "crash loop: the run ends (exit 3)");
    } else if (n == "worker_start" || n == "worker_restart") {
      start_life(e);
    } else if (n == "worker_exit") {
      end_life(e);
    } else if (n == "worker_error") {  // torch's @record message (--restart-mode all)
      add_mark(e, lanes_.row_of(e), mark_kind::failure, "error", "worker_error: " + text_field(e.fields, "message"));
    } else if (n == "launcher_round_stop") {
      add_mark(e, lanes_.row_of(e), mark_kind::failure, "round",
               "every worker restarts together: " + text_field(e.fields, "reason"));
    } else if (n == "launcher_round_start") {
      add_mark(e, lanes_.row_of(e), mark_kind::other, "round",
               fmt::format("round {}: host {} of {}, MASTER_PORT {}", any_field(e.fields, "round"),
                           any_field(e.fields, "group_rank"), any_field(e.fields, "group_world_size"),
                           any_field(e.fields, "master_port")));
    } else if (n == "worker_start_failed" || n == "worker_backoff" || n == "worker_grace_exceeded") {
      slot_event(e);
    } else if (n == "watchdog_kill" || n == "watchdog_stack" || n == "watchdog_escalate" ||
               n == "watchdog_refused" || n == "watchdog_kill_failed" || n == "watchdog_warning") {
      watchdog_event(e);
    } else if (n == "rendezvous_round_closed") {
      rounds_.closed(e);
    } else if (n == "group_formed" || n == "group_rebuilt") {
      rounds_.formed(e);
    } else if (n == "group_resynced") {
      rounds_.resynced(e);
    } else if (n == "group_resharded") {
      rounds_.resharded(e);
    } else if (n == "group_failure") {
      const std::string what = fmt::format("{} {}", text_field(e.fields, "collective"), text_field(e.fields, "code"));
      rounds_.failure(e, what);
      add_mark(e, lanes_.row_of(e), mark_kind::failure, text_field(e.fields, "collective"),
               fmt::format("group_failure: {} failed here", what));
    } else if (n == "group_culprit") {
      culprit(e);
    } else if (n == "straggler" || n == "timeouts_updated") {
      rank_note(e);
    } else if (n == "straggler_evicted") {
      add_mark(e, lanes_.row_of(e), mark_kind::straggler, "evicted",
               "straggler_evicted: this rank leaves the group (a persistent straggler, evict_stragglers)");
    } else if (n.rfind("checkpoint_", 0) == 0) {
      checkpoint_event(e);
    } else if (n == "loop_preempted") {
      const bool saved = bool_field(e.fields, "final_checkpoint");
      add_mark(e, lanes_.row_of(e), mark_kind::preempted, "",
               fmt::format("loop_preempted at step {}: final checkpoint {}", any_field(e.fields, "step"),
                           saved ? "committed" : "not committed"));
    } else if (!detail::silent(n)) {
      add_mark(e, lanes_.row_of(e), detail::sounds_wrong(n) ? mark_kind::warning : mark_kind::other, "", n);
    }
  }

  static std::string run(const event& e) { return text_field(e.fields, "run_id"); }

  /// The event as the page embeds it: long strings cut, a structured stack left to the text.
  std::ptrdiff_t datum(const event& e) {
    if (const auto it = data_of_.find(e.order); it != data_of_.end()) return it->second;
    if (m_.data.size() >= max_data) {
      ++data_left_out_;
      return -1;
    }
    json copy = json::object();
    for (const auto& [key, value] : e.fields.items()) {
      if (key == "stacks" && value.is_array()) {
        copy[key] = fmt::format("({} threads: see the stack dump under Watchdog kills)", value.size());
      } else if (value.is_string()) {
        copy[key] = shortened(value.as_string(), 4000);
      } else if (const auto size = value.dump().size(); size > 4000) {
        copy[key] = fmt::format("({} bytes of JSON: see the events file)", size);
      } else {
        copy[key] = value;
      }
    }
    m_.data.push_back(std::move(copy));
    return data_of_[e.order] = static_cast<std::ptrdiff_t>(m_.data.size() - 1);
  }

  mark& add_mark(const event& e, std::size_t row, mark_kind kind, std::string label, std::string_view headline,
                 std::string ref = {}) {
    m_.marks.push_back({.t = e.t,
                        .row = row,
                        .kind = kind,
                        .label = std::move(label),
                        .title = event_title(e, m_.t_first, headline),
                        .event = datum(e),
                        .ref = std::move(ref),
                        .count = 1,
                        .step = -1});
    return m_.marks.back();
  }

  /// The group rank a worker holds from the round that closed (events name ranks: culprits,
  /// stragglers). Only the rendezvous says it: other events of a worker carry the rank it started
  /// with (ELASTIC_RANK), which a rebuild does not change.
  void note_rank(const event& e) {
    if (const auto r = lanes_.worker_row(e.host, e.pid)) {
      rank_rows_[{run(e), *e.rank}] = *r;
      auto& life = life_of_pid(e, *r);
      if (life.ranks.empty() || life.ranks.back() != *e.rank) life.ranks.push_back(*e.rank);
    }
  }

  std::size_t row_of_rank(const event& e, std::int64_t rank) {
    const auto it = rank_rows_.find({run(e), rank});
    return it != rank_rows_.end() ? it->second : lanes_.rank_row(e.host, rank);
  }

  // Lives -------------------------------------------------------------------------------------

  /// The life `e`'s process belongs to: its own, the lane's open one (a wrapper's trainer), or
  /// one inferred from its events.
  life_entry& life_of_pid(const event& e, std::size_t row) {
    if (const auto it = life_of_.find({e.host, e.pid}); it != life_of_.end()) return m_.lives[it->second];
    if (const auto it = open_on_row_.find(row); it != open_on_row_.end()) return m_.lives[it->second];
    m_.lives.push_back({.row = row, .pid = e.pid, .t0 = e.t, .t1 = e.t, .how = "", .kind = span_kind::life_unknown,
                        .restart_count = 0, .ranks = {}, .inferred = true});
    life_of_[{e.host, e.pid}] = m_.lives.size() - 1;
    return m_.lives.back();
  }

  void start_life(const event& e) {
    const auto pid = int_field(e.fields, "worker_pid").value_or(-1);
    const auto row = lanes_.worker_row(e.host, pid).value_or(lanes_.row_of(e));
    m_.lives.push_back({.row = row, .pid = pid, .t0 = e.t, .t1 = std::nullopt, .how = "",
                        .kind = span_kind::life_unknown,
                        .restart_count = int_field(e.fields, "restart_count").value_or(0), .ranks = {},
                        .inferred = false});
    life_of_[{e.host, pid}] = open_on_row_[row] = m_.lives.size() - 1;
    if (e.name == "worker_restart") {
      ++m_.facts.restarts;
      add_mark(e, row, mark_kind::restart, "",
               fmt::format("worker_restart: pid {}, restart {}, after {}", pid, any_field(e.fields, "restart_count"),
                           ms_text(number_field(e.fields, "delay_ms").value_or(0))));
    }
  }

  void end_life(const event& e) {
    const auto pid = int_field(e.fields, "worker_pid").value_or(-1);
    const auto row = lanes_.worker_row(e.host, pid).value_or(lanes_.row_of(e));
    event self = e;
    self.pid = pid;
    auto& life = life_of_pid(self, row);
    life.t1 = e.t;
    const std::string signal = text_field(e.fields, "signal");
    const auto code = int_field(e.fields, "code");
    mark_kind kind = mark_kind::exit_failed;
    if (!signal.empty() && bool_field(e.fields, "watchdog")) {
      life.kind = span_kind::life_watchdog, kind = mark_kind::exit_watchdog;
      life.how = fmt::format("killed by the watchdog ({})", signal);
    } else if (!signal.empty()) {
      life.kind = span_kind::life_killed, kind = mark_kind::exit_killed;
      life.how = fmt::format("killed by {}{}", signal, grace_killed_.count({e.host, pid}) ? " after the grace" : "");
    } else if (code == 0) {
      life.kind = span_kind::life_ok, kind = mark_kind::exit_ok;
      life.how = "exited 0";
    } else if (code == 75) {
      life.kind = span_kind::life_preempted, kind = mark_kind::exit_preempted;
      life.how = "exited 75 (preempted)";
    } else {
      life.kind = span_kind::life_failed;
      life.how = fmt::format("exited {}", code ? std::to_string(*code) : std::string("?"));
    }
    if (kind != mark_kind::exit_ok && kind != mark_kind::exit_preempted) ++m_.facts.failures;
    const std::string label = !signal.empty() ? signal : kind == mark_kind::exit_ok ? "" : fmt::format("exit {}", code.value_or(-1));
    add_mark(e, row, kind, label, fmt::format("worker_exit: pid {} {}", pid, life.how));
    open_on_row_.erase(row);
  }

  /// Launcher events about a slot that has no process (yet, or any more).
  void slot_event(const event& e) {
    std::size_t row = lanes_.row_of(e);
    if (const auto pid = int_field(e.fields, "worker_pid")) {
      row = lanes_.worker_row(e.host, *pid).value_or(row);
      if (e.name == "worker_grace_exceeded") grace_killed_.insert({e.host, *pid});
    } else if (const auto slot = int_field(e.fields, "slot")) {
      for (const auto& l : m_.lives) {
        if (lanes_.rows()[l.row].kind == row_kind::lane && lanes_.rows()[l.row].index == *slot) row = l.row;
      }
    }
    const auto kind = e.name == "worker_backoff" ? mark_kind::warning : mark_kind::failure;
    const std::string label = e.name == "worker_backoff" ? "backoff" : e.name == "worker_grace_exceeded" ? "grace" : "start failed";
    add_mark(e, row, kind, label, e.name);
  }

  // The watchdog -----------------------------------------------------------------------------

  void watchdog_event(const event& e) {
    const auto target = int_field(e.fields, "target_pid").value_or(-1);
    const auto rank = int_field(e.fields, "target_rank");
    const std::size_t row = lanes_.worker_row(e.host, target)
                                .value_or(rank ? row_of_rank(e, *rank) : lanes_.row_of(e));
    const std::string scope = text_field(e.fields, "scope");
    if (e.name == "watchdog_kill") {
      ++m_.facts.watchdog_kills;
      add_mark(e, row, mark_kind::kill, scope.empty() ? "kill" : scope,
               fmt::format("watchdog_kill: scope '{}' ran {} (limit {}, {} late): {}", scope,
                           ms_text(number_field(e.fields, "held_ms").value_or(0)),
                           ms_text(number_field(e.fields, "limit_ms").value_or(0)),
                           ms_text(number_field(e.fields, "late_ms").value_or(0)), text_field(e.fields, "signal")),
               stacks_.ref_of(e));
      stacks_.place(e, row);
    } else if (e.name == "watchdog_stack") {
      add_mark(e, row, mark_kind::stack, "", fmt::format("watchdog_stack: {} threads of pid {}",
                                                         any_field(e.fields, "threads"), target),
               stacks_.ref_of(e));
      stacks_.place(e, row);
    } else if (e.name == "watchdog_warning") {
      add_mark(e, row, mark_kind::warning, scope,
               fmt::format("watchdog_warning: scope '{}' still open after {}, past its warning at {}; killed at {} "
                           "if still open",
                           scope, ms_text(number_field(e.fields, "held_ms").value_or(0)),
                           ms_text(number_field(e.fields, "warn_ms").value_or(0)),
                           ms_text(number_field(e.fields, "limit_ms").value_or(0))));
    } else {
      add_mark(e, row, mark_kind::watchdog, "", e.name);
    }
  }

  // Culprits, stragglers, deadlines ---------------------------------------------------------------

  /// group_culprit: rank(s) that never entered collective #k, found from the flight records.
  void culprit(const event& e) {
    const auto ranks = number_list(e.fields, "culprits");
    const auto pids = number_list(e.fields, "culprit_pids");
    const std::string seq = any_field(e.fields, e.fields.find("seq") != nullptr ? "seq" : "collective");
    const std::string op = any_field(e.fields, "op");
    if (!once(fmt::format("culprit|{}|{}|{}|{}|{}", run(e), any_field(e.fields, "round"), seq, op,
                          any_field(e.fields, "culprits")),
              e.t)) {
      return;
    }
    ++m_.facts.culprits;
    std::string who;
    for (auto r : ranks) who += fmt::format("{}{}", who.empty() ? "" : ", ", r);
    std::string text = text_field(e.fields, "text");
    if (text.empty()) text = fmt::format("rank(s) {} never entered collective #{} ({})", who.empty() ? "?" : who, seq, op);
    const std::size_t group = lanes_.group_row(run(e));
    const std::string id = add_note(e, "culprit", text, group);
    const std::string headline = fmt::format("group_culprit: rank {} held up collective #{} ({})", who, seq, op);
    add_mark(e, group, mark_kind::culprit, fmt::format("culprit r{}", who), headline, id);
    for (std::size_t i = 0; i < std::max(ranks.size(), pids.size()); ++i) {
      std::optional<std::size_t> row;
      if (i < pids.size()) row = lanes_.worker_row(e.host, pids[i]);
      if (!row && i < ranks.size()) row = row_of_rank(e, ranks[i]);
      if (row) add_mark(e, *row, mark_kind::culprit, fmt::format("#{} {}", seq, op), headline, id);
    }
  }

  /// A straggler (on its lane) or new step deadlines (on the group's row): every rank may log
  /// the same finding, so one mark per finding.
  void rank_note(const event& e) {
    const bool straggler = e.name == "straggler";
    std::string fields;
    for (const auto& [key, value] : e.fields.items()) {
      if (!identity_field(key)) fields += fmt::format("{}{} {}", fields.empty() ? "" : ", ", key, shortened(any_field(e.fields, key), 200));
    }
    // A straggler named by another rank carries its group rank; one that reports itself is
    // found by its pid (the identity's rank is the one it started with).
    std::optional<std::int64_t> rank;
    for (const char* k : {"straggler_rank", "slow_rank", "target_rank"}) rank = rank ? rank : int_field(e.fields, k);
    const std::string finding =
        straggler ? fmt::format("{}|{}", rank ? std::to_string(*rank) : fmt::format("{}/{}", e.host, e.pid), any_field(e.fields, "step"))
                  : fmt::format("{}|{}|{}", any_field(e.fields, "step"), any_field(e.fields, "step_timeout_ms"),
                                any_field(e.fields, "checkpoint_step_timeout_ms"));
    if (!once(fmt::format("{}|{}|{}", e.name, run(e), finding), e.t)) return;
    const std::size_t row = !straggler ? lanes_.group_row(run(e)) : rank ? row_of_rank(e, *rank) : lanes_.row_of(e);
    straggler ? ++m_.facts.stragglers : ++m_.facts.deadline_updates;
    const std::string id = add_note(e, straggler ? "straggler" : "deadlines", fields, row);
    std::string label = straggler ? (rank ? fmt::format("slow r{}", *rank) : "slow") : "deadlines";
    if (const auto ratio = number_field(e.fields, "ratio"); straggler && ratio) label += fmt::format(" ×{:.1f}", *ratio);
    if (const auto ms = number_field(e.fields, "step_timeout_ms"); !straggler && ms) label = "step ≤ " + ms_text(*ms);
    add_mark(e, row, straggler ? mark_kind::straggler : mark_kind::timeouts, label, e.name, id);
  }

  /// Whether `key` was not seen in the last 2 s: every rank may report the same finding.
  bool once(const std::string& key, double t) {
    auto [it, added] = seen_keys_.try_emplace(key, t);
    if (!added && t - it->second < 2) return false;
    it->second = t;
    return true;
  }

  std::string add_note(const event& e, std::string what, std::string text, std::size_t row) {
    std::string id = fmt::format("note-{}", m_.notes.size() + 1);
    m_.notes.push_back({.id = id, .t = e.t, .what = std::move(what), .where = lanes_.rows()[row].label,
                        .text = std::move(text)});
    return id;
  }

  // Checkpoints ----------------------------------------------------------------------------

  void checkpoint_event(const event& e) {
    const auto step = int_field(e.fields, "step");
    if (e.name == "checkpoint_commit") {
      const std::string text = fmt::format("step {}: {} bytes in {}", step.value_or(-1), any_field(e.fields, "bytes"),
                                           ms_text(number_field(e.fields, "persist_s").value_or(0) * 1000));
      m_.checkpoints.push_back({.t = e.t, .step = step.value_or(-1), .text = text});
      auto& mk = add_mark(e, lanes_.checkpoint_row(), mark_kind::checkpoint, fmt::format("{}", step.value_or(-1)),
                          "checkpoint_commit " + text);
      mk.step = step.value_or(-1);
    } else if (e.name == "checkpoint_restore") {
      add_mark(e, lanes_.row_of(e), mark_kind::restore, "",
               fmt::format("checkpoint_restore: resumed from step {}", step.value_or(-1)));
    } else {
      add_mark(e, lanes_.checkpoint_row(), detail::sounds_wrong(e.name) ? mark_kind::checkpoint_failed : mark_kind::other,
               "", e.name);
    }
  }

  // Finishing ----------------------------------------------------------------------------------

  void finish_lives() {
    for (auto& l : m_.lives) {
      if (!l.t1) {
        l.how = "no worker_exit: still running when the events end, or its launcher was killed";
      } else if (l.inferred && l.how.empty()) {
        l.how = "no worker_start or worker_exit: drawn from its own events";
      }
      const double end = l.t1.value_or(m_.t_last);
      std::string ranks;
      for (auto r : l.ranks) ranks += fmt::format("{}{}", ranks.empty() ? "" : "→", r);
      m_.spans.push_back({.t0 = l.t0, .t1 = std::max(end, l.t0), .row = l.row, .kind = l.kind,
                          .label = ranks.empty() ? fmt::format("pid {}", l.pid) : fmt::format("pid {} · rank {}", l.pid, ranks),
                          .title = fmt::format("pid {}{}: {} → {}, {}\n{}", l.pid,
                                               l.restart_count > 0 ? fmt::format(" (restart {})", l.restart_count) : "",
                                               when_text(l.t0, m_.t_first), when_text(end, m_.t_first),
                                               duration_text(end - l.t0), l.how),
                          .event = -1, .ref = "", .height = 1});
    }
    m_.facts.lives = m_.lives.size();
  }

  static constexpr std::size_t max_data = 6000;

  const event_set& set_;
  model m_;
  lane_map lanes_;
  stack_matcher stacks_;
  round_tracker rounds_;
  std::map<std::pair<std::string, std::int64_t>, std::size_t> life_of_;
  std::map<std::size_t, std::size_t> open_on_row_;
  std::map<std::pair<std::string, std::int64_t>, std::size_t> rank_rows_;
  std::set<std::pair<std::string, std::int64_t>> grace_killed_;
  std::map<std::string, double> seen_keys_;
  std::map<std::string, std::vector<double>> worker_times_;
  std::map<std::size_t, std::ptrdiff_t> data_of_;
  std::size_t data_left_out_ = 0;
};

/// What `set` shows: rows, spans, marks and lists (see timeline_types.hpp).
inline model build_model(const event_set& set) { return model_builder(set).build(); }

}  // namespace elastic::agent::timeline
