// A worker slot's output: each line to the console with a "[rank N] " prefix and to the slot's
// log file, which is appended to across restarts and outlives every worker that wrote it.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include <elastic/detail/file.hpp>
#include <elastic/error.hpp>

namespace elastic::agent {

class log_pump {
 public:
  /// Appends to `path` (created 0644); `console` is the fd lines are echoed to, -1 for none.
  log_pump(const std::filesystem::path& path, std::size_t slot, int console)
      : file_(::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644)),
        prefix_(fmt::format("[rank {}] ", slot)),
        console_(console) {
    if (!file_) throw os_error("cannot open the worker log " + path.string());
  }

  /// A line of the launcher's own about this slot (start, exit), in the log and on the console.
  void note(std::string_view text) {
    write_line(fmt::format("=== {} ===", text));
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
    out.reserve(line.size() + 1);
    out.append(line).push_back('\n');
    elastic::detail::write_all_best_effort(file_.get(), out);
    if (console_ >= 0) {
      // One write() per line: lines of different workers never interleave on the console.
      elastic::detail::write_all_best_effort(console_, prefix_ + out);
    }
  }

  elastic::detail::unique_fd file_;
  std::string prefix_;
  int console_;
  std::string pending_[2];
};

}  // namespace elastic::agent
