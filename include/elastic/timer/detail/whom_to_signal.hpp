// Which processes a watchdog may signal at all, before the segment check (internal::signal_client).
//
// That check proves a process maps the segment, not that it is a client: the process hosting the
// watchdog maps it too (elastic-run), and any process of the user may open it. A client can write
// any pid into a slot, so without this a worker could get the watchdog to kill elastic-run itself,
// or an unrelated process that happens to map the segment. So, whatever a slot says:
//  - never the watchdog's own process, pid 1, or the watchdog's parent;
//  - under a host that starts its clients (watchdog_options::descendants_only: elastic-run), only
//    its descendants: the workers and what they started (those that escape with setsid() are
//    reparented to elastic-run, a child subreaper, and stay descendants);
//  - otherwise (the standalone elastic-watchdog), only processes of the watchdog's effective uid.
// Read with open/read/close on stack buffers (internal::read_proc_stat): no allocation unless
// there is a refusal to explain.
#pragma once

#include <fcntl.h>
#include <sys/types.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include <elastic/internal/process.hpp>

namespace elastic::inline v1::timer::detail {

/// Whether `pid` descends from `ancestor` (by the parents /proc shows now).
inline bool descends_from(pid_t pid, pid_t ancestor) noexcept {
  pid_t at = pid;
  for (int depth = 0; depth < 4096 && at > 1; ++depth) {  // a bound: a cycle cannot happen, a race could look like one
    const pid_t parent = internal::read_proc_stat(at).ppid;
    if (parent == ancestor) return true;
    at = parent;
  }
  return false;
}

/// The effective uid of `pid` (the second field of Uid: in /proc/PID/status: the owner of
/// /proc/PID is root for a process that is not dumpable), or -1 when it cannot be read.
inline uid_t process_uid(pid_t pid) noexcept {
  char path[40];
  std::snprintf(path, sizeof path, "/proc/%d/status", static_cast<int>(pid));
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return static_cast<uid_t>(-1);
  char buf[2048];  // Uid: is among the first lines
  const ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return static_cast<uid_t>(-1);
  buf[n] = '\0';
  const char* at = std::strstr(buf, "\nUid:");
  if (at == nullptr) return static_cast<uid_t>(-1);
  char* end = nullptr;
  (void)std::strtoul(at + 5, &end, 10);  // the real uid
  const unsigned long effective = std::strtoul(end, &end, 10);
  return static_cast<uid_t>(effective);
}

/// Why the watchdog must not signal process (pid, start), in words for its `watchdog_refused`
/// event; empty when it may (the segment check still follows). A process that is gone, or whose
/// pid names a newer process, is not refused here: the signal finds it gone.
inline std::string signal_refusal(pid_t pid, std::uint64_t start, bool descendants_only) {
  const std::string who = "pid " + std::to_string(pid);
  const pid_t self = ::getpid();
  if (pid == self) return who + " is the watchdog's own process: a client wrote the pid of the watchdog's host into a slot";
  if (pid == 1) return who + " is the system's init process";
  if (pid == ::getppid()) return who + " is the watchdog's parent";
  const internal::proc_stat st = internal::read_proc_stat(pid);
  if (st.state == '\0' || st.start_time != start) return {};
  if (descendants_only) {
    if (!descends_from(pid, self)) {
      return who + " is not a descendant of pid " + std::to_string(self) +
             ", which hosts the watchdog: not a process elastic-run started, nor one they started";
    }
    return {};
  }
  if (const uid_t uid = process_uid(pid); uid != ::geteuid()) {
    return who + " runs as uid " + (uid == static_cast<uid_t>(-1) ? std::string("(unknown)") : std::to_string(uid)) +
           ", the watchdog as uid " + std::to_string(::geteuid()) + ": a watchdog signals its own user's processes only";
  }
  return {};
}

/// Why a process failed internal::signal_client()'s check of segment `segment`, at `stage`
/// ("signal", or "escalate" for the SIGKILL that follows).
inline std::string not_mapped_reason(pid_t pid, std::string_view segment, std::string_view stage,
                                     const internal::client_check& why) {
  if (why.maps == internal::maps_result::does_not_map) {
    return "pid " + std::to_string(pid) + " does not map segment " + std::string(segment) +
           (stage == "escalate" ? ": it no longer maps it" : ": it never attached");
  }
  return "cannot read /proc/" + std::to_string(pid) + "/maps (" + std::strerror(why.err) +
         "): cannot tell whether it attached to segment " + std::string(segment);
}

}  // namespace elastic::inline v1::timer::detail
