// The events a run timeline is drawn from: JSON lines of one or more events files (several hosts'
// files may be given, or concatenated), read into one list sorted by time. A line that is not an
// event (not JSON, not an object, no "event" or no readable "ts", cut short by a crash) is
// skipped and counted, never a reason to stop: a timeline is most wanted after a bad run.
//
// Events that only repeat what others say (checkpoint_part, replica_sent, ...) are counted and
// dropped as they are read, so a long run's file costs memory for what is drawn, not per step.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "run_events.hpp"
#include <elastic/error.hpp>
#include <elastic/internal/env.hpp>
#include <elastic/internal/json.hpp>

namespace elastic::agent::timeline {

using elastic::internal::json;

/// One line that was an event.
struct event {
  double t = 0;                    ///< seconds since the epoch, from "ts"
  std::string name;                ///< "event"
  std::string host;
  std::int64_t pid = -1;
  std::optional<std::int64_t> rank;
  std::size_t order = 0;           ///< where it was read: equal times keep the files' order
  json fields;                     ///< the whole object
};

/// A line that was skipped, for the page's note.
struct skipped_line {
  std::string source;
  std::size_t line = 0;
  std::string why;
};

/// Everything read, events sorted by time.
struct event_set {
  std::vector<event> events;
  std::vector<std::string> sources;           ///< the inputs' names, in order
  std::size_t lines = 0;                      ///< non-empty lines read
  std::size_t malformed = 0;                  ///< lines that were not events
  std::vector<skipped_line> first_skipped;    ///< the first few, with why
  std::map<std::string, std::size_t> counts;  ///< events read, by name (dropped ones included)
  std::size_t dropped = 0;                    ///< repeating events counted but not kept
  std::size_t over_limit = 0;                 ///< events past max_kept, counted only
  std::vector<std::string> notes;             ///< what the reader could not take whole
};

/// Events the timeline only counts: each repeats what another event says, once per rank or step.
inline bool counted_only(std::string_view name) {
  static constexpr std::string_view names[] = {
      "checkpoint_part", "checkpoint_removed", "replica_sent",  "checkpoint_policy", "loop_start",
      "loop_resynced",   "watchdog_reclaim",   "watchdog_priority", "final_step_agreed", "rendezvous_departure",
      "replica_listening"};
  return std::find(std::begin(names), std::end(names), name) != std::end(names);
}

/// A field of `e` as text ("" when absent or not text).
inline std::string text_field(const json& e, std::string_view key) {
  const json* v = e.find(key);
  return v != nullptr && v->is_string() ? v->as_string() : std::string();
}

/// `v` as a signed integer; nothing for anything else, or an unsigned value past int64: an
/// event's numbers are the outside world's.
inline std::optional<std::int64_t> integer(const json& v) {
  if (!v.is_integer()) return std::nullopt;
  try {
    return v.as_int64();
  } catch (const error&) {
    return std::nullopt;
  }
}

/// A field of `e` as an integer.
inline std::optional<std::int64_t> int_field(const json& e, std::string_view key) {
  const json* v = e.find(key);
  return v != nullptr ? integer(*v) : std::nullopt;
}

/// A field of `e` as a number.
inline std::optional<double> number_field(const json& e, std::string_view key) {
  const json* v = e.find(key);
  return v != nullptr && v->is_number() ? std::optional<double>(v->as_double()) : std::nullopt;
}

/// A field of `e` as a boolean (false when absent).
inline bool bool_field(const json& e, std::string_view key) {
  const json* v = e.find(key);
  return v != nullptr && v->is_bool() && v->as_bool();
}

/// The integers of a field that is a JSON array of them, a comma-separated string ("1,3") or
/// one integer: group_culprit names ranks and pids either way.
inline std::vector<std::int64_t> number_list(const json& e, std::string_view key) {
  std::vector<std::int64_t> out;
  const json* v = e.find(key);
  if (v != nullptr && v->is_array()) {
    for (const auto& x : v->elements()) {
      if (const auto n = integer(x)) out.push_back(*n);
    }
  } else if (v != nullptr && v->is_string()) {
    std::string_view s = v->as_string();
    while (!s.empty()) {
      const auto comma = std::min(s.find(','), s.size());
      if (const auto n = elastic::internal::parse_integer(s.substr(0, comma))) out.push_back(*n);
      s.remove_prefix(std::min(comma + 1, s.size()));
    }
  } else if (const auto n = v != nullptr ? integer(*v) : std::nullopt) {
    out.push_back(*n);
  }
  return out;
}

/// Any field as short text, for titles and tables: strings as they are, the rest as JSON.
inline std::string any_field(const json& e, std::string_view key) {
  const json* v = e.find(key);
  if (v == nullptr || v->is_null()) return {};
  return v->is_string() ? v->as_string() : v->dump();
}

/// Reads events files into an event_set.
class event_reader {
 public:
  /// Lines longer than this are skipped (a stack dump of every thread is well below it).
  static constexpr std::size_t max_line = std::size_t(8) << 20;
  /// Kept events beyond this are counted only: a page of millions of marks helps nobody.
  static constexpr std::size_t max_kept = 200'000;
  static constexpr std::size_t skipped_listed = 20;

  /// Takes every line of `text` (a last line without '\n' too), read from `source`.
  void add(std::string_view source, std::string_view text) {
    set_.sources.emplace_back(source);
    std::size_t line_no = 0;
    while (!text.empty()) {
      const auto nl = text.find('\n');
      const auto line = text.substr(0, nl);
      text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
      ++line_no;
      if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
      ++set_.lines;
      take(source, line_no, line);
    }
  }

  /// Something the reader's caller could not read whole (a file cut at a size limit).
  void note(std::string text) { set_.notes.push_back(std::move(text)); }

  /// The events, sorted by time (and input order among equal times).
  event_set finish() && {
    std::stable_sort(set_.events.begin(), set_.events.end(),
                     [](const event& a, const event& b) { return a.t < b.t; });
    return std::move(set_);
  }

 private:
  void skip(std::string_view source, std::size_t line_no, std::string why) {
    ++set_.malformed;
    if (set_.first_skipped.size() < skipped_listed) {
      set_.first_skipped.push_back({.source = std::string(source), .line = line_no, .why = std::move(why)});
    }
  }

  void take(std::string_view source, std::size_t line_no, std::string_view line) {
    if (line.size() > max_line) return skip(source, line_no, fmt::format("a line of {} bytes: too long", line.size()));
    event e;
    try {
      e.fields = json::parse(line);
    } catch (const error& ex) {
      return skip(source, line_no, fmt::format("not JSON: {}", ex.message()));
    }
    if (!e.fields.is_object()) return skip(source, line_no, "not a JSON object");
    const json* name = e.fields.find("event");
    const json* ts = e.fields.find("ts");
    if (name == nullptr || !name->is_string() || name->as_string().empty()) {
      return skip(source, line_no, "no \"event\" name");
    }
    if (ts == nullptr || !ts->is_string() || (e.t = detail::parse_ts(ts->as_string())) <= 0) {
      return skip(source, line_no, "no readable \"ts\" (RFC 3339, UTC)");
    }
    e.name = name->as_string();
    ++set_.counts[e.name];
    if (counted_only(e.name)) {
      ++set_.dropped;
      return;
    }
    if (set_.events.size() >= max_kept) {
      ++set_.over_limit;
      return;
    }
    if (const json* h = e.fields.find("host"); h != nullptr && h->is_string()) e.host = h->as_string();
    e.pid = int_field(e.fields, "pid").value_or(-1);
    e.rank = int_field(e.fields, "rank");
    e.order = order_++;
    set_.events.push_back(std::move(e));
  }

  event_set set_;
  std::size_t order_ = 0;
};

}  // namespace elastic::agent::timeline
