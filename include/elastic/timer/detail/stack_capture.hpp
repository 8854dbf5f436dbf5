// One stack capture: the stack of every thread of another process, taken from outside it with
// ptrace (the calls are in ptrace_stacks.hpp), for the watchdog's stack dumps (stack_dump.hpp).
//
// Why from outside: a hung process may be wedged where no code of its own can run (a thread
// blocked inside malloc holding its arena lock; a handler of ours would wait for that lock
// too). A tracer needs nothing of the process but that its threads stop.
//
// How, all on the calling thread (ptrace ties each tracee to the one thread that attached it),
// each step bounded by the capture's deadline:
//  1. list /proc/PID/task with each thread's name, state and wchan, as they are before we stop it;
//  2. PTRACE_SEIZE the main thread and check, with the process pinned, that it is still the
//     client whose scope expired (start time, maps the segment): a pid in the table is a
//     client's word, not a proof, exactly as for the watchdog's signals;
//  3. PTRACE_SEIZE + PTRACE_INTERRUPT every thread, listing /proc/PID/task again until no new
//     thread appears (a thread may start one until it is stopped itself), until each is stopped;
//  4. walk each stopped thread's stack (libdw; without it, its instruction pointer alone);
//  5. detach every thread, giving back a signal whose delivery a stop held;
//  6. name the frames (libdw: symbol, file:line) while the process runs again.
// A thread that does not stop in time (uninterruptible in the kernel) is listed with its state
// and the reason; the capture goes on without it. It stays traced until the capturing thread
// exits, which detaches it: one reason the watchdog gives each capture a thread of its own.
#pragma once

#include <sys/types.h>
#include <time.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <elastic/config.hpp>
#include <elastic/internal/clock.hpp>
#include <elastic/internal/process.hpp>
#include <elastic/timer/detail/libdw_stacks.hpp>
#include <elastic/timer/detail/ptrace_stacks.hpp>
#include <elastic/timer/stack_dump.hpp>

namespace elastic::inline v1::timer::detail {

/// What one capture is asked.
struct capture_request {
  pid_t pid = 0;
  std::uint64_t start_time = 0;      ///< the client's start time (internal::proc_stat)
  pid_t scope_tid = 0;               ///< the thread whose scope expired
  internal::file_identity segment{};  ///< what the client must map
  std::int64_t started_ns = 0;       ///< monotonic
  std::int64_t deadline_ns = 0;      ///< everything done by then
};

/// Frames kept per thread: the innermost are the ones that say where it hangs.
inline constexpr std::size_t max_stack_frames = 64;

/// Adds a reason to the dump's, after those it has.
inline void add_reason(stack_dump& d, std::string_view why) {
  if (!d.reason.empty()) d.reason += "; ";
  d.reason += why;
}

inline std::string ms_text(std::int64_t ns) { return std::to_string(ns / 1'000'000) + " ms"; }

/// Sleeps a little while waiting for threads to stop: 0.1 ms, doubling to 2 ms.
inline void stop_wait_pause(int round) noexcept {
  const long ns = std::min(100'000L << std::min(round, 5), 2'000'000L);
  timespec ts{0, ns};
  ::nanosleep(&ts, nullptr);
}

/// Steps 1 to 3: the threads, seized and stopped (those that stopped by `by_ns`). False when
/// the process cannot be traced at all, with the reason in `dump`.
inline bool stop_threads(const capture_request& rq, stack_dump& dump, seized_threads& held, std::int64_t by_ns) {
  for (const pid_t tid : task_ids(rq.pid)) dump.threads.push_back(describe_thread(rq.pid, tid));
  if (dump.threads.empty()) {
    add_reason(dump, "pid " + std::to_string(rq.pid) + " ended before it could be stopped");
    return false;
  }
  int err = 0;
  if (!held.seize(rq.pid, err)) {
    add_reason(dump, seize_refusal(rq.pid, err) + "; only the threads' names and states are known");
    return false;
  }
  if (internal::process_start_time(rq.pid) != rq.start_time ||
      internal::process_maps_file(rq.pid, rq.segment) != internal::maps_result::maps) {
    dump.threads.clear();  // whatever it is now, it is not ours to show
    add_reason(dump, "pid " + std::to_string(rq.pid) + " is no longer the client whose scope expired");
    return false;
  }
  // Where each thread is in dump.threads: a lookup per thread and round, not a search.
  std::unordered_map<pid_t, std::size_t> listed;
  for (std::size_t i = 0; i < dump.threads.size(); ++i) listed.emplace(dump.threads[i].tid, i);
  for (int round = 0;; ++round) {
    bool fresh = false;
    for (const pid_t tid : task_ids(rq.pid)) {
      if (held.find(tid) != nullptr) continue;
      auto [at, added] = listed.try_emplace(tid, dump.threads.size());
      if (added) dump.threads.push_back(describe_thread(rq.pid, tid));
      thread_stack* known = &dump.threads[at->second];
      if (!known->note.empty()) continue;  // refused before
      fresh = true;
      if (!held.seize(tid, err)) known->note = err == ESRCH ? "it ended during the capture" : "cannot stop it: " + seize_refusal(tid, err);
    }
    if (held.poll_stops(rq.pid) && !fresh) return true;
    if (internal::monotonic_ns() >= by_ns) return true;
    stop_wait_pause(round);
  }
}

/// Names MODULE+OFFSET each frame of `dump` that has no module yet, from /proc/PID/maps.
inline void name_modules(pid_t pid, stack_dump& dump) {
  const auto maps = code_mappings(pid);
  for (auto& t : dump.threads) {
    for (auto& f : t.frames) {
      if (!f.module.empty()) continue;
      for (const auto& m : maps) {
        if (f.pc >= m.start && f.pc < m.end) {
          f.module = m.path;
          f.offset = f.pc - m.start + m.file_offset;
        }
      }
    }
  }
}

/// Step 4 without libdw: each stopped thread's instruction pointer, named MODULE+OFFSET.
inline void take_instruction_pointers(const capture_request& rq, stack_dump& dump, const seized_threads& held) {
  for (auto& t : dump.threads) {
    const auto* tr = held.find(t.tid);
    if (tr == nullptr || !tr->stopped) continue;
    stack_frame f;
    f.pc = instruction_pointer(t.tid);
    if (f.pc != 0) t.frames.push_back(std::move(f));
  }
  name_modules(rq.pid, dump);
}

/// Captures the stacks of process `rq.pid` into `dump` (its threads, complete, symbols and
/// reason; the caller fills in the rest), following the steps at the top of this file. Calls
/// `publish(dump, done, from, to)` after each step, so that what is known can be taken at the
/// deadline even if a step overran it; threads [from, to) changed since the last call (all of
/// them when their number did); the last call has done = true. Each thread is published a
/// bounded number of times: the cost is linear in threads x frames. Never throws: what it cannot do
/// (memory exhausted, say) ends it with what it has.
template <class Publish>
void capture_stacks(const capture_request& rq, stack_dump& dump, Publish&& publish) noexcept {
  // The bound's share of each step: waiting for stops is the only one that can use all it has.
  const std::int64_t total = rq.deadline_ns - rq.started_ns;
  const std::int64_t stop_by = rq.started_ns + total / 2;
  [[maybe_unused]] const std::int64_t walk_by = rq.started_ns + total * 3 / 4;
  [[maybe_unused]] const std::int64_t names_by = rq.deadline_ns - std::min<std::int64_t>(total / 20, 50'000'000);
  dump.complete = false;
  dump.symbols = false;
  try {
    seized_threads held;
    const bool stopped = stop_threads(rq, dump, held, stop_by);
    for (auto& t : dump.threads) t.scope_thread = t.tid == rq.scope_tid;
    publish(dump, false, 0, dump.threads.size());
    if (!stopped) {
      publish(dump, true, 0, 0);
      return;
    }
    bool whole = true;
    std::size_t unstopped = 0;
    for (auto& t : dump.threads) {
      const auto* tr = held.find(t.tid);
      if ((tr != nullptr && tr->gone) || (tr == nullptr && t.note.empty())) t.note = "it ended during the capture";
      if (tr != nullptr && !tr->stopped && !tr->gone) {
        t.note = "it did not stop within " + ms_text(stop_by - rq.started_ns) +
                 (t.state == 'D' ? ": it is in an uninterruptible wait in the kernel" : "");
        ++unstopped;
      }
      whole = whole && (t.note.empty() || t.note == "it ended during the capture");
    }
    if (unstopped > 0) {
      add_reason(dump, std::to_string(unstopped) + " of " + std::to_string(dump.threads.size()) +
                           " threads did not stop within " + ms_text(stop_by - rq.started_ns));
    } else if (!whole) {
      add_reason(dump, "some threads could not be stopped (see their notes)");
    }
#if ELASTIC_WITH_LIBDW
    std::vector<std::vector<std::uint64_t>> lookups(dump.threads.size());
    auto dw = std::make_unique<libdw_process>(rq.pid);
    if (dw->ok()) {
      for (std::size_t i = 0; i < dump.threads.size(); ++i) {
        thread_stack& t = dump.threads[i];
        const auto* tr = held.find(t.tid);
        if (tr == nullptr || !tr->stopped) continue;
        if (internal::monotonic_ns() >= walk_by) {
          t.note = "not unwound: the capture's time was up";
          whole = false;
          continue;
        }
        std::string cut = dw->unwind(t.tid, t.frames, lookups[i], max_stack_frames, walk_by);
        if (!cut.empty()) t.note = std::move(cut);
      }
    } else {
      add_reason(dump, dw->error() + ": frame #0 of each thread only");
      take_instruction_pointers(rq, dump, held);
    }
#else
    add_reason(dump, "this watchdog was built without libdw (ELASTIC_WITH_LIBDW=0; Debian: libdw-dev): frame #0 of "
                     "each thread only, as MODULE+OFFSET (addr2line -e MODULE OFFSET names it)");
    take_instruction_pointers(rq, dump, held);
#endif
    held.detach_all();
    publish(dump, false, 0, dump.threads.size());
#if ELASTIC_WITH_LIBDW
    if (dw->ok()) {
      dump.symbols = true;
      std::size_t unnamed = 0;
      // Threads of one process share most of their frames (a pool of workers waiting in one
      // place): each address is named once.
      std::unordered_map<std::uint64_t, std::vector<stack_frame>> known;
      for (std::size_t i = 0; i < dump.threads.size(); ++i) {
        auto& frames = dump.threads[i].frames;
        std::vector<stack_frame> named;
        for (std::size_t j = 0; j < frames.size(); ++j) {
          if (auto at = known.find(lookups[i][j]); at != known.end()) {
            named.insert(named.end(), at->second.begin(), at->second.end());
          } else if (internal::monotonic_ns() >= names_by) {
            ++unnamed;
            named.push_back(frames[j]);
          } else {
            const std::size_t first = named.size();
            dw->symbolize(frames[j], lookups[i][j], named);
            known.emplace(lookups[i][j], std::vector<stack_frame>(named.begin() + static_cast<std::ptrdiff_t>(first), named.end()));
          }
        }
        frames = std::move(named);
        publish(dump, false, i, i + 1);
      }
      if (unnamed > 0) {
        add_reason(dump, std::to_string(unnamed) + " of the frames left unnamed: the capture's time was up");
        whole = false;
        name_modules(rq.pid, dump);
        publish(dump, false, 0, dump.threads.size());
      }
      if (!dw->unverified().empty()) {
        // Named from the process's own files where they could be checked; the rest says so.
        whole = false;
        for (auto& t : dump.threads) {
          for (auto& f : t.frames) f.unverified = dw->unverified().count(f.module) != 0;
        }
        std::string which;
        std::size_t listed = 0;
        for (const auto& [module, why] : dw->unverified()) {
          if (listed++ == 4) {
            which += "; and " + std::to_string(dw->unverified().size() - 4) + " more";
            break;
          }
          which += (listed > 1 ? "; " : "") + module + ": " + why;
        }
        add_reason(dump, std::to_string(dw->unverified().size()) + " module" + (dw->unverified().size() == 1 ? "" : "s") +
                             " not verified to be the file pid " + std::to_string(rq.pid) +
                             " maps, frames in them marked [unverified] (" + which + ")");
        publish(dump, false, 0, dump.threads.size());
      }
    }
#endif
    for (const auto& t : dump.threads) whole = whole && (t.note.empty() || t.note == "it ended during the capture");
    dump.complete = whole && unstopped == 0;
    if (!dump.complete && dump.reason.empty()) add_reason(dump, "some stacks are missing or cut short (see each thread's note)");
  } catch (...) {
    add_reason(dump, "the capture failed (out of memory)");
  }
  publish(dump, true, 0, dump.threads.size());
}

}  // namespace elastic::inline v1::timer::detail
