// Identity and signalling of processes by pid, safe against pid reuse, and the kernel's account
// of which file a process maps (how a watchdog knows its clients without trusting what they wrote).
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string_view>

namespace elastic::inline v1::internal {

/// The calling thread's kernel id.
inline pid_t current_tid() noexcept { return static_cast<pid_t>(::syscall(SYS_gettid)); }

/// What /proc/PID/stat says of a process: its state letter and its start time in clock ticks
/// since boot (field 22). A pid together with its start time names one process for the life of
/// the machine: a later process that reuses the pid has a later start time.
struct proc_stat {
  char state = '\0';  ///< '\0' when the process does not exist
  std::uint64_t start_time = 0;
  pid_t ppid = 0;  ///< its parent (field 4)
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
    if (++field == 4) {
      for (const char* q = p + 1; *q >= '0' && *q <= '9'; ++q) out.ppid = out.ppid * 10 + static_cast<pid_t>(*q - '0');
    } else if (field == 22) {
      for (++p; *p >= '0' && *p <= '9'; ++p)
        out.start_time = out.start_time * 10 + static_cast<std::uint64_t>(*p - '0');
      break;
    }
  }
  return out;
}

/// Start time of a process (see proc_stat), or 0 when it does not exist.
inline std::uint64_t process_start_time(pid_t pid) noexcept { return read_proc_stat(pid).start_time; }

/// The inode of this process's pid namespace, or 0 when it cannot be known (no /proc): a pid
/// (and a pid with its start time) names one process only within one pid namespace.
inline std::uint64_t pid_namespace() noexcept {
  struct stat st {};
  return ::stat("/proc/self/ns/pid", &st) == 0 ? static_cast<std::uint64_t>(st.st_ino) : 0;
}

/// The inode of the host's own (initial) pid namespace: a constant of the kernel
/// (PROC_PID_INIT_INO), the same on every host.
inline constexpr std::uint64_t initial_pid_namespace = 0xEFFFFFFCu;

/// True when the process that started at `start_time` (0: any process with this pid) still
/// runs. Zombies count as gone: they have finished and only wait to be reaped.
inline bool process_alive(pid_t pid, std::uint64_t start_time) noexcept {
  if (pid <= 0) return false;
  proc_stat s = read_proc_stat(pid);
  if (s.state == '\0' || s.state == 'Z' || s.state == 'X') return false;
  return start_time == 0 || s.start_time == start_time;
}

/// Which file a mapping shows: the device and inode that fstat() reports for it. Two names of
/// one object (or an unlinked object still mapped) have the same identity; a new object made
/// under an old name does not.
struct file_identity {
  dev_t dev = 0;
  ino_t ino = 0;

  /// The identity of the file open on `fd`; {0, 0} when fstat fails.
  static file_identity of(int fd) noexcept {
    struct stat st {};
    if (::fstat(fd, &st) != 0) return {};
    return {st.st_dev, st.st_ino};
  }
};

/// What /proc/PID/maps says about one file.
enum class maps_result {
  maps,          ///< the process has the file mapped
  does_not_map,  ///< it has not (a zombie maps nothing)
  unreadable,    ///< its maps could not be read: the errno says why (ENOENT: no such process)
};

/// Whether process `pid` maps the file `file` right now, by the kernel's own account in
/// /proc/PID/maps: a process can write anything into shared memory, but it cannot make another
/// process map a file. Matches the device and inode of each mapping, not its name. Reads with
/// open/read/close and a stack buffer (no allocation), however many mappings there are.
/// On unreadable, `*err` (when given) is the errno.
inline maps_result process_maps_file(pid_t pid, file_identity file, int* err = nullptr) noexcept {
  auto fail = [&](int e) {
    if (err != nullptr) *err = e;
    return maps_result::unreadable;
  };
  if (pid <= 0) return fail(ESRCH);
  if (file.ino == 0) return fail(EINVAL);
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/maps", static_cast<int>(pid));
  int fd;
  do {
    fd = ::open(path, O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return fail(errno);
  // Each line: "start-end perms offset MAJ:MIN inode   path". Parsed as a stream, one byte at a
  // time, so a line split across two reads needs no copy. The device is printed as the
  // kernel's major and minor in hex, which are what major()/minor() decode from st_dev.
  const auto want_major = static_cast<unsigned long long>(major(file.dev));
  const auto want_minor = static_cast<unsigned long long>(minor(file.dev));
  const auto want_ino = static_cast<unsigned long long>(file.ino);
  int field = 0;
  bool minor_part = false, bad = false;
  unsigned long long dev_major = 0, dev_minor = 0, ino = 0;
  maps_result out = maps_result::does_not_map;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      ::close(fd);
      return fail(e);
    }
    if (n == 0) break;
    for (ssize_t i = 0; i < n; ++i) {
      const char c = buf[i];
      if (c == '\n') {
        if (!bad && field >= 4 && ino == want_ino && dev_major == want_major && dev_minor == want_minor) {
          out = maps_result::maps;
          break;
        }
        field = 0;
        minor_part = bad = false;
        dev_major = dev_minor = ino = 0;
        continue;
      }
      if (field > 4) continue;  // the path, which may hold anything but a newline
      if (c == ' ') {
        ++field;
        continue;
      }
      if (field == 3) {
        int v = -1;
        if (c >= '0' && c <= '9') v = c - '0';
        else if (c >= 'a' && c <= 'f') v = c - 'a' + 10;
        if (c == ':') minor_part = true;
        else if (v < 0) bad = true;
        else (minor_part ? dev_minor : dev_major) = (minor_part ? dev_minor : dev_major) * 16 + static_cast<unsigned>(v);
      } else if (field == 4) {
        if (c >= '0' && c <= '9') ino = ino * 10 + static_cast<unsigned>(c - '0');
        else bad = true;
      }
    }
    if (out == maps_result::maps) break;
  }
  ::close(fd);
  return out;
}

/// Outcome of signal_process() and signal_client().
enum class signal_result {
  sent,
  gone,     ///< no process with this pid and start time (it ended, or the pid names a newer one)
  failed,   ///< the kernel refused the signal; errno says why
  refused,  ///< signal_client(): the process is not a client, so it was not signalled
};

/// Sends `sig` to the process `pid` only if it is still the process that started at
/// `start_time` and `allowed()` says yes. A pidfd pins the process while both are checked, so
/// the signal can never reach a newer process that reused the pid: if the pid was reused after
/// the pidfd was opened, the pinned process is dead and the signal fails with ESRCH, whatever
/// the checks read of the newer one.
template <class Allowed>
signal_result signal_process_if(pid_t pid, std::uint64_t start_time, int sig, Allowed&& allowed) noexcept {
  if (pid <= 0) return signal_result::gone;
  auto decide = [&]() -> signal_result {
    if (!process_alive(pid, start_time)) return signal_result::gone;
    if (allowed()) return signal_result::sent;
    // A process that ends during the check maps nothing any more: that is not a refusal.
    return process_alive(pid, start_time) ? signal_result::refused : signal_result::gone;
  };
#if defined(SYS_pidfd_open) && defined(SYS_pidfd_send_signal)
  int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (fd >= 0) {
    signal_result r = decide();
    if (r == signal_result::sent) {
      r = ::syscall(SYS_pidfd_send_signal, fd, sig, nullptr, 0) == 0
              ? signal_result::sent
              : (errno == ESRCH ? signal_result::gone : signal_result::failed);
    }
    const int saved = errno;
    ::close(fd);
    errno = saved;
    return r;
  }
  if (errno == ESRCH) return signal_result::gone;
  // ENOSYS on kernels before 5.3: fall through to the racy but bounded check-then-kill.
#endif
  const signal_result r = decide();
  if (r != signal_result::sent) return r;
  if (::kill(pid, sig) == 0) return signal_result::sent;
  return errno == ESRCH ? signal_result::gone : signal_result::failed;
}

/// Sends `sig` to the process `pid` only if it is still the process that started at
/// `start_time` (see signal_process_if).
inline signal_result signal_process(pid_t pid, std::uint64_t start_time, int sig) noexcept {
  return signal_process_if(pid, start_time, sig, [] { return true; });
}

/// Why signal_client() refused: what /proc/PID/maps said, and its errno when unreadable.
struct client_check {
  maps_result maps = maps_result::maps;
  int err = 0;
};

/// signal_process(), but only to a process that maps `file` (a watchdog's segment), checked on
/// the pinned process just before the signal. Returns refused for any other process, with the
/// reason in `*why` (when given).
inline signal_result signal_client(pid_t pid, std::uint64_t start_time, int sig, file_identity file,
                                   client_check* why = nullptr) noexcept {
  client_check c;
  const signal_result r = signal_process_if(pid, start_time, sig, [&] {
    c.maps = process_maps_file(pid, file, &c.err);
    return c.maps == maps_result::maps;
  });
  if (why != nullptr) *why = c;
  return r;
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

}  // namespace elastic::inline v1::internal
