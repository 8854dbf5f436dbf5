// The launcher's console (its stdout for worker lines, its stderr for its own messages): written
// without ever blocking the supervision loop. Whatever reads the console may be slow, stopped
// (a terminal on Ctrl-S, a pipe nobody drains) or gone (`elastic-run ... | head`); none of that
// may delay a signal's forwarding or a restart, and none of it may stop the logs.
//
// Text is queued in a bounded buffer and written when the console takes it. When the buffer is
// full, whole pieces are dropped and counted; once there is room again a line says how many
// lines were dropped. When the console is gone (EPIPE), everything for it is dropped. The
// per-rank logs and the events file never go through here: they get every line.
//
// Non-blocking writes need a non-blocking file description. Setting O_NONBLOCK on the inherited
// stdout would change it for every process sharing it (the shell after we exit, a `tee` beside
// us); so pipes and terminals are opened afresh through /proc/self/fd/N with O_NONBLOCK (a new
// description of the same pipe or terminal), sockets are written with MSG_DONTWAIT, and regular
// files (which do not block) are written directly. Only when none of that works is O_NONBLOCK
// set on the shared description, and put back when the console is destroyed.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include <elastic/internal/file.hpp>

namespace elastic::agent {

class console {
 public:
  /// Writes to `fd` (not owned); at most `capacity` bytes wait for a slow reader. fd -1: none.
  explicit console(int fd, std::size_t capacity = 1u << 20) : capacity_(capacity) {
    if (fd < 0) {
      gone_ = true;
      return;
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      gone_ = true;  // closed: nobody to write to
      return;
    }
    if (S_ISREG(st.st_mode) || S_ISBLK(st.st_mode)) {
      fd_ = fd;
      how_ = mode::direct;
      return;
    }
    if (S_ISSOCK(st.st_mode)) {
      fd_ = fd;
      how_ = mode::socket;
      return;
    }
    const std::string self = fmt::format("/proc/self/fd/{}", fd);
    int own;
    do {
      own = ::open(self.c_str(), O_WRONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    } while (own < 0 && errno == EINTR);
    if (own >= 0) {
      own_ = elastic::internal::unique_fd(own);
      fd_ = own;
      how_ = mode::nonblocking;
      return;
    }
    if (errno == ENXIO && S_ISFIFO(st.st_mode)) {
      gone_ = true;  // a pipe with no reader left
      return;
    }
    // No /proc: make the shared description non-blocking for our lifetime.
    const int flags = ::fcntl(fd, F_GETFL);
    if (flags >= 0 && ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0) {
      restore_fd_ = fd;
      restore_flags_ = flags;
    }
    fd_ = fd;
    how_ = mode::nonblocking;
  }

  console(const console&) = delete;
  console& operator=(const console&) = delete;
  ~console() {
    if (restore_fd_ >= 0) ::fcntl(restore_fd_, F_SETFL, restore_flags_);
  }

  /// Queues `text` (whole lines) and writes what the console takes now. Never blocks.
  void write(std::string_view text) noexcept {
    if (gone_ || text.empty()) return;
    if (how_ == mode::direct) {
      elastic::internal::write_all_best_effort(fd_, text);
      return;
    }
    flush();
    if (dropped_lines_pending_ > 0) {
      note_dropped();
      if (dropped_lines_pending_ > 0) {
        drop(text);
        return;
      }
    }
    if (queued() + text.size() > capacity_) {
      drop(text);
      return;
    }
    try {
      buf_.append(text);
    } catch (...) {
      drop(text);
      return;
    }
    flush();
  }

  /// Writes what is queued as far as the console takes it now. Never blocks.
  void flush() noexcept {
    while (!gone_ && queued() > 0) {
      const std::string_view data = std::string_view(buf_).substr(head_);
      ssize_t n;
      if (how_ == mode::socket) {
        n = ::send(fd_, data.data(), data.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
      } else {
        n = ::write(fd_, data.data(), data.size());
      }
      if (n > 0) {
        head_ += static_cast<std::size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      // EPIPE (nobody reads any more) or another error: the console is gone for good.
      gone_ = true;
      dropped_lines_ += count_lines(data);
      buf_.clear();
      head_ = 0;
      return;
    }
    if (head_ > 0 && (head_ == buf_.size() || head_ > capacity_ / 2)) {
      buf_.erase(0, head_);
      head_ = 0;
    }
  }

  /// Waits up to `limit` for the console to take what is queued (at exit: a slow reader gets a
  /// moment, a stopped or absent one does not hold the launcher).
  void drain(std::chrono::milliseconds limit) noexcept {
    const auto until = std::chrono::steady_clock::now() + limit;
    flush();
    if (dropped_lines_pending_ > 0) note_dropped();
    while (!gone_ && queued() > 0) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now()).count();
      if (left <= 0) break;
      pollfd p{fd_, POLLOUT, 0};
      if (::poll(&p, 1, static_cast<int>(left)) < 0 && errno != EINTR) break;
      flush();
      if (dropped_lines_pending_ > 0) note_dropped();
    }
  }

  /// The fd to poll for POLLOUT while something waits, else -1.
  [[nodiscard]] int waiting_fd() const noexcept { return !gone_ && queued() > 0 ? fd_ : -1; }
  /// Lines dropped so far (a full buffer, or a console that went away).
  [[nodiscard]] std::size_t dropped_lines() const noexcept { return dropped_lines_; }
  /// True once nothing reads the console any more.
  [[nodiscard]] bool gone() const noexcept { return gone_; }

 private:
  enum class mode { direct, socket, nonblocking };

  [[nodiscard]] std::size_t queued() const noexcept { return buf_.size() - head_; }

  static std::size_t count_lines(std::string_view s) noexcept {
    const auto n = static_cast<std::size_t>(std::count(s.begin(), s.end(), '\n'));
    return n > 0 ? n : (s.empty() ? 0 : 1);
  }

  void drop(std::string_view text) noexcept {
    const std::size_t n = count_lines(text);
    dropped_lines_ += n;
    dropped_lines_pending_ += n;
  }

  /// Says how many lines were dropped, once there is room for saying it.
  void note_dropped() noexcept {
    try {
      const std::string note = fmt::format(
          "elastic-run: {} lines not shown: the console did not keep up (the logs have every line)\n",
          dropped_lines_pending_);
      if (queued() + note.size() > capacity_) return;
      buf_.append(note);
      dropped_lines_pending_ = 0;
    } catch (...) {
    }
  }

  std::size_t capacity_;
  int fd_ = -1;
  mode how_ = mode::direct;
  elastic::internal::unique_fd own_;
  int restore_fd_ = -1;
  int restore_flags_ = 0;
  bool gone_ = false;
  std::string buf_;
  std::size_t head_ = 0;
  std::size_t dropped_lines_ = 0;
  std::size_t dropped_lines_pending_ = 0;
};

}  // namespace elastic::agent
