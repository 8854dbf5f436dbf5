// The platform calls behind the watchdog's stack dumps (stack_capture.hpp has the procedure):
// what /proc says of a process and its threads, why the kernel refused to let us trace it, and
// the threads this thread has seized with ptrace, stopped and detached on every path.
//
// A stop is seen with PTRACE_GETSIGINFO (it succeeds only on a tracee in a ptrace stop), never
// with waitpid(): the kernel tells every thread of the tracer's process of a tracee's stop, and
// whoever hosts the watchdog may take that notice first. This thread never waits with WEXITED
// either: a tracer in the process of the tracee's parent would reap its exit, which the parent
// (elastic-run) needs.
#pragma once

#include <dirent.h>
#include <elf.h>
#include <fcntl.h>
#include <sys/ptrace.h>
#include <sys/uio.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <vector>

#include <elastic/timer/detail/mapped_files.hpp>
#include <elastic/timer/stack_dump.hpp>

namespace elastic::inline v1::timer::detail {

/// A small /proc file's text without its trailing newline; empty when it cannot be read.
inline std::string read_proc_text(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  char buf[4096];
  ssize_t n;
  do {
    n = ::read(fd, buf, sizeof buf);
  } while (n < 0 && errno == EINTR);
  ::close(fd);
  if (n <= 0) return {};
  std::string s(buf, static_cast<std::size_t>(n));
  while (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

/// The thread ids of process `pid` now (empty when it is gone).
inline std::vector<pid_t> task_ids(pid_t pid) {
  std::vector<pid_t> out;
  const std::string dir = "/proc/" + std::to_string(pid) + "/task";
  std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(dir.c_str()), &::closedir);
  if (!d) return out;
  while (const dirent* e = ::readdir(d.get())) {
    const long tid = std::strtol(e->d_name, nullptr, 10);
    if (tid > 0) out.push_back(static_cast<pid_t>(tid));
  }
  std::sort(out.begin(), out.end());
  return out;
}

inline std::string task_path(pid_t pid, pid_t tid, const char* file) {
  return "/proc/" + std::to_string(pid) + "/task/" + std::to_string(tid) + "/" + file;
}

/// A thread's name, state and wchan from /proc, as the dump shows them; state '\0' when the
/// thread is gone.
inline thread_stack describe_thread(pid_t pid, pid_t tid) {
  thread_stack t;
  t.tid = tid;
  t.name = read_proc_text(task_path(pid, tid, "comm"));
  const std::string stat = read_proc_text(task_path(pid, tid, "stat"));
  const auto paren = stat.rfind(')');
  t.state = paren != std::string::npos && paren + 2 < stat.size() ? stat[paren + 2] : '\0';
  t.wchan = read_proc_text(task_path(pid, tid, "wchan"));
  if (t.wchan == "0") t.wchan.clear();  // not waiting, or the kernel hides it
  return t;
}

/// The process tracing `pid`, 0 when none (TracerPid in /proc/PID/status).
inline pid_t tracer_of(pid_t pid) {
  const std::string status = read_proc_text("/proc/" + std::to_string(pid) + "/status");
  const auto at = status.find("TracerPid:");
  return at == std::string::npos ? 0 : static_cast<pid_t>(std::strtol(status.c_str() + at + 10, nullptr, 10));
}

/// Why PTRACE_SEIZE of `pid` failed with `err`, in words that say what to change.
inline std::string seize_refusal(pid_t pid, int err) {
  const std::string who = "pid " + std::to_string(pid);
  if (err == ESRCH) return who + " ended before it could be stopped";
  if (err != EPERM) return "cannot trace " + who + ": " + std::generic_category().message(err);
  if (const pid_t tracer = tracer_of(pid); tracer != 0) {
    return who + " is already traced by pid " + std::to_string(tracer) + " ('" +
           read_proc_text("/proc/" + std::to_string(tracer) + "/comm") +
           "'): a process has one tracer at a time; detach that debugger or profiler";
  }
  std::string why = "not permitted to trace " + who + " (EPERM): ";
  const std::string yama = read_proc_text("/proc/sys/kernel/yama/ptrace_scope");
  if (yama == "1") {
    why += "kernel.yama.ptrace_scope is 1, so only an ancestor of the process (elastic-run, which starts the "
           "workers, is one; a standalone elastic-watchdog is not) or a holder of CAP_SYS_PTRACE may trace it";
  } else if (yama == "2") {
    why += "kernel.yama.ptrace_scope is 2, so only a holder of CAP_SYS_PTRACE may trace it";
  } else if (yama == "3") {
    why += "kernel.yama.ptrace_scope is 3, so no process may trace another";
  } else if (read_proc_text("/proc/self/status").find("Seccomp:\t2") != std::string::npos) {
    return why + "this watchdog runs under a seccomp filter (Seccomp: 2 in its /proc/PID/status), as in a "
                 "container, and the filter may refuse ptrace: allow it, or run the watchdog outside the filter";
  } else {
    why += "the watchdog lacks CAP_SYS_PTRACE, and the process runs as another user or is not dumpable "
           "(PR_SET_DUMPABLE 0, a setuid program)";
  }
  return why + "; in a container, seccomp or a dropped CAP_SYS_PTRACE refuse it too";
}

/// One executable mapping of a process, to name a bare address as MODULE+OFFSET.
struct code_mapping {
  std::uint64_t start = 0, end = 0, file_offset = 0;
  std::string path;
};

/// The executable mappings of `pid` that have a file (from /proc/PID/maps).
inline std::vector<code_mapping> code_mappings(pid_t pid) {
  std::vector<code_mapping> out;
  for_each_mapping(pid, [&](const mapping_line& m) {
    if (std::strchr(m.perms, 'x') != nullptr) out.push_back({m.start, m.end, m.file_offset, m.path});
  });
  return out;
}

/// The instruction pointer of `tid`, a thread in a ptrace stop of ours; 0 when not readable here.
inline std::uint64_t instruction_pointer([[maybe_unused]] pid_t tid) noexcept {
#if defined(__x86_64__) || defined(__aarch64__)
  user_regs_struct regs{};
  iovec io{&regs, sizeof regs};
  if (::ptrace(PTRACE_GETREGSET, tid, reinterpret_cast<void*>(std::uintptr_t{NT_PRSTATUS}), &io) != 0) return 0;
#if defined(__x86_64__)
  return regs.rip;
#else
  return regs.pc;
#endif
#else
  return 0;
#endif
}

/// The threads this thread has seized, each stopped (or waited for) and detached on every path.
class seized_threads {
 public:
  struct tracee {
    pid_t tid = 0;
    bool stopped = false;
    bool gone = false;  ///< it ended before it stopped
  };

  seized_threads() = default;
  seized_threads(const seized_threads&) = delete;
  seized_threads& operator=(const seized_threads&) = delete;
  ~seized_threads() { detach_all(); }

  /// Seizes `tid` and asks it to stop; false with `err` (errno) when it cannot be traced.
  bool seize(pid_t tid, int& err) {
    tracees_.reserve(tracees_.size() + 1);  // a failure to grow leaves nobody attached
    index_.reserve(index_.size() + 1);
    if (::ptrace(PTRACE_SEIZE, tid, nullptr, nullptr) != 0) {
      err = errno;
      return false;
    }
    index_.emplace(tid, tracees_.size());
    tracees_.push_back({tid, false, false});
    ::ptrace(PTRACE_INTERRUPT, tid, nullptr, nullptr);
    return true;
  }


  /// Notes which threads of process `pid` have stopped, or ended; true when none is left to wait for.
  bool poll_stops(pid_t pid) {
    bool all = true;
    for (auto& t : tracees_) {
      if (t.stopped || t.gone) continue;
      siginfo_t si{};
      t.stopped = ::ptrace(PTRACE_GETSIGINFO, t.tid, nullptr, &si) == 0;
      if (t.stopped) {
        // Take our notice off the queue if nobody else did; WSTOPPED only: never an exit.
        siginfo_t notice{};
        ::waitid(P_PID, static_cast<id_t>(t.tid), &notice, WSTOPPED | WNOHANG | __WALL);
        continue;
      }
      const char state = describe_thread(pid, t.tid).state;
      t.gone = state == '\0' || state == 'Z' || state == 'X';
      all = all && t.gone;
    }
    return all;
  }

  /// The tracee of thread `tid`, or nullptr.
  [[nodiscard]] const tracee* find(pid_t tid) const noexcept {
    const auto at = index_.find(tid);  // a lookup: a capture asks once per thread and step
    return at == index_.end() ? nullptr : &tracees_[at->second];
  }

  /// Lets every stopped thread go on. One stopped on its way to a signal's handler (a
  /// signal-delivery stop) gets that signal back; our own interrupt stops give nothing back.
  /// A thread not stopped yet cannot be detached: it stays traced until this thread exits.
  void detach_all() noexcept {
    for (const auto& t : tracees_) {
      siginfo_t si{};
      if (::ptrace(PTRACE_GETSIGINFO, t.tid, nullptr, &si) != 0) continue;
      const int give_back = (si.si_code >> 8) == PTRACE_EVENT_STOP ? 0 : si.si_signo;
      ::ptrace(PTRACE_DETACH, t.tid, nullptr, reinterpret_cast<void*>(static_cast<std::intptr_t>(give_back)));
    }
    tracees_.clear();
    index_.clear();
  }

 private:
  std::vector<tracee> tracees_;
  std::unordered_map<pid_t, std::size_t> index_;  ///< tid -> its place in tracees_
};

}  // namespace elastic::inline v1::timer::detail
