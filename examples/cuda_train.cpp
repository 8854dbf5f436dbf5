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
#include <vector>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <elastic/checkpoint.hpp>
#include <elastic/comm/nccl_group.hpp>
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
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--ckpt") ckpt = argv[i + 1];
    else if (a == "--steps") steps = std::strtoull(argv[i + 1], nullptr, 10);
    else {
      std::fprintf(stderr, "usage: cuda_train [--ckpt DIR] [--steps N]\n");
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
    constexpr int n = 16384, d = 1024, batch = 1024;
    std::vector<float> x(static_cast<std::size_t>(n) * d), y(n), w_true(d);
    std::mt19937 g(5);
    std::normal_distribution<float> normal(0, 1);
    for (auto& v : w_true) v = normal(g);
    for (int i = 0; i < n; ++i) {
      float dot = 0;
      for (int k = 0; k < d; ++k) dot += (x[static_cast<std::size_t>(i) * d + k] = normal(g) / 32) * w_true[k];
      y[i] = dot + normal(g) * 0.01f;
    }
    device_floats dx(x.size()), dy(n), dw(d), dgrad(d), dres(batch);
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
      // This rank's rows of the step's batch.
      const int first = static_cast<int>((step.index() * batch) % n);
      const int lo = batch * rank / world, hi = batch * (rank + 1) / world, rows = hi - lo;
      const float* xb = dx.p + static_cast<std::size_t>(first + lo) * d;  // column-major: D x rows
      const float one = 1, zero = 0, minus_one = -1, inv_batch = 1.0f / batch;
      // residual = X_b w - y_b
      check(cublasScopy(blas.h, rows, dy.p + first + lo, 1, dres.p, 1), "copy y_b");
      check(cublasSgemv(blas.h, CUBLAS_OP_T, d, rows, &one, xb, d, dw.p, 1, &minus_one, dres.p, 1), "X_b w - y_b");
      // grad = X_b^T residual / batch (this rank's share of the batch mean)
      check(cublasSgemv(blas.h, CUBLAS_OP_N, d, rows, &inv_batch, xb, d, dres.p, 1, &zero, dgrad.p, 1), "gradient");
      if (!group.allreduce(std::span<float>(dgrad.p, d), elastic::comm::reduce_op::sum)) continue;  // redone
      step.before_update(stream.s);  // an in-flight snapshot of w must be taken first (stream order)
      const float step_size = -lr;
      check(cublasSaxpy(blas.h, d, &step_size, dgrad.p, 1, dw.p, 1), "w -= lr grad");
      if (rank == 0 && (step.index() + 1) % 100 == 0) {
        float norm = 0;
        check(cublasSnrm2(blas.h, rows, dres.p, 1, &norm), "residual norm");  // synchronizes the stream
        std::printf("step %llu/%llu  ranks %d  rms residual %.4f\n", static_cast<unsigned long long>(step.index() + 1),
                    static_cast<unsigned long long>(steps), world, norm / std::sqrt(static_cast<float>(rows)));
        std::fflush(stdout);
      }
    }
    check(cudaStreamSynchronize(stream.s), "final sync");
    return loop.exit_code();
  } catch (const elastic::error& e) {
    std::fprintf(stderr, "cuda_train: %s\n", e.what());
    return 1;
  }
}
