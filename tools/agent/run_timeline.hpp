// A run's timeline: its events file drawn as one self-contained HTML page (timeline_page.hpp).
// elastic-run writes it at the end of every run, finished, failed or interrupted, beside the
// events file (DIR/RUN_ID/timeline.html; beside --events FILE.jsonl as FILE.timeline.html) or
// where --timeline says; elastic-report draws any events files the same way.
//
// The launcher reads the events back through the descriptor it appended with (never by path
// again) and writes the page through private_dir (no planted link is followed; readers see the
// old page or the whole new one). Nothing here may fail the run: a page that cannot be written
// is a line in the summary saying why.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include <fmt/format.h>

#include "launch_options.hpp"
#include "run_files.hpp"
#include "timeline_events.hpp"
#include "timeline_model.hpp"
#include "timeline_page.hpp"
#include <elastic/error.hpp>
#include <elastic/internal/file.hpp>
#include <elastic/internal/private_dir.hpp>

namespace elastic::agent {

/// Most bytes of events one page is drawn from; of a larger input the last part is read.
inline constexpr std::uint64_t timeline_input_limit = std::uint64_t(256) << 20;

/// The page of the events read into `reader`.
inline std::string render_timeline(timeline::event_reader&& reader, const timeline::page_info& info) {
  const auto set = std::move(reader).finish();
  return timeline::render_page(timeline::build_model(set), set, info);
}

/// The timeline's default name beside an events file: events.jsonl → timeline.html, any other
/// NAME.EXT → NAME.timeline.html.
inline std::filesystem::path default_timeline_path(const std::filesystem::path& events) {
  const auto name = events.filename();
  if (name == "events.jsonl") return events.parent_path() / "timeline.html";
  return events.parent_path() / (events.stem().string() + ".timeline.html");
}

/// The text of the file open on `fd` (not owned), at most its last `limit` bytes from a line's
/// start; `note` says what was left out. Throws errc::os_error when it cannot be read.
inline std::string read_events_fd(int fd, std::string_view name, std::uint64_t limit, std::string& note) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw os_error(fmt::format("cannot stat {}", name));
  const bool regular = S_ISREG(st.st_mode);
  const auto size = static_cast<std::uint64_t>(st.st_size);
  bool cut = regular && size > limit;
  std::uint64_t at = cut ? size - limit : 0;
  std::string text;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = regular ? ::pread(fd, buf, sizeof buf, static_cast<off_t>(at)) : ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw os_error(fmt::format("cannot read {}", name));
    if (n == 0) break;
    text.append(buf, static_cast<std::size_t>(n));
    at += static_cast<std::uint64_t>(n);
    if (text.size() > limit) {  // a pipe, or a file still growing: keep its last `limit` bytes
      text.erase(0, text.size() - limit);
      cut = true;
    }
  }
  if (cut) {
    const auto nl = text.find('\n');
    text.erase(0, nl == std::string::npos ? text.size() : nl + 1);
    note = fmt::format("{} is larger than {} MiB: only its last {} MiB are drawn", name, limit >> 20, limit >> 20);
  }
  return text;
}

/// Where elastic-run writes its run's timeline, and the writing.
class run_timeline {
 public:
  run_timeline() = default;

  /// Opens the directory the page of `o` goes to (beside o.events, or --timeline), checked like
  /// every path of the run: a path that cannot be used is an error naming --timeline (exit 2).
  /// Nothing is opened with --no-timeline.
  static run_timeline open(const launch_options& o) {
    run_timeline t;
    if (o.no_timeline) return t;
    t.path_ = o.timeline.empty() ? default_timeline_path(o.events) : o.timeline;
    const auto name = t.path_.filename();
    if (name.empty() || name == "." || name == "..") {
      throw error(errc::invalid_argument, fmt::format("--timeline {}: name a file, not a directory", t.path_.string()));
    }
    auto normal = [](const std::filesystem::path& p) {
      std::error_code ec;  // a path that cannot be made absolute is compared as it is
      const auto a = std::filesystem::absolute(p, ec);
      return (ec ? p : a).lexically_normal();
    };
    if (normal(t.path_) == normal(o.events)) {
      throw error(errc::invalid_argument,
                  fmt::format("--timeline {} names the events file: give the page a name of its own", t.path_.string()));
    }
    try {
      const auto parent = t.path_.parent_path();
      t.dir_ = elastic::internal::private_dir::open(parent.empty() ? std::filesystem::path(".") : parent);
    } catch (const error& e) {
      throw detail::bad_path(o.timeline.empty() ? "--events" : "--timeline", t.path_, e);
    }
    t.name_ = name.string();
    t.events_name_ = o.events.filename().string();
    return t;
  }

  /// Draws the events file open on `events_fd` and writes the page; returns what the summary
  /// says: the page's path, or why there is none ("" with --no-timeline). Never throws.
  std::string write(int events_fd, std::string_view generator) const noexcept {
    if (!dir_) return {};
    try {
      timeline::event_reader reader;
      std::string note;
      reader.add(events_name_, read_events_fd(events_fd, events_name_, timeline_input_limit, note));
      if (!note.empty()) reader.note(note);
      dir_.write_atomic(name_, render_timeline(std::move(reader), {.generator = std::string(generator), .notes = {}}));
      return path_.string();
    } catch (const error& e) {
      return fmt::format("not written: {}", e.os_code() ? fmt::format("{} ({})", e.message(), e.os_code().message())
                                                        : e.message());
    } catch (const std::exception& e) {
      return fmt::format("not written: {}", e.what());
    } catch (...) {
      return "not written: an unexpected error";
    }
  }

 private:
  elastic::internal::private_dir dir_;
  std::string name_, events_name_;
  std::filesystem::path path_;
};

}  // namespace elastic::agent
