// The structured event log of docs/design.md: one JSON object per line, appended with O_APPEND so
// lines from many processes never interleave, so that a killed worker's story outlives it.
//
//   {"ts":"2026-11-22T20:28:00.123456Z","event":"watchdog_kill","run_id":"job7","host":"h1",
//    "pid":4242,"rank":0,"target_pid":4300,"scope":"allreduce",...}
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include <elastic/detail/env.hpp>
#include <elastic/detail/file.hpp>
#include <elastic/detail/json_text.hpp>
#include <elastic/detail/private_dir.hpp>
#include <elastic/error.hpp>

namespace elastic {

namespace events {

/// Where finished lines go. A sink receives one whole line (with its '\n') per call and must
/// write it with a single write so that concurrent writers never interleave.
class sink {
 public:
  virtual ~sink() = default;
  /// Writes one line; never throws (an event log must not take training down).
  virtual void write(std::string_view line) noexcept = 0;
};

/// Appends to a file opened with O_APPEND; many processes may share the file.
///
/// A process running as root must never append through a link someone else planted, so the
/// path is opened with O_NOFOLLOW (a symbolic link at its end is refused), a symbolic link of
/// another user on the way to it is refused (detail::check_path_links), and what it opens must
/// be a regular file of this user with a single name (detail::unsafe_file_reason: no FIFO, device,
/// directory or hard link to another file). Each refusal is errc::unsafe_path naming the path.
class file_sink final : public sink {
 public:
  /// Opens (creating with mode 0644) `path` for appending, under the rule above. Throws
  /// elastic::error: unsafe_path for a refused path, os_error (with the errno) when the file
  /// cannot be opened, invalid_argument for a directory; each names the path, introduced as
  /// `what` ("events file", "ELASTIC_EVENTS file").
  explicit file_sink(const std::filesystem::path& path, std::string_view what = "events file")
      : fd_(open_checked(path, what)) {}

  /// Appends to `fd`, which the sink now owns and closes: for a file its owner already opened
  /// safely (say, through detail::private_dir::open_file with O_WRONLY | O_APPEND). Throws
  /// errc::invalid_argument when `fd` is not open.
  explicit file_sink(elastic::detail::unique_fd fd) : fd_(std::move(fd)) {
    if (!fd_) throw error(errc::invalid_argument, "events file_sink given no open descriptor");
  }

  file_sink(const file_sink&) = delete;
  file_sink& operator=(const file_sink&) = delete;

  void write(std::string_view line) noexcept override {
    // Regular files opened with O_APPEND take one write() atomically; retry only on EINTR.
    while (::write(fd_.get(), line.data(), line.size()) < 0 && errno == EINTR) {
    }
  }

 private:
  static elastic::detail::unique_fd open_checked(const std::filesystem::path& path, std::string_view what) {
    const std::string shown = std::string(what) + " " + path.string();
    if (path.empty()) throw error(errc::invalid_argument, std::string(what) + " is empty: name a file");
    elastic::detail::check_path_links(path);  // a link of another user on the way: unsafe_path
    const auto refuse = [&](std::string_view why, int err = 0) {
      return error(errc::unsafe_path,
                   "refusing to append to " + shown + ": " + std::string(why) +
                       "; elastic never writes events through a link or into a file that is not a regular file "
                       "of its own user: name another file",
                   err != 0 ? std::error_code(err, std::generic_category()) : std::error_code());
    };
    int fd;
    // O_NONBLOCK: opening a FIFO planted in the file's place must fail (ENXIO), not wait
    // forever for a reader; it changes nothing for a regular file.
    do {
      fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) {
      const int err = errno;
      if (err == ELOOP) throw refuse("it is a symbolic link");
      if (err == ENXIO) throw refuse("it is a FIFO or socket", err);
      if (err == EISDIR) {
        throw error(errc::invalid_argument,
                    shown + " is a directory: name a file in it, such as " + (path / "events.jsonl").string(),
                    std::error_code(err, std::generic_category()));
      }
      throw os_error("cannot open " + shown + " for appending: check that its directory exists and that this "
                     "user may write there",
                     err);
    }
    elastic::detail::unique_fd out(fd);
    struct stat st {};
    if (::fstat(out.get(), &st) != 0) throw os_error("cannot stat " + shown);
    if (auto why = elastic::detail::unsafe_file_reason(st); !why.empty()) throw refuse(why);
    ::fcntl(out.get(), F_SETFL, O_APPEND);  // blocking again: a full disk must not drop half a line
    return out;
  }

  elastic::detail::unique_fd fd_;
};

/// Writes to a descriptor it does not own, such as stderr.
class fd_sink final : public sink {
 public:
  explicit fd_sink(int fd) noexcept : fd_(fd) {}
  void write(std::string_view line) noexcept override {
    while (::write(fd_, line.data(), line.size()) < 0 && errno == EINTR) {
    }
  }

 private:
  int fd_;
};

/// Events that say something went wrong, was refused or was given up on: all that a console
/// shows of a run without an events file (the rest, progress, would drown the trainer's output).
inline bool is_warning(std::string_view event) noexcept {
  constexpr std::string_view endings[] = {"_failed",     "_failure",    "_refused",  "_error",       "_exceeded",
                                          "_full",       "_lost",       "_timeout",  "_unavailable", "_unagreed",
                                          "_unacknowledged", "_skipped", "_quarantined", "_unwatched", "_kill",
                                          "_escalate",   "_crash_loop", "_departure", "_interrupted"};
  for (const auto e : endings)
    if (event.ends_with(e)) return true;
  return false;
}

}  // namespace events

/// A value of an event field: integer, floating point, boolean, string or null.
class event_value {
 public:
  enum class kind { null, boolean, integer, unsigned_integer, floating, string };

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

namespace detail {

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

}  // namespace detail

inline void event_value::append_json(std::string& out) const {
  switch (kind_) {
    case kind::null: out += "null"; break;
    case kind::boolean: out += i_ ? "true" : "false"; break;
    case kind::integer: detail::append_json_integer(out, i_); break;
    case kind::unsigned_integer: detail::append_json_integer(out, u_); break;
    case kind::floating: detail::append_json_double(out, d_); break;  // JSON has no NaN: null
    case kind::string: detail::append_json_string(out, s_); break;
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
    id.run_id = elastic::detail::env_string("ELASTIC_RUN_ID").value_or("");
    id.rank = elastic::detail::env_index_or_none("ELASTIC_RANK");
    char host[256] = {};
    if (::gethostname(host, sizeof host - 1) == 0) id.host = host;
    return id;
  }
};

/// A JSON-lines event log. Copies share the sink. Emitting is thread-safe and lock-free: each
/// line is formatted in a local buffer and handed to the sink in one write.
class event_log {
 public:
  /// A log that drops everything.
  event_log() = default;

  /// A log writing to `sink` with the given common fields.
  explicit event_log(std::shared_ptr<events::sink> sink,
                     event_identity identity = event_identity::from_env())
      : sink_(std::move(sink)), id_(std::move(identity)) {}

  /// Appends to `path` (created if missing), refusing links and files that are not this
  /// user's own (see events::file_sink). Throws elastic::error naming the path.
  static event_log to_file(const std::filesystem::path& path,
                           event_identity identity = event_identity::from_env()) {
    return event_log(std::make_shared<events::file_sink>(path), std::move(identity));
  }

  /// Appends to the open descriptor `fd`, which the log now owns (closed with the last copy):
  /// for an events file opened safely by its owner, say through detail::private_dir.
  static event_log to_file(elastic::detail::unique_fd fd, event_identity identity = event_identity::from_env()) {
    return event_log(std::make_shared<events::file_sink>(std::move(fd)), std::move(identity));
  }

  /// Appends every event to the file named by ELASTIC_EVENTS (elastic-run sets it). Without it,
  /// writes to stderr only the warnings (events::is_warning), or every event with
  /// `everything_to_stderr` (a program whose stderr is its log). Throws elastic::error, naming
  /// ELASTIC_EVENTS and the path, when that file is refused or cannot be opened.
  static event_log from_env(bool everything_to_stderr = false) {
    if (auto path = elastic::detail::env_string("ELASTIC_EVENTS")) {
      return event_log(std::make_shared<events::file_sink>(*path, "ELASTIC_EVENTS file"));
    }
    event_log log(std::make_shared<events::fd_sink>(STDERR_FILENO));
    if (!everything_to_stderr) log.keep_ = events::is_warning;
    return log;
  }

  [[nodiscard]] bool enabled() const noexcept { return sink_ != nullptr; }
  [[nodiscard]] const event_identity& identity() const noexcept { return id_; }
  void set_rank(std::optional<long> rank) { id_.rank = rank; }

  /// The line `emit` would write, without its newline.
  [[nodiscard]] std::string format(std::string_view event,
                                   std::initializer_list<event_field> fields = {}) const {
    std::string line;
    format_to(line, event, fields);
    return line;
  }

  /// Writes one event. Never throws: a failure to log is dropped, not turned into a crash.
  void emit(std::string_view event, std::initializer_list<event_field> fields = {}) const noexcept {
    if (!sink_ || (keep_ != nullptr && !keep_(event))) return;
    try {
      std::string line;
      line.reserve(256);
      format_to(line, event, fields);
      line += '\n';
      sink_->write(line);
    } catch (...) {
    }
  }

 private:
  void format_to(std::string& buf, std::string_view event,
                 std::initializer_list<event_field> fields) const {
    auto key = [&](std::string_view k) {
      buf += ',';
      detail::append_json_string(buf, k);
      buf += ':';
    };
    buf += "{\"ts\":\"";
    detail::append_rfc3339_now(buf);
    buf += "\",\"event\":";
    detail::append_json_string(buf, event);
    key("run_id");
    detail::append_json_string(buf, id_.run_id);
    key("host");
    detail::append_json_string(buf, id_.host);
    key("pid");
    detail::append_json_integer(buf, static_cast<long>(::getpid()));
    if (id_.rank) {
      key("rank");
      detail::append_json_integer(buf, *id_.rank);
    }
    for (const auto& f : fields) {
      key(f.key);
      f.value.append_json(buf);
    }
    buf += '}';
  }

  std::shared_ptr<events::sink> sink_;
  event_identity id_;
  bool (*keep_)(std::string_view) noexcept = nullptr;  ///< nullptr: every event
};

}  // namespace elastic
