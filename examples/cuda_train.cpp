// Elastic data-parallel training on GPUs: linear regression with cuBLAS (no custom kernels, so
// it builds with a C++ compiler alone), gradients averaged over an nccl_group, the weights in
// device memory snapshotted asynchronously on the compute stream by the training_loop.
//
//   elastic-run --nproc-per-node 8 --min-ranks 2 -- cuda_train --ckpt /shared/ckpt --steps 2000
//
// Each worker uses GPU ELASTIC_LOCAL_RANK (mod the GPUs it sees). When a rank dies the others
// rebuild the NCCL communicator from a fresh unique id, take rank 0's weights (an NCCL broadcast
// from device memory) and redo the step; a restarted rank restores the newest checkpoint and is
// taken in at the next round.
//
// The batch is cut into a fixed number of shards, whatever the world size: each rank computes the
// gradients of its shards into their own slots of a zeroed buffer, the allreduce adds zeros to
// them (exact), and every rank sums the slots in one order. So the weights are the same bits
// however many ranks there were at each step, and a disturbed run (scripts/demo_gpu.sh) ends with
// the weights of an undisturbed one: rank 0 prints their CRC-32C at the end.
//   --step-sleep-ms N   sleep N ms after each step (to pace a demo)
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <elastic/checkpoint.hpp>
#include <elastic/comm/nccl_group.hpp>
#include <elastic/crc32c.hpp>
#include <elastic/env.hpp>
#include <elastic/rendezvous/open_store.hpp>

namespace {

using namespace std::chrono_literals;

void check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) {
    throw elastic::error(elastic::errc::device_error, std::string(what) + ": " + cudaGetErrorString(rc));
  }
}
void check(cublasStatus_t rc, const char* what) {
  if (rc != CUBLAS_STATUS_SUCCESS) {
    throw elastic::error(elastic::errc::device_error, std::string(what) + ": cuBLAS status " + std::to_string(rc));
  }
}

/// Device memory for `n` floats, freed with the object.
struct device_floats {
  float* p = nullptr;
  explicit device_floats(std::size_t n) { check(cudaMalloc(&p, n * sizeof(float)), "cudaMalloc"); }
  ~device_floats() { cudaFree(p); }
  device_floats(const device_floats&) = delete;
  device_floats& operator=(const device_floats&) = delete;
};

struct cublas_handle {
  cublasHandle_t h = nullptr;
  explicit cublas_handle(cudaStream_t s) {
    check(cublasCreate(&h), "cublasCreate");
    check(cublasSetStream(h, s), "cublasSetStream");
  }
  ~cublas_handle() { cublasDestroy(h); }
  cublas_handle(const cublas_handle&) = delete;
  cublas_handle& operator=(const cublas_handle&) = delete;
};

struct cuda_stream {
  cudaStream_t s = nullptr;
  cuda_stream() { check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate"); }
  ~cuda_stream() { cudaStreamDestroy(s); }
  cuda_stream(const cuda_stream&) = delete;
  cuda_stream& operator=(const cuda_stream&) = delete;
};

}  // namespace

int main(int argc, char** argv) {
  std::string ckpt = "cuda-ckpt";
  std::uint64_t steps = 1000;
  long step_sleep_ms = 0;
  for (int i = 1; i < argc; i += 2) {
    const std::string a = argv[i];
    if (i + 1 < argc && a == "--ckpt") ckpt = argv[i + 1];
    else if (i + 1 < argc && a == "--steps") steps = std::strtoull(argv[i + 1], nullptr, 10);
    else if (i + 1 < argc && a == "--step-sleep-ms") step_sleep_ms = std::strtol(argv[i + 1], nullptr, 10);
    else {
      std::fprintf(stderr, "usage: cuda_train [--ckpt DIR] [--steps N] [--step-sleep-ms N]\n");
      return 2;
    }
  }
  try {
    // The worker environment, every value checked: a malformed setting is an error naming it.
    const auto local_rank = elastic::env_int("ELASTIC_LOCAL_RANK", 0, 65535).value_or(0);
    const auto rdzv = elastic::env_string("ELASTIC_RDZV");
    // The group's bounds, in ranks: ELASTIC_MIN_RANKS/MAX_RANKS, or their older names _NODES.
    const char* min_var = std::getenv("ELASTIC_MIN_RANKS") ? "ELASTIC_MIN_RANKS" : "ELASTIC_MIN_NODES";
    const char* max_var = std::getenv("ELASTIC_MAX_RANKS") ? "ELASTIC_MAX_RANKS" : "ELASTIC_MAX_NODES";
    const auto min_ranks = static_cast<int>(elastic::env_int(min_var, 1, 65536).value_or(1));
    const auto max_ranks = static_cast<int>(elastic::env_int(max_var, 1, 65536).value_or(min_ranks));
    if (min_ranks > max_ranks) {
      throw elastic::error(elastic::errc::invalid_argument,
                           std::string(min_var) + "=" + std::to_string(min_ranks) + " is above " + max_var + "=" +
                               std::to_string(max_ranks) + ": the group needs MIN <= MAX; fix either");
    }
    if (!rdzv && min_ranks > 1) {
      throw elastic::error(elastic::errc::invalid_argument,
                           std::string(min_var) + "=" + std::to_string(min_ranks) +
                               " needs ELASTIC_RDZV, a store the other ranks reach (elastic-run sets it): set it, or "
                               "unset " + min_var + " to train alone");
    }
    int gpus = 0;
    check(cudaGetDeviceCount(&gpus), "cudaGetDeviceCount");
    const int device = static_cast<int>(local_rank % std::max(gpus, 1));
    check(cudaSetDevice(device), "cudaSetDevice");
    cuda_stream stream;
    cublas_handle blas(stream.s);

    // The dataset, the same on every rank: N samples of D features, y = X w* + noise.
    constexpr int n = 16384, d = 1024, batch = 1024, shards = 8, shard_rows = batch / shards;
    std::vector<float> x(static_cast<std::size_t>(n) * d), y(n), w_true(d);
    std::mt19937 g(5);
    std::normal_distribution<float> normal(0, 1);
    for (auto& v : w_true) v = normal(g);
    for (int i = 0; i < n; ++i) {
      float dot = 0;
      for (int k = 0; k < d; ++k) dot += (x[static_cast<std::size_t>(i) * d + k] = normal(g) / 32) * w_true[k];
      y[i] = dot + normal(g) * 0.01f;
    }
    device_floats dx(x.size()), dy(n), dw(d), dgrad(d), dres(shard_rows), dslots(static_cast<std::size_t>(d) * shards);
    check(cudaMemcpy(dx.p, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice), "copy X");
    check(cudaMemcpy(dy.p, y.data(), y.size() * sizeof(float), cudaMemcpyHostToDevice), "copy y");
    check(cudaMemset(dw.p, 0, d * sizeof(float)), "zero w");

    elastic::checkpoint::state st;
    st.add("w", elastic::device_span(dw.p, d));

    std::unique_ptr<elastic::rendezvous::store> store;
    if (rdzv) {
      store = elastic::rendezvous::open_store(*rdzv);
    } else {
      // A world of one: a store nobody else opens by name. The name goes at once (the mapping
      // stays), so nothing is left in /dev/shm even if this process is SIGKILLed.
      const std::string name = "cuda-train-" + std::to_string(::getpid());
      store = std::make_unique<elastic::rendezvous::shm_store>(name);
      elastic::rendezvous::shm_store::remove(name);
    }
    elastic::comm::group_options go;
    go.rendezvous.min_ranks = min_ranks;
    go.rendezvous.max_ranks = max_ranks;
    if (!elastic::env_string("ELASTIC_RUN_ID")) go.rendezvous.run_id = "cuda-train";
    elastic::comm::nccl_group group(*store, go, elastic::comm::nccl_factory(device, 30s, stream.s),
                                    elastic::comm::nccl_bootstrap());
    elastic::training_loop loop({.dir = ckpt, .steps = steps, .every_steps = 100, .stream = stream.s, .group = &group}, st);

    const float lr = 0.5f;
    for (auto& step : loop) {
      const int rank = group.rank(), world = group.size();
      const int first = static_cast<int>((step.index() * batch) % n);
      const float one = 1, zero = 0, minus_one = -1, inv_batch = 1.0f / batch;
      // This rank's shards of the step's batch, each into its own slot; the others' slots stay 0.
      check(cudaMemsetAsync(dslots.p, 0, static_cast<std::size_t>(d) * shards * sizeof(float), stream.s), "zero slots");
      for (int j = rank; j < shards; j += world) {
        const int lo = first + j * shard_rows;
        const float* xb = dx.p + static_cast<std::size_t>(lo) * d;  // column-major: D x rows
        float* slot = dslots.p + static_cast<std::size_t>(j) * d;
        // residual = X_j w - y_j
        check(cublasScopy(blas.h, shard_rows, dy.p + lo, 1, dres.p, 1), "copy y_j");
        check(cublasSgemv(blas.h, CUBLAS_OP_T, d, shard_rows, &one, xb, d, dw.p, 1, &minus_one, dres.p, 1),
              "X_j w - y_j");
        // slot j = X_j^T residual / batch (shard j's share of the batch mean)
        check(cublasSgemv(blas.h, CUBLAS_OP_N, d, shard_rows, &inv_batch, xb, d, dres.p, 1, &zero, slot, 1), "gradient");
      }
      if (!group.allreduce(std::span<float>(dslots.p, static_cast<std::size_t>(d) * shards),
                           elastic::comm::reduce_op::sum)) {
        continue;  // redone
      }
      // grad = slot 0 + slot 1 + ... in this order on every rank, whatever the world size.
      check(cublasScopy(blas.h, d, dslots.p, 1, dgrad.p, 1), "grad = slot 0");
      for (int j = 1; j < shards; ++j) {
        check(cublasSaxpy(blas.h, d, &one, dslots.p + static_cast<std::size_t>(j) * d, 1, dgrad.p, 1), "grad += slot");
      }
      step.before_update(stream.s);  // an in-flight snapshot of w must be taken first (stream order)
      const float step_size = -lr;
      check(cublasSaxpy(blas.h, d, &step_size, dgrad.p, 1, dw.p, 1), "w -= lr grad");
      if (rank == 0 && (step.index() + 1) % 100 == 0) {
        float norm = 0;
        check(cublasSnrm2(blas.h, shard_rows, dres.p, 1, &norm), "residual norm");  // synchronizes the stream
        std::printf("step %llu/%llu  ranks %d  rms residual %.4f\n", static_cast<unsigned long long>(step.index() + 1),
                    static_cast<unsigned long long>(steps), world, norm / std::sqrt(static_cast<float>(shard_rows)));
        std::fflush(stdout);
      }
      if (step_sleep_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(step_sleep_ms));
    }
    check(cudaStreamSynchronize(stream.s), "final sync");
    if (group.rank() == 0) {
      std::vector<float> w(d);
      check(cudaMemcpy(w.data(), dw.p, d * sizeof(float), cudaMemcpyDeviceToHost), "copy w");
      std::printf("%s at step %llu: weights crc32c %08x\n",
                  loop.reason() != elastic::loop_reason::preempted ? "finished"
                  : loop.final_checkpoint_written() ? "preempted (checkpoint written)"
                                                    : "preempted (no final checkpoint: the newest committed step stands)",
                  static_cast<unsigned long long>(loop.completed_steps()), elastic::crc32c(std::as_bytes(std::span(w))));
      std::fflush(stdout);
    }
    return loop.exit_code();
  } catch (const elastic::error& e) {
    std::fprintf(stderr, "cuda_train: %s\n", e.what());
    return 1;
  }
}
