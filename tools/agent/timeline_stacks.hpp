// Watchdog kills and the stack dumps taken before them. The watchdog logs watchdog_stack (every
// thread of the process it is about to kill: `text`, a dump people read, and optionally `stacks`,
// the same as data) and then watchdog_kill; each dump is paired with the kill of the same process
// that follows it (or, written out of order, just precedes it), so the page shows a kill with the
// stacks that explain it. A dump with no kill, or a kill with no dump, is shown as it is.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "timeline_events.hpp"
#include "timeline_text.hpp"
#include "timeline_types.hpp"

namespace elastic::agent::timeline {

/// A dump's text: its `text`, else written from its `stacks`.
inline std::string stack_text(const json& e) {
  if (auto t = text_field(e, "text"); !t.empty()) return t;
  const json* stacks = e.find("stacks");
  if (stacks == nullptr || !stacks->is_array()) return {};
  std::string out;
  for (const auto& th : stacks->elements()) {
    if (!th.is_object()) continue;
    out += fmt::format("thread {} '{}' (state {}{}){}:\n", any_field(th, "tid"), any_field(th, "name"),
                       any_field(th, "state"), text_field(th, "wchan").empty() ? "" : ", in " + text_field(th, "wchan"),
                       bool_field(th, "scope_thread") ? ", the scope's thread" : "");
    if (auto note = text_field(th, "note"); !note.empty()) out += "  (" + note + ")\n";
    const json* frames = th.find("frames");
    if (frames == nullptr || !frames->is_array()) continue;
    std::size_t i = 0;
    for (const auto& f : frames->elements()) {
      if (!f.is_object()) continue;
      const std::string function = any_field(f, "function");
      std::string line = fmt::format("  #{:<2} {} in {}", i++, any_field(f, "pc"), function.empty() ? "??" : function);
      if (auto file = any_field(f, "file"); !file.empty()) {
        line += fmt::format(" at {}:{}", file, any_field(f, "line"));
      } else if (auto mod = any_field(f, "module"); !mod.empty()) {
        line += fmt::format(" from {}", mod);
      }
      out += line + "\n";
    }
  }
  return out;
}

class stack_matcher {
 public:
  /// Pairs the dumps and kills of `events` (sorted by time; kept alive by the caller).
  explicit stack_matcher(const std::vector<event>& events) {
    std::vector<const event*> kills, stacks;
    for (const auto& e : events) {
      if (e.name == "watchdog_kill") kills.push_back(&e);
      if (e.name == "watchdog_stack") stacks.push_back(&e);
    }
    std::map<std::pair<std::string, std::int64_t>, std::vector<std::size_t>> by_target;
    for (std::size_t k = 0; k < kills.size(); ++k) {
      items_.push_back({.kill = kills[k], .stack = nullptr, .id = fmt::format("kill-{}", k + 1), .row = 0});
      ref_[kills[k]->order] = items_.back().id;
      by_target[target(*kills[k])].push_back(k);
    }
    std::size_t alone = 0;
    for (const event* s : stacks) {
      std::optional<std::size_t> best;
      for (std::size_t k : by_target[target(*s)]) {
        const double dt = items_[k].kill->t - s->t;  // a dump is taken before its kill
        if (items_[k].stack != nullptr || dt < -5 || dt > 120) continue;
        if (!best || std::abs(dt) < std::abs(items_[*best].kill->t - s->t)) best = k;
      }
      if (!best) {
        best = items_.size();
        items_.push_back({.kill = nullptr, .stack = s, .id = fmt::format("stack-{}", ++alone), .row = 0});
      }
      items_[*best].stack = s;
      ref_[s->order] = items_[*best].id;
    }
  }

  /// The id of the entry that tells of `e` (a kill or a dump).
  [[nodiscard]] std::string ref_of(const event& e) const {
    const auto it = ref_.find(e.order);
    return it == ref_.end() ? std::string() : it->second;
  }

  /// The row `e` (a kill or a dump) was drawn on.
  void place(const event& e, std::size_t row) { rows_[e.order] = row; }

  /// One entry per kill (with its dump, if any) and per dump with no kill, in time order.
  [[nodiscard]] std::vector<kill_entry> entries(const std::vector<row>& rows, double t_first) const {
    std::vector<kill_entry> out;
    for (const auto& it : items_) {
      const event& first = it.kill != nullptr ? *it.kill : *it.stack;
      kill_entry k;
      k.id = it.id;
      k.t = first.t;
      if (const auto r = rows_.find(first.order); r != rows_.end() && r->second < rows.size()) {
        k.where = rows[r->second].label;
      }
      k.summary = it.kill != nullptr ? kill_summary(*it.kill, t_first)
                                     : fmt::format("{}: a stack dump with no kill after it", when_text(first.t, t_first));
      if (it.stack != nullptr) {
        const json& s = it.stack->fields;
        const bool complete = bool_field(s, "complete");
        k.stack_heading = fmt::format("stack dump of pid {}{}: {} threads, {}{}{}", any_field(s, "target_pid"),
                                      rank_text(s, "target_rank"), any_field(s, "threads"),
                                      complete ? "complete" : "incomplete",
                                      text_field(s, "reason").empty() ? "" : " (" + text_field(s, "reason") + ")",
                                      scope_text(s));
        k.stack_text = stack_text(s);
        if (k.stack_text.empty()) k.stack_text = "(the event holds no text and no stacks)";
      }
      out.push_back(std::move(k));
    }
    std::stable_sort(out.begin(), out.end(), [](const kill_entry& a, const kill_entry& b) { return a.t < b.t; });
    return out;
  }

 private:
  struct item {
    const event* kill;
    const event* stack;
    std::string id;
    std::size_t row;
  };

  static std::pair<std::string, std::int64_t> target(const event& e) {
    return {e.host, int_field(e.fields, "target_pid").value_or(-1)};
  }

  static std::string rank_text(const json& e, const char* key) {
    const auto r = int_field(e, key);
    return r && *r >= 0 ? fmt::format(" (rank {})", *r) : std::string();
  }

  static std::string scope_text(const json& e) {
    std::string out;
    if (auto s = text_field(e, "scope"); !s.empty()) out += fmt::format(", scope '{}'", s);
    if (auto late = number_field(e, "late_ms")) out += fmt::format(", {} late", ms_text(*late));
    return out;
  }

  static std::string kill_summary(const event& k, double t_first) {
    const json& f = k.fields;
    return fmt::format("{}: pid {}{} killed by the watchdog ({}): scope '{}' ran {} against a limit of {}, {} late",
                       when_text(k.t, t_first), any_field(f, "target_pid"), rank_text(f, "target_rank"),
                       text_field(f, "signal"), text_field(f, "scope"), ms_text(number_field(f, "held_ms").value_or(0)),
                       ms_text(number_field(f, "limit_ms").value_or(0)), ms_text(number_field(f, "late_ms").value_or(0)));
  }

  std::vector<item> items_;
  std::map<std::size_t, std::string> ref_;
  std::map<std::size_t, std::size_t> rows_;
};

}  // namespace elastic::agent::timeline
