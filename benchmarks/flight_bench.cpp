// The flight recorder's cost per collective (comm/detail/flight_recorder.hpp): what an
// elastic_group adds to every collective so that a hang names its culprit, next to the limits
// measured in the same run.
//
//   BM_empty_loop          baseline: an empty benchmark loop
//   BM_two_clock_reads     the limit: the two CLOCK_MONOTONIC reads (vDSO) a record needs
//   BM_enter_leave         one collective recorded: enter() + leave() into the shared-memory ring
//   BM_enter_leave_read    the same while another thread reads the ring back (read_flight) in a
//                          loop, as the launcher does after a kill: the writer never waits on it
//
//   flight_bench [google benchmark flags]
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>

#include <benchmark/benchmark.h>

#include <elastic/comm/detail/flight_recorder.hpp>
#include <elastic/internal/clock.hpp>

namespace cd = elastic::comm::detail;

namespace {

std::string bench_run() { return "flight-bench-" + std::to_string(::getpid()); }

void BM_empty_loop(benchmark::State& state) {
  int x = 0;
  for (auto _ : state) benchmark::DoNotOptimize(x);
}

void BM_two_clock_reads(benchmark::State& state) {
  for (auto _ : state) {
    benchmark::DoNotOptimize(elastic::internal::monotonic_ns());
    benchmark::DoNotOptimize(elastic::internal::monotonic_ns());
  }
}

void BM_enter_leave(benchmark::State& state) {
  cd::flight_recorder rec(bench_run());
  rec.begin_round(1, 0, 4);
  for (auto _ : state) {
    rec.enter("allreduce", 4096);
    rec.leave(true);
  }
}

void BM_enter_leave_read(benchmark::State& state) {
  cd::flight_recorder rec(bench_run());
  rec.begin_round(1, 0, 4);
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> reads{0};
  std::jthread reader([&] {
    while (!stop.load(std::memory_order_relaxed)) {
      benchmark::DoNotOptimize(cd::read_flight(rec.name()));
      reads.fetch_add(1, std::memory_order_relaxed);
    }
  });
  for (auto _ : state) {
    rec.enter("allreduce", 4096);
    rec.leave(true);
  }
  stop = true;
  reader.join();
  state.counters["reads"] = static_cast<double>(reads.load());
}

}  // namespace

BENCHMARK(BM_empty_loop);
BENCHMARK(BM_two_clock_reads);
BENCHMARK(BM_enter_leave);
BENCHMARK(BM_enter_leave_read);
BENCHMARK_MAIN();
