// A rank of an elastic data-parallel job over NCCL, for tests/test_nccl_group.cpp: linear
// regression on synthetic data, trained by a training_loop with an nccl_group. The same source
// builds against the NCCL model (tests/nccl_model, label nccl-model) and against real NCCL and
// CUDA (label gpu), so every scenario runs on both.
//
//   elastic_nccl_group_worker --store URL --run-id ID --id NAME --min N --max N --steps S --dir CKPT
//                             [--device D] [--timeout-ms T] [--kill-self-at N] [--stop-self-at N]
//                             [--standby MAX_WORLD] [--standbys-ready-by STEP] ...
//
// Gradients are summed in 2^-24 fixed point (int64) by NCCL, so the sum is exact whatever the world
// size and the ranks' order: a run that loses and regains ranks ends with the very weights of an
// undisturbed one. The gradient reaches the device the way a trainer's kernels would put it there:
// on the legacy default stream, behind a host function that sleeps (--producer-delay-ms), so a
// collective that does not wait for the default stream reads stale data and the weights differ.
// The weights live on the host and, as registered device state, on the device (resynced by NCCL
// broadcast, snapshotted by the checkpoint's device path). --shard 2 adds moments partitioned
// across the group in device memory (state::add_partitioned with a resize callback), which the
// group moves through the host after a rebuild; the final line then carries their whole crc.
//
// stdout, one line each, flushed:
//   nccl version=<code> revoke=<0|1> shrink=<0|1> grow=<0|1>
//   joined round=R rank=r world=W t=<ns>
//   step=N world=W rank=r t=<CLOCK_MONOTONIC ns> crc=<crc32c of the weights>
//   rebuilt round=R world=W rank=r path=<reinit|shrink|grow|shrink+grow|standby> noticed=<ns> ... cause=<...>
//   standbys ready=<n>                  (--standbys-ready-by: once this rank's standbys are built)
//   killing t=<ns> / stopping t=<ns>
//   final step=N crc=<hex> reason=<finished|preempted|stopped> redone=<n> roots=<n|-1> moments=<hex>
// Errors: "error code=<errc> <message>" and exit 3.
#include <dlfcn.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime_api.h>

#include <elastic/checkpoint.hpp>
#include <elastic/comm/nccl_group.hpp>
#include <elastic/internal/clock.hpp>
#include <elastic/internal/crc32c.hpp>
#include <elastic/rendezvous/open_store.hpp>

#include "regression_job.hpp"

namespace {

using namespace std::chrono_literals;
using elastic::test::job_options;
using elastic::test::say;

void check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) {
    throw elastic::error(elastic::errc::device_error, std::string(what) + ": " + cudaGetErrorString(rc));
  }
}

/// Device memory for n elements of T, freed with the object.
template <class T>
struct device_array {
  T* p = nullptr;
  std::size_t n = 0;
  explicit device_array(std::size_t count) : n(count) {
    check(cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(T)), "cudaMalloc");
    check(cudaMemset(p, 0, n * sizeof(T)), "cudaMemset");
  }
  ~device_array() { cudaFree(p); }
  device_array(const device_array&) = delete;
  device_array& operator=(const device_array&) = delete;
  std::span<T> span() const { return {p, n}; }
};

/// Pinned host memory, so a copy from it is truly asynchronous.
template <class T>
struct pinned_array {
  T* p = nullptr;
  std::size_t n = 0;
  explicit pinned_array(std::size_t count) : n(count) {
    check(cudaHostAlloc(reinterpret_cast<void**>(&p), n * sizeof(T), cudaHostAllocDefault), "cudaHostAlloc");
  }
  ~pinned_array() { cudaFreeHost(p); }
  pinned_array(const pinned_array&) = delete;
  pinned_array& operator=(const pinned_array&) = delete;
};

/// Bootstrap roots of this process still waiting for ranks: the NCCL model says (a leak test);
/// real NCCL cannot, -1.
int live_bootstrap_roots() {
  using fn = int (*)();
  auto f = reinterpret_cast<fn>(::dlsym(RTLD_DEFAULT, "elastic_nccl_model_live_roots"));
  return f ? f() : -1;
}

}  // namespace

int main(int argc, char** argv) {
  int device = 0;
  bool shard = false;
  int standby = -1;                 // nccl_standby::max_world; -1: the library's default
  std::vector<long> standbys_ready_by;  // before these steps, wait until this rank's standbys are ready
  std::chrono::milliseconds producer_delay{2};
  job_options defaults;
  defaults.dim = 16384;
  defaults.timeout = 3000ms;
  defaults.join_timeout = 30000ms;
  const job_options o = elastic::test::parse_job_options(argc, argv, "elastic_nccl_group_worker", defaults,
                                                         [&](const std::string& name, long long v) {
                                                           if (name == "--device") device = static_cast<int>(v);
                                                           else if (name == "--producer-delay-ms") producer_delay = std::chrono::milliseconds(v);
                                                           else if (name == "--shard") shard = v == 2;
                                                           else if (name == "--standby") standby = static_cast<int>(v);
                                                           else if (name == "--standbys-ready-by") standbys_ready_by.push_back(static_cast<long>(v));
                                                           else return false;
                                                           return true;
                                                         });
  namespace comm = elastic::comm;
  try {
    check(cudaSetDevice(device), "cudaSetDevice");
    {
      const auto& calls = comm::detail::recovery_calls();
      say("nccl version=" + std::to_string(calls.version) + " revoke=" + std::to_string(calls.revoke) +
          " shrink=" + std::to_string(calls.shrink) + " grow=" + std::to_string(calls.grow));
    }
    auto store = elastic::rendezvous::open_store(o.store);
    const elastic::test::dataset data(o.dim, 18);
    std::vector<float> w(o.dim, 0.0f);
    device_array<float> d_w(o.dim);  // the device copy of the weights: replicated device state
    std::uint64_t samples_seen = 0;
    elastic::checkpoint::state st;
    st.add("w", w).add("d_w", elastic::device_span(d_w.p, d_w.n)).add_value("samples_seen", samples_seen);
    // This rank's slice of the moments, in device memory the state resizes through us.
    std::unique_ptr<device_array<float>> d_m;
    std::vector<float> m_host;
    if (shard) {
      st.add_partitioned(
          "moments",
          [&d_m](std::uint64_t count) {
            d_m = std::make_unique<device_array<float>>(std::max<std::size_t>(1, static_cast<std::size_t>(count)));
            return elastic::device_span<float>(d_m->p, static_cast<std::size_t>(count));
          },
          o.dim, 0, 1);
    }

    comm::nccl_standby standbys;
    if (standby >= 0) standbys.max_world = standby;
    // A copy stays here: the group's copy shares its standbys, whose readiness we may wait for.
    const comm::nccl_factory factory(device, o.timeout, nullptr, {}, standbys);
    comm::nccl_group group(*store, elastic::test::group_options_of(o), factory, comm::nccl_bootstrap());

    elastic::training_loop loop({.dir = o.dir,
                                 .steps = o.steps,
                                 .every_steps = o.every,
                                 .keep_last = 3,
                                 .step_timeout = o.step_timeout,
                                 .group = &group},
                                st);
    pinned_array<std::int64_t> grad(o.dim);
    device_array<std::int64_t> d_grad(o.dim);
    std::size_t rebuilds_seen = 0;
    bool announced = false;
    for (auto& step : loop) {
      elastic::test::report_group(group, announced, rebuilds_seen);
      const std::uint64_t idx = step.index();
      // Once per step: a step redone after a rebuild must not wait for the next round's standbys
      // (the GPU check's first run timed that wait as the first step after a switch).
      if (const auto at = std::find(standbys_ready_by.begin(), standbys_ready_by.end(), static_cast<long>(idx));
          at != standbys_ready_by.end()) {
        standbys_ready_by.erase(at);
        // A fault at this step should meet ready standbys (a test's wait, bounded, not a timing).
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
        while (factory.standbys_ready() < group.size() - 1 && std::chrono::steady_clock::now() < until) {
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        elastic::test::say("standbys ready=" + std::to_string(factory.standbys_ready()));
      }
      std::memset(grad.p, 0, o.dim * sizeof(std::int64_t));
      elastic::test::local_gradient(data, w, idx, o.batch, group.rank(), group.size(), grad.p);
      // The producer: the default stream is busy a while, then the gradient lands on the device.
      static long delay_ms = 0;  // read by the host function on the stream's thread, set before
      delay_ms = static_cast<long>(producer_delay.count());
      check(cudaLaunchHostFunc(
                nullptr, [](void* p) { std::this_thread::sleep_for(std::chrono::milliseconds(*static_cast<long*>(p))); },
                &delay_ms),
            "cudaLaunchHostFunc");
      check(cudaMemcpyAsync(d_grad.p, grad.p, o.dim * sizeof(std::int64_t), cudaMemcpyHostToDevice, nullptr),
            "cudaMemcpyAsync gradient");
      std::jthread killer = elastic::test::inject_faults(o, idx);
      if (!group.allreduce(d_grad.span(), comm::reduce_op::sum)) continue;  // redone on the new group
      check(cudaMemcpy(grad.p, d_grad.p, o.dim * sizeof(std::int64_t), cudaMemcpyDeviceToHost), "cudaMemcpy gradient");
      step.before_update();
      elastic::test::apply_gradient(w, grad.p, o.batch);
      check(cudaMemcpy(d_w.p, w.data(), o.dim * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy weights");
      if (shard) {  // this rank's slice of the moments, from the whole gradient
        const auto* e = st.find("moments");
        const std::size_t lo = e->shard->offset, n = e->bytes / sizeof(float);
        m_host.resize(n);
        check(cudaMemcpy(m_host.data(), d_m->p, n * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy moments");
        for (std::size_t k = 0; k < n; ++k) {
          m_host[k] = 0.9f * m_host[k] + static_cast<float>(static_cast<double>(grad.p[lo + k]) / 1e6);
        }
        check(cudaMemcpy(d_m->p, m_host.data(), n * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy moments");
      }
      const auto crc = elastic::internal::crc32c(w.data(), w.size() * sizeof(float));
      samples_seen += o.batch;
      elastic::test::report_step(idx + 1, group.size(), group.rank(), crc);
      if (o.step_sleep.count() > 0) std::this_thread::sleep_for(o.step_sleep);
    }
    // The crc covers the host weights, the device weights and the value.
    std::vector<float> dev(o.dim);
    check(cudaMemcpy(dev.data(), d_w.p, o.dim * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy final weights");
    std::uint32_t all = elastic::internal::crc32c(w.data(), w.size() * sizeof(float));
    all = elastic::internal::crc32c(dev.data(), dev.size() * sizeof(float), all);
    all = elastic::internal::crc32c(&samples_seen, sizeof samples_seen, all);
    std::uint32_t moments_crc = 0;
    if (shard && loop.reason() == elastic::loop_reason::finished) {
      // The whole buffer on the device: each rank adds its slice to zeros (exact), by NCCL.
      const auto* e = st.find("moments");
      device_array<float> whole(o.dim);
      check(cudaMemcpy(whole.p + e->shard->offset, d_m->p, e->bytes, cudaMemcpyDeviceToDevice), "cudaMemcpy slice");
      if (!group.allreduce(whole.span(), comm::reduce_op::sum)) throw elastic::error(elastic::errc::aborted, "gather failed");
      std::vector<float> host(o.dim);
      check(cudaMemcpy(host.data(), whole.p, o.dim * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy moments");
      moments_crc = elastic::internal::crc32c(host.data(), host.size() * sizeof(float));
    }
    char line[220];
    std::snprintf(line, sizeof line, "final step=%llu crc=%08x reason=%s redone=%llu roots=%d moments=%08x",
                  static_cast<unsigned long long>(loop.completed_steps()), all,
                  std::string(elastic::to_string(loop.reason())).c_str(),
                  static_cast<unsigned long long>(loop.redone_steps()), live_bootstrap_roots(), moments_crc);
    say(line);
    return loop.exit_code();
  } catch (const elastic::error& e) {
    say("error code=" + std::string(elastic::to_string(e.code())) + " " + e.what());
    return 3;
  }
}
