// What one event says and how it is written: the field values, who writes it, and the JSON
// line itself. The event log (events.hpp) and the warnings of light headers (warning_hook.hpp)
// both write lines with this, so every line has the same shape wherever it comes from.
//
//   {"ts":"2026-11-22T20:28:00.123456Z","event":"watchdog_kill","run_id":"job7","host":"h1",
//    "pid":4242,"rank":0,"target_pid":4300,"scope":"allreduce",...}
#pragma once

#include <time.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include <elastic/internal/env.hpp>
#include <elastic/internal/host_name.hpp>
#include <elastic/internal/json_text.hpp>

namespace elastic::inline v1 {

namespace events {

/// Events that say something went wrong, was refused or was given up on: all that a console
/// shows of a run without an events file (the rest, progress, would drown the trainer's output).
inline bool is_warning(std::string_view event) noexcept {
  constexpr std::string_view endings[] = {"_failed",     "_failure",    "_refused",  "_error",       "_exceeded",
                                          "_full",       "_lost",       "_timeout",  "_unavailable", "_unagreed",
                                          "_unacknowledged", "_skipped", "_quarantined", "_unwatched", "_kill",
                                          "_escalate",   "_crash_loop", "_departure", "_interrupted", "_stack",
                                          "_warning",    "_raised"};
  for (const auto e : endings)
    if (event.ends_with(e)) return true;
  return false;
}

}  // namespace events

/// A value of an event field: integer, floating point, boolean, string or null; or, made with
/// event_value::json(), an array or object already encoded as JSON.
class event_value {
 public:
  enum class kind { null, boolean, integer, unsigned_integer, floating, string, json };

  event_value() noexcept = default;
  event_value(std::nullptr_t) noexcept {}
  event_value(bool b) noexcept : kind_(kind::boolean), i_(b) {}
  template <class T>
    requires(std::is_integral_v<T> && !std::is_same_v<T, bool> && std::is_signed_v<T>)
  event_value(T v) noexcept : kind_(kind::integer), i_(v) {}
  template <class T>
    requires(std::is_integral_v<T> && !std::is_same_v<T, bool> && std::is_unsigned_v<T>)
  event_value(T v) noexcept : kind_(kind::unsigned_integer), u_(v) {}
  event_value(double v) noexcept : kind_(kind::floating), d_(v) {}
  event_value(std::string_view s) noexcept : kind_(kind::string), s_(s) {}
  event_value(const char* s) noexcept : kind_(kind::string), s_(s) {}
  event_value(const std::string& s) noexcept : kind_(kind::string), s_(s) {}

  /// A value that is already JSON text (say, an array of objects: fields are flat, but one may
  /// carry a structure), written into the line as it is. The caller answers for it being one
  /// valid JSON value without a newline; the text must outlive the value, as a string's does.
  static event_value json(std::string_view encoded) noexcept {
    event_value v;
    v.kind_ = kind::json;
    v.s_ = encoded;
    return v;
  }

  /// Appends this value as JSON.
  void append_json(std::string& out) const;

 private:
  kind kind_ = kind::null;
  std::int64_t i_ = 0;
  std::uint64_t u_ = 0;
  double d_ = 0;
  std::string_view s_;
};

/// One `"key": value` pair of an event.
struct event_field {
  std::string_view key;
  event_value value;
};

namespace internal {

/// The current UTC time as RFC 3339 with microseconds: 2026-11-22T20:28:00.123456Z.
inline void append_rfc3339_now(std::string& out) {
  timespec ts;
  ::clock_gettime(CLOCK_REALTIME, &ts);
  std::tm tm{};
  ::gmtime_r(&ts.tv_sec, &tm);
  char buf[40];
  const int n = std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%06ldZ", tm.tm_year + 1900, tm.tm_mon + 1,
                              tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<long>(ts.tv_nsec / 1000));
  if (n > 0) out.append(buf, static_cast<std::size_t>(n) < sizeof buf ? static_cast<std::size_t>(n) : sizeof buf - 1);
}

/// The current UTC time as RFC 3339 with microseconds.
inline std::string rfc3339_now() {
  std::string out;
  append_rfc3339_now(out);
  return out;
}

}  // namespace internal

inline void event_value::append_json(std::string& out) const {
  switch (kind_) {
    case kind::null: out += "null"; break;
    case kind::boolean: out += i_ ? "true" : "false"; break;
    case kind::integer: internal::append_json_integer(out, i_); break;
    case kind::unsigned_integer: internal::append_json_integer(out, u_); break;
    case kind::floating: internal::append_json_double(out, d_); break;  // JSON has no NaN: null
    case kind::string: internal::append_json_string(out, s_); break;
    case kind::json: out += s_.empty() ? std::string_view("null") : s_; break;
  }
}

/// Who writes the events: the common fields of every line.
struct event_identity {
  std::string run_id;       ///< ELASTIC_RUN_ID, or empty
  std::string host;         ///< gethostname()
  std::optional<long> rank; ///< ELASTIC_RANK when set

  /// Reads ELASTIC_RUN_ID and ELASTIC_RANK (a malformed rank is left out) and the host name.
  static event_identity from_env() {
    event_identity id;
    id.run_id = elastic::internal::env_string("ELASTIC_RUN_ID").value_or("");
    id.rank = elastic::internal::env_index_or_none("ELASTIC_RANK");
    id.host = internal::host_name();
    return id;
  }
};

namespace internal {

/// Appends the JSON line (without its newline) for `event` written by `id` with `fields`.
inline void append_event_line(std::string& out, std::string_view event, const event_identity& id,
                              std::span<const event_field> fields) {
  auto key = [&](std::string_view k) {
    out += ',';
    append_json_string(out, k);
    out += ':';
  };
  out += "{\"ts\":\"";
  append_rfc3339_now(out);
  out += "\",\"event\":";
  append_json_string(out, event);
  key("run_id");
  append_json_string(out, id.run_id);
  key("host");
  append_json_string(out, id.host);
  key("pid");
  append_json_integer(out, static_cast<long>(::getpid()));
  if (id.rank) {
    key("rank");
    append_json_integer(out, *id.rank);
  }
  for (const auto& f : fields) {
    key(f.key);
    f.value.append_json(out);
  }
  out += '}';
}

}  // namespace internal

}  // namespace elastic::inline v1
