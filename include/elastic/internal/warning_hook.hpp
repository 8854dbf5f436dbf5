// Warnings from code that must stay cheap to include (a timer scope's first use in a process).
// They go through a route that the event log installs (events.hpp), so in a program that includes
// the event log anywhere they are events like every other. A program that includes nothing but
// <elastic/timer/expires.hpp> writes the same line itself: appended to the file ELASTIC_EVENTS
// names (opened as the event log opens it, except that links of other users on the way to it are
// not looked for), or, without one, to stderr.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include <elastic/internal/env.hpp>
#include <elastic/internal/unique_fd.hpp>
#include <elastic/event_fields.hpp>

namespace elastic::inline v1::internal {

using warning_sink = void (*)(std::string_view event, std::span<const event_field> fields) noexcept;

/// The installed route for warnings; nullptr until the event log installs its own.
inline std::atomic<warning_sink> warning_route{nullptr};

/// Opens `path` for appending an event line: never through a symbolic link at its end, never a
/// FIFO or device, only a regular file of this user with a single name. An invalid fd otherwise.
inline unique_fd open_events_file_light(const std::string& path) noexcept {
  int fd;
  do {
    fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
  } while (fd < 0 && errno == EINTR);
  unique_fd out(fd);
  struct stat st {};
  if (!out || ::fstat(out.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid() || st.st_nlink != 1) {
    return unique_fd();
  }
  ::fcntl(out.get(), F_SETFL, O_APPEND);  // blocking again: a full disk must not drop half a line
  return out;
}

/// Reports a warning event. Never throws: a failure to warn is dropped.
inline void warn(std::string_view event, std::initializer_list<event_field> fields) noexcept {
  const std::span<const event_field> all(fields.begin(), fields.size());
  if (const warning_sink route = warning_route.load(std::memory_order_acquire)) return route(event, all);
  try {
    std::string line;
    append_event_line(line, event, event_identity::from_env(), all);
    line += '\n';
    unique_fd file;
    if (const auto path = env_string("ELASTIC_EVENTS")) file = open_events_file_light(*path);
    const int fd = file ? file.get() : STDERR_FILENO;
    while (::write(fd, line.data(), line.size()) < 0 && errno == EINTR) {
    }
  } catch (...) {
  }
}

}  // namespace elastic::inline v1::internal
