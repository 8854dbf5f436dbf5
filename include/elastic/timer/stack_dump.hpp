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
//   30 threads with this stack: tids 1240, 1241, ..., 1269; the first 'pool' (state S, in futex_wait_queue):
//     #0  ...
//   ... 812 threads not shown (40 stacks): a dump holds at most 65536 bytes
//
// A second line says why when the dump is incomplete ("dump incomplete: ...") or has no
// function names ("no symbols: ..."): a dump is never silently partial. A frame named from a
// file that could not be checked to be the one the process maps (a worker in a mount namespace
// of its own) is marked [unverified], and such a dump is not complete.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <unordered_map>
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
  bool unverified = false;    ///< module's file could not be checked to be the one mapped (the dump's reason says why)
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

/// How much of a dump its text and its JSON hold: a process of thousands of threads would
/// otherwise make an event of megabytes, which the events file, a rank log and the run's timeline
/// all carry. Threads with the same stack are folded into one entry first; what is still past a
/// bound is cut, and the dump says how many threads it does not show.
struct dump_bounds {
  std::size_t text_bytes = 64 * 1024;  ///< the text stops before its entries pass this
  std::size_t json_bytes = 96 * 1024;  ///< the JSON likewise
  std::size_t tids_listed = 32;        ///< of a folded entry, the tids named (the count says the rest)
};

/// Threads of a dump with one stack: `threads[members[0]]` stands for all of them.
struct folded_threads {
  std::vector<std::size_t> members;  ///< indices into stack_dump::threads, in tid order
};

namespace detail {

/// What folds threads together: the same frames (address, name, inlined) and the same note.
inline std::string fold_key(const thread_stack& t) {
  std::string key = t.note;
  key += '\n';
  for (const auto& f : t.frames) {
    append_hex(key, f.pc);
    key += f.inlined ? '+' : ' ';
    key += f.unverified ? '?' : ' ';
    key += f.function;
    key += '\n';
  }
  return key;
}

}  // namespace detail

/// The dump's threads folded by stack, in the order of each stack's first thread, the scope's
/// thread alone and first. Linear in threads x frames.
inline std::vector<folded_threads> fold_threads(const stack_dump& d) {
  std::vector<folded_threads> out;
  std::unordered_map<std::string, std::size_t> at;
  for (std::size_t i = 0; i < d.threads.size(); ++i) {
    if (d.threads[i].scope_thread) {
      out.insert(out.begin(), folded_threads{{i}});
      for (auto& [key, index] : at) ++index;
      continue;
    }
    auto [it, fresh] = at.try_emplace(detail::fold_key(d.threads[i]), out.size());
    if (fresh) out.push_back({});
    out[it->second].members.push_back(i);
  }
  return out;
}

namespace detail {

inline void append_thread_line(std::string& out, const stack_dump& d, const folded_threads& g, std::size_t tids_listed) {
  const thread_stack& t = d.threads[g.members.front()];
  const auto state = [](const thread_stack& th) {
    std::string s = "state " + std::string(1, th.state);
    if (!th.wchan.empty()) s += ", in " + th.wchan;
    return s;
  };
  if (g.members.size() == 1) {
    out += "thread " + std::to_string(t.tid) + " '" + t.name + "' (" + state(t);
    out += t.scope_thread ? "), the scope's thread:\n" : "):\n";
  } else {
    out += std::to_string(g.members.size()) + " threads with this stack: tids ";
    const std::size_t listed = std::min(g.members.size(), tids_listed);
    for (std::size_t k = 0; k < listed; ++k) {
      if (k > 0) out += ", ";
      out += std::to_string(d.threads[g.members[k]].tid);
    }
    if (listed < g.members.size()) out += " and " + std::to_string(g.members.size() - listed) + " more";
    out += "; the first '" + t.name + "' (" + state(t) + "):\n";
  }
  if (!t.note.empty()) out += "  (" + t.note + ")\n";
}

inline void append_frames_text(std::string& out, const thread_stack& t) {
  for (std::size_t i = 0; i < t.frames.size(); ++i) {
    const stack_frame& f = t.frames[i];
    const std::string index = std::to_string(i);
    out += "  #" + index + (index.size() < 2 ? "  " : " ");
    append_hex(out, f.pc, 16);
    out += " in ";
    out += f.function.empty() ? "??" : f.function;
    if (f.inlined) out += " [inlined]";
    if (f.unverified) out += " [unverified]";
    if (!f.file.empty()) {
      out += " at " + f.file + ":" + std::to_string(f.line);
    } else if (!f.module.empty()) {
      out += " from " + f.module;
      if (f.function.empty()) {
        out += '+';
        append_hex(out, f.offset);
      }
    }
    out += '\n';
  }
}

/// "... N threads not shown (M stacks): ..." for the entries from `from` on, or "" when none.
inline std::string not_shown(const std::vector<folded_threads>& groups, std::size_t from, std::size_t bytes) {
  std::size_t threads = 0;
  for (std::size_t k = from; k < groups.size(); ++k) threads += groups[k].members.size();
  if (threads == 0) return {};
  return "... " + std::to_string(threads) + (threads == 1 ? " thread" : " threads") + " not shown (" +
         std::to_string(groups.size() - from) + (groups.size() - from == 1 ? " stack" : " stacks") +
         "): a dump holds at most " + std::to_string(bytes) + " bytes";
}

}  // namespace detail

/// The dump as text, gdb-like and grep-able (see the top of this file): a header line, a line
/// saying why when it is incomplete or has no symbols, then per stack a line and its frames
/// (threads with one stack folded: "N threads with this stack: tids ..."), within
/// `bounds.text_bytes`, ending "... N threads not shown" when it had to stop.
inline std::string to_text(const stack_dump& d, const dump_bounds& bounds = {}) {
  std::string out = "elastic watchdog: scope '" + d.scope + "' of pid " + std::to_string(d.pid);
  out += d.rank >= 0 ? " (rank " + std::to_string(d.rank) + ")" : std::string(" (no rank)");
  out += " expired ";
  detail::append_ms(out, d.late, 1);
  out += " ms ago; " + std::to_string(d.threads.size()) + (d.threads.size() == 1 ? " thread" : " threads");
  out += ", captured in ";
  detail::append_ms(out, d.capture_time, 0);
  out += " ms\n";
  if (!d.reason.empty()) out += (d.complete ? "no symbols: " : "dump incomplete: ") + d.reason + "\n";
  const auto groups = fold_threads(d);
  std::string entry;
  for (std::size_t k = 0; k < groups.size(); ++k) {
    entry.clear();
    detail::append_thread_line(entry, d, groups[k], bounds.tids_listed);
    detail::append_frames_text(entry, d.threads[groups[k].members.front()]);
    if (k > 0 && out.size() + entry.size() > bounds.text_bytes) {
      out += detail::not_shown(groups, k, bounds.text_bytes) + "\n";
      break;
    }
    out += entry;
  }
  return out;
}

/// How many threads to_json() left out (past `bounds.json_bytes`), and of how many stacks.
struct json_cut {
  std::size_t threads = 0;
  std::size_t stacks = 0;
};

/// The threads as a JSON array, what `watchdog_stack` carries as "stacks", one object per stack
/// (threads with one stack folded), within `bounds.json_bytes`:
///   [{"tid":1234,"name":"train","state":"R","wchan":null,"scope_thread":true,"note":null,
///     "count":1,"tids":[1234],
///     "frames":[{"pc":"0x55d0c0de1234","function":"hang_here(int)","file":"/src/train.cpp",
///                "line":42,"module":"/src/build/train","offset":"0x1234","inlined":false,
///                "unverified":false}, ...]}, ...]
/// tid, name, state and wchan are the first thread's; "count" how many threads have the stack,
/// "tids" the first `bounds.tids_listed` of them. Addresses are hexadecimal strings (a JSON
/// number cannot hold every 64-bit value); what is unknown is null. `cut`, when given, says what
/// was left out.
inline std::string to_json(const stack_dump& d, const dump_bounds& bounds = {}, json_cut* cut = nullptr) {
  std::string out = "[";
  std::string entry;
  const auto groups = fold_threads(d);
  if (cut != nullptr) *cut = {};
  for (std::size_t k = 0; k < groups.size(); ++k) {
    const auto& g = groups[k];
    const thread_stack& t = d.threads[g.members.front()];
    entry.assign(k == 0 ? "{\"tid\":" : ",{\"tid\":");
    entry += std::to_string(t.tid) + ",\"name\":";
    internal::append_json_string(entry, t.name);
    entry += ",\"state\":";
    internal::append_json_string(entry, std::string_view(&t.state, 1));
    entry += ",\"wchan\":";
    detail::append_text_or_null(entry, t.wchan);
    entry += t.scope_thread ? ",\"scope_thread\":true,\"note\":" : ",\"scope_thread\":false,\"note\":";
    detail::append_text_or_null(entry, t.note);
    entry += ",\"count\":" + std::to_string(g.members.size()) + ",\"tids\":[";
    for (std::size_t m = 0; m < std::min(g.members.size(), bounds.tids_listed); ++m) {
      if (m > 0) entry += ',';
      entry += std::to_string(d.threads[g.members[m]].tid);
    }
    entry += "],\"frames\":[";
    for (std::size_t i = 0; i < t.frames.size(); ++i) {
      const stack_frame& f = t.frames[i];
      entry += i == 0 ? "{\"pc\":" : ",{\"pc\":";
      detail::append_hex_string(entry, f.pc);
      entry += ",\"function\":";
      detail::append_text_or_null(entry, f.function);
      entry += ",\"file\":";
      detail::append_text_or_null(entry, f.file);
      entry += ",\"line\":";
      if (f.line > 0) internal::append_json_integer(entry, f.line);
      else entry += "null";
      entry += ",\"module\":";
      detail::append_text_or_null(entry, f.module);
      entry += ",\"offset\":";
      if (f.module.empty()) entry += "null";
      else detail::append_hex_string(entry, f.offset);
      entry += f.inlined ? ",\"inlined\":true" : ",\"inlined\":false";
      entry += f.unverified ? ",\"unverified\":true}" : ",\"unverified\":false}";
    }
    entry += "]}";
    if (k > 0 && out.size() + entry.size() + 1 > bounds.json_bytes) {
      if (cut != nullptr) {
        for (std::size_t r = k; r < groups.size(); ++r) cut->threads += groups[r].members.size();
        cut->stacks = groups.size() - k;
      }
      break;
    }
    out += entry;
  }
  out += ']';
  return out;
}

}  // namespace elastic::inline v1::timer
