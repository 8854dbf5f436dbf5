// The guardian: a small process that outlives a SIGKILLed launcher just long enough to finish
// its job. No launcher can clean up after a SIGKILL, and PR_SET_PDEATHSIG reaches only its
// direct children, not a wrapper's trainers (`elastic-run -- ./train.sh`) nor what escaped with
// setsid(); nor does anything remove the launcher's /dev/shm objects (that is RAM).
//
// The launcher forks it first thing, before any thread exists and before any lock is taken.
// It is single-threaded, in a process group of its own, ignores every signal it can, has
// /dev/null for stdio and no other descriptor than its end of a pipe: it holds neither the run
// lock nor the watchdog segment's flock. Over the pipe (CLOEXEC on the launcher's side) the
// launcher says, one line each:
//   w PGID     a worker's process group now exists      f PGID    it is gone
//   n NAME     the launcher owns /dev/shm/NAME          d NAME    it removed it (or never had it)
// When the pipe reaches EOF (the launcher died, however, or closed it at its normal end), the
// guardian SIGKILLs the groups it still knows and every process whose environment carries the
// launcher's ELASTIC_PARTICIPANT_ID (escaped descendants), waits a bounded while until none
// runs, unlinks the names it still knows (only when it can flock them: a live process that
// locks one, such as a new launcher of the same run, keeps it), and exits.
//
// Everything the guardian does after fork is async-signal-safe: fixed tables, raw system calls.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "process_tree.hpp"
#include <elastic/internal/env.hpp>
#include <elastic/internal/file.hpp>
#include <elastic/error.hpp>

namespace elastic::agent {

namespace detail {

inline constexpr std::size_t guardian_max_groups = 8192;
inline constexpr std::size_t guardian_max_names = 16;
inline constexpr std::size_t guardian_max_name = 240;

/// The guardian's tables and its work.
struct guardian_state {
  pid_t groups[guardian_max_groups];
  std::size_t group_count = 0;
  char names[guardian_max_names][guardian_max_name + 1];
  std::size_t name_count = 0;
  const char* marker = nullptr;  // "ELASTIC_PARTICIPANT_ID=HOST[@NS].PID:", launcher_identity.hpp
  std::size_t marker_len = 0;

  void command(char* line) noexcept {
    if (line[0] == '\0' || line[1] != ' ') return;
    char* arg = line + 2;
    switch (line[0]) {
      case 'w': {
        const pid_t g = parse_pid(arg);
        if (g > 1 && group_count < guardian_max_groups) groups[group_count++] = g;
        break;
      }
      case 'f': {
        const pid_t g = parse_pid(arg);
        for (std::size_t i = 0; i < group_count; ++i) {
          if (groups[i] == g) {
            groups[i] = groups[--group_count];
            break;
          }
        }
        break;
      }
      case 'n': {
        const std::size_t len = std::strlen(arg);
        if (len == 0 || len > guardian_max_name || std::strchr(arg, '/') != nullptr || arg[0] == '.') break;
        if (find_name(arg) < 0 && name_count < guardian_max_names) std::memcpy(names[name_count++], arg, len + 1);
        break;
      }
      case 'd': {
        const long i = find_name(arg);
        if (i >= 0) {
          --name_count;
          if (static_cast<std::size_t>(i) != name_count) std::memcpy(names[i], names[name_count], guardian_max_name + 1);
        }
        break;
      }
      default: break;
    }
  }

  static pid_t parse_pid(const char* s) noexcept {
    const auto v = elastic::internal::parse_integer(s);
    return v && *v >= 0 && *v < (1LL << 30) ? static_cast<pid_t>(*v) : 0;
  }

  long find_name(const char* n) const noexcept {
    for (std::size_t i = 0; i < name_count; ++i)
      if (std::strcmp(names[i], n) == 0) return static_cast<long>(i);
    return -1;
  }

  bool ours(const proc_info& p) const noexcept {
    if (p.pid == ::getpid()) return false;
    for (std::size_t i = 0; i < group_count; ++i)
      if (p.pgid == groups[i]) return true;
    // Only our own processes can carry our mark; reading another's environment could stall.
    return p.uid == ::geteuid() && environ_has_prefix(p.pid, marker, marker_len);
  }

  /// SIGKILLs what is left of the launcher's workers; true when nothing of them still runs.
  bool kill_round() noexcept {
    for (std::size_t i = 0; i < group_count; ++i) ::kill(-groups[i], SIGKILL);
    bool any = false;
    for_each_process([&](const proc_info& p) {
      if (p.state == 'Z' || p.state == 'X' || !ours(p)) return;
      any = true;
      ::kill(p.pid, SIGKILL);
    });
    return !any;
  }

  void unlink_names() noexcept {
    for (std::size_t i = 0; i < name_count; ++i) {
      char path[16 + guardian_max_name];
      std::memcpy(path, "/dev/shm/", 9);
      std::memcpy(path + 9, names[i], std::strlen(names[i]) + 1);
      // O_NONBLOCK: a FIFO planted under the name must not hold the guardian.
      const int fd = ::open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
      if (fd < 0) continue;
      struct stat st {};
      // Unlink under the lock, so that a process that locks it (a new launcher of the same run)
      // cannot be robbed of it.
      if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == ::geteuid() && ::flock(fd, LOCK_EX | LOCK_NB) == 0) {
        ::unlink(path);
      }
      ::close(fd);
    }
  }

  static void sleep_ms(long ms) noexcept {
    timespec t{ms / 1000, (ms % 1000) * 1'000'000};
    while (::nanosleep(&t, &t) != 0 && errno == EINTR) {
    }
  }

  [[noreturn]] void run(int in) noexcept {
    char buf[4096];
    std::size_t have = 0;
    for (;;) {
      const ssize_t n = ::read(in, buf + have, sizeof buf - have);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;  // EOF: the launcher is gone or done
      have += static_cast<std::size_t>(n);
      std::size_t start = 0;
      for (std::size_t i = 0; i < have; ++i) {
        if (buf[i] != '\n') continue;
        buf[i] = '\0';
        command(buf + start);
        start = i + 1;
      }
      if (start == 0 && have == sizeof buf) have = 0;  // a line longer than any we send: drop it
      std::memmove(buf, buf + start, have - start);
      have -= start;
    }
    // Bounded: a process in uninterruptible sleep must not keep the names forever.
    for (int round = 0; round < 300 && !kill_round(); ++round) sleep_ms(10);
    unlink_names();
    ::_exit(0);
  }
};

/// The guardian's life after fork: isolate, then serve `in`.
[[noreturn]] inline void guardian_main(int in, const char* marker, std::size_t marker_len) noexcept {
  ::setpgid(0, 0);
  ::prctl(PR_SET_NAME, "elastic-guard", 0, 0, 0);
  ::prctl(PR_SET_PDEATHSIG, 0, 0, 0, 0);
  struct sigaction ign {};
  ign.sa_handler = SIG_IGN;
  sigemptyset(&ign.sa_mask);
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig != SIGKILL && sig != SIGSTOP) ::sigaction(sig, &ign, nullptr);
  }
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  // Out of the way of 0..3 first: a launcher started with stdin closed got the pipe as fd 0.
  const int keep = ::fcntl(in, F_DUPFD, 10);
  if (keep >= 0) in = keep;
  const int null = ::open("/dev/null", O_RDWR);
  if (null >= 0) {
    for (int fd = 0; fd < 3; ++fd)
      if (null != fd && in != fd) ::dup2(null, fd);
    if (null > 2 && null != in) ::close(null);
  }
  if (in != 3) {
    ::dup2(in, 3);
    in = 3;
  }
  ::fcntl(in, F_SETFD, FD_CLOEXEC);
#if defined(SYS_close_range)
  const bool closed = ::syscall(SYS_close_range, 4u, ~0u, 0u) == 0;
#else
  const bool closed = false;
#endif
  if (!closed) {
    rlimit r{};
    const long top = ::getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < (1u << 20) ? static_cast<long>(r.rlim_cur) : 65536;
    for (long fd = 4; fd < top; ++fd) ::close(static_cast<int>(fd));
  }
  // Big tables in static storage (constant-initialized), not from malloc.
  static guardian_state state;
  state.marker = marker;
  state.marker_len = marker_len;
  state.run(in);
}

}  // namespace detail

/// The launcher's handle on its guardian. Sending never blocks: lines wait in a buffer while
/// the pipe is full. Destroying it ends the guardian (closes the pipe, waits a bounded while,
/// SIGKILLs and reaps it if it lingers).
class guardian {
 public:
  guardian() = default;

  /// Forks the guardian. `marker` is the environment entry prefix that marks this launcher's
  /// descendants ("ELASTIC_PARTICIPANT_ID=HOST[@NS].PID:", launcher_identity.hpp). Call before
  /// any thread is started.
  static guardian start(std::string marker) {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) throw os_error("cannot make the guardian's pipe");
    elastic::internal::unique_fd rd(p[0]), wr(p[1]);
    guardian g;
    g.marker_ = std::move(marker);
    const pid_t pid = ::fork();
    if (pid < 0) throw os_error("cannot fork the guardian");
    if (pid == 0) {
      wr.reset();
      detail::guardian_main(rd.get(), g.marker_.c_str(), g.marker_.size());
    }
    g.pid_ = pid;
    ::fcntl(wr.get(), F_SETFL, ::fcntl(wr.get(), F_GETFL) | O_NONBLOCK);
    g.out_ = std::move(wr);
    return g;
  }

  guardian(guardian&& o) noexcept
      : pid_(std::exchange(o.pid_, -1)), out_(std::move(o.out_)), pending_(std::move(o.pending_)),
        marker_(std::move(o.marker_)) {}
  guardian& operator=(guardian&& o) noexcept {
    if (this != &o) {
      finish(std::chrono::seconds(3));
      pid_ = std::exchange(o.pid_, -1);
      out_ = std::move(o.out_);
      pending_ = std::move(o.pending_);
      marker_ = std::move(o.marker_);
    }
    return *this;
  }
  guardian(const guardian&) = delete;
  guardian& operator=(const guardian&) = delete;
  ~guardian() { finish(std::chrono::seconds(3)); }

  [[nodiscard]] pid_t pid() const noexcept { return pid_; }
  /// False once the guardian died (its pipe broke) or was never started.
  [[nodiscard]] bool alive() const noexcept { return static_cast<bool>(out_); }

  void watch(pid_t pgid) noexcept { send(fmt::format("w {}\n", pgid)); }
  void forget(pid_t pgid) noexcept { send(fmt::format("f {}\n", pgid)); }
  void own(std::string_view shm_name) noexcept { send(fmt::format("n {}\n", shm_name)); }
  void disown(std::string_view shm_name) noexcept { send(fmt::format("d {}\n", shm_name)); }

  /// Writes what waits, as far as the pipe takes it now.
  void flush() noexcept {
    while (out_ && !pending_.empty()) {
      const ssize_t n = ::write(out_.get(), pending_.data(), pending_.size());
      if (n > 0) {
        pending_.erase(0, static_cast<std::size_t>(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EAGAIN) return;
      out_.reset();  // EPIPE: the guardian is gone
      pending_.clear();
    }
  }

  /// The launcher reaped the guardian's pid with waitpid(-1): it is gone.
  void reaped() noexcept {
    pid_ = -1;
    out_.reset();
    pending_.clear();
  }

  /// Normal end: tells the guardian to finish (EOF), waits up to `limit` for it, then SIGKILLs
  /// and reaps it.
  void finish(std::chrono::milliseconds limit) noexcept {
    if (out_) {
      // A last chance for what waits: the guardian reads while we wait.
      const auto until = std::chrono::steady_clock::now() + limit / 2;
      while (!pending_.empty() && out_ && std::chrono::steady_clock::now() < until) {
        flush();
        if (!pending_.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
    out_.reset();
    pending_.clear();
    if (pid_ <= 0) return;
    const auto until = std::chrono::steady_clock::now() + limit;
    int st = 0;
    for (;;) {
      const pid_t r = ::waitpid(pid_, &st, WNOHANG);
      if (r == pid_ || (r < 0 && errno == ECHILD)) break;
      if (std::chrono::steady_clock::now() >= until) {
        ::kill(pid_, SIGKILL);
        while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
        }
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    pid_ = -1;
  }

 private:
  void send(const std::string& line) noexcept {
    if (!out_) return;
    try {
      pending_ += line;
    } catch (...) {
      return;
    }
    flush();
  }

  pid_t pid_ = -1;
  elastic::internal::unique_fd out_;
  std::string pending_;
  std::string marker_;
};

}  // namespace elastic::agent
