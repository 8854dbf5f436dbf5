// Finding a launcher's descendants by what the kernel says of them (/proc), so that none outlives
// it: the workers' process groups, what they started, and what escaped both with setsid() (the
// launcher is a child subreaper, so those become its children when their parents die, and they
// carry the launcher's ELASTIC_PARTICIPANT_ID in their environment wherever they went).
//
// Everything here uses open/read/close and getdents64 on fixed buffers: no allocation, no lock,
// so that the guardian (a forked child of a process that may have threads) can call it.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#include <elastic/internal/env.hpp>

namespace elastic::agent::detail {

/// Writes "/proc/PID/<file>" into `out` (48 bytes) without snprintf, which may allocate.
inline void proc_path(char* out, pid_t pid, const char* file) noexcept {
  char digits[16];
  int n = 0;
  auto v = static_cast<unsigned long>(pid);
  do {
    digits[n++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v != 0 && n < 15);
  char* p = out;
  for (const char* s = "/proc/"; *s != '\0';) *p++ = *s++;
  while (n > 0) *p++ = digits[--n];
  *p++ = '/';
  for (int i = 0; file[i] != '\0' && p < out + 46; ++i) *p++ = file[i];
  *p = '\0';
}

/// What /proc/PID/stat says of a process.
struct proc_info {
  pid_t pid = 0;
  pid_t ppid = 0;
  pid_t pgid = 0;
  uid_t uid = static_cast<uid_t>(-1);  ///< owner of /proc/PID (its effective uid)
  char state = '\0';  ///< 'Z' for a zombie (finished, not yet reaped)
};

/// Reads /proc/PID/stat; false when the process is gone.
inline bool read_proc_info(pid_t pid, proc_info& out) noexcept {
  char path[48];
  proc_path(path, pid, "stat");
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[512];
  const ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return false;
  buf[n] = '\0';
  // "pid (comm) S ppid pgrp ...": the name may hold spaces and ')', the fields follow the last ')'.
  const char* p = std::strrchr(buf, ')');
  if (p == nullptr || p[1] != ' ' || p[2] == '\0') return false;
  out.pid = pid;
  out.state = p[2];
  p += 3;
  const char* const end = p + std::strlen(p);
  long fields[2] = {0, 0};
  for (long& f : fields) {
    while (*p == ' ') ++p;
    p = std::from_chars(p, end, f).ptr;  // left 0 when it is not a number
  }
  out.ppid = static_cast<pid_t>(fields[0]);
  out.pgid = static_cast<pid_t>(fields[1]);
  return true;
}

/// Calls `f(const proc_info&)` for every process on the host (that /proc shows us).
template <class F>
void for_each_process(F&& f) noexcept {
  const int dir = ::open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) return;
  alignas(8) char buf[8192];
  for (;;) {
    const long n = ::syscall(SYS_getdents64, dir, buf, sizeof buf);
    if (n <= 0) break;
    for (long at = 0; at < n;) {
      struct entry {
        std::uint64_t ino;
        std::int64_t off;
        unsigned short reclen;
        unsigned char type;
        char name[1];
      };
      const auto* e = reinterpret_cast<const entry*>(buf + at);
      at += e->reclen;
      if (e->name[0] < '1' || e->name[0] > '9') continue;  // not a process
      const auto number = elastic::internal::parse_integer(e->name);
      if (!number || *number > std::numeric_limits<pid_t>::max()) continue;
      const auto pid = static_cast<pid_t>(*number);
      proc_info info;
      struct stat st {};
      if (::fstatat(dir, e->name, &st, 0) != 0) continue;
      info.uid = st.st_uid;
      if (read_proc_info(pid, info)) f(info);
    }
  }
  ::close(dir);
}

/// True when the environment of `pid` holds an entry that starts with `prefix` (say
/// "ELASTIC_PARTICIPANT_ID=host.4242:"). Reads /proc/PID/environ in pieces.
inline bool environ_has_prefix(pid_t pid, const char* prefix, std::size_t len) noexcept {
  if (len == 0) return false;
  char path[48];
  proc_path(path, pid, "environ");
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[4096];
  std::size_t pos = 0;   // bytes of `prefix` matched in the current entry
  bool matching = true;  // the current entry still agrees with `prefix`
  bool found = false;
  for (ssize_t n; !found && (n = ::read(fd, buf, sizeof buf)) > 0;) {
    for (ssize_t i = 0; i < n; ++i) {
      const char c = buf[i];
      if (c == '\0') {
        pos = 0;
        matching = true;
        continue;
      }
      if (!matching) continue;
      if (c != prefix[pos]) {
        matching = false;
        continue;
      }
      if (++pos == len) {
        found = true;
        break;
      }
    }
  }
  ::close(fd);
  return found;
}

}  // namespace elastic::agent::detail
