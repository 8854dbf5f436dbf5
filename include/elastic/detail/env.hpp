// Reading the worker environment of DESIGN.md (ELASTIC_RANK, ELASTIC_RUN_ID, ...).
#pragma once

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include <elastic/error.hpp>

namespace elastic::detail {

/// The variable's value, or nullopt when it is unset or empty.
inline std::optional<std::string> env_string(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

/// The variable as a non-negative integer; nullopt when unset; an error naming the variable
/// when it is set to something else.
inline std::optional<long> env_index(const char* name) {
  auto v = env_string(name);
  if (!v) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  long n = std::strtol(v->c_str(), &end, 10);
  if (errno != 0 || end == v->c_str() || *end != '\0' || n < 0) {
    throw error(errc::invalid_argument,
                std::string(name) + "='" + *v + "' is not a non-negative integer: fix or unset it");
  }
  return n;
}

/// Like env_index, but a malformed value counts as unset: for code that must not throw, such as
/// the first timer scope of a training step.
inline std::optional<long> env_index_or_none(const char* name) noexcept {
  try {
    return env_index(name);
  } catch (...) {
    return std::nullopt;
  }
}

/// The variable as a duration in seconds ("30", "2.5"); nullopt when unset; an error naming
/// the variable when it is set to something else.
inline std::optional<std::chrono::milliseconds> env_seconds(const char* name) {
  auto v = env_string(name);
  if (!v) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const double s = std::strtod(v->c_str(), &end);
  if (errno != 0 || end == v->c_str() || *end != '\0' || !(s >= 0) || s > 1e9) {
    throw error(errc::invalid_argument,
                std::string(name) + "='" + *v + "' is not a number of seconds (e.g. 30 or 2.5): fix or unset it");
  }
  return std::chrono::milliseconds(static_cast<std::int64_t>(std::llround(s * 1000)));
}

}  // namespace elastic::detail
