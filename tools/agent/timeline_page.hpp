// A run timeline as one self-contained HTML page: the heading (run, outcome, duration, counts),
// the picture (timeline_svg.hpp) with its legend, then the lists that tell more: watchdog kills
// with their stack dumps (in <details>, so the text is in the page), rounds and rebuilds, worker
// lives, stragglers and culprits, checkpoints, and every event name read with its count. The
// events the marks point at are embedded as JSON for the script (timeline_assets.hpp). Every
// string from the events goes through html() or script_json() (timeline_text.hpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "timeline_assets.hpp"
#include "timeline_events.hpp"
#include "timeline_svg.hpp"
#include "timeline_text.hpp"
#include "timeline_types.hpp"

namespace elastic::agent::timeline {

/// What the page says about where it came from.
struct page_info {
  std::string generator;           ///< "elastic-run 0.9.0", "elastic-report 0.9.0"
  std::vector<std::string> notes;  ///< the reader's own (an input cut at a size limit)
};

namespace detail {

/// Most rows a list below the picture shows; the events file has the rest.
inline constexpr std::size_t max_list_rows = 300;

inline std::string joined(const std::vector<std::string>& parts, std::string_view sep) {
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : std::string(sep)) + p;
  return out;
}

inline std::string list_cap(std::size_t total, std::string_view what) {
  return total > max_list_rows ? fmt::format("<p class=\"caps\">{} more {} not listed (the events file has them).</p>\n",
                                             total - max_list_rows, what)
                               : std::string();
}

inline std::string heading(const model& m, const event_set& set) {
  const auto& f = m.facts;
  const std::string outcome = f.outcomes.empty() ? "no launcher in these events" : joined(f.outcomes, "; ");
  const bool good = f.exit_code && *f.exit_code == 0;
  const bool bad = (f.exit_code && *f.exit_code != 0 && *f.exit_code != 75) || outcome.find("no launcher_end") != std::string::npos;
  std::string out = fmt::format("<header>\n<h1>Run <span id=\"run-id\">{}</span>: <span id=\"outcome\" class=\"{}\">{}</span></h1>\n",
                                html(f.run_ids.empty() ? "(no run id)" : joined(f.run_ids, ", ")),
                                good ? "good" : bad ? "bad" : "warn", html(outcome));
  out += fmt::format("<p class=\"facts\">{}{} from {} to {} UTC · {} {}{}</p>\n",
                     f.exit_code ? fmt::format("exit {} · ", *f.exit_code) : std::string(),
                     duration_text(m.t_last - m.t_first), utc_text(m.t_first),
                     // the end's date only when it is another day
                     utc_text(m.t_last).substr(utc_text(m.t_last).compare(0, 10, utc_text(m.t_first), 0, 10) == 0 ? 11 : 0),
                     f.hosts.size() == 1 ? "host" : "hosts", html(joined(f.hosts, ", ")),
                     f.launchers > 1 ? fmt::format(" · {} launches of elastic-run", f.launchers) : std::string());
  // "one|many": the form that goes with n.
  auto item = [](std::size_t n, std::string_view forms, std::string_view cls = {}) {
    const auto bar = forms.find('|');
    const auto what = bar == std::string_view::npos ? forms : n == 1 ? forms.substr(0, bar) : forms.substr(bar + 1);
    return fmt::format("<li{}><b>{}</b> {}</li>", cls.empty() || n == 0 ? "" : fmt::format(" class=\"{}\"", cls), n, what);
  };
  out += "<ul id=\"counts\">";
  out += item(f.slots, "worker slot|worker slots");
  out += item(f.lives, "worker life|worker lives");
  out += item(f.restarts, "restart|restarts");
  out += item(f.failures, "failure|failures", "bad");
  out += item(f.watchdog_kills, "watchdog kill|watchdog kills", "bad");
  out += item(f.rounds, "round|rounds");
  out += item(f.rebuilds, "rebuild|rebuilds");
  out += item(f.checkpoints, f.newest_checkpoint >= 0
                                 ? fmt::format("checkpoint (step {0})|checkpoints (newest step {0})", f.newest_checkpoint)
                                 : std::string("checkpoint|checkpoints"));
  if (f.stragglers > 0) out += item(f.stragglers, "straggler|stragglers", "warn");
  if (f.culprits > 0) out += item(f.culprits, "culprit report|culprit reports", "bad");
  if (f.deadline_updates > 0) out += item(f.deadline_updates, "deadline update|deadline updates");
  out += item(set.lines, "line read|lines read");
  if (set.malformed > 0) out += item(set.malformed, "malformed line skipped|malformed lines skipped", "warn");
  out += "</ul>\n</header>\n";
  return out;
}

inline std::string legend() {
  constexpr std::pair<mark_kind, const char*> marks[] = {
      {mark_kind::restart, "restart"},          {mark_kind::exit_ok, "exit 0"},
      {mark_kind::exit_failed, "exit, failed"}, {mark_kind::exit_killed, "killed by a signal"},
      {mark_kind::exit_preempted, "exit 75, preempted"}, {mark_kind::kill, "watchdog kill"},
      {mark_kind::stack, "stack dump"},         {mark_kind::failure, "failed collective"},
      {mark_kind::rebuild, "round: ranks before→after"}, {mark_kind::culprit, "culprit"},
      {mark_kind::straggler, "straggler"},      {mark_kind::timeouts, "deadlines updated"},
      {mark_kind::checkpoint, "checkpoint commit (step)"}, {mark_kind::restore, "restored from step"},
      {mark_kind::signal, "notice to elastic-run"}, {mark_kind::preempted, "loop preempted"},
      {mark_kind::warning, "warning"},          {mark_kind::other, "other event"}};
  constexpr std::pair<span_kind, const char*> spans[] = {
      {span_kind::life_ok, "life, ended 0"},       {span_kind::life_failed, "life, failed"},
      {span_kind::life_killed, "life, killed"},    {span_kind::life_watchdog, "life, killed by the watchdog"},
      {span_kind::life_preempted, "life, preempted"}, {span_kind::life_unknown, "life, end unknown"},
      {span_kind::rendezvous, "rendezvous"},       {span_kind::connect, "connect"},
      {span_kind::resync, "resync"},               {span_kind::training, "round: world size"}};
  std::string out = "<ul id=\"legend\">";
  for (const auto& [k, what] : marks) {
    out += fmt::format("<li class=\"m-{}\"><svg width=\"16\" height=\"18\" viewBox=\"-8 -9 16 18\"><use href=\"#{}\"/></svg>{}</li>",
                       class_of(k), symbol_of(k), what);
  }
  for (const auto& [k, what] : spans) {
    out += fmt::format("<li><svg width=\"22\" height=\"12\"><rect class=\"s s-{}\" x=\"1\" y=\"1\" width=\"20\" height=\"10\"/></svg>{}</li>",
                       class_of(k), what);
  }
  return out + "</ul>\n";
}

inline std::string kills_section(const model& m) {
  std::string out = fmt::format("<section id=\"kills\">\n<h2>Watchdog kills and stack dumps ({})</h2>\n", m.kills.size());
  if (m.kills.empty()) return out + "<p>None.</p>\n</section>\n";
  const bool open = m.kills.size() <= 3;
  for (std::size_t i = 0; i < m.kills.size() && i < max_list_rows; ++i) {
    const auto& k = m.kills[i];
    out += fmt::format("<details class=\"kill\" id=\"{}\"{}>\n<summary>{}{}</summary>\n", html(k.id), open ? " open" : "",
                       k.where.empty() ? "" : "<b>" + html(k.where) + "</b>: ", html(k.summary));
    if (k.stack_text.empty()) {
      out += "<p>No stack dump was recorded for this kill (no watchdog_stack event of this process).</p>\n";
    } else {
      out += fmt::format("<p class=\"stack-heading\">{}</p>\n<pre class=\"stack\">{}</pre>\n", html(k.stack_heading),
                         html(k.stack_text));
    }
    out += "</details>\n";
  }
  return out + list_cap(m.kills.size(), "kills") + "</section>\n";
}

inline std::string rounds_section(const model& m) {
  std::string out = fmt::format("<section id=\"rebuilds\">\n<h2>Rounds and rebuilds ({} rounds, {} rebuilds)</h2>\n",
                                m.facts.rounds, m.facts.rebuilds);
  if (m.rounds.empty()) return out + "<p>No rounds in these events.</p>\n</section>\n";
  out += "<table><tr><th>round</th><th>at</th><th>ranks</th><th>cause</th><th>rendezvous</th><th>connect</th>"
         "<th>resync</th><th>recovery</th><th>from step</th><th>state moved</th></tr>\n";
  for (std::size_t i = 0; i < m.rounds.size() && i < max_list_rows; ++i) {
    const auto& r = m.rounds[i];
    auto phase = [](std::optional<double> a, std::optional<double> b) {
      return a && b ? ms_text(std::max(0.0, *b - *a) * 1000) : std::string("–");
    };
    const double start = r.noticed.value_or(r.closed.value_or(r.connected.value_or(m.t_first)));
    out += fmt::format("<tr id=\"{}\"><td class=\"n\">{}{}</td><td>+{}</td><td>{}</td><td>{}{}</td><td class=\"n\">{}</td>"
                       "<td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td></tr>\n",
                       html(r.id), r.round, r.run_id.empty() || m.facts.run_ids.size() < 2 ? "" : " (" + html(r.run_id) + ")",
                       duration_text(start - m.t_first),
                       r.first_of_run ? fmt::format("{} (formed)", r.world) : fmt::format("{} → {}", r.world_before, r.world),
                       html(r.cause), r.failures.empty() ? "" : "<br><small>after: " + html(r.failures) + "</small>",
                       phase(r.noticed, r.closed), phase(r.closed, r.connected), phase(r.connected, r.resynced),
                       r.recovery_ms > 0 ? ms_text(r.recovery_ms) : "–", r.step ? std::to_string(*r.step) : "–",
                       html(r.resharded));
  }
  return out + "</table>\n" + list_cap(m.rounds.size(), "rounds") + "</section>\n";
}

inline std::string lives_section(const model& m) {
  std::string out = fmt::format("<section id=\"lives\">\n<h2>Worker lives ({})</h2>\n", m.lives.size());
  if (m.lives.empty()) return out + "<p>No workers in these events.</p>\n</section>\n";
  out += "<table><tr><th>lane</th><th>pid</th><th>restart</th><th>from</th><th>for</th><th>ranks</th><th>how it ended</th></tr>\n";
  for (std::size_t i = 0; i < m.lives.size() && i < max_list_rows; ++i) {
    const auto& l = m.lives[i];
    std::string ranks;
    for (auto r : l.ranks) ranks += fmt::format("{}{}", ranks.empty() ? "" : " → ", r);
    out += fmt::format("<tr class=\"life-{}\"><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td>+{}</td><td>{}</td>"
                       "<td>{}</td><td>{}</td></tr>\n",
                       class_of(l.kind), html(l.row < m.rows.size() ? m.rows[l.row].label : ""), l.pid, l.restart_count,
                       duration_text(l.t0 - m.t_first), l.t1 ? duration_text(*l.t1 - l.t0) : "?", ranks, html(l.how));
  }
  return out + "</table>\n" + list_cap(m.lives.size(), "lives") + "</section>\n";
}

inline std::string notes_section(const model& m) {
  if (m.notes.empty()) return {};
  std::string out = fmt::format("<section id=\"notes\">\n<h2>Stragglers, culprits and deadlines ({})</h2>\n"
                                "<table><tr><th>at</th><th>what</th><th>where</th><th>details</th></tr>\n",
                                m.notes.size());
  for (std::size_t i = 0; i < m.notes.size() && i < max_list_rows; ++i) {
    const auto& n = m.notes[i];
    out += fmt::format("<tr id=\"{}\"><td>+{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n", html(n.id),
                       duration_text(n.t - m.t_first), html(n.what), html(n.where), html(n.text));
  }
  return out + "</table>\n" + list_cap(m.notes.size(), "notes") + "</section>\n";
}

inline std::string checkpoints_section(const model& m) {
  std::string out = fmt::format("<section id=\"checkpoints\">\n<h2>Checkpoints ({} committed)</h2>\n<p>", m.checkpoints.size());
  if (m.checkpoints.empty()) return out + "None committed in these events.</p>\n</section>\n";
  out += "Steps: ";
  for (std::size_t i = 0; i < m.checkpoints.size() && i < max_list_rows * 4; ++i) {
    const auto& c = m.checkpoints[i];
    out += fmt::format("{}<span class=\"ckpt\" title=\"+{}: {}\">{}</span>", i == 0 ? "" : ", ",
                       duration_text(c.t - m.t_first), html(c.text), c.step);
  }
  return out + "</p>\n" + (m.checkpoints.size() > max_list_rows * 4 ? "<p class=\"caps\">… and more.</p>\n" : "") + "</section>\n";
}

inline std::string events_section(const event_set& set, const page_info& info) {
  std::string out = fmt::format("<section id=\"events\">\n<h2>Events read</h2>\n<p>Lines read from {1}: {0}; events "
                                "drawn or listed: {2}; counted only (one per rank or step): {3}; malformed lines "
                                "skipped: {4}.</p>\n",
                                set.lines, html(joined(set.sources, ", ")), set.events.size(), set.dropped, set.malformed);
  std::vector<std::string> notes = set.notes;
  notes.insert(notes.end(), info.notes.begin(), info.notes.end());
  if (set.over_limit > 0) notes.push_back(fmt::format("{} events past the first {} were counted only", set.over_limit,
                                                      event_reader::max_kept));
  for (const auto& n : notes) out += fmt::format("<p class=\"caps\">{}</p>\n", html(n));
  if (!set.first_skipped.empty()) {
    out += "<table id=\"skipped\"><tr><th>skipped line</th><th>why</th></tr>\n";
    for (const auto& s : set.first_skipped) {
      out += fmt::format("<tr><td>{}:{}</td><td>{}</td></tr>\n", html(s.source), s.line, html(s.why));
    }
    out += "</table>\n";
  }
  if (!set.counts.empty()) {
    out += "<table id=\"event-counts\"><tr><th>event</th><th>count</th></tr>\n";
    for (const auto& [name, n] : set.counts) {
      out += fmt::format("<tr><td><code>{}</code></td><td class=\"n\">{}</td></tr>\n", html(name), n);
    }
    out += "</table>\n";
  }
  return out + "</section>\n";
}

}  // namespace detail

/// The page of `m`, read from `set`.
inline std::string render_page(const model& m, const event_set& set, const page_info& info) {
  const std::string run = m.facts.run_ids.empty() ? std::string("events") : detail::joined(m.facts.run_ids, ", ");
  std::string out = fmt::format("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
                                "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
                                "<title>{} · run timeline</title>\n<style>{}</style>\n</head>\n<body>\n",
                                html(run), page_style);
  if (set.events.empty()) {
    out += fmt::format("<header><h1>No events</h1></header>\n<p class=\"empty\" id=\"no-events\">There are no events to "
                       "draw in {}: {} lines read, {} of them malformed.</p>\n",
                       html(set.sources.empty() ? std::string("no input") : detail::joined(set.sources, ", ")), set.lines,
                       set.malformed);
  } else {
    out += detail::heading(m, set);
    out += "<section id=\"picture\">\n<div class=\"toolbar\">Drag across the picture to zoom in; double-click it or "
           "<button id=\"reset\" type=\"button\">show everything</button>. Hover for details, click a mark for its event.</div>\n";
    for (const auto& c : m.caps) out += fmt::format("<p class=\"caps\">{}</p>\n", html(c));
    out += "<div class=\"scroll\">\n" + draw_svg(m) + "</div>\n" + detail::legend();
    out += "<div id=\"selected\" hidden><b id=\"selected-title\"></b><pre id=\"selected-event\"></pre></div>\n</section>\n";
    out += detail::kills_section(m) + detail::rounds_section(m) + detail::notes_section(m) + detail::lives_section(m) +
           detail::checkpoints_section(m);
  }
  out += detail::events_section(set, info);
  out += fmt::format("<footer>Drawn by {} from {}.</footer>\n", html(info.generator), html(detail::joined(set.sources, ", ")));
  json data = json::array();
  for (const auto& d : m.data) data.push_back(d);
  out += "<script type=\"application/json\" id=\"events-data\">" + script_json(data) + "</script>\n";
  out += fmt::format("<script>{}</script>\n</body>\n</html>\n", page_script);
  return out;
}

}  // namespace elastic::agent::timeline
