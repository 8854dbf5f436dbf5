// The last steps of a run timeline's model: the group's rounds and the launchers become spans and
// marks, the heading's figures are counted, and a crowded picture is thinned to what a browser
// draws at once (marks closer than a pixel merged, the least telling left out, each with a note).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "timeline_events.hpp"
#include "timeline_lanes.hpp"
#include "timeline_rounds.hpp"
#include "timeline_text.hpp"
#include "timeline_types.hpp"

namespace elastic::agent::timeline {

/// Most marks and spans one page draws; past them, marks merge and the least telling go.
inline constexpr std::size_t max_marks = 4000;
inline constexpr std::size_t max_spans = 4000;

/// The group's rows: per round, its phases (rendezvous, connect, resync), the world it trained
/// with (a bar as high as its share of the largest world), and a mark with the world before and
/// after. `worker_times` (per run, sorted): when workers last spoke, to end a round's bar.
inline void draw_rounds(model& m, std::vector<round_entry> rounds, lane_map& lanes,
                        const std::map<std::string, std::vector<double>>& worker_times) {
  std::int64_t largest = 1;
  for (const auto& r : rounds) largest = std::max(largest, r.world);
  for (std::size_t i = 0; i < rounds.size(); ++i) {
    const auto& r = rounds[i];
    const std::size_t row = lanes.group_row(r.run_id);
    const double start = round_tracker::start(r);
    const std::string what = r.first_of_run ? fmt::format("round {} formed: {} ranks", r.round, r.world)
                                            : fmt::format("round {}: {} → {} ranks", r.round, r.world_before, r.world);
    const std::string title = fmt::format("{}\ncause: {}{}\nrendezvous {}, connect {}, resync {}; recovery {}", what,
                                          r.cause, r.failures.empty() ? "" : "\nafter: " + r.failures,
                                          ms_text(r.rendezvous_ms), ms_text(r.connect_ms), ms_text(r.resync_ms),
                                          ms_text(r.recovery_ms));
    const std::optional<double> bounds[] = {start, r.closed, r.connected, r.resynced};
    constexpr span_kind phases[] = {span_kind::rendezvous, span_kind::connect, span_kind::resync};
    constexpr const char* names[] = {"rendezvous", "connect", "resync"};
    for (std::size_t p = 0; p < 3; ++p) {
      if (!bounds[p] || !bounds[p + 1]) continue;
      m.spans.push_back({.t0 = *bounds[p], .t1 = std::max(*bounds[p], *bounds[p + 1]), .row = row, .kind = phases[p],
                         .label = "", .title = fmt::format("{}: {}\n{}", names[p], ms_text((*bounds[p + 1] - *bounds[p]) * 1000), title),
                         .event = -1, .ref = r.id, .height = 1});
    }
    // The world's bar: from training again to the next round of this run, or the run's last word.
    const double from = r.resynced.value_or(r.connected.value_or(r.closed.value_or(start)));
    double until = HUGE_VAL;
    for (std::size_t j = i + 1; j < rounds.size(); ++j) {
      if (rounds[j].run_id == r.run_id) {
        until = round_tracker::start(rounds[j]);
        break;
      }
    }
    if (const auto it = worker_times.find(r.run_id); it != worker_times.end()) {
      const auto last = std::upper_bound(it->second.begin(), it->second.end(), until);
      if (last != it->second.begin()) until = std::min(until, *std::prev(last));
    }
    if (std::isfinite(until) && until > from) {
      m.spans.push_back({.t0 = from, .t1 = until, .row = row, .kind = span_kind::training,
                         .label = fmt::format("round {} · {} ranks", r.round, r.world),
                         .title = fmt::format("round {}: training with {} ranks for {}{}", r.round, r.world,
                                              duration_text(until - from),
                                              r.step ? fmt::format(" (from step {})", *r.step) : std::string()),
                         .event = -1, .ref = r.id,
                         .height = std::max(0.25, static_cast<double>(r.world) / static_cast<double>(largest))});
    }
    m.marks.push_back({.t = r.closed.value_or(start), .row = row, .kind = mark_kind::rebuild,
                       .label = r.first_of_run ? fmt::format("{}", r.world) : fmt::format("{}→{}", r.world_before, r.world),
                       .title = title, .event = -1, .ref = r.id, .count = 1, .step = -1});
    if (!r.first_of_run) ++m.facts.rebuilds;
  }
  m.facts.rounds = rounds.size();
  m.rounds = std::move(rounds);
}

/// Each launcher's life on its row, and the run's outcome per host.
inline void draw_launchers(model& m, lane_map& lanes) {
  std::map<std::string, const launcher_seen*> latest;  // per host group
  for (const auto& [k, l] : lanes.launchers()) {
    if (!l.spoke) continue;
    const double t0 = l.started.value_or(l.first);
    const double t1 = l.ended.value_or(l.last);
    const std::string end = l.ended ? fmt::format("{} (exit {})", l.outcome, l.exit_code.value_or(-1))
                                    : std::string("no launcher_end: killed, or still running when the events end");
    m.spans.push_back({.t0 = t0, .t1 = std::max(t0, t1), .row = l.row, .kind = span_kind::launcher,
                       .label = fmt::format("elastic-run pid {}: {}", l.pid, l.ended ? l.outcome : "no launcher_end"),
                       .title = fmt::format("elastic-run pid {} on {}: {} → {}, {}\n{}{}", l.pid, l.host,
                                            when_text(t0, m.t_first), when_text(t1, m.t_first), duration_text(t1 - t0),
                                            end, l.command.empty() ? "" : "\ncommand: " + shortened(l.command, 400)),
                       .event = -1, .ref = "", .height = 1});
    auto& best = latest[l.group];
    if (best == nullptr || best->started.value_or(best->first) < t0) best = &l;
  }
  for (const auto& [group, l] : latest) {
    const std::string outcome = l->ended ? l->outcome : "no launcher_end (killed, or still running)";
    m.facts.outcomes.push_back(latest.size() > 1 ? fmt::format("{}: {}", group, outcome) : outcome);
    if (l->ended && l->exit_code) m.facts.exit_code = l->exit_code;
  }
}

/// The heading's figures that are not counted on the way.
inline void count_facts(model& m, const event_set& set, lane_map& lanes) {
  std::set<std::string> runs, hosts;
  for (const auto& e : set.events) {
    if (auto r = text_field(e.fields, "run_id"); !r.empty() && runs.insert(r).second) m.facts.run_ids.push_back(r);
    if (!e.host.empty() && hosts.insert(e.host).second) m.facts.hosts.push_back(e.host);
  }
  for (const auto& r : lanes.rows()) m.facts.slots += r.kind == row_kind::lane ? 1 : 0;
  m.facts.checkpoints = m.checkpoints.size();
  for (const auto& c : m.checkpoints) m.facts.newest_checkpoint = std::max(m.facts.newest_checkpoint, c.step);
}

namespace detail {

/// How much a mark tells, to choose what stays when there are too many.
inline int weight(mark_kind k) {
  switch (k) {
    case mark_kind::kill: case mark_kind::stack: case mark_kind::culprit: case mark_kind::exit_failed:
    case mark_kind::exit_killed: case mark_kind::exit_watchdog: case mark_kind::failure: return 3;
    case mark_kind::restart: case mark_kind::rebuild: case mark_kind::signal: case mark_kind::restore:
    case mark_kind::checkpoint_failed: case mark_kind::exit_preempted: case mark_kind::preempted: return 2;
    case mark_kind::straggler: case mark_kind::timeouts: case mark_kind::checkpoint: case mark_kind::warning:
    case mark_kind::watchdog: return 1;
    default: return 0;
  }
}

/// Marks of one kind on one row closer than 1/2000 of the run merge into the first of them.
inline void merge_close_marks(model& m) {
  const double bucket = std::max(m.t_last - m.t_first, 1e-3) / 2000;
  std::map<std::tuple<std::size_t, int, std::int64_t>, std::size_t> first;
  std::vector<mark> kept;
  for (auto& mk : m.marks) {
    const auto b = static_cast<std::int64_t>(std::floor((mk.t - m.t_first) / bucket));
    const auto [it, added] = first.try_emplace({mk.row, static_cast<int>(mk.kind), b}, kept.size());
    if (added) {
      kept.push_back(std::move(mk));
    } else {
      kept[it->second].count += mk.count;
    }
  }
  for (auto& mk : kept) {
    if (mk.count > 1) mk.title = fmt::format("{} such marks here; the first:\n{}", mk.count, mk.title);
  }
  m.marks = std::move(kept);
}

}  // namespace detail

/// Thins a crowded picture (with a note of what went), drops empty rows and puts the rows in
/// order: the groups, checkpoints, then per host its launcher and its lanes by slot.
inline void tidy(model& m) {
  if (m.marks.size() > max_marks) {
    const std::size_t before = m.marks.size();
    detail::merge_close_marks(m);
    m.caps.push_back(fmt::format("{} marks were merged into {}: marks of one kind on one row closer than 1/2000 of "
                                 "the run are drawn as one (its tooltip says how many)",
                                 before, m.marks.size()));
  }
  if (m.marks.size() > max_marks) {
    std::stable_sort(m.marks.begin(), m.marks.end(),
                     [](const mark& a, const mark& b) { return detail::weight(a.kind) > detail::weight(b.kind); });
    m.caps.push_back(fmt::format("{} of {} marks are not drawn (the page draws {} at most, the least telling go "
                                 "first: other events, then checkpoints and stragglers)",
                                 m.marks.size() - max_marks, m.marks.size(), max_marks));
    m.marks.resize(max_marks);
  }
  if (m.spans.size() > max_spans) {
    auto phase = [](const span& s) {
      return s.kind == span_kind::rendezvous || s.kind == span_kind::connect || s.kind == span_kind::resync;
    };
    std::stable_sort(m.spans.begin(), m.spans.end(), [&](const span& a, const span& b) { return !phase(a) && phase(b); });
    m.caps.push_back(fmt::format("{} of {} spans are not drawn (the page draws {} at most; rebuild phases go first, "
                                 "the rebuilds table keeps them)",
                                 m.spans.size() - max_spans, m.spans.size(), max_spans));
    m.spans.resize(max_spans);
  }
  std::vector<bool> used(m.rows.size(), false);
  for (const auto& s : m.spans) used[s.row] = true;
  for (const auto& mk : m.marks) used[mk.row] = true;
  for (const auto& l : m.lives) used[l.row] = true;
  auto section = [](row_kind k) { return k == row_kind::group ? 0 : k == row_kind::checkpoints ? 1 : 2; };
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < m.rows.size(); ++i) {
    if (used[i]) order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const auto& x = m.rows[a];
    const auto& y = m.rows[b];
    return std::make_tuple(section(x.kind), x.group, static_cast<int>(x.kind), x.index) <
           std::make_tuple(section(y.kind), y.group, static_cast<int>(y.kind), y.index);
  });
  std::vector<std::size_t> new_index(m.rows.size(), 0);
  std::vector<row> rows;
  for (std::size_t i = 0; i < order.size(); ++i) {
    new_index[order[i]] = i;
    rows.push_back(std::move(m.rows[order[i]]));
  }
  for (auto& s : m.spans) s.row = new_index[s.row];
  for (auto& mk : m.marks) mk.row = new_index[mk.row];
  for (auto& l : m.lives) l.row = new_index[l.row];
  m.rows = std::move(rows);
}

}  // namespace elastic::agent::timeline
