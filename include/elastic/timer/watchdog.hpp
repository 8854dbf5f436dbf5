// The watchdog: owns the shared-memory table of timer scopes, scans it, and signals every
// process whose scope has expired.
//
//   elastic::timer::watchdog wd({.name = "job7"});   // creates the segment, starts scanning
//   // workers run with ELASTIC_WATCHDOG=job7 ...
//
// It sleeps until the earliest deadline (or warning: detail/scope_warnings.hpp) it knows of, at
// most `poll`, and is woken early by a worker that enters a scope due before then; so an idle
// watchdog costs nothing measurable and an expired scope is acted on within a millisecond.
//
// Whom it may signal. The table is written by its clients, and any of them (buggy, or
// compromised, with the same uid) can write any pid into a slot; a watchdog running as root
// must not become a way to kill pid 1 or another user's process. So the watchdog learns who its
// clients are from the kernel, not from the table: a process that maps this very segment object
// (its device and inode, not just its name, in /proc/PID/maps) has attached to it, and no client
// can make another process map it. Before every signal, the scope's and the SIGKILL escalation
// alike, the watchdog pins the process with a pidfd, checks its start time against the slot,
// checks that the pinned process maps the segment, and only then sends the signal through the
// pidfd (internal::signal_client). A process that fails is never signalled: its slots are
// freed and one `watchdog_refused` event per process says why.
// Why not a registration handshake instead: see docs/design.md, "Whom the watchdog may signal".
#pragma once

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <cstdint>
#include <iterator>
#include <set>
#include <stop_token>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <elastic/internal/clock.hpp>
#include <elastic/internal/process.hpp>
#include <elastic/internal/futex.hpp>
#include <elastic/error.hpp>
#include <elastic/events.hpp>
#include <elastic/timer/detail/segment.hpp>
#include <elastic/timer/detail/capture_threads.hpp>
#include <elastic/timer/detail/scope_warnings.hpp>
#include <elastic/timer/detail/table.hpp>
#include <elastic/timer/detail/watchdog_counters.hpp>
#include <elastic/timer/detail/whom_to_signal.hpp>
#include <elastic/timer/watchdog_options.hpp>

namespace elastic::inline v1::timer {

class watchdog {
 public:
  /// Creates the segment (or adopts the one of a dead watchdog) and, unless
  /// `start_thread` is false, starts scanning on its own thread. Throws elastic::error.
  explicit watchdog(watchdog_options opts)
      : opts_(std::move(opts).checked()),
        events_(opts_.events ? std::move(*opts_.events) : event_log::from_env()),
        segment_(detail::segment::create_or_adopt(opts_.name, opts_.capacity)),
        segment_id_(segment_.identity()),
        captures_(opts_, events_, segment_id_, segment_.table().header().doorbell) {
    opts_.events.reset();
    try {
      if (segment_id_.ino == 0) throw os_error("cannot stat watchdog segment '" + opts_.name + "'");
      auto& h = segment_.table().header();
      h.default_signal.store(opts_.signal, std::memory_order_relaxed);
      for (const auto& obj : segment_.swept()) {
        events_.emit("watchdog_swept", {{"segment", opts_.name}, {"object", "/dev/shm/" + obj},
                                        {"reason", "no process maps it and no watchdog serves it"}});
      }
      for (const auto& text : segment_.planted()) events_.emit("shm_planted", {{"segment", opts_.name}, {"text", text}});
      if (segment_.adopted()) {
        const std::uint32_t reclaimed = sweep(internal::monotonic_ns());
        events_.emit("watchdog_adopt", {{"segment", opts_.name},
                                        {"slots", h.slot_count},
                                        {"reclaimed_slots", reclaimed},
                                        {"live_slots", count_owned()}});
      }
      events_.emit("watchdog_start", {{"segment", opts_.name},
                                      {"slots", h.slot_count},
                                      {"poll_ms", static_cast<std::int64_t>(opts_.poll.count())},
                                      {"signal", internal::signal_name(opts_.signal)}});
      if (opts_.start_thread) {
        thread_ = std::jthread([this](std::stop_token st) {
          raise_priority();
          run_guarded(st);
        });
      }
    } catch (...) {
      // No destructor runs for a constructor that throws: leave nothing behind in /dev/shm.
      segment_.table().header().watchdog_pid.store(0, std::memory_order_release);
      if (opts_.remove_on_stop) segment_.remove();
      try {
        throw;
      } catch (const error&) {
        throw;
      } catch (const std::system_error& e) {
        throw error(errc::os_error, "cannot start the watchdog thread for segment '" + opts_.name + "'", e.code());
      }
    }
  }

  watchdog(const watchdog&) = delete;
  watchdog& operator=(const watchdog&) = delete;

  ~watchdog() { stop(); }

  /// Stops scanning (joins the thread) and, with remove_on_stop, unlinks the segment. Workers
  /// still running keep their mapping; their scopes are simply no longer enforced.
  void stop() noexcept {
    if (stopped_.exchange(true)) return;
    if (thread_.joinable()) {
      thread_.request_stop();
      internal::futex_ring(segment_.table().header().doorbell);
      thread_.join();
    }
    segment_.table().header().watchdog_pid.store(0, std::memory_order_release);
    events_.emit("watchdog_stop", {{"segment", opts_.name}, {"scans", stats_.scans.load()},
                                   {"signals", stats_.signals.load()}, {"warnings", warnings_.count()},
                                   {"reclaimed_slots", stats_.reclaimed.load()}});
    if (opts_.remove_on_stop) segment_.remove();
  }

  /// Scans until `stop` is requested. Called by the watchdog's own thread; call it yourself
  /// only with start_thread = false.
  void run(std::stop_token stop) {
    auto& h = segment_.table().header();
    std::int64_t next_sweep = internal::monotonic_ns() + ns(opts_.reclaim_interval);
    while (!stop.stop_requested()) {
      const std::uint32_t seen = h.doorbell.load(std::memory_order_acquire);
      // While we scan, a worker entering any scope rings: we might scan its slot too early.
      h.next_wake_ns.store(std::numeric_limits<std::int64_t>::max(), std::memory_order_relaxed);
      std::int64_t now = internal::monotonic_ns();
      if (now >= next_sweep) {
        sweep(now);
        next_sweep = now + ns(opts_.reclaim_interval);
      }
      const scan_result r = scan_once(now);
      const std::int64_t wake = std::min({r.next_deadline_ns, now + ns(opts_.poll), next_sweep});
      h.next_wake_ns.store(wake, std::memory_order_release);
      if (stop.stop_requested()) break;
      internal::futex_wait_until(h.doorbell, seen, wake);
    }
  }

  /// One pass over the table at time `now`: signals processes whose scopes expired, escalates,
  /// and returns the earliest deadline still ahead.
  scan_result scan_once(std::int64_t now = internal::monotonic_ns()) {
    scan_result r;
    for_each_owned([&](detail::slot& s, pid_t pid, std::uint64_t start) {
      if (start == 0) return;  // being claimed
      ++r.owned_slots;
      const std::uint32_t depth = std::min(s.head.depth.load(std::memory_order_acquire), detail::scopes_per_slot);
      for (std::uint32_t j = 0; j < depth; ++j) {
        detail::entry_snapshot e;
        if (!detail::read_entry_stable(s.scopes[j], e)) continue;
        ++r.live_scopes;
        if (e.deadline_ns > now) {
          r.next_deadline_ns = std::min(r.next_deadline_ns, warnings_.look(segment_.table(), s, j, pid, e, now));
        } else if (on_expired(s, pid, start, e, now)) {
          ++r.signals_sent;
        }
      }
    });
    r.next_deadline_ns = std::min({r.next_deadline_ns, escalate(now), captures_.settle(now)});
    stats_.scans.fetch_add(1, std::memory_order_relaxed);
    return r;
  }

  /// Frees the slots of processes that are gone; returns how many.
  std::uint32_t sweep(std::int64_t now = internal::monotonic_ns()) {
    std::uint32_t freed = 0;
    std::unordered_map<pid_t, bool> alive;
    for_each_owned([&](detail::slot&, pid_t pid, std::uint64_t start) {
      if (start == 0) {
        // Claiming: only a process that died mid-claim stays here; any process with the pid
        // being alive keeps the slot until the next sweep.
        if (internal::process_alive(pid, 0)) return;
      } else {
        auto [it, inserted] = alive.try_emplace(pid, false);
        if (inserted) it->second = internal::process_alive(pid, start);
        if (it->second) return;
      }
      freed += reclaim_process(pid, start, "process gone");
    });
    captures_.forget_gone(now);
    warnings_.forget_ended(segment_.table());
    // Forget refusals of processes that are gone, so the set stays as small as the live ones.
    for (auto it = refused_.begin(); it != refused_.end();) {
      it = internal::process_alive(it->first, it->second) ? std::next(it) : refused_.erase(it);
    }
    return freed;
  }

  [[nodiscard]] watchdog_stats stats() const noexcept { return stats_.snapshot(warnings_.count()); }
  [[nodiscard]] const std::string& name() const noexcept { return opts_.name; }
  [[nodiscard]] detail::table_view table() const noexcept { return segment_.table(); }
  [[nodiscard]] bool adopted() const noexcept { return segment_.adopted(); }
  /// The log this watchdog writes its events to.
  [[nodiscard]] const event_log& events() const noexcept { return events_; }
  /// The process this watchdog is signalling for an expired scope right now (0: none): set before
  /// the signal and cleared once on_kill returned. A host that reaps a signalled process before
  /// its on_kill came (a loaded machine) learns here to wait for it. Any thread.
  [[nodiscard]] pid_t signalling() const noexcept { return signalling_.load(std::memory_order_acquire); }

 private:
  struct kill_record {
    std::uint64_t start_time;
    int signal;
    std::int64_t sent_ns;
    bool final;  ///< SIGKILL sent (or escalation done): wait for it to die
    char scope[detail::scope_name_bytes];  ///< the expired scope, for the events that follow
  };

  void raise_priority() noexcept {
    if (opts_.realtime_priority <= 0) return;
    sched_param p{};
    p.sched_priority = opts_.realtime_priority;
    if (const int rc = ::pthread_setschedparam(::pthread_self(), SCHED_FIFO, &p); rc != 0) {
      events_.emit("watchdog_priority", {{"segment", opts_.name},
                                              {"wanted", "SCHED_FIFO"},
                                              {"priority", opts_.realtime_priority},
                                              {"result", std::strerror(rc)},
                                              {"running_at", "normal priority"}});
    }
  }

  /// Calls f(slot, owner pid, owner start time) for every owned slot below the high-water mark;
  /// a start time of 0 means the slot is still being claimed.
  template <class F>
  void for_each_owned(F&& f) const {
    const auto t = segment_.table();
    const std::uint32_t hw = std::min(t.header().slots_high_water.load(std::memory_order_acquire), t.slot_count());
    for (std::uint32_t i = 0; i < hw; ++i) {
      detail::slot& s = t.at(i);
      const auto pid = static_cast<pid_t>(s.head.owner.load(std::memory_order_acquire));
      if (pid == 0) continue;
      f(s, pid, s.head.start_time.load(std::memory_order_acquire));
    }
  }

  static std::int64_t ns(std::chrono::milliseconds ms) noexcept { return ms.count() * 1'000'000; }

  /// run(), kept going through anything it throws (memory exhaustion in a bookkeeping map): an
  /// exception must neither end the process through std::terminate nor stop enforcement.
  void run_guarded(std::stop_token stop) noexcept {
    while (!stop.stop_requested()) {
      try {
        run(stop);
        return;
      } catch (const std::exception& e) {
        events_.emit("watchdog_error", {{"segment", opts_.name}, {"error", e.what()}, {"effect", "scanning again"}});
      } catch (...) {
        events_.emit("watchdog_error", {{"segment", opts_.name}, {"error", "unknown exception"}, {"effect", "scanning again"}});
      }
      std::this_thread::sleep_for(opts_.poll);
    }
  }

  /// Refuses to signal process (pid, start), which failed signal_client()'s check: frees its
  /// slots (their content came from someone else, or from a process that no longer maps the
  /// segment) and logs one `watchdog_refused` per process.
  void refuse(pid_t pid, std::uint64_t start, int sig, std::string_view scope, std::string_view stage,
              const std::string& reason) {
    stats_.refused.fetch_add(1, std::memory_order_relaxed);
    reclaim_process(pid, start, "refused: not a client");
    if (!refused_.emplace(pid, start).second) return;
    events_.emit("watchdog_refused", {{"segment", opts_.name},
                                      {"target_pid", pid},
                                      {"target_start_time", start},
                                      {"scope", scope},
                                      {"signal", internal::signal_name(sig)},
                                      {"stage", stage},
                                      {"reason", reason},
                                      {"effect", "not signalled; its slots were freed"}});
  }

  /// False, after refusing it, for a process no slot may get signalled (detail/whom_to_signal.hpp).
  bool may_signal(pid_t pid, std::uint64_t start, int sig, std::string_view scope, std::string_view stage) {
    const std::string why = detail::signal_refusal(pid, start, opts_.descendants_only);
    if (!why.empty()) refuse(pid, start, sig, scope, stage, why);
    return why.empty();
  }

  std::uint32_t count_owned() const noexcept {
    std::uint32_t n = 0;
    const auto t = segment_.table();
    for (std::uint32_t i = 0; i < t.slot_count(); ++i)
      if (t.at(i).head.owner.load(std::memory_order_acquire) != 0) ++n;
    return n;
  }

  /// Handles one expired scope of process (pid, start). True when a signal was sent.
  bool on_expired(detail::slot& s, pid_t pid, std::uint64_t start, const detail::entry_snapshot& e,
                  std::int64_t now) {
    auto it = kills_.find(pid);
    if (it != kills_.end() && it->second.start_time == start) {
      // Already signalled for this process; escalate() follows up. Free its slots once it died.
      if (!internal::process_alive(pid, start)) reclaim_process(pid, start, "killed");
      return false;
    }
    const int sig = e.signal != 0 ? e.signal : opts_.signal;
    if (!may_signal(pid, start, sig, e.name, "signal")) return false;  // nor trace it, nor escalate
    if (captures_.hold(s, pid, start, e, now)) return false;  // its stacks first (capture_threads.hpp)
    internal::client_check why;
    signalling_.store(pid, std::memory_order_release);
    const struct done_signalling {
      std::atomic<pid_t>& pid;
      ~done_signalling() { pid.store(0, std::memory_order_release); }
    } done{signalling_};
    const auto result = internal::signal_client(pid, start, sig, segment_id_, &why);
    const int err = errno;
    if (result == internal::signal_result::gone) {
      // Died on its own (or the pid now names a newer process): nothing to kill.
      reclaim_process(pid, start, "process gone");
      return false;
    }
    if (result == internal::signal_result::refused) {
      refuse(pid, start, sig, e.name, "signal", detail::not_mapped_reason(pid, opts_.name, "signal", why));
      return false;
    }
    kill_record& k = kills_[pid] = kill_record{start, sig, now, sig == SIGKILL || result != internal::signal_result::sent, {}};
    std::memcpy(k.scope, e.name, sizeof k.scope);
    const std::int64_t late = now - e.deadline_ns;
    const int rank = s.head.rank.load(std::memory_order_relaxed);
    if (result == internal::signal_result::failed) {
      events_.emit("watchdog_kill_failed",
                        {{"segment", opts_.name}, {"target_pid", pid}, {"scope", std::string_view(e.name)},
                         {"signal", internal::signal_name(sig)}, {"errno", err}});
      return false;
    }
    stats_.signalled(late);
    events_.emit("watchdog_kill",
                      {{"segment", opts_.name},
                       {"target_pid", pid},
                       {"target_tid", s.head.tid.load(std::memory_order_relaxed)},
                       {"target_rank", rank >= 0 ? event_value(rank) : event_value(nullptr)},
                       {"scope", std::string_view(e.name)},
                       {"signal", internal::signal_name(sig)},
                       {"signo", sig},
                       {"limit_ms", static_cast<double>(e.deadline_ns - e.entered_ns) / 1e6},
                       {"held_ms", static_cast<double>(now - e.entered_ns) / 1e6},
                       {"late_ms", static_cast<double>(late) / 1e6}});
    if (opts_.on_kill) {
      try {
        opts_.on_kill(watchdog_kill_report{pid, s.head.tid.load(std::memory_order_relaxed), rank,
                                           std::string_view(e.name, ::strnlen(e.name, sizeof e.name)), sig,
                                           std::chrono::nanoseconds(e.deadline_ns - e.entered_ns),
                                           std::chrono::nanoseconds(now - e.entered_ns), std::chrono::nanoseconds(late)});
      } catch (...) {
      }
    }
    return true;
  }

  /// Sends SIGKILL to processes still alive `escalate_after` past a softer signal; forgets
  /// processes that are gone. Returns when it next needs to look.
  std::int64_t escalate(std::int64_t now) {
    std::int64_t next = std::numeric_limits<std::int64_t>::max();
    for (auto it = kills_.begin(); it != kills_.end();) {
      const pid_t pid = it->first;
      kill_record& k = it->second;
      if (!internal::process_alive(pid, k.start_time)) {
        reclaim_process(pid, k.start_time, "killed");
        it = kills_.erase(it);
        continue;
      }
      if (!k.final) {
        const std::int64_t due = k.sent_ns + ns(opts_.escalate_after);
        if (now >= due) {
          k.final = true;
          internal::client_check why;
          const auto result = internal::signal_client(pid, k.start_time, SIGKILL, segment_id_, &why);
          if (result == internal::signal_result::refused) {
            refuse(pid, k.start_time, SIGKILL, k.scope, "escalate", detail::not_mapped_reason(pid, opts_.name, "escalate", why));
            it = kills_.erase(it);
            continue;
          }
          if (result == internal::signal_result::sent) {
            stats_.escalations.fetch_add(1, std::memory_order_relaxed);
            events_.emit("watchdog_escalate", {{"segment", opts_.name},
                                                    {"target_pid", pid},
                                                    {"after_signal", internal::signal_name(k.signal)},
                                                    {"signal", "SIGKILL"},
                                                    {"grace_ms", static_cast<std::int64_t>(opts_.escalate_after.count())}});
          }
        } else {
          next = std::min(next, due);
        }
      }
      ++it;
    }
    return next;
  }

  /// Frees every slot of the process (pid, start). Its deadlines are dropped: a process that
  /// no longer exists is never signalled, and a newer process with the same pid never is
  /// for the old one's scopes.
  std::uint32_t reclaim_process(pid_t pid, std::uint64_t start, std::string_view reason) {
    std::uint32_t freed = 0;
    const auto t = segment_.table();
    const std::uint32_t hw = std::min(t.header().slots_high_water.load(std::memory_order_acquire), t.slot_count());
    for (std::uint32_t i = 0; i < hw; ++i) {
      detail::slot& s = t.at(i);
      if (s.head.owner.load(std::memory_order_acquire) != static_cast<std::uint64_t>(pid)) continue;
      if (s.head.start_time.load(std::memory_order_acquire) != start) continue;
      for (auto& e : s.scopes) e.generation.store(0, std::memory_order_relaxed);
      s.head.depth.store(0, std::memory_order_relaxed);
      s.head.rank.store(-1, std::memory_order_relaxed);
      // Move the generation far past anything the dead owner may have published.
      s.head.generation.fetch_add(std::uint64_t{1} << 40, std::memory_order_relaxed);
      s.head.start_time.store(0, std::memory_order_relaxed);
      s.head.owner.store(0, std::memory_order_release);
      ++freed;
    }
    if (freed > 0) {
      stats_.reclaimed.fetch_add(freed, std::memory_order_relaxed);
      events_.emit("watchdog_reclaim",
                        {{"segment", opts_.name}, {"target_pid", pid}, {"slots", freed}, {"reason", reason}});
    }
    return freed;
  }

  watchdog_options opts_;
  event_log events_;
  detail::segment segment_;
  internal::file_identity segment_id_;  // what a client's /proc/PID/maps shows
  std::unordered_map<pid_t, kill_record> kills_;  // only the scanning thread touches it
  std::set<std::pair<pid_t, std::uint64_t>> refused_;  // logged refusals; only the scanning thread
  detail::scope_warnings warnings_{opts_, events_};  // only the scanning thread (its count: any)
  detail::watchdog_counters stats_;
  detail::capture_threads captures_;  // only the scanning thread calls it; after the segment it rings
  std::atomic<bool> stopped_{false};
  std::atomic<pid_t> signalling_{0};  // set by the scanning thread around a signal and its on_kill
  std::jthread thread_;  // last: it must stop before the members it uses go away
};

}  // namespace elastic::inline v1::timer
