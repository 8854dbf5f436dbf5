// Text for a run timeline page: times and durations in words, and the two escapes everything
// taken from an events file goes through before it reaches the page. An event's strings are the
// outside world's (a scope name, an error message, a host name can hold `</script>` or
// `<img onerror=...>`): as HTML text or attribute they are escaped with html(); inside the page's
// JSON data block with script_json(), which leaves no '<' for the HTML parser to end it at.
#pragma once

#include <time.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <ctime>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "timeline_events.hpp"

namespace elastic::agent::timeline {

/// `s` escaped for HTML text and for attribute values in double or single quotes.
inline std::string html(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (const char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      case '\0': out += "\xef\xbf\xbd"; break;  // U+FFFD: the HTML parser would drop or replace it anyway
      default: out += c;
    }
  }
  return out;
}

/// A JSON value's text made safe inside <script type="application/json">: '<', '>' and '&' only
/// occur inside JSON strings, where \u003c, \u003e and \u0026 mean the same characters, so no
/// `</script>` or `<!--` is left to end or change the block.
inline std::string script_json(const json& v) {
  const std::string text = v.dump();
  std::string out;
  out.reserve(text.size() + 16);
  for (const char c : text) {
    switch (c) {
      case '<': out += "\\u003c"; break;
      case '>': out += "\\u003e"; break;
      case '&': out += "\\u0026"; break;
      default: out += c;
    }
  }
  return out;
}

/// `s` cut to `max` bytes (at a UTF-8 character boundary), saying how much was left out.
inline std::string shortened(std::string_view s, std::size_t max) {
  if (s.size() <= max) return std::string(s);
  std::size_t cut = max;
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
  return fmt::format("{}… ({} more bytes)", s.substr(0, cut), s.size() - cut);
}

/// A duration in seconds as people say it: "0.35 s", "12.3 s", "4 min 05 s", "2 h 03 min".
inline std::string duration_text(double s) {
  if (!std::isfinite(s) || s < 0) s = 0;
  if (s < 10) return fmt::format("{:.2f} s", s);
  if (s < 120) return fmt::format("{:.1f} s", s);
  const auto whole = static_cast<std::int64_t>(s);
  if (whole < 7200) return fmt::format("{} min {:02} s", whole / 60, whole % 60);
  return fmt::format("{} h {:02} min", whole / 3600, whole / 60 % 60);
}

/// Milliseconds: "0.04 ms", "12 ms", "2.35 s".
inline std::string ms_text(double ms) {
  if (!std::isfinite(ms)) return "?";
  if (ms < 1) return fmt::format("{:.2f} ms", ms);
  if (ms < 1000) return fmt::format("{:.0f} ms", ms);
  return fmt::format("{:.2f} s", ms / 1000);
}

/// Seconds since the epoch as UTC wall time, "2026-11-24 23:52:17.883".
inline std::string utc_text(double t) {
  const auto whole = static_cast<std::time_t>(std::floor(t));
  std::tm tm{};
  ::gmtime_r(&whole, &tm);
  const auto ms = static_cast<int>(std::floor((t - std::floor(t)) * 1000));
  return fmt::format("{:04}-{:02}-{:02} {:02}:{:02}:{:02}.{:03}", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                     tm.tm_hour, tm.tm_min, tm.tm_sec, ms);
}

/// "+12.35 s (23:52:17.883 UTC)": when something happened, from the timeline's start.
inline std::string when_text(double t, double t_first) {
  return fmt::format("+{} ({} UTC)", duration_text(t - t_first), utc_text(t).substr(11));
}

/// The fields that say who logged an event: left out of the lists of its own fields.
inline bool identity_field(std::string_view key) {
  return key == "ts" || key == "event" || key == "run_id" || key == "host" || key == "pid" || key == "rank";
}

/// An event in a few lines, for a tooltip: its name, when, who, then its own fields.
inline std::string event_title(const event& e, double t_first, std::string_view headline = {}) {
  std::string text = headline.empty() ? e.name : std::string(headline);
  text += fmt::format("\n{} · {} pid {}", when_text(e.t, t_first), e.host, e.pid);
  if (e.rank) text += fmt::format(" · rank {}", *e.rank);
  std::size_t shown = 0;
  for (const auto& [key, value] : e.fields.items()) {
    if (identity_field(key)) continue;
    if (++shown > 16) {
      text += "\n…";
      break;
    }
    text += fmt::format("\n{}: {}", key, shortened(value.is_string() ? value.as_string() : value.dump(), 200));
  }
  return text;
}

}  // namespace elastic::agent::timeline
