// Warnings from code that must stay cheap to include (a timer scope's first use in a process).
// They go through a route that the event log installs (events.hpp), so in a program that includes
// the event log anywhere they are events like every other. A program that includes nothing but
// <elastic/timer/expires.hpp> writes the same line itself: appended to the file ELASTIC_EVENTS
// names (opened as the event log opens it, except that links of other users on the way to it are
// not looked for), or, without one, to stderr.
#pragma once

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include <elastic/internal/env.hpp>
#include <elastic/internal/append_file.hpp>
#include <elastic/internal/unique_fd.hpp>
#include <elastic/event_fields.hpp>

namespace elastic::inline v1::internal {

using warning_sink = void (*)(std::string_view event, std::span<const event_field> fields) noexcept;

/// The installed route for warnings; nullptr until the event log installs its own.
inline std::atomic<warning_sink> warning_route{nullptr};

/// Reports a warning event. Never throws: a failure to warn is dropped.
inline void warn(std::string_view event, std::initializer_list<event_field> fields) noexcept {
  const std::span<const event_field> all(fields.begin(), fields.size());
  if (const warning_sink route = warning_route.load(std::memory_order_acquire)) return route(event, all);
  try {
    std::string line;
    append_event_line(line, event, event_identity::from_env(), all);
    line += '\n';
    unique_fd file;
    if (const auto path = env_string("ELASTIC_EVENTS")) file = std::move(open_for_append(path->c_str()).fd);
    const int fd = file ? file.get() : STDERR_FILENO;
    while (::write(fd, line.data(), line.size()) < 0 && errno == EINTR) {
    }
  } catch (...) {
  }
}

}  // namespace elastic::inline v1::internal
