// Checkpoint costs, each next to the limit measured in the same run:
//   BM_snapshot_stall/MiB    time the loop is blocked (snapshot() + before_update()) vs a plain
//                            memcpy of the same bytes into pre-faulted memory (the CPU limit)
//   BM_persist/MiB           snapshot to durable commit vs write()+fsync() of the same bytes
//   BM_restore/MiB           restore() from a cold page cache vs pread() of the same file
//   BM_training_overhead     steps/s with checkpoints every N steps (and the adaptive policy)
//                            vs no checkpoints
//
//   checkpoint_bench [--dir=PATH] [google benchmark flags]   (default dir: $TMPDIR or /tmp)
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include <elastic/checkpoint.hpp>
#include <elastic/internal/file.hpp>

#include "bench_common.hpp"

namespace fs = std::filesystem;
namespace ck = elastic::checkpoint;
using elastic::bench::clock_type;
using elastic::bench::filled;
using elastic::bench::median;
using elastic::bench::since;

namespace {

const elastic::bench::scratch_dir* g_scratch = nullptr;

/// Evicts a file from the page cache so the next read comes from the disk.
void evict(const fs::path& p) {
  auto fd = elastic::internal::open_file(p, O_RDONLY);
  ::fdatasync(fd.get());
  ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_DONTNEED);
}

fs::path fresh_dir(const std::string& name) { return g_scratch->fresh(name); }

ck::checkpointer_options opts(const fs::path& dir) {
  return {.dir = dir, .keep_last = 1, .rank = 0, .world_size = 1, .events = elastic::event_log()};
}

void BM_snapshot_stall(benchmark::State& state) {
  const std::size_t bytes = static_cast<std::size_t>(state.range(0)) << 20;
  auto src = filled(bytes);
  auto dst = filled(bytes);
  ck::state st;
  st.add("state", std::span<std::byte>(src.get(), bytes));
  const auto dir = fresh_dir("stall");
  auto c = std::make_unique<ck::checkpointer>(st, opts(dir));
  double memcpy_s = 0, stall_s = 0, call_s = 0;
  std::uint64_t step = 0;
  for (auto _ : state) {
    auto t0 = clock_type::now();
    std::memcpy(dst.get(), src.get(), bytes);
    benchmark::ClobberMemory();
    memcpy_s += since(t0);
    t0 = clock_type::now();
    c->snapshot(++step);
    call_s += since(t0);
    c->before_update();
    stall_s += since(t0);
    state.SetIterationTime(since(t0));
    c->wait_durable();  // not part of the stall: persistence runs beside training
  }
  const auto n = static_cast<double>(state.iterations());
  state.counters["stall_ms"] = stall_s / n * 1e3;
  state.counters["snapshot_call_ms"] = call_s / n * 1e3;
  state.counters["memcpy_ms"] = memcpy_s / n * 1e3;
  state.counters["x_memcpy"] = stall_s / memcpy_s;
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes) * state.iterations());
  c.reset();  // finishes its housekeeping before the directory goes
  fs::remove_all(dir);
}

void BM_persist(benchmark::State& state) {
  const std::size_t bytes = static_cast<std::size_t>(state.range(0)) << 20;
  auto src = filled(bytes);
  ck::state st;
  st.add("state", std::span<std::byte>(src.get(), bytes));
  const auto dir = fresh_dir("persist");
  elastic::bench::paired_runs runs;
  std::uint64_t step = 0;
  {
    ck::checkpointer c(st, opts(dir));
    const fs::path path = dir / "raw.bin";
    // The limit on the same disk: the same bytes written sequentially in 4 MiB calls, then fsync.
    auto raw_write = [&] {
      const auto t0 = clock_type::now();
      {
        auto fd = elastic::internal::open_file(path, O_WRONLY | O_CREAT | O_TRUNC);
        for (std::size_t at = 0; at < bytes; at += 4u << 20) {
          elastic::internal::pwrite_all(fd.get(), src.get() + at, std::min<std::size_t>(4u << 20, bytes - at), at, path);
        }
        elastic::internal::fsync_fd(fd.get(), path);
      }
      const double r = since(t0);
      fs::remove(path);
      return r;
    };
    // Ours: from the staged copy (the snapshot, measured as the stall) to a durable commit.
    auto persist = [&] { return elastic::bench::persist_seconds(c, ++step); };
    // Alternating which goes first: this shared disk's speed drifts by 5x within seconds.
    for (auto _ : state) state.SetIterationTime(runs.run(persist, raw_write));
  }
  state.counters["ours_MB_s"] = static_cast<double>(bytes) / median(runs.ours) / 1e6;
  state.counters["raw_write_MB_s"] = static_cast<double>(bytes) / median(runs.ref) / 1e6;
  state.counters["x_raw_write"] = median(runs.ratio);  // share of the disk's throughput we reach
  fs::remove_all(dir);
}

void BM_restore(benchmark::State& state) {
  const std::size_t bytes = static_cast<std::size_t>(state.range(0)) << 20;
  auto src = filled(bytes);
  ck::state st;
  st.add("state", std::span<std::byte>(src.get(), bytes));
  const auto dir = fresh_dir("restore");
  {
    ck::checkpointer c(st, opts(dir));
    c.snapshot(1);
    c.wait_durable();
  }
  const fs::path data = dir / ck::format::step_dir_name(1) / ck::format::rank_data_name(0);
  auto buf = filled(4u << 20);
  std::vector<double> ours, raw, ratio;
  for (auto _ : state) {
    evict(data);
    auto t0 = clock_type::now();
    {
      auto fd = elastic::internal::open_file(data, O_RDONLY);
      for (std::size_t at = 0; at < bytes; at += 4u << 20) {
        elastic::internal::pread_all(fd.get(), buf.get(), std::min<std::size_t>(4u << 20, bytes - at), at, data);
      }
    }
    const double r = since(t0);
    ck::checkpointer c(st, opts(dir));  // allocates staging once, as a trainer does at start
    evict(data);
    t0 = clock_type::now();
    if (!c.restore()) state.SkipWithError("restore found nothing");
    const double s = since(t0);
    state.SetIterationTime(s);
    ours.push_back(s);
    raw.push_back(r);
    ratio.push_back(r / s);
  }
  state.counters["ours_MB_s"] = static_cast<double>(bytes) / median(ours) / 1e6;
  state.counters["raw_read_MB_s"] = static_cast<double>(bytes) / median(raw) / 1e6;
  state.counters["x_raw_read"] = median(ratio);
  fs::remove_all(dir);
}

/// Seconds for `steps` steps of a loop over 64 MiB of state whose step reads all of it
/// (forward/backward) and then writes all of it (the update), checkpointing every `every`
/// steps (0: never; -1: the adaptive policy at 1%). Returns the interval in force at the end.
double train_seconds(long every, int steps, std::uint64_t* interval) {
  const std::size_t n = (64u << 20) / sizeof(float);
  std::vector<float> w(n, 1.0f);
  const auto dir = fresh_dir("train");
  ck::state st;
  st.add("w", w);
  elastic::training_loop loop({.dir = dir,
                               .steps = static_cast<std::uint64_t>(steps),
                               .every_steps = every > 0 ? static_cast<std::uint64_t>(every) : 0,
                               .keep_last = 1,
                               .max_overhead = every < 0 ? 0.01 : 0.0,
                               .checkpoint_at_end = false,
                               .handle_signals = false,
                               .rank = 0,
                               .world_size = 1,
                               .events = elastic::event_log()},
                              st);
  const auto t0 = clock_type::now();
  for (auto& step : loop) {
    float acc = 0;
    for (std::size_t r = 0; r < 4; ++r)
      for (std::size_t i = r; i < n; i += 4) acc += w[i] * 0.5f;  // forward/backward reads the weights
    benchmark::DoNotOptimize(acc);
    step.before_update();
    for (std::size_t i = 0; i < n; ++i) w[i] = w[i] * 0.999f + 1e-6f;  // the update writes them
  }
  const double s = since(t0);
  if (interval) *interval = loop.interval_steps();
  return s;
}

/// Training with checkpoints against the same loop without, alternating runs because this
/// machine's speed drifts; reports the median slowdown.
void BM_training_overhead(benchmark::State& state) {
  const long every = state.range(0);
  const int steps = 600;
  std::vector<double> ratio;
  std::uint64_t interval = 0;
  double with_s = 0;
  for (auto _ : state) {
    for (int rep = 0; rep < 5; ++rep) {
      const double base = train_seconds(0, steps, nullptr);
      with_s = train_seconds(every, steps, &interval);
      ratio.push_back(with_s / base);
    }
    state.SetIterationTime(with_s);
  }
  state.counters["overhead_pct"] = (median(ratio) - 1) * 100;
  state.counters["steps_s"] = steps / with_s;
  state.counters["every_steps"] = static_cast<double>(interval);
}

}  // namespace

int main(int argc, char** argv) {
  const elastic::bench::scratch_dir scratch(argc, argv, "elastic-checkpoint-bench");
  g_scratch = &scratch;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  for (long mib : {64L, 256L, 1024L, 4096L}) {
    const long iters = mib >= 1024 ? 2 : 5;
    benchmark::RegisterBenchmark(("BM_snapshot_stall/" + std::to_string(mib)).c_str(), BM_snapshot_stall)
        ->Arg(mib)->Iterations(iters)->UseManualTime()->Unit(benchmark::kMillisecond);
  }
  for (long mib : {64L, 256L, 1024L}) {
    benchmark::RegisterBenchmark(("BM_persist/" + std::to_string(mib)).c_str(), BM_persist)
        ->Arg(mib)->Iterations(mib >= 1024 ? 4 : 10)->UseManualTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("BM_restore/" + std::to_string(mib)).c_str(), BM_restore)
        ->Arg(mib)->Iterations(mib >= 1024 ? 3 : 7)->UseManualTime()->Unit(benchmark::kMillisecond);
  }
  for (long every : {10L, 50L, -1L}) {
    benchmark::RegisterBenchmark(("BM_training_overhead/every:" + (every < 0 ? std::string("adaptive") : std::to_string(every))).c_str(),
                                 BM_training_overhead)
        ->Arg(every)->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
