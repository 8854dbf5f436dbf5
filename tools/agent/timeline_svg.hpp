// A run timeline's picture: inline SVG, one row per lane, wall time across. Every span and mark
// carries its time (data-t, data-t2: seconds from the first event) so the page's script can
// zoom by placing them again; without the script the picture is complete as drawn here. Marks
// are <use> of the symbols in <defs>, coloured by class; each holds a <title> (the tooltip) and,
// when there is one, the index of its event in the page's data (data-e) and the id of the entry
// below that tells more (data-ref).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "timeline_text.hpp"
#include "timeline_types.hpp"

namespace elastic::agent::timeline {

/// The picture's geometry, in pixels.
struct svg_layout {
  static constexpr double label_width = 210;  ///< the row labels' column
  static constexpr double plot_width = 1000;
  static constexpr double axis_height = 24;
  static constexpr double char_width = 6.2;   ///< of 11 px text, to judge whether a label fits
};

inline const char* class_of(span_kind k) {
  constexpr const char* names[] = {"life-ok",  "life-failed", "life-killed", "life-watchdog", "life-preempted", "life-unknown",
                                   "launcher", "rendezvous",  "connect",     "resync",        "training"};
  return names[static_cast<int>(k)];
}

inline const char* class_of(mark_kind k) {
  constexpr const char* names[] = {"restart",   "exit-ok",  "exit-failed", "exit-killed", "exit-watchdog", "exit-preempted",
                                   "kill",      "watchdog", "stack",       "failure",     "rebuild",       "culprit",
                                   "straggler", "timeouts", "checkpoint",  "restore",     "checkpoint-failed", "signal",
                                   "preempted", "warning",  "other"};
  return names[static_cast<int>(k)];
}

inline const char* class_of_row(row_kind k) {
  constexpr const char* names[] = {"launcher", "group", "checkpoints", "lane", "lane", "other"};
  return names[static_cast<int>(k)];
}

/// The symbol a mark kind is drawn with (an id in the picture's <defs>).
inline const char* symbol_of(mark_kind k) {
  switch (k) {
    case mark_kind::restart: return "y-restart";
    case mark_kind::exit_ok: case mark_kind::exit_failed: case mark_kind::exit_killed: case mark_kind::exit_watchdog:
    case mark_kind::exit_preempted: return "y-exit";
    case mark_kind::kill: return "y-kill";
    case mark_kind::stack: return "y-stack";
    case mark_kind::failure: case mark_kind::checkpoint_failed: return "y-failure";
    case mark_kind::rebuild: return "y-rebuild";
    case mark_kind::culprit: return "y-culprit";
    case mark_kind::straggler: return "y-straggler";
    case mark_kind::timeouts: return "y-timeouts";
    case mark_kind::checkpoint: return "y-checkpoint";
    case mark_kind::restore: return "y-restore";
    case mark_kind::signal: return "y-signal";
    case mark_kind::preempted: return "y-preempted";
    case mark_kind::warning: case mark_kind::watchdog: return "y-warning";
    default: return "y-other";
  }
}

/// The symbols, drawn around (0,0) in currentColor.
inline constexpr std::string_view svg_symbols = R"(<defs>
<symbol id="y-exit" overflow="visible"><path d="M-5,-7 L5,-7 L0,2 Z" fill="currentColor"/><path d="M0,-7 V7" stroke="currentColor" stroke-width="1.5"/></symbol>
<symbol id="y-restart" overflow="visible"><path d="M-2,-6 L6,0 L-2,6 Z" fill="currentColor"/></symbol>
<symbol id="y-kill" overflow="visible"><path d="M2,-9 L-6,1 L-1,1 L-3,9 L6,-2 L1,-2 Z" fill="currentColor" stroke="#fff" stroke-width="0.8"/></symbol>
<symbol id="y-stack" overflow="visible"><rect x="-5" y="-7" width="10" height="13" rx="1" fill="#fff" stroke="currentColor" stroke-width="1.5"/><path d="M-3,-3.5 H3 M-3,-0.5 H3 M-3,2.5 H1.5" stroke="currentColor" stroke-width="1.2"/></symbol>
<symbol id="y-failure" overflow="visible"><path d="M-4.5,-4.5 L4.5,4.5 M4.5,-4.5 L-4.5,4.5" stroke="currentColor" stroke-width="2.6"/></symbol>
<symbol id="y-rebuild" overflow="visible"><path d="M0,-7 L7,0 L0,7 L-7,0 Z" fill="currentColor" stroke="#fff" stroke-width="1"/></symbol>
<symbol id="y-culprit" overflow="visible"><path d="M0,-7 V7 M-6,-3.5 L6,3.5 M6,-3.5 L-6,3.5" stroke="currentColor" stroke-width="2.2"/></symbol>
<symbol id="y-straggler" overflow="visible"><path d="M-5,-7 H5 L-5,7 H5 Z" fill="currentColor" stroke="#fff" stroke-width="0.8"/></symbol>
<symbol id="y-timeouts" overflow="visible"><circle r="6" fill="#fff" stroke="currentColor" stroke-width="1.6"/><path d="M0,0 V-4 M0,0 H3" stroke="currentColor" stroke-width="1.4"/></symbol>
<symbol id="y-checkpoint" overflow="visible"><rect x="-1.6" y="-8" width="3.2" height="16" fill="currentColor"/></symbol>
<symbol id="y-restore" overflow="visible"><path d="M4.5,-3 A5.5,5.5 0 1 0 5,2" fill="none" stroke="currentColor" stroke-width="1.8"/><path d="M2,-6 L6,-3 L2,-0.5 Z" fill="currentColor"/></symbol>
<symbol id="y-signal" overflow="visible"><path d="M-3,8 V-8 L6,-5 L-3,-1.5" fill="currentColor" stroke="currentColor" stroke-width="1.4"/></symbol>
<symbol id="y-preempted" overflow="visible"><path d="M-3.5,-6 V6 M3.5,-6 V6" stroke="currentColor" stroke-width="2.6"/></symbol>
<symbol id="y-warning" overflow="visible"><path d="M0,-7 L7,6 H-7 Z" fill="currentColor"/><path d="M0,-2 V2.5 M0,3.8 V4.8" stroke="#fff" stroke-width="1.5"/></symbol>
<symbol id="y-other" overflow="visible"><circle r="3.5" fill="currentColor"/></symbol>
</defs>
)";

namespace detail {

inline double row_height(row_kind k) {
  switch (k) {
    case row_kind::group: return 38;
    case row_kind::launcher: return 22;
    default: return 26;
  }
}

/// A tick every `step` seconds: about eight across `range`.
inline double tick_step(double range) {
  constexpr double steps[] = {0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2,  0.5,   1,     2,     5,     10,
                              15,    30,    60,    120,  300,  600,  900, 1800, 3600,  7200,  14400, 21600, 43200,
                              86400, 172800, 604800};
  for (double s : steps) {
    if (range / s <= 10) return s;
  }
  return std::ceil(range / 10 / 604800) * 604800;
}

inline std::string tick_label(double t, double step) {
  if (step < 1) return fmt::format("{:.3g} s", t);
  if (step < 60) return fmt::format("{:.0f} s", t);
  if (step < 3600) return fmt::format("{:.0f} min", t / 60);
  return fmt::format("{:.0f} h", t / 3600);
}

}  // namespace detail

/// The picture of `m`.
inline std::string draw_svg(const model& m) {
  using L = svg_layout;
  const double range = std::max(m.t_last - m.t_first, 1e-3);
  auto x_of = [&](double t) { return (t - m.t_first) / range * L::plot_width; };
  auto rel = [&](double t) { return fmt::format("{:.6f}", t - m.t_first); };

  std::vector<double> top(m.rows.size() + 1, L::axis_height);
  for (std::size_t i = 0; i < m.rows.size(); ++i) top[i + 1] = top[i] + detail::row_height(m.rows[i].kind);
  const double height = top.back() + 6;
  const double width = L::label_width + L::plot_width + 24;

  std::string out = fmt::format(
      "<svg id=\"timeline\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{0:.0f}\" height=\"{1:.0f}\" "
      "viewBox=\"0 0 {0:.0f} {1:.0f}\" role=\"img\" aria-label=\"run timeline: one row per lane, time across\">\n",
      width, height);
  out += svg_symbols;
  out += "<g class=\"rows\">\n";
  for (std::size_t i = 0; i < m.rows.size(); ++i) {
    const auto& r = m.rows[i];
    out += fmt::format("<rect class=\"stripe stripe-{}\" x=\"0\" y=\"{:.1f}\" width=\"{:.0f}\" height=\"{:.1f}\"/>", i % 2,
                       top[i], width, top[i + 1] - top[i]);
    out += fmt::format("<text class=\"row-label row-{}\" x=\"8\" y=\"{:.1f}\" data-row=\"{}\"><title>{}</title>{}</text>\n",
                       class_of_row(r.kind),
                       (top[i] + top[i + 1]) / 2 + 4, i, html(r.detail), html(shortened(r.label, 32)));
  }
  out += "</g>\n";
  out += fmt::format("<svg id=\"plot\" x=\"{:.0f}\" y=\"0\" width=\"{:.0f}\" height=\"{:.0f}\" data-span=\"{:.6f}\" "
                     "overflow=\"hidden\">\n<rect id=\"plot-bg\" width=\"100%\" height=\"100%\" fill=\"transparent\"/>\n",
                     L::label_width, L::plot_width, height, range);
  // The axis (the page's script draws it again when zooming).
  out += "<g id=\"axis\">";
  const double step = detail::tick_step(range);
  for (double t = 0; t <= range + step * 1e-9; t += step) {
    const double x = t / range * L::plot_width;
    out += fmt::format("<line class=\"tick\" x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1:.0f}\" y2=\"{2:.0f}\"/>"
                       "<text class=\"tick-label\" x=\"{3:.1f}\" y=\"15\">{4}</text>",
                       x, L::axis_height - 4, height, x + 3, detail::tick_label(t, step));
  }
  out += "</g>\n<g id=\"spans\">\n";
  // Where labels are already written, per row: a label that would overlap one is left out.
  std::vector<std::vector<std::pair<double, double>>> taken(m.rows.size());
  auto is_free = [&](std::size_t row, double from, double to) {
    for (const auto& [a, b] : taken[row]) {
      if (from < b + 4 && a < to + 4) return false;
    }
    return true;
  };
  for (const auto& s : m.spans) {
    const double h = detail::row_height(m.rows[s.row].kind) - 8;
    const double sh = std::max(3.0, h * s.height);
    const double y = top[s.row + 1] - 4 - sh;
    const double x0 = x_of(s.t0);
    const double w = std::max(1.0, x_of(s.t1) - x0);
    out += fmt::format("<rect class=\"s s-{}\" data-t=\"{}\" data-t2=\"{}\" x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" "
                       "height=\"{:.1f}\"{}{}><title>{}</title></rect>",
                       class_of(s.kind), rel(s.t0), rel(s.t1), x0, y, w, sh,
                       s.event >= 0 ? fmt::format(" data-e=\"{}\"", s.event) : std::string(),
                       s.ref.empty() ? std::string() : fmt::format(" data-ref=\"{}\"", html(s.ref)), html(s.title));
    if (!s.label.empty()) {
      const double lw = static_cast<double>(s.label.size()) * L::char_width;
      const bool fits = w >= lw + 16;
      if (fits) taken[s.row].emplace_back(x0 + 10, x0 + 10 + lw);
      out += fmt::format("<text class=\"sl\" data-t=\"{}\" data-t2=\"{}\" data-chars=\"{}\" x=\"{:.1f}\" y=\"{:.1f}\"{}>{}</text>",
                         rel(s.t0), rel(s.t1), s.label.size(), x0 + 10, y + sh / 2 + 4,
                         fits ? "" : " display=\"none\"", html(s.label));
    }
    out += "\n";
  }
  out += "</g>\n<g id=\"marks\">\n";
  for (const auto& mk : m.marks) {
    const double x = x_of(mk.t);
    const double y = (top[mk.row] + top[mk.row + 1]) / 2;
    // An exit's label goes left of it, inside the life it ends: right of it starts the next life.
    const bool before = mk.kind >= mark_kind::exit_ok && mk.kind <= mark_kind::exit_preempted;
    const double width = static_cast<double>(mk.label.size()) * L::char_width;
    const double from = before ? x - 8 - width : x + 8;
    std::string label;
    if (!mk.label.empty() && is_free(mk.row, from, from + width)) {
      label = before ? fmt::format("<text x=\"-8\" y=\"4\" text-anchor=\"end\">{}</text>", html(mk.label))
                     : fmt::format("<text x=\"8\" y=\"4\">{}</text>", html(mk.label));
      taken[mk.row].emplace_back(from, from + width);
    }
    out += fmt::format("<g class=\"m m-{}\" data-t=\"{}\" data-y=\"{:.1f}\" transform=\"translate({:.1f} {:.1f})\"{}{}{}>"
                       "<title>{}</title><use href=\"#{}\"/>{}</g>\n",
                       class_of(mk.kind), rel(mk.t), y, x, y,
                       mk.event >= 0 ? fmt::format(" data-e=\"{}\"", mk.event) : std::string(),
                       mk.ref.empty() ? std::string() : fmt::format(" data-ref=\"{}\"", html(mk.ref)),
                       mk.step >= 0 ? fmt::format(" data-step=\"{}\"", mk.step) : std::string(), html(mk.title),
                       symbol_of(mk.kind), label);
  }
  out += "</g>\n<rect id=\"brush\" y=\"0\" height=\"100%\" width=\"0\" display=\"none\"/>\n</svg>\n</svg>\n";
  return out;
}

}  // namespace elastic::agent::timeline
