// What a watchdog saw of a hung process just before it signalled it: the stack of every thread,
// taken from outside the process (ptrace, symbols with libdw: see detail/ptrace_stacks.hpp), and
// the two ways it is written: gdb-like text for logs and people, JSON for programs.
//
//   elastic watchdog: scope 'step' of pid 1234 (rank 2) expired 3.1 ms ago; 3 threads, captured in 41 ms
//   thread 1234 'train' (state R), the scope's thread:
//     #0  0x000055d0c0de1234 in hang_here(int) at /src/train.cpp:42
//     #1  0x000055d0c0de1300 in main at /src/train.cpp:88
//     #2  0x00007f1200029d90 in __libc_start_call_main from /usr/lib/x86_64-linux-gnu/libc.so.6
//   thread 1236 'loader' (state S, in futex_wait_queue):
//     #0  0x00007f12000913a6 in ?? from /usr/lib/x86_64-linux-gnu/libc.so.6+0x913a6
//
// A second line says why when the dump is incomplete ("dump incomplete: ...") or has no
// function names ("no symbols: ..."): a dump is never silently partial.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include <elastic/internal/json_text.hpp>

namespace elastic::inline v1::timer {

/// One frame of a thread's stack; frames run innermost first.
struct stack_frame {
  std::uint64_t pc = 0;       ///< the instruction pointer (frame #0) or the return address
  std::string function;       ///< demangled name; empty when no symbol covers pc
  std::string file;           ///< source file of the call, with debug info only
  int line = 0;               ///< its line; 0 when unknown
  std::string module;         ///< the ELF file mapped at pc (the executable or a shared library)
  std::uint64_t offset = 0;   ///< pc's address inside module, for `addr2line -e MODULE OFFSET`
  bool inlined = false;       ///< a function inlined into the next frame, at the same address
};

/// One thread of the process, as it was when the watchdog stopped it.
struct thread_stack {
  pid_t tid = 0;
  std::string name;           ///< /proc/PID/task/TID/comm
  char state = '?';           ///< before it was stopped: R running, S sleeping, D uninterruptible, ...
  std::string wchan;          ///< where in the kernel it waited ("futex_wait_queue"), or empty
  bool scope_thread = false;  ///< the thread whose scope expired
  std::vector<stack_frame> frames;
  std::string note;           ///< why its stack is missing or cut short; empty when whole
};

/// The stacks of a process whose scope expired, as `watchdog_stack` logs them.
struct stack_dump {
  pid_t pid = 0;
  int rank = -1;                             ///< -1: the process declared none
  std::string scope;                         ///< the expired scope
  std::chrono::nanoseconds late{0};          ///< from the scope's deadline to the capture's start
  std::chrono::nanoseconds capture_time{0};  ///< from the capture's start to the dump's hand-over
  bool complete = false;  ///< every thread was stopped and unwound within the bound
  bool symbols = false;   ///< frames name their functions (libdw unwound and symbolized them)
  std::string reason;     ///< why it is incomplete or has no symbols; empty when neither
  std::vector<thread_stack> threads;
};

namespace detail {

/// Appends `v` in hexadecimal with a 0x, zero-padded to `digits`.
inline void append_hex(std::string& out, std::uint64_t v, int digits = 1) {
  char buf[24];
  const int n = std::snprintf(buf, sizeof buf, "0x%0*llx", digits, static_cast<unsigned long long>(v));
  if (n > 0) out.append(buf, static_cast<std::size_t>(n));
}

/// Appends a duration in milliseconds with `decimals` decimals.
inline void append_ms(std::string& out, std::chrono::nanoseconds d, int decimals) {
  char buf[32];
  const int n = std::snprintf(buf, sizeof buf, "%.*f", decimals, std::chrono::duration<double, std::milli>(d).count());
  if (n > 0) out.append(buf, static_cast<std::size_t>(n) < sizeof buf ? static_cast<std::size_t>(n) : sizeof buf - 1);
}

inline void append_hex_string(std::string& out, std::uint64_t v) {
  out += '"';
  append_hex(out, v);
  out += '"';
}

inline void append_text_or_null(std::string& out, std::string_view s) {
  if (s.empty()) out += "null";
  else internal::append_json_string(out, s);
}

}  // namespace detail

/// The dump as text, gdb-like and grep-able (see the top of this file): a header line, a line
/// saying why when it is incomplete or has no symbols, then per thread a line and its frames.
inline std::string to_text(const stack_dump& d) {
  std::string out = "elastic watchdog: scope '" + d.scope + "' of pid " + std::to_string(d.pid);
  out += d.rank >= 0 ? " (rank " + std::to_string(d.rank) + ")" : std::string(" (no rank)");
  out += " expired ";
  detail::append_ms(out, d.late, 1);
  out += " ms ago; " + std::to_string(d.threads.size()) + (d.threads.size() == 1 ? " thread" : " threads");
  out += ", captured in ";
  detail::append_ms(out, d.capture_time, 0);
  out += " ms\n";
  if (!d.reason.empty()) out += (d.complete ? "no symbols: " : "dump incomplete: ") + d.reason + "\n";
  for (const auto& t : d.threads) {
    out += "thread " + std::to_string(t.tid) + " '" + t.name + "' (state " + std::string(1, t.state);
    if (!t.wchan.empty()) out += ", in " + t.wchan;
    out += t.scope_thread ? "), the scope's thread:\n" : "):\n";
    if (!t.note.empty()) out += "  (" + t.note + ")\n";
    for (std::size_t i = 0; i < t.frames.size(); ++i) {
      const stack_frame& f = t.frames[i];
      const std::string index = std::to_string(i);
      out += "  #" + index + (index.size() < 2 ? "  " : " ");
      detail::append_hex(out, f.pc, 16);
      out += " in ";
      out += f.function.empty() ? "??" : f.function;
      if (f.inlined) out += " [inlined]";
      if (!f.file.empty()) {
        out += " at " + f.file + ":" + std::to_string(f.line);
      } else if (!f.module.empty()) {
        out += " from " + f.module;
        if (f.function.empty()) {
          out += '+';
          detail::append_hex(out, f.offset);
        }
      }
      out += '\n';
    }
  }
  return out;
}

/// The threads as a JSON array, what `watchdog_stack` carries as "stacks":
///   [{"tid":1234,"name":"train","state":"R","wchan":null,"scope_thread":true,"note":null,
///     "frames":[{"pc":"0x55d0c0de1234","function":"hang_here(int)","file":"/src/train.cpp",
///                "line":42,"module":"/src/build/train","offset":"0x1234","inlined":false}, ...]}, ...]
/// Addresses are hexadecimal strings (a JSON number cannot hold every 64-bit value); what is
/// unknown is null.
inline std::string to_json(const stack_dump& d) {
  std::string out = "[";
  for (const auto& t : d.threads) {
    if (out.size() > 1) out += ',';
    out += "{\"tid\":" + std::to_string(t.tid) + ",\"name\":";
    internal::append_json_string(out, t.name);
    out += ",\"state\":";
    internal::append_json_string(out, std::string_view(&t.state, 1));
    out += ",\"wchan\":";
    detail::append_text_or_null(out, t.wchan);
    out += t.scope_thread ? ",\"scope_thread\":true,\"note\":" : ",\"scope_thread\":false,\"note\":";
    detail::append_text_or_null(out, t.note);
    out += ",\"frames\":[";
    for (std::size_t i = 0; i < t.frames.size(); ++i) {
      const stack_frame& f = t.frames[i];
      out += i == 0 ? "{\"pc\":" : ",{\"pc\":";
      detail::append_hex_string(out, f.pc);
      out += ",\"function\":";
      detail::append_text_or_null(out, f.function);
      out += ",\"file\":";
      detail::append_text_or_null(out, f.file);
      out += ",\"line\":";
      if (f.line > 0) internal::append_json_integer(out, f.line);
      else out += "null";
      out += ",\"module\":";
      detail::append_text_or_null(out, f.module);
      out += ",\"offset\":";
      if (f.module.empty()) out += "null";
      else detail::append_hex_string(out, f.offset);
      out += f.inlined ? ",\"inlined\":true}" : ",\"inlined\":false}";
    }
    out += "]}";
  }
  out += ']';
  return out;
}

}  // namespace elastic::inline v1::timer
