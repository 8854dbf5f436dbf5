// A worker slot's output: each line to the slot's log file, which is appended to across restarts
// and outlives every worker that wrote it, and to the console with a "[rank N] " prefix. The log
// gets every line; the console only what it keeps up with (see console.hpp).
#pragma once

#include <algorithm>
#include <cerrno>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "console.hpp"
#include <elastic/internal/file.hpp>
#include <elastic/error.hpp>

namespace elastic::agent {

class log_pump {
 public:
  /// Appends to `file` (an open log, owned from now on); `console` gets the lines with the
  /// slot's prefix, nullptr for none.
  log_pump(elastic::internal::unique_fd file, std::size_t slot, console* out)
      : file_(std::move(file)), prefix_(fmt::format("[rank {}] ", slot)), console_(out) {}

  /// A line of the launcher's own about this slot (start, exit), in the log and on the console.
  void note(std::string_view text) {
    write_line(fmt::format("=== {} ===", text));
  }

  /// Lines the launcher writes for this slot as they are (a watchdog's stack dump), in the log
  /// and on the console; never mixed into a worker line still pending.
  void lines(std::string_view text) {
    for (std::size_t start = 0; start < text.size();) {
      const std::size_t nl = std::min(text.find('\n', start), text.size());
      write_line(text.substr(start, nl - start));
      start = nl + 1;
    }
  }

  /// Takes what a worker pipe gave; `stream` 0 stdout, 1 stderr (lines are kept apart).
  void feed(int stream, std::string_view bytes) {
    std::string& buf = pending_[stream];
    buf.append(bytes);
    std::size_t start = 0;
    for (std::size_t nl; (nl = buf.find('\n', start)) != std::string::npos; start = nl + 1) {
      write_line(std::string_view(buf).substr(start, nl - start));
    }
    buf.erase(0, start);
    if (buf.size() > 64 * 1024) {  // a "line" that never ends: pass it on in pieces
      write_line(buf);
      buf.clear();
    }
  }

  /// The stream ended: a last line without its newline still counts.
  void flush(int stream) {
    if (!pending_[stream].empty()) write_line(pending_[stream]);
    pending_[stream].clear();
  }

 private:
  void write_line(std::string_view line) {
    std::string out;
    out.reserve(prefix_.size() + line.size() + 1);
    out.append(prefix_).append(line).push_back('\n');
    elastic::internal::write_all_best_effort(file_.get(), std::string_view(out).substr(prefix_.size()));
    // One piece per line: lines of different workers never interleave on the console.
    if (console_ != nullptr) console_->write(out);
  }

  elastic::internal::unique_fd file_;
  std::string prefix_;
  console* console_;
  std::string pending_[2];
};

}  // namespace elastic::agent
