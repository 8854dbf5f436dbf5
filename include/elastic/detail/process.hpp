// Identity and signalling of processes by pid, safe against pid reuse.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string_view>

namespace elastic::detail {

/// The calling thread's kernel id.
inline pid_t current_tid() noexcept { return static_cast<pid_t>(::syscall(SYS_gettid)); }

/// What /proc/PID/stat says of a process: its state letter and its start time in clock ticks
/// since boot (field 22). A pid together with its start time names one process for the life of
/// the machine: a later process that reuses the pid has a later start time.
struct proc_stat {
  char state = '\0';  ///< '\0' when the process does not exist
  std::uint64_t start_time = 0;
};

/// Reads /proc/PID/stat with open/read/close only, so it is safe in a child between fork and
/// exec and in a watchdog that must not allocate while it decides whom to kill.
inline proc_stat read_proc_stat(pid_t pid) noexcept {
  proc_stat out;
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return out;
  char buf[1024];
  ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return out;
  buf[n] = '\0';
  // The command name (field 2) is in parentheses and may itself hold spaces or ')': the fields
  // we want follow the last ')'.
  const char* p = std::strrchr(buf, ')');
  if (p == nullptr || p[1] != ' ') return out;
  out.state = p[2];
  int field = 2;
  for (++p; *p != '\0'; ++p) {
    if (*p != ' ') continue;
    if (++field == 22) {
      for (++p; *p >= '0' && *p <= '9'; ++p)
        out.start_time = out.start_time * 10 + static_cast<std::uint64_t>(*p - '0');
      break;
    }
  }
  return out;
}

/// Start time of a process (see proc_stat), or 0 when it does not exist.
inline std::uint64_t process_start_time(pid_t pid) noexcept { return read_proc_stat(pid).start_time; }

/// True when the process that started at `start_time` (0: any process with this pid) still
/// runs. Zombies count as gone: they have finished and only wait to be reaped.
inline bool process_alive(pid_t pid, std::uint64_t start_time) noexcept {
  if (pid <= 0) return false;
  proc_stat s = read_proc_stat(pid);
  if (s.state == '\0' || s.state == 'Z' || s.state == 'X') return false;
  return start_time == 0 || s.start_time == start_time;
}

/// Outcome of signal_process().
enum class signal_result { sent, gone, failed };

/// Sends `sig` to the process `pid` only if it is still the process that started at
/// `start_time`. A pidfd pins the process while its start time is checked, so the signal can
/// never reach a newer process that reused the pid.
inline signal_result signal_process(pid_t pid, std::uint64_t start_time, int sig) noexcept {
#if defined(SYS_pidfd_open) && defined(SYS_pidfd_send_signal)
  int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (fd >= 0) {
    signal_result r = signal_result::gone;
    if (process_alive(pid, start_time)) {
      r = ::syscall(SYS_pidfd_send_signal, fd, sig, nullptr, 0) == 0
              ? signal_result::sent
              : (errno == ESRCH ? signal_result::gone : signal_result::failed);
    }
    ::close(fd);
    return r;
  }
  if (errno == ESRCH) return signal_result::gone;
  // ENOSYS on kernels before 5.3: fall through to the racy but bounded check-then-kill.
#endif
  if (!process_alive(pid, start_time)) return signal_result::gone;
  if (::kill(pid, sig) == 0) return signal_result::sent;
  return errno == ESRCH ? signal_result::gone : signal_result::failed;
}

/// "SIGKILL" for 9, "signal 42" for what has no name.
inline std::string_view signal_name(int sig) noexcept {
  switch (sig) {
    case SIGKILL: return "SIGKILL";
    case SIGABRT: return "SIGABRT";
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGQUIT: return "SIGQUIT";
    case SIGUSR1: return "SIGUSR1";
    case SIGUSR2: return "SIGUSR2";
    case SIGSEGV: return "SIGSEGV";
    case SIGSTOP: return "SIGSTOP";
    case SIGCONT: return "SIGCONT";
    case SIGHUP: return "SIGHUP";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGILL: return "SIGILL";
    case SIGPIPE: return "SIGPIPE";
    default: return "signal";
  }
}

}  // namespace elastic::detail
