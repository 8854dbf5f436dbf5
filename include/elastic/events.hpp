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
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <elastic/internal/env.hpp>
#include <elastic/internal/file.hpp>
#include <elastic/internal/private_dir.hpp>
#include <elastic/internal/warning_hook.hpp>
#include <elastic/error.hpp>
#include <elastic/event_fields.hpp>

namespace elastic::inline v1 {

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
/// another user on the way to it is refused (internal::check_path_links), and what it opens must
/// be a regular file of this user with a single name (internal::unsafe_file_reason: no FIFO, device,
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
  /// safely (say, through internal::private_dir::open_file with O_WRONLY | O_APPEND). Throws
  /// errc::invalid_argument when `fd` is not open.
  explicit file_sink(elastic::internal::unique_fd fd) : fd_(std::move(fd)) {
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
  static elastic::internal::unique_fd open_checked(const std::filesystem::path& path, std::string_view what) {
    const std::string shown = std::string(what) + " " + path.string();
    if (path.empty()) throw error(errc::invalid_argument, std::string(what) + " is empty: name a file");
    elastic::internal::check_path_links(path);  // a link of another user on the way: unsafe_path
    const auto refuse = [&](std::string_view why, int err = 0) {
      return error(errc::unsafe_path,
                   "refusing to append to " + shown + ": " + std::string(why) +
                       "; elastic never writes events through a link or into a file that is not a regular file "
                       "of its own user: name another file",
                   err != 0 ? std::error_code(err, std::generic_category()) : std::error_code());
    };
    auto opened = elastic::internal::open_for_append(path.c_str());
    if (const int err = opened.open_errno; err != 0) {
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
    if (opened.stat_errno != 0) throw os_error("cannot stat " + shown, opened.stat_errno);
    if (!opened.unsafe.empty()) throw refuse(opened.unsafe);
    return std::move(opened.fd);
  }

  elastic::internal::unique_fd fd_;
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

}  // namespace events

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
  /// for an events file opened safely by its owner, say through internal::private_dir.
  static event_log to_file(elastic::internal::unique_fd fd, event_identity identity = event_identity::from_env()) {
    return event_log(std::make_shared<events::file_sink>(std::move(fd)), std::move(identity));
  }

  /// Appends every event to the file named by ELASTIC_EVENTS (elastic-run sets it). Without it,
  /// writes to stderr only the warnings (events::is_warning), or every event with
  /// `everything_to_stderr` (a program whose stderr is its log). Throws elastic::error, naming
  /// ELASTIC_EVENTS and the path, when that file is refused or cannot be opened.
  static event_log from_env(bool everything_to_stderr = false) {
    if (auto path = elastic::internal::env_string("ELASTIC_EVENTS")) {
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
    format_to(line, event, std::span<const event_field>(fields.begin(), fields.size()));
    return line;
  }

  /// Writes one event. Never throws: a failure to log is dropped, not turned into a crash.
  void emit(std::string_view event, std::initializer_list<event_field> fields = {}) const noexcept {
    emit(event, std::span<const event_field>(fields.begin(), fields.size()));
  }

  /// Writes one event whose fields were gathered at run time.
  void emit(std::string_view event, std::span<const event_field> fields) const noexcept {
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
  void format_to(std::string& buf, std::string_view event, std::span<const event_field> fields) const {
    internal::append_event_line(buf, event, id_, fields);
  }

  std::shared_ptr<events::sink> sink_;
  event_identity id_;
  bool (*keep_)(std::string_view) noexcept = nullptr;  ///< nullptr: every event
};

namespace internal {

/// The event log's route for warnings from light headers (warning_hook.hpp): each becomes an
/// event of event_log::from_env(), or a line on stderr when that log cannot be opened.
inline void warn_through_event_log(std::string_view event, std::span<const event_field> fields) noexcept {
  try {
    event_log log;
    try {
      log = event_log::from_env();
    } catch (...) {
      log = event_log(std::make_shared<events::fd_sink>(STDERR_FILENO));
    }
    log.emit(event, fields);
  } catch (...) {
  }
}

/// Installed by every program that includes the event log, before main() runs.
inline const bool event_log_takes_warnings =
    (warning_route.store(&warn_through_event_log, std::memory_order_release), true);

}  // namespace internal

}  // namespace elastic::inline v1
