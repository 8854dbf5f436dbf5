// Benchmarks of the timer scopes and the watchdog (Google Benchmark).
//
//   timer_bench [--kill-trials=N] [google benchmark flags...]
//
// What is measured, in this order (each row prints its ratio to the baselines of the same run,
// so the numbers mean something on a noisy machine):
//   BM_empty_loop            baseline: an empty benchmark loop (DoNotOptimize)
//   BM_clock_gettime         baseline: one clock_gettime(CLOCK_MONOTONIC) (vDSO); 1 and 2 threads
//   BM_scope_enter_leave     enter+leave one scope, watchdog hosted in-process; 1 and 2 threads
//   BM_scope_nested8         8 nested scopes entered and left per iteration
//   BM_scope_unwatched       a scope with no watchdog attached: the no-op cost
//   BM_watchdog_idle_cpu     CPU an idle watchdog burns over 2 s (getrusage)
//   BM_full_table_scan       one watchdog::scan_once() over a full 4096-slot table
//   BM_kill_baseline_direct  baseline: kill(SIGKILL) -> waitpid, this process killing the worker
//   BM_kill_latency          deadline -> worker's death seen by waitpid, over many trials
//   BM_kill_latency_stack_dump  the same, without and with the stack dump before the kill
//                            (watchdog_options::stack_dump), for a worker of 1 and of 16 threads
//
// The binary re-executes itself as the hung worker of the kill benchmarks:
//   timer_bench --worker SEGMENT TIMEOUT_MS [THREADS]
// starts THREADS - 1 more threads that wait in pause(), attaches to SEGMENT, enters a scope of
// TIMEOUT_MS, writes the scope's deadline (CLOCK_MONOTONIC ns) on stdout and hangs in pause()
// until the watchdog kills it.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <benchmark/benchmark.h>

#include <elastic/config.hpp>
#include <elastic/internal/clock.hpp>
#include <elastic/internal/process.hpp>
#include <elastic/timer/client.hpp>
#include <elastic/internal/futex.hpp>
#include <elastic/timer/expires.hpp>
#include <elastic/timer/watchdog.hpp>

using namespace std::chrono_literals;
namespace timer = elastic::timer;

namespace {

// ------------------------------------------------------------------------------------------
// The worker (a separate process, started by BM_kill_latency).

[[noreturn]] void write_all_and_hang(const std::string& line) {
  const char* p = line.data();
  std::size_t left = line.size();
  while (left > 0) {
    const ssize_t n = ::write(STDOUT_FILENO, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) std::_Exit(4);
    p += n;
    left -= static_cast<std::size_t>(n);
  }
  for (;;) ::pause();
}

int worker_main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s --worker SEGMENT TIMEOUT_MS [THREADS]\n", argv[0]);
    return 2;
  }
  for (int t = 1; t < (argc > 4 ? std::atoi(argv[4]) : 1); ++t) std::thread([] { for (;;) ::pause(); }).detach();
  try {
    timer::client::attach(argv[2]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "worker: %s\n", e.what());
    return 3;
  }
  const long timeout_ms = std::atol(argv[3]);
  auto scope = elastic::expires(std::chrono::milliseconds(timeout_ms), "hung");
  if (!scope.watched()) {
    std::fprintf(stderr, "worker: scope is not watched\n");
    return 3;
  }
  // The exact deadline the watchdog sees: read back from this thread's slot.
  const auto& b = timer::detail::this_thread();
  const std::int64_t deadline = b.held->scopes[b.depth - 1].deadline_ns.load(std::memory_order_relaxed);
  write_all_and_hang(std::to_string(deadline) + "\n");
}

// ------------------------------------------------------------------------------------------
// Same-run baselines. Every loop below is timed twice: wall clock and this thread's CPU time
// (CLOCK_THREAD_CPUTIME_ID). Wall time is what a trainer waits; CPU time is what the ratios use,
// because other load on the machine deschedules a thread (inflating its wall time) without
// changing how much CPU an iteration takes. Each baseline run stashes its per-iteration times;
// the other benchmarks divide by the median of those (runs shorter than 50 ms, i.e. Google
// Benchmark's iteration-count probes, are left out).

std::int64_t now_ns() { return elastic::internal::monotonic_ns(); }

std::int64_t thread_cpu_ns() {
  timespec ts;
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return std::int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

/// Wall and thread-CPU time of one benchmark loop, per iteration.
struct loop_clock {
  std::int64_t wall0 = now_ns();
  std::int64_t cpu0 = thread_cpu_ns();
  double wall_ns = 0, cpu_ns = 0, run_s = 0;

  void stop(const benchmark::State& state) {
    const std::int64_t wall = now_ns() - wall0, cpu = thread_cpu_ns() - cpu0;
    const auto n = static_cast<double>(state.iterations());
    wall_ns = static_cast<double>(wall) / n;
    cpu_ns = static_cast<double>(cpu) / n;
    run_s = static_cast<double>(wall) / 1e9;
  }
};

struct baseline {
  std::mutex m;
  std::vector<double> cpu_ns, wall_ns;
  void add(const loop_clock& c) {
    if (c.run_s < 0.05) return;
    std::lock_guard l(m);
    cpu_ns.push_back(c.cpu_ns);
    wall_ns.push_back(c.wall_ns);
  }
  static double median_of(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  }
  double cpu() {
    std::lock_guard l(m);
    return median_of(cpu_ns);
  }
  double wall() {
    std::lock_guard l(m);
    return median_of(wall_ns);
  }
};
baseline g_empty;
baseline g_clock[3];  // by thread count (1, 2)

/// Sets the per-iteration counters of a loop (per thread, averaged over threads): `ns` wall,
/// `cpu_ns` thread CPU; x_empty_loop / x_clock_gettime, the CPU time as a multiple of each
/// single-thread baseline's; and x_clock_gettime_wall, the wall time as a multiple of
/// clock_gettime's wall time at the same thread count (so a machine whose threads do not really
/// run in parallel shows up in the baseline too). `per` divides the iteration into that many
/// scopes (8 for 8 nested scopes) for the *_per_scope counters.
void set_loop_counters(benchmark::State& state, const loop_clock& c, int per = 0) {
  using C = benchmark::Counter;
  state.counters["ns"] = C(c.wall_ns, C::kAvgThreads);
  state.counters["cpu_ns"] = C(c.cpu_ns, C::kAvgThreads);
  if (per > 0) {
    state.counters["ns_per_scope"] = C(c.wall_ns / per, C::kAvgThreads);
    state.counters["cpu_ns_per_scope"] = C(c.cpu_ns / per, C::kAvgThreads);
  }
  const double e = g_empty.cpu(), k = g_clock[1].cpu();
  if (e > 0) state.counters["x_empty_loop"] = C(c.cpu_ns / e, C::kAvgThreads);
  if (k > 0) state.counters["x_clock_gettime"] = C(c.cpu_ns / k, C::kAvgThreads);
  const int t = state.threads();
  const double kw = t >= 1 && t <= 2 ? g_clock[t].wall() : 0;
  if (kw > 0) state.counters["x_clock_gettime_wall"] = C(c.wall_ns / kw, C::kAvgThreads);
}

void BM_empty_loop(benchmark::State& state) {
  std::uint64_t x = 0;
  loop_clock c;
  for (auto _ : state) {
    benchmark::DoNotOptimize(x);
    ++x;
  }
  c.stop(state);
  g_empty.add(c);
  set_loop_counters(state, c);
}
BENCHMARK(BM_empty_loop)->Repetitions(5)->DisplayAggregatesOnly();

void BM_clock_gettime(benchmark::State& state) {
  timespec ts;
  loop_clock c;
  for (auto _ : state) {
    ::clock_gettime(CLOCK_MONOTONIC, &ts);
    benchmark::DoNotOptimize(ts);
  }
  c.stop(state);
  if (state.threads() <= 2) g_clock[state.threads()].add(c);
  set_loop_counters(state, c);
}
BENCHMARK(BM_clock_gettime)->Threads(1)->Repetitions(5)->DisplayAggregatesOnly();
BENCHMARK(BM_clock_gettime)->Threads(2)->Repetitions(5)->DisplayAggregatesOnly();

// ------------------------------------------------------------------------------------------
// Scopes against a watchdog hosted in this process (its own thread scanning, as in elastic-run).

std::string bench_name(const char* what) { return std::string("bench-") + what + "-" + std::to_string(::getpid()); }

std::mutex g_scope_wd_mutex;
std::unique_ptr<timer::watchdog> g_scope_wd;

/// Starts (once) the watchdog the scope benchmarks run against and attaches this process to it.
void ensure_scope_watchdog() {
  std::lock_guard l(g_scope_wd_mutex);
  if (!g_scope_wd) {
    g_scope_wd = std::make_unique<timer::watchdog>(
        timer::watchdog_options{.name = bench_name("scopes"), .start_thread = true, .events = elastic::event_log()});
  }
  timer::client::attach(g_scope_wd->name());  // a no-op when already attached
}

void stop_scope_watchdog() {
  std::lock_guard l(g_scope_wd_mutex);
  if (g_scope_wd) {
    timer::client::detach();
    g_scope_wd.reset();  // stops its thread, unlinks the segment
  }
}

/// This thread's first scope claims its slot (a /proc read): done before the timed loop.
bool warm_up_watched(benchmark::State& state) {
  auto warm = elastic::expires(60s, "warmup");
  if (!warm.watched()) state.SkipWithError("scope not watched");
  return warm.watched();
}

void BM_scope_enter_leave(benchmark::State& state) {
  ensure_scope_watchdog();
  if (!warm_up_watched(state)) return;
  loop_clock c;
  for (auto _ : state) {
    auto s = elastic::expires(60s, "step");
    benchmark::DoNotOptimize(s);
  }
  c.stop(state);
  set_loop_counters(state, c, 1);
}
BENCHMARK(BM_scope_enter_leave)->Threads(1)->Repetitions(5)->DisplayAggregatesOnly();
BENCHMARK(BM_scope_enter_leave)->Threads(2)->Repetitions(5)->DisplayAggregatesOnly();

void BM_scope_nested8(benchmark::State& state) {
  ensure_scope_watchdog();
  if (!warm_up_watched(state)) return;
  loop_clock c;
  for (auto _ : state) {
    auto s0 = elastic::expires(60s, "step");
    auto s1 = elastic::expires(50s, "forward");
    auto s2 = elastic::expires(40s, "layer");
    auto s3 = elastic::expires(30s, "attention");
    auto s4 = elastic::expires(20s, "allreduce");
    auto s5 = elastic::expires(10s, "bucket");
    auto s6 = elastic::expires(9s, "send");
    auto s7 = elastic::expires(8s, "wait");
    benchmark::DoNotOptimize(s0);
    benchmark::DoNotOptimize(s7);
  }
  c.stop(state);
  set_loop_counters(state, c, 8);  // ratios are of the whole iteration (8 scopes)
}
BENCHMARK(BM_scope_nested8)->Repetitions(5)->DisplayAggregatesOnly();

void BM_scope_unwatched(benchmark::State& state) {
  stop_scope_watchdog();
  timer::client::detach();  // no watchdog: scopes are no-ops (and nothing looks at the environment)
  {
    auto probe = elastic::expires(60s, "probe");
    if (probe.watched()) {
      state.SkipWithError("scope unexpectedly watched");
      return;
    }
  }
  loop_clock c;
  for (auto _ : state) {
    auto s = elastic::expires(60s, "step");
    benchmark::DoNotOptimize(s);
  }
  c.stop(state);
  set_loop_counters(state, c, 1);
}
BENCHMARK(BM_scope_unwatched)->Repetitions(5)->DisplayAggregatesOnly();

// ------------------------------------------------------------------------------------------
// An idle watchdog (no scopes): CPU time over 2 s of wall time.

double cpu_s(const rusage& r) {
  return static_cast<double>(r.ru_utime.tv_sec + r.ru_stime.tv_sec) +
         static_cast<double>(r.ru_utime.tv_usec + r.ru_stime.tv_usec) / 1e6;
}

void BM_watchdog_idle_cpu(benchmark::State& state) {
  stop_scope_watchdog();  // only the watchdog under test may run
  for (auto _ : state) {
    timer::watchdog wd({.name = bench_name("idle"), .start_thread = false, .events = elastic::event_log()});
    double thread_cpu = 0;
    std::jthread t([&](std::stop_token st) {
      rusage a{}, b{};
      ::getrusage(RUSAGE_THREAD, &a);
      wd.run(st);
      ::getrusage(RUSAGE_THREAD, &b);
      thread_cpu = cpu_s(b) - cpu_s(a);
    });
    rusage pa{}, pb{};
    ::getrusage(RUSAGE_SELF, &pa);
    const std::int64_t t0 = now_ns();
    std::this_thread::sleep_for(2s);
    t.request_stop();
    elastic::internal::futex_ring(wd.table().header().doorbell);
    t.join();
    const double wall = static_cast<double>(now_ns() - t0) / 1e9;
    ::getrusage(RUSAGE_SELF, &pb);
    state.counters["thread_cpu_pct"] = 100.0 * thread_cpu / wall;
    state.counters["process_cpu_pct"] = 100.0 * (cpu_s(pb) - cpu_s(pa)) / wall;
    state.counters["scans_per_s"] = static_cast<double>(wd.stats().scans) / wall;
  }
}
BENCHMARK(BM_watchdog_idle_cpu)->Iterations(1)->Unit(benchmark::kMillisecond);

// ------------------------------------------------------------------------------------------
// One scan of a full table: every slot of a default-capacity (4096) segment owned by a live
// process (this one) with `depth` scopes each, all due far in the future, so the scan reads
// everything and signals nobody.

void BM_full_table_scan(benchmark::State& state) {
  stop_scope_watchdog();
  const auto depth = static_cast<std::uint32_t>(state.range(0));
  timer::watchdog wd({.name = bench_name("scan"), .start_thread = false, .events = elastic::event_log()});
  const auto t = wd.table();
  const auto pid = static_cast<std::uint64_t>(::getpid());
  const std::uint64_t start = elastic::internal::process_start_time(::getpid());
  const std::int64_t now = now_ns();
  std::uint64_t gen = 0;
  for (std::uint32_t i = 0; i < t.slot_count(); ++i) {
    timer::detail::slot& s = t.at(i);
    s.head.owner.store(pid);
    s.head.tid.store(static_cast<std::int32_t>(elastic::internal::current_tid()));
    s.head.rank.store(-1);
    for (std::uint32_t j = 0; j < depth; ++j) {
      auto& e = s.scopes[j];
      e.deadline_ns.store(now + 3600'000'000'000LL + i);
      e.entered_ns.store(now);
      e.signal.store(0);
      timer::detail::store_name(e, "bench-scope");
      e.generation.store(++gen);
    }
    s.head.depth.store(depth);
    s.head.start_time.store(start);
  }
  t.header().slots_high_water.store(t.slot_count());

  timer::scan_result r{};
  for (auto _ : state) {
    r = wd.scan_once(now_ns());
    benchmark::DoNotOptimize(r);
  }
  if (r.owned_slots != t.slot_count() || r.live_scopes != t.slot_count() * depth || r.signals_sent != 0) {
    state.SkipWithError("scan did not see the full table");
  }
  state.counters["slots"] = r.owned_slots;
  state.counters["scopes"] = r.live_scopes;
  state.counters["ns_per_slot"] =
      benchmark::Counter(static_cast<double>(t.slot_count()), benchmark::Counter::kIsIterationInvariantRate |
                                                                   benchmark::Counter::kInvert);
  // Empty the table before the watchdog goes away (it unlinks the segment on stop).
  for (std::uint32_t i = 0; i < t.slot_count(); ++i) {
    timer::detail::slot& s = t.at(i);
    for (auto& e : s.scopes) e.generation.store(0);
    s.head.depth.store(0);
    s.head.start_time.store(0);
    s.head.owner.store(0);
  }
}
BENCHMARK(BM_full_table_scan)
    ->ArgName("depth")
    ->Arg(1)
    ->Arg(timer::detail::scopes_per_slot)
    ->Unit(benchmark::kMicrosecond)
    ->Repetitions(3)
    ->DisplayAggregatesOnly();

// ------------------------------------------------------------------------------------------
// Kill latency: a worker process enters a scope of `range(0)` ms and hangs; the watchdog
// (hosted here, default options) kills it. Measured from the scope's deadline to the moment
// waitpid() in this process returns the worker's death by SIGKILL.

int g_kill_trials = 200;

struct child {
  pid_t pid = -1;
  int out = -1;
  bool reaped = false;
  int status = 0;

  ~child() { kill_and_reap(); }
  void kill_and_reap() noexcept {
    if (out >= 0) ::close(out);
    out = -1;
    if (pid > 0 && !reaped) {
      ::kill(pid, SIGKILL);
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      reaped = true;
    }
  }
};

/// fork+exec of /proc/self/exe --worker SEG MS THREADS with stdout on a pipe.
bool spawn_worker(child& c, const std::string& segment, int timeout_ms, int threads = 1) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return false;
  std::string ms = std::to_string(timeout_ms);
  std::string seg = segment;
  std::string nthreads = std::to_string(threads);
  char arg0[] = "timer_bench";
  char arg1[] = "--worker";
  char* argv[] = {arg0, arg1, seg.data(), ms.data(), nthreads.data(), nullptr};
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return false;
  }
  if (pid == 0) {
    // Async-signal-safe calls only until exec: this process has other threads.
    ::dup2(fds[1], STDOUT_FILENO);
    ::execv("/proc/self/exe", argv);
    ::_exit(127);
  }
  ::close(fds[1]);
  c.pid = pid;
  c.out = fds[0];
  return true;
}

/// The worker's first line (its deadline), or nullopt after `timeout`.
std::optional<std::int64_t> read_deadline(child& c, std::chrono::milliseconds timeout) {
  std::string buf;
  const std::int64_t until = now_ns() + timeout.count() * 1'000'000;
  while (buf.find('\n') == std::string::npos) {
    const std::int64_t left_ms = (until - now_ns()) / 1'000'000;
    if (left_ms <= 0) return std::nullopt;
    pollfd p{c.out, POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(left_ms));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;
    char tmp[64];
    const ssize_t n = ::read(c.out, tmp, sizeof tmp);
    if (n <= 0) return std::nullopt;  // died before entering its scope
    buf.append(tmp, static_cast<std::size_t>(n));
  }
  return std::strtoll(buf.c_str(), nullptr, 10);
}

double percentile(const std::vector<double>& sorted, double p) {
  // Nearest rank.
  if (sorted.empty()) return 0;
  std::size_t k = static_cast<std::size_t>(std::ceil(p * static_cast<double>(sorted.size())));
  k = std::clamp<std::size_t>(k, 1, sorted.size());
  return sorted[k - 1];
}

/// The number `field` of every `event` in the events file, sorted.
std::vector<double> event_numbers(const std::string& path, const std::string& event, const std::string& field) {
  std::vector<double> out;
  std::ifstream in(path);
  const std::string key = "\"" + field + "\":";
  for (std::string line; std::getline(in, line);) {
    if (line.find("\"event\":\"" + event + "\"") == std::string::npos) continue;
    const auto k = line.find(key);
    if (k == std::string::npos) continue;
    out.push_back(std::strtod(line.c_str() + k + key.size(), nullptr));
  }
  std::sort(out.begin(), out.end());
  return out;
}

/// late_ms of every watchdog_kill event in the events file (deadline -> signal sent).
std::vector<double> signal_lateness_ms(const std::string& path) { return event_numbers(path, "watchdog_kill", "late_ms"); }

/// Waits for child `pid` to end and reaps it, as the host of a watchdog that dumps stacks must:
/// the capture thread traces from this process, so the kernel reports the child's ptrace stops
/// here too; those are taken off the queue, never mistaken for its end. The wait status, or -1.
int wait_skipping_stops(pid_t pid) {
  for (;;) {
    siginfo_t si{};
    if (::waitid(P_PID, static_cast<id_t>(pid), &si, WEXITED | WNOWAIT) != 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    if (si.si_code == CLD_EXITED || si.si_code == CLD_KILLED || si.si_code == CLD_DUMPED) {
      int status = 0;
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      return status;
    }
    siginfo_t notice{};
    ::waitid(P_PID, static_cast<id_t>(pid), &notice, WSTOPPED | WCONTINUED | WNOHANG | __WALL);
  }
}

/// Runs `trials` workers against the watchdog serving `segment`, one after the other. Each
/// enters a scope of `scope_ms` and hangs. With `direct`, this process kills it itself right after
/// it entered the scope (the baseline: SIGKILL -> waitpid); otherwise the watchdog must, and the
/// latency is counted from the scope's deadline. Every worker is reaped, whatever happens.
/// `threads`: the worker's threads; `skip_stops`: wait with wait_skipping_stops().
std::vector<double> run_kill_trials(const std::string& segment, int scope_ms, int trials, bool direct,
                                    std::string& error, int threads = 1, bool skip_stops = false) {
  std::vector<double> lat_ms;
  for (int trial = 0; trial < trials && error.empty(); ++trial) {
    child c;
    if (!spawn_worker(c, segment, scope_ms, threads)) {
      error = "fork failed";
      break;
    }
    const auto deadline = read_deadline(c, 10s);
    if (!deadline) {
      error = "worker did not enter its scope";
      break;
    }
    // Block in waitpid, as a launcher would. A guard kills the worker itself if the watchdog has
    // not 10 s after the deadline, so a broken watchdog fails the benchmark instead of hanging it.
    std::mutex m;
    std::condition_variable_any cv;
    std::jthread guard([&](std::stop_token st) {
      std::unique_lock l(m);
      const auto until = std::chrono::steady_clock::now() + std::chrono::nanoseconds(*deadline - now_ns()) + 10s;
      if (!cv.wait_until(l, st, until, [] { return false; }) && !st.stop_requested()) ::kill(c.pid, SIGKILL);
    });
    const std::int64_t t0 = now_ns();
    if (direct) ::kill(c.pid, SIGKILL);
    int status = 0;
    pid_t r;
    if (skip_stops) {
      status = wait_skipping_stops(c.pid);
      r = status < 0 ? -1 : c.pid;
    } else {
      while ((r = ::waitpid(c.pid, &status, 0)) < 0 && errno == EINTR) {
      }
    }
    const std::int64_t seen = now_ns();
    guard.request_stop();
    guard.join();
    if (r == c.pid) {
      c.reaped = true;
      c.status = status;
    }
    if (!(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) || (!direct && seen - *deadline >= 10'000'000'000LL)) {
      error = "worker was not killed by the watchdog within 10 s of its deadline";
      break;
    }
    lat_ms.push_back(static_cast<double>(seen - (direct ? t0 : *deadline)) / 1e6);
  }
  std::sort(lat_ms.begin(), lat_ms.end());
  return lat_ms;
}

void set_latency_counters(benchmark::State& state, const std::vector<double>& lat_ms) {
  const double med = percentile(lat_ms, 0.5);
  state.SetIterationTime(med / 1e3);  // the Time column shows the median
  state.counters["trials"] = static_cast<double>(lat_ms.size());
  state.counters["min_ms"] = lat_ms.front();
  state.counters["median_ms"] = med;
  state.counters["p99_ms"] = percentile(lat_ms, 0.99);
  state.counters["max_ms"] = lat_ms.back();
}

/// CPU time the rest of the machine used while a kill benchmark ran, in percent of one CPU:
/// all CPUs' busy time from /proc/stat minus this process's and its reaped workers'. Tail
/// latencies depend on it (a watchdog thread waiting for a CPU acts late), so it is reported.
struct machine_load {
  double busy0 = busy_s(), self0 = self_s();
  std::int64_t wall0 = now_ns();

  static double busy_s() {
    std::ifstream in("/proc/stat");
    std::string cpu;
    unsigned long long v[8] = {};
    in >> cpu;
    for (auto& x : v) in >> x;
    const unsigned long long busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];  // not idle, iowait
    return static_cast<double>(busy) / static_cast<double>(::sysconf(_SC_CLK_TCK));
  }
  static double self_s() {
    rusage a{}, b{};
    ::getrusage(RUSAGE_SELF, &a);
    ::getrusage(RUSAGE_CHILDREN, &b);
    return cpu_s(a) + cpu_s(b);
  }
  double others_cpu_pct() const {
    const double wall = static_cast<double>(now_ns() - wall0) / 1e9;
    return std::max(0.0, 100.0 * ((busy_s() - busy0) - (self_s() - self0)) / wall);
  }
};

double g_direct_kill_median_ms = 0;

/// Baseline: the same workers, killed by this process itself as soon as they are in their scope;
/// measured from kill() to waitpid() returning. No watchdog can beat this.
void BM_kill_baseline_direct(benchmark::State& state) {
  stop_scope_watchdog();
  const std::string name = bench_name("killbase");
  for (auto _ : state) {
    std::string error;
    std::vector<double> lat_ms;
    {
      timer::watchdog wd({.name = name, .events = elastic::event_log()});
      machine_load load;
      lat_ms = run_kill_trials(name, 3'600'000, g_kill_trials, /*direct=*/true, error);
      state.counters["others_cpu_pct"] = load.others_cpu_pct();
    }
    if (!error.empty()) {
      state.SkipWithError(error.c_str());
      break;
    }
    set_latency_counters(state, lat_ms);
    g_direct_kill_median_ms = percentile(lat_ms, 0.5);
  }
}
BENCHMARK(BM_kill_baseline_direct)->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);

void BM_kill_latency(benchmark::State& state) {
  stop_scope_watchdog();
  const int scope_ms = static_cast<int>(state.range(0));
  const std::string name = bench_name(("kill" + std::to_string(scope_ms)).c_str());
  const std::string events = (std::filesystem::temp_directory_path() / (name + ".events.jsonl")).string();
  std::filesystem::remove(events);
  for (auto _ : state) {
    std::string error;
    std::vector<double> lat_ms;
    {
      // Default options, as elastic-run hosts it; kill events go to a file as they would.
      timer::watchdog wd({.name = name, .events = elastic::event_log::to_file(events)});
      machine_load load;
      lat_ms = run_kill_trials(name, scope_ms, g_kill_trials, /*direct=*/false, error);
      state.counters["others_cpu_pct"] = load.others_cpu_pct();
      state.counters["wd_signals"] = static_cast<double>(wd.stats().signals);
    }  // the watchdog stops here and unlinks its segment
    if (!error.empty()) {
      state.SkipWithError(error.c_str());
      break;
    }
    set_latency_counters(state, lat_ms);
    // deadline -> signal sent, from the watchdog's own kill events
    const auto late = signal_lateness_ms(events);
    state.counters["signal_late_median_ms"] = percentile(late, 0.5);
    state.counters["signal_late_max_ms"] = late.empty() ? 0 : late.back();
    if (g_direct_kill_median_ms > 0) state.counters["x_direct_kill"] = percentile(lat_ms, 0.5) / g_direct_kill_median_ms;
  }
  std::filesystem::remove(events);
}
BENCHMARK(BM_kill_latency)
    ->ArgName("scope_ms")
    ->Arg(20)
    ->Arg(200)
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

int g_stack_trials = 30;

/// Deadline -> death, as BM_kill_latency, with the stack dump off (stack_dump:0) and on
/// (stack_dump:1): the watchdog stops every thread of the hung worker (`threads` of them) with
/// ptrace, unwinds and names their frames (libdw, where the build has it), logs watchdog_stack,
/// then kills. Scopes of 200 ms; both rows wait for the worker the same way (skipping stops).
/// capture_* is the capture's own time, from the watchdog_stack events.
void BM_kill_latency_stack_dump(benchmark::State& state) {
  stop_scope_watchdog();
  const bool dump = state.range(0) != 0;
  const int threads = static_cast<int>(state.range(1));
  const std::string name = bench_name(("stack" + std::to_string(state.range(0)) + "t" + std::to_string(threads)).c_str());
  const std::string events = (std::filesystem::temp_directory_path() / (name + ".events.jsonl")).string();
  std::filesystem::remove(events);
  for (auto _ : state) {
    std::string error;
    std::vector<double> lat_ms;
    {
      timer::watchdog wd({.name = name, .events = elastic::event_log::to_file(events), .stack_dump = dump});
      machine_load load;
      lat_ms = run_kill_trials(name, 200, g_stack_trials, /*direct=*/false, error, threads, /*skip_stops=*/true);
      state.counters["others_cpu_pct"] = load.others_cpu_pct();
    }
    if (!error.empty()) {
      state.SkipWithError(error.c_str());
      break;
    }
    set_latency_counters(state, lat_ms);
    const auto late = signal_lateness_ms(events);
    state.counters["signal_late_median_ms"] = percentile(late, 0.5);
    state.counters["signal_late_max_ms"] = late.empty() ? 0 : late.back();
    const auto capture = event_numbers(events, "watchdog_stack", "capture_ms");
    state.counters["dumps"] = static_cast<double>(capture.size());
    state.counters["capture_median_ms"] = percentile(capture, 0.5);
    state.counters["capture_max_ms"] = capture.empty() ? 0 : capture.back();
    std::ifstream in(events);
    int complete = 0;
    for (std::string line; std::getline(in, line);) {
      complete += line.find("\"event\":\"watchdog_stack\"") != std::string::npos &&
                  line.find("\"complete\":true") != std::string::npos;
    }
    state.counters["dumps_complete"] = complete;
  }
  std::filesystem::remove(events);
}
BENCHMARK(BM_kill_latency_stack_dump)
    ->ArgNames({"stack_dump", "threads"})
    ->Args({0, 1})
    ->Args({1, 1})
    ->Args({0, 16})
    ->Args({1, 16})
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::string_view(argv[1]) == "--worker") return worker_main(argc, argv);
  // Our own flag, taken out before Google Benchmark sees the arguments.
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    std::string_view a(argv[i]);
    if (a.rfind("--kill-trials=", 0) == 0) {
      g_kill_trials = std::max(1, std::atoi(argv[i] + 14));
    } else if (a.rfind("--stack-trials=", 0) == 0) {
      g_stack_trials = std::max(1, std::atoi(argv[i] + 15));
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  argv[argc] = nullptr;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("kill_trials", std::to_string(g_kill_trials));
  benchmark::AddCustomContext("stack_trials", std::to_string(g_stack_trials));
  benchmark::AddCustomContext("stack_symbols", ELASTIC_WITH_LIBDW ? "libdw" : "none (built without libdw)");
  benchmark::RunSpecifiedBenchmarks();
  stop_scope_watchdog();
  benchmark::Shutdown();
  return 0;
}
