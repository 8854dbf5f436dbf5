// What a run keeps on disk: DIR/RUN_ID (--log-dir), one rank-N.log per worker slot, and the
// events file (DIR/RUN_ID/events.jsonl, or --events). All are opened through private_dir, so a
// directory or file another user planted is refused, never written through. A path that cannot
// be used is an error naming its flag: errc::invalid_argument (exit 2), or errc::unsafe_path.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "launch_options.hpp"
#include <elastic/internal/file.hpp>
#include <elastic/internal/private_dir.hpp>
#include <elastic/error.hpp>

namespace elastic::agent {

namespace detail {

/// A path given on the command line that cannot be used: exit 2 (unsafe_path keeps its code).
inline error bad_path(std::string_view flag, const std::filesystem::path& p, const error& e) {
  return error(e.code() == errc::unsafe_path ? errc::unsafe_path : errc::invalid_argument,
               fmt::format("{} {}: {}", flag, p.string(), e.message()), e.os_code());
}

/// The events file --events names, opened for reading back and appending.
inline elastic::internal::unique_fd open_events_file(const std::filesystem::path& events, int flags) {
  const auto name = events.filename();
  if (name.empty() || name == "." || name == "..") {
    throw error(errc::invalid_argument, fmt::format("--events {}: name a file, not a directory", events.string()));
  }
  try {
    const auto parent = events.parent_path();
    return elastic::internal::private_dir::open(parent.empty() ? std::filesystem::path(".") : parent)
        .open_file(name.string(), flags);
  } catch (const error& e) {
    throw bad_path("--events", events, e);
  }
}

}  // namespace detail

/// The run's directory, its rank logs and its events file, open.
struct run_files {
  elastic::internal::private_dir dir;            ///< DIR/RUN_ID
  std::vector<elastic::internal::unique_fd> logs;  ///< rank-N.log, one per slot (taken by the slots)
  elastic::internal::unique_fd events;
  std::uint64_t events_offset = 0;  ///< the events file's size when opened: what follows is this run's

  /// Creates (or opens) DIR/RUN_ID, the rank logs and the events file of `o`; fills in
  /// o.events when it was left to its default.
  static run_files open(launch_options& o) {
    run_files f;
    try {
      f.dir = elastic::internal::private_dir::open(o.log_dir).subdir(o.run_id);
    } catch (const error& e) {
      throw detail::bad_path("--log-dir", o.log_dir, e);
    }
    for (std::size_t i = 0; i < o.nproc_per_node; ++i) {
      try {
        f.logs.push_back(f.dir.open_file(fmt::format("rank-{}.log", i), O_WRONLY | O_APPEND | O_CREAT));
      } catch (const error& e) {
        throw detail::bad_path("--log-dir", o.log_dir, e);
      }
    }
    constexpr int events_flags = O_RDWR | O_APPEND | O_CREAT;  // we read it back too
    if (o.events.empty()) {
      o.events = f.dir / "events.jsonl";
      try {
        f.events = f.dir.open_file("events.jsonl", events_flags);
      } catch (const error& e) {
        throw detail::bad_path("--log-dir", o.log_dir, e);
      }
    } else {
      f.events = detail::open_events_file(o.events, events_flags);
    }
    // A retried run appends to the same file: only what comes after this point is ours.
    struct stat st {};
    f.events_offset = ::fstat(f.events.get(), &st) == 0 ? static_cast<std::uint64_t>(st.st_size) : 0;
    return f;
  }
};

}  // namespace elastic::agent
