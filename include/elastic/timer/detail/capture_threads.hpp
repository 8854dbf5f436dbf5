// The capture threads of a watchdog: before it signals a process whose scope expired, the stacks
// of that process's threads are captured from outside (stack_capture.hpp) and logged
// (`watchdog_stack`, then watchdog_options::on_stack), within watchdog_options::stack_dump_limit.
//
// Each capture runs on a thread of its own, never on the scanning thread. The scanner goes on
// enforcing every other deadline while a capture waits for threads to stop or for libdw to name
// frames, so one process's capture delays no other process's signal, and its own signal waits at
// most the bound: hold() keeps the signal back until the capture says it is done or the bound
// passes, whichever is first. A thread per capture is also what ptrace needs: each tracee belongs
// to the thread that attached it, and a thread that exits detaches whatever it still holds (a
// thread that never stopped). A capture that ends rings the segment's doorbell, so the scanner
// signals at once; one still running at its bound is taken as it stands (what it has published),
// said to be incomplete, and joined later. A capture detaches every thread it stopped before it
// says it is done, so a soft signal (SIGTERM, SIGABRT) reaches a process its handler can run in.
#pragma once

#include <pthread.h>
#include <sched.h>
#include <sys/types.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <elastic/events.hpp>
#include <elastic/internal/futex.hpp>
#include <elastic/internal/process.hpp>
#include <elastic/timer/detail/ptrace_stacks.hpp>
#include <elastic/timer/detail/stack_capture.hpp>
#include <elastic/timer/detail/table.hpp>
#include <elastic/timer/stack_dump.hpp>
#include <elastic/timer/watchdog_options.hpp>

namespace elastic::inline v1::timer::detail {

class capture_threads {
 public:
  /// Most captures running at once; a process that expires beyond them is signalled with its
  /// threads' names and states only, and a dump that says why.
  static constexpr std::size_t most_at_once = 16;

  /// Captures for the watchdog whose options, events, segment identity and doorbell these are;
  /// all must outlive this object (the watchdog's members do).
  capture_threads(const watchdog_options& opts, const event_log& events, const internal::file_identity& segment,
                 std::atomic<std::uint32_t>& doorbell) noexcept
      : opts_(opts), events_(events), segment_(segment), doorbell_(doorbell) {}

  capture_threads(const capture_threads&) = delete;
  capture_threads& operator=(const capture_threads&) = delete;
  ~capture_threads() = default;  // joins every capture, each bounded by stack_dump_limit

  /// For an expired scope `e` of process (pid, start) in slot `s`: whether its signal must wait
  /// for the capture of its stacks. True while one runs within its bound (the first call starts
  /// it). False when stack dumps are off, when the process is not a client (the signal refuses
  /// it and says why), when its dump was logged already, or once the capture ended: then, that
  /// once, after logging its `watchdog_stack` and calling on_stack.
  bool hold(const slot& s, pid_t pid, std::uint64_t start, const entry_snapshot& e, std::int64_t now) {
    if (!opts_.stack_dump) return false;
    auto it = running_.find(pid);
    if (it != running_.end() && it->second.start != start) {
      finish(it, now);  // the pid names a newer process now: the old one's dump goes out as it is
      it = running_.end();
    }
    if (it != running_.end()) {
      it->second.seen = true;
      {
        std::lock_guard lk(it->second.state->mu);
        if (!it->second.state->done && now < it->second.due_ns) return true;
      }
      finish(it, now);
      return false;
    }
    if (reported_.count({pid, start}) != 0) return false;
    if (internal::process_maps_file(pid, segment_) != internal::maps_result::maps) return false;
    return begin(s, pid, start, e, now);
  }

  /// After each scan: logs the dump of a capture that ended, or reached its bound, while the
  /// scan no longer saw its process's expired scope (the process left the scope, or its slots
  /// were freed): no signal follows, the dump still tells what it was doing. Returns when the
  /// scanner must look next for the captures still running (one that ends sooner rings the
  /// doorbell).
  std::int64_t settle(std::int64_t now) {
    std::int64_t next = std::numeric_limits<std::int64_t>::max();
    for (auto it = running_.begin(); it != running_.end();) {
      capture& c = it->second;
      const bool seen = std::exchange(c.seen, false);
      bool over;
      {
        std::lock_guard lk(c.state->mu);
        over = c.state->done || now >= c.due_ns;
      }
      if (over && !seen) {
        it = finish(it, now);
        continue;
      }
      next = std::min(next, over ? now : c.due_ns);  // over since hold() looked: look again now
      ++it;
    }
    return next;
  }

  /// Forgets processes that are gone: logs the dump of one that ended during its capture (no
  /// scan will see its scope again), joins captures that overran their bound and have ended.
  void forget_gone(std::int64_t now) {
    for (auto it = running_.begin(); it != running_.end();) {
      if (internal::process_alive(it->first, it->second.start)) {
        ++it;
      } else {
        it = finish(it, now);
      }
    }
    for (auto it = reported_.begin(); it != reported_.end();) {
      it = internal::process_alive(it->first, it->second) ? std::next(it) : reported_.erase(it);
    }
    std::erase_if(lingering_, [](const late_capture& l) {
      std::lock_guard lk(l.state->mu);
      return l.state->done;  // its thread is returning: the jthread joins it as it goes
    });
  }

 private:
  /// What a capture thread publishes and the scanner takes.
  struct shared {
    std::mutex mu;
    stack_dump dump;  ///< the header the scanner wrote, the threads the capture found so far
    bool done = false;
  };
  struct capture {
    std::uint64_t start = 0;
    pid_t tid = 0;  ///< the thread whose scope expired
    std::int64_t started_ns = 0;
    std::int64_t due_ns = 0;
    bool seen = true;  ///< hold() looked at it in the scan now ending
    std::shared_ptr<shared> state;
    std::jthread thread;  ///< last: joined before the state it uses goes
  };
  struct late_capture {
    std::shared_ptr<shared> state;
    std::jthread thread;
  };
  using running_map = std::unordered_map<pid_t, capture>;

  bool begin(const slot& s, pid_t pid, std::uint64_t start, const entry_snapshot& e, std::int64_t now) {
    stack_dump header;
    header.pid = pid;
    header.rank = s.head.rank.load(std::memory_order_relaxed);
    header.scope.assign(e.name, ::strnlen(e.name, sizeof e.name));
    header.late = std::chrono::nanoseconds(now - e.deadline_ns);
    const pid_t tid = s.head.tid.load(std::memory_order_relaxed);
    if (running_.size() >= most_at_once) {
      for (const pid_t t : task_ids(pid)) header.threads.push_back(describe_thread(pid, t));
      header.reason = "not captured: " + std::to_string(most_at_once) + " captures were running already";
      report(header, tid);
      reported_.emplace(pid, start);
      return false;
    }
    capture_request rq;
    rq.pid = pid;
    rq.start_time = start;
    rq.scope_tid = tid;
    rq.segment = segment_;
    rq.started_ns = now;
    rq.deadline_ns = now + opts_.stack_dump_limit.count() * 1'000'000;
    auto state = std::make_shared<shared>();
    state->dump = header;
    try {
      std::jthread worker([state, rq, bell = &doorbell_] {
        // Naming frames burns CPU: never at the scanner's real-time priority.
        sched_param normal{};
        ::pthread_setschedparam(::pthread_self(), SCHED_OTHER, &normal);
        stack_dump found;
        capture_stacks(rq, found, [&](const stack_dump& d, bool done, std::size_t from, std::size_t to) noexcept {
          std::lock_guard lk(state->mu);
          try {
            // Only what changed: publishing every thread after each one is named made a dump of
            // N threads cost N^2 copies.
            if (state->dump.threads.size() != d.threads.size()) {
              state->dump.threads = d.threads;
            } else {
              for (std::size_t i = from; i < to && i < d.threads.size(); ++i) state->dump.threads[i] = d.threads[i];
            }
          } catch (...) {  // out of memory: the threads published before stand
          }
          state->dump.complete = d.complete;
          state->dump.symbols = d.symbols;
          state->dump.reason = d.reason;
          state->done = done;
        });
        internal::futex_ring(*bell);
      });
      running_.try_emplace(pid, capture{start, tid, now, rq.deadline_ns, true, std::move(state), std::move(worker)});
    } catch (const std::system_error& x) {
      header.reason = std::string("not captured: cannot start a capture thread: ") + x.what();
      report(header, tid);
      reported_.emplace(pid, start);
      return false;
    }
    return true;
  }

  /// Logs the dump of capture `it` as it stands and forgets it; returns the next capture.
  running_map::iterator finish(running_map::iterator it, std::int64_t now) {
    capture& c = it->second;
    stack_dump d;
    bool done;
    {
      std::lock_guard lk(c.state->mu);
      d = c.state->dump;
      done = c.state->done;
    }
    d.capture_time = std::chrono::nanoseconds(now - c.started_ns);
    if (!done) {
      d.complete = false;
      add_reason(d, "the capture did not end within its bound of " + std::to_string(opts_.stack_dump_limit.count()) +
                        " ms: what it had found by then is shown");
    }
    reported_.emplace(it->first, c.start);
    report(d, c.tid);
    if (done) {
      c.thread.join();  // it only has to return: detaching what it held happens as it exits
    } else {
      lingering_.push_back({std::move(c.state), std::move(c.thread)});
    }
    return running_.erase(it);
  }

  void report(const stack_dump& d, pid_t tid) const {
    const std::string text = to_text(d);
    json_cut cut;
    const std::string stacks = to_json(d, {}, &cut);
    events_.emit("watchdog_stack",
                 {{"segment", opts_.name},
                  {"target_pid", d.pid},
                  {"target_tid", tid},
                  {"target_rank", d.rank >= 0 ? event_value(d.rank) : event_value(nullptr)},
                  {"scope", d.scope},
                  {"late_ms", std::chrono::duration<double, std::milli>(d.late).count()},
                  {"capture_ms", std::chrono::duration<double, std::milli>(d.capture_time).count()},
                  {"complete", d.complete},
                  {"symbols", d.symbols},
                  {"reason", d.reason.empty() ? event_value(nullptr) : event_value(d.reason)},
                  {"threads", d.threads.size()},
                  {"threads_not_shown", cut.threads},  // in "stacks", past its bound (the text says its own)
                  {"text", text},
                  {"stacks", event_value::json(stacks)}});
    if (opts_.on_stack) {
      try {
        opts_.on_stack(d);
      } catch (...) {
      }
    }
  }

  const watchdog_options& opts_;
  const event_log& events_;
  const internal::file_identity& segment_;
  std::atomic<std::uint32_t>& doorbell_;
  std::set<std::pair<pid_t, std::uint64_t>> reported_;  ///< dumps logged, until their process is gone
  std::vector<late_capture> lingering_;  ///< captures past their bound, joined once they end
  running_map running_;                  ///< last: its threads are joined first
};

}  // namespace elastic::inline v1::timer::detail
