// Reading the worker environment of docs/design.md (ELASTIC_RANK, ELASTIC_RUN_ID, ...).
//
// A setting that is present but malformed or out of range is an error that names the variable,
// its value and what is accepted: a typo must never silently become "unset" (a run without its
// step timeout, a rendezvous of the wrong size). The range-checked readers (env_int,
// env_seconds_in) are what new code uses; env_index and env_index_or_none stay for the few
// readers that must not throw (a rank for an event, the first timer scope of a step).
#pragma once

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>

#include <elastic/internal/names.hpp>
#include <elastic/error.hpp>

namespace elastic::inline v1::internal {

/// The variable's value, or nullopt when it is unset or empty.
inline std::optional<std::string> env_string(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

/// `text` as a whole decimal integer (no sign other than '-', no spaces), or nullopt.
inline std::optional<long long> parse_integer(std::string_view text) noexcept {
  long long n = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) return std::nullopt;
  return n;
}

/// The variable as an integer in [lo, hi]; nullopt when unset (or empty). Anything else (not a
/// number, a fraction, out of range) is errc::invalid_argument naming the variable and the range.
inline std::optional<long long> env_int(const char* name, long long lo, long long hi) {
  auto v = env_string(name);
  if (!v) return std::nullopt;
  const auto n = parse_integer(*v);
  if (!n || *n < lo || *n > hi) {
    throw error(errc::invalid_argument, std::string(name) + "='" + printable(*v) + "' is " +
                                            (n ? "out of range" : "not an integer") + ": it takes an integer from " +
                                            std::to_string(lo) + " to " + std::to_string(hi) + "; fix or unset it");
  }
  return n;
}

/// The variable as a non-negative integer; nullopt when unset; an error naming the variable
/// when it is set to something else.
inline std::optional<long> env_index(const char* name) {
  auto v = env_string(name);
  if (!v) return std::nullopt;
  const auto n = parse_integer(*v);
  if (!n || *n < 0 || *n > std::numeric_limits<long>::max()) {
    throw error(errc::invalid_argument,
                std::string(name) + "='" + printable(*v) + "' is not a non-negative integer: fix or unset it");
  }
  return static_cast<long>(*n);
}

/// Like env_index, but a malformed value counts as unset: only for code that must not throw,
/// such as the first timer scope of a training step or the rank an event reports. Whoever acts
/// on the value reads it with env_int, which refuses it.
inline std::optional<long> env_index_or_none(const char* name) noexcept {
  try {
    return env_index(name);
  } catch (...) {
    return std::nullopt;
  }
}

/// `text` as a finite decimal number of seconds ("30", "2.5", "1e-3"), or nullopt.
inline std::optional<double> parse_seconds(std::string_view text) noexcept {
  double s = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), s);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty() || !std::isfinite(s)) return std::nullopt;
  return s;
}

/// The variable as a duration in seconds within [min, max], or exactly 0 when `zero` names
/// what 0 means ("no timeout"); nullopt when unset. A value that would round to 0 ms, or to
/// anything outside the range, is refused rather than rounded away: "0.0001" is not "no timeout".
inline std::optional<std::chrono::milliseconds> env_seconds_in(const char* name, std::chrono::milliseconds min,
                                                               std::chrono::milliseconds max,
                                                               std::string_view zero = {}) {
  auto v = env_string(name);
  if (!v) return std::nullopt;
  const auto s = parse_seconds(*v);
  if (s && *s == 0 && !zero.empty()) return std::chrono::milliseconds(0);
  const double ms = s ? *s * 1000 : 0;
  if (!s || !(ms >= static_cast<double>(min.count())) || !(ms <= static_cast<double>(max.count()))) {
    auto secs = [](std::chrono::milliseconds d) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.15g", static_cast<double>(d.count()) / 1000);
      return std::string(buf);
    };
    const std::string range =
        (zero.empty() ? std::string() : "0 (" + std::string(zero) + ") or ") + secs(min) + " to " + secs(max) + " seconds";
    throw error(errc::invalid_argument, std::string(name) + "='" + printable(*v) + "' is " +
                                            (s ? "out of range" : "not a number of seconds") + ": it takes " + range +
                                            "; fix or unset it");
  }
  return std::chrono::milliseconds(static_cast<std::int64_t>(std::llround(ms)));
}

/// The variable as a duration in seconds ("30", "2.5"); nullopt when unset; an error naming
/// the variable when it is set to something else. Prefer env_seconds_in, which checks a range.
inline std::optional<std::chrono::milliseconds> env_seconds(const char* name) {
  auto v = env_string(name);
  if (!v) return std::nullopt;
  const auto s = parse_seconds(*v);
  if (!s || *s < 0 || *s > 1e9) {
    throw error(errc::invalid_argument,
                std::string(name) + "='" + printable(*v) + "' is not a number of seconds (e.g. 30 or 2.5): fix or unset it");
  }
  return std::chrono::milliseconds(static_cast<std::int64_t>(std::llround(*s * 1000)));
}

}  // namespace elastic::inline v1::internal
