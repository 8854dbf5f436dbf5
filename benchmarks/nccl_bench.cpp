// Lifecycle costs of the NCCL communicator on one GPU (Google Benchmark): what a recovery pays.
//
//   nccl_bench [google benchmark flags...]
//
// Every row is a single-rank communicator in this process. Shrink and grow need several ranks
// (NCCL rejects an empty exclude list, so a communicator of one cannot shrink): the multi-rank
// rebuild paths, ranks sharing one GPU by NCCL_HOSTID, are timed by tests/test_nccl_group, which
// prints each rebuild's phases.
//   BM_unique_id        ncclGetUniqueId: the leader's bootstrap blob (opens the bootstrap root)
//   BM_init             nccl_unique_id() + non-blocking ncclCommInitRankConfig polled to ready
//   BM_abort            ncclCommAbort of a ready communicator (includes stopping the watcher)
//   BM_reinit           abort, then init from a fresh id: the path without shrink
//   BM_allreduce_small  one 1 KiB float allreduce, enqueue to completion seen by polling
// Without a GPU every row reports an error and measures nothing.
#include <cuda_runtime_api.h>

#include <chrono>
#include <memory>
#include <span>
#include <string>

#include <benchmark/benchmark.h>

#include <elastic/comm/nccl.hpp>

#include "gpu_check.hpp"

namespace {

using namespace std::chrono_literals;
namespace comm = elastic::comm;

using elastic::bench::have_gpu;

std::unique_ptr<comm::nccl_communicator> make() {
  return std::make_unique<comm::nccl_communicator>(comm::nccl_unique_id(), 0, 1, 0, 30s);
}

void BM_unique_id(benchmark::State& state) {
  if (!have_gpu(state)) return;
  for (auto _ : state) benchmark::DoNotOptimize(comm::nccl_unique_id());
}
// Few iterations: an id no communicator is made from keeps its bootstrap root (a socket and a
// thread) open in NCCL, and thousands of them run the process out of file descriptors.
BENCHMARK(BM_unique_id)->Unit(benchmark::kMicrosecond)->Iterations(50);

// Five iterations each: every communicator's teardown (timed in BM_abort, paused in the others)
// took ~1 s on an H200 (NCCL's proxy threads end at their next 500 ms poll), and 20 of each ran
// past the GPU check's 60 s.
void BM_init(benchmark::State& state) {
  if (!have_gpu(state)) return;
  for (auto _ : state) {
    auto c = make();
    state.PauseTiming();
    c.reset();
    state.ResumeTiming();
  }
}
BENCHMARK(BM_init)->Unit(benchmark::kMillisecond)->Iterations(5);

void BM_abort(benchmark::State& state) {
  if (!have_gpu(state)) return;
  for (auto _ : state) {
    state.PauseTiming();
    auto c = make();
    state.ResumeTiming();
    c->abort();
  }
}
BENCHMARK(BM_abort)->Unit(benchmark::kMillisecond)->Iterations(5);

void BM_reinit(benchmark::State& state) {
  if (!have_gpu(state)) return;
  for (auto _ : state) {
    state.PauseTiming();
    auto c = make();
    state.ResumeTiming();
    c->abort();
    c = make();
    state.PauseTiming();
    c.reset();
    state.ResumeTiming();
  }
}
BENCHMARK(BM_reinit)->Unit(benchmark::kMillisecond)->Iterations(5);

void BM_allreduce_small(benchmark::State& state) {
  if (!have_gpu(state)) return;
  auto c = make();
  float* d = nullptr;
  if (cudaMalloc(&d, 256 * sizeof(float)) != cudaSuccess) {
    state.SkipWithError("cudaMalloc failed");
    return;
  }
  for (auto _ : state) c->allreduce(std::span<float>(d, 256), comm::reduce_op::sum);
  cudaFree(d);
}
BENCHMARK(BM_allreduce_small)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
