// A rank of an elastic data-parallel job over NCCL, for tests/test_nccl_group.cpp: linear
// regression on synthetic data, trained by a training_loop with an nccl_group. The same source
// builds against the NCCL model (tests/nccl_model, label nccl-model) and against real NCCL and
// CUDA (label gpu), so every scenario runs on both.
//
//   elastic_nccl_group_worker --store URL --run-id ID --id NAME --min N --max N --steps S --dir CKPT
//                             [--device D] [--timeout-ms T] [--kill-self-at N] [--stop-self-at N] ...
//
// Gradients are summed in 2^-24 fixed point (int64) by NCCL, so the sum is exact whatever the world
// size and the ranks' order: a run that loses and regains ranks ends with the very weights of an
// undisturbed one. The gradient reaches the device the way a trainer's kernels would put it there:
// on the legacy default stream, behind a host function that sleeps (--producer-delay-ms), so a
// collective that does not wait for the default stream reads stale data and the weights differ.
// The weights live on the host and, as registered device state, on the device (resynced by NCCL
// broadcast, snapshotted by the checkpoint's device path).
//
// stdout, one line each, flushed:
//   nccl version=<code> revoke=<0|1> shrink=<0|1> grow=<0|1>
//   joined round=R rank=r world=W t=<ns>
//   step=N world=W rank=r t=<CLOCK_MONOTONIC ns> crc=<crc32c of the weights>
//   rebuilt round=R world=W rank=r path=<reinit|shrink|grow|shrink+grow|kept> noticed=<ns> ... cause=<...>
//   killing t=<ns> / stopping t=<ns>
//   final step=N crc=<hex> reason=<finished|preempted|stopped> redone=<n> roots=<n|-1>
// Errors: "error code=<errc> <message>" and exit 3.
#include <dlfcn.h>
#include <signal.h>
#include <unistd.h>

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

namespace {

using namespace std::chrono_literals;
using ms = std::chrono::milliseconds;

struct options {
  std::string store, run_id, dir, id;
  int min = 1, max = 1, device = 0;
  std::uint64_t steps = 100, every = 10;
  std::size_t dim = 16384, batch = 16;
  ms timeout{3000}, hb_interval{100}, hb_timeout{500}, last_call{300}, join_timeout{30000}, poll{20};
  ms step_sleep{0}, step_timeout{0}, producer_delay{2};
  long kill_self_at = -1;  // SIGKILL ourselves mid-allreduce of this step
  long stop_self_at = -1;  // SIGSTOP ourselves before the allreduce of this step (a hang)
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "elastic_nccl_group_worker: %s\n", why.c_str());
  std::exit(2);
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) usage("missing value for " + a);
    const std::string v = argv[++i];
    auto n = [&] { return std::strtoll(v.c_str(), nullptr, 10); };
    if (a == "--store") o.store = v;
    else if (a == "--run-id") o.run_id = v;
    else if (a == "--dir") o.dir = v;
    else if (a == "--id") o.id = v;
    else if (a == "--min") o.min = static_cast<int>(n());
    else if (a == "--max") o.max = static_cast<int>(n());
    else if (a == "--device") o.device = static_cast<int>(n());
    else if (a == "--steps") o.steps = static_cast<std::uint64_t>(n());
    else if (a == "--every") o.every = static_cast<std::uint64_t>(n());
    else if (a == "--dim") o.dim = static_cast<std::size_t>(n());
    else if (a == "--timeout-ms") o.timeout = ms(n());
    else if (a == "--hb-interval-ms") o.hb_interval = ms(n());
    else if (a == "--hb-timeout-ms") o.hb_timeout = ms(n());
    else if (a == "--last-call-ms") o.last_call = ms(n());
    else if (a == "--join-timeout-ms") o.join_timeout = ms(n());
    else if (a == "--poll-ms") o.poll = ms(n());
    else if (a == "--step-sleep-ms") o.step_sleep = ms(n());
    else if (a == "--step-timeout-ms") o.step_timeout = ms(n());
    else if (a == "--producer-delay-ms") o.producer_delay = ms(n());
    else if (a == "--kill-self-at") o.kill_self_at = static_cast<long>(n());
    else if (a == "--stop-self-at") o.stop_self_at = static_cast<long>(n());
    else usage("unknown option " + a);
  }
  if (o.store.empty() || o.dir.empty()) usage("--store and --dir are required");
  return o;
}

void say(const std::string& line) {
  std::fputs((line + "\n").c_str(), stdout);
  std::fflush(stdout);
}

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

/// The synthetic dataset (as tests/support/group_worker.cpp): the same on every rank.
struct dataset {
  static constexpr std::size_t table_size = 1 << 18;
  std::vector<float> table, target;
  explicit dataset(std::size_t dim) : table(table_size), target(dim) {
    std::uint64_t z = 0x9e3779b97f4a7c15ull;
    auto next = [&] {
      z += 0x9e3779b97f4a7c15ull;
      std::uint64_t x = z;
      x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
      x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
      return static_cast<float>(static_cast<double>((x ^ (x >> 31)) >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    };
    for (auto& v : table) v = next();
    for (auto& v : target) v = next();
  }
  std::size_t features(std::uint64_t s) const { return static_cast<std::size_t>(s * 2654435761ull); }
  float at(std::size_t x, std::size_t k) const { return table[(x + k) & (table_size - 1)]; }
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
  const options o = parse(argc, argv);
  namespace comm = elastic::comm;
  try {
    check(cudaSetDevice(o.device), "cudaSetDevice");
    {
      const auto& calls = comm::detail::recovery_calls();
      say("nccl version=" + std::to_string(calls.version) + " revoke=" + std::to_string(calls.revoke) +
          " shrink=" + std::to_string(calls.shrink) + " grow=" + std::to_string(calls.grow));
    }
    auto store = elastic::rendezvous::open_store(o.store);
    const dataset data(o.dim);
    std::vector<float> w(o.dim, 0.0f);
    device_array<float> d_w(o.dim);  // the device copy of the weights: replicated device state
    std::uint64_t samples_seen = 0;
    elastic::checkpoint::state st;
    st.add("w", w).add("d_w", elastic::device_span(d_w.p, d_w.n)).add_value("samples_seen", samples_seen);

    comm::group_options go;
    go.rendezvous.run_id = o.run_id;
    go.rendezvous.min_ranks = o.min;
    go.rendezvous.max_ranks = o.max;
    go.rendezvous.join_timeout = o.join_timeout;
    go.rendezvous.last_call_timeout = o.last_call;
    go.rendezvous.heartbeat_interval = o.hb_interval;
    go.rendezvous.heartbeat_timeout = o.hb_timeout;
    go.rendezvous.participant_id = o.id;
    go.poll_interval = o.poll;
    comm::nccl_group group(*store, go, comm::nccl_factory(o.device, o.timeout), comm::nccl_bootstrap());

    elastic::training_loop loop({.dir = o.dir,
                                 .steps = o.steps,
                                 .every_steps = o.every,
                                 .keep_last = 3,
                                 .step_timeout = o.step_timeout,
                                 .group = &group},
                                st);
    const double scale = 16777216.0;  // 2^24
    const float lr = 4.0f / static_cast<float>(o.dim);
    pinned_array<std::int64_t> grad(o.dim);
    device_array<std::int64_t> d_grad(o.dim);
    std::size_t rebuilds_seen = 0;
    bool announced = false;
    for (auto& step : loop) {
      if (!announced) {
        say("joined round=" + std::to_string(group.round()) + " rank=" + std::to_string(group.rank()) +
            " world=" + std::to_string(group.size()) + " t=" + std::to_string(elastic::internal::monotonic_ns()));
        announced = true;
      }
      if (group.rebuilds() != rebuilds_seen) {
        rebuilds_seen = group.rebuilds();
        const auto& r = group.last_recovery();
        say("rebuilt round=" + std::to_string(r.round) + " world=" + std::to_string(r.world_size) +
            " rank=" + std::to_string(group.rank()) + " path=" + r.path + " noticed=" + std::to_string(r.noticed_ns) +
            " met=" + std::to_string(r.rendezvous_done_ns) + " connected=" + std::to_string(r.connected_ns) +
            " resynced=" + std::to_string(r.resynced_ns) + " cause=" + r.cause);
      }
      const std::uint64_t idx = step.index();
      // This rank's share of the global batch: samples j with j % world == rank.
      std::memset(grad.p, 0, o.dim * sizeof(std::int64_t));
      for (std::size_t j = static_cast<std::size_t>(group.rank()); j < o.batch; j += static_cast<std::size_t>(group.size())) {
        const std::size_t x = data.features(idx * o.batch + j);
        float pred = 0, label = 0;
        for (std::size_t k = 0; k < o.dim; ++k) {
          pred += w[k] * data.at(x, k);
          label += data.target[k] * data.at(x, k);
        }
        const float r = pred - label;
        for (std::size_t k = 0; k < o.dim; ++k) grad.p[k] += std::llround(static_cast<double>(r * data.at(x, k)) * scale);
      }
      // The producer: the default stream is busy a while, then the gradient lands on the device.
      static long delay_ms = 0;  // read by the host function on the stream's thread, set before
      delay_ms = static_cast<long>(o.producer_delay.count());
      check(cudaLaunchHostFunc(
                nullptr, [](void* p) { std::this_thread::sleep_for(std::chrono::milliseconds(*static_cast<long*>(p))); },
                &delay_ms),
            "cudaLaunchHostFunc");
      check(cudaMemcpyAsync(d_grad.p, grad.p, o.dim * sizeof(std::int64_t), cudaMemcpyHostToDevice, nullptr),
            "cudaMemcpyAsync gradient");
      if (o.stop_self_at >= 0 && idx == static_cast<std::uint64_t>(o.stop_self_at)) {
        say("stopping t=" + std::to_string(elastic::internal::monotonic_ns()));
        ::raise(SIGSTOP);  // frozen inside the step's timer scope, as a hung kernel would leave it
      }
      std::jthread killer;
      if (o.kill_self_at >= 0 && idx == static_cast<std::uint64_t>(o.kill_self_at)) {
        std::this_thread::sleep_for(20ms);  // let the others enter the allreduce first
        killer = std::jthread([] {
          std::this_thread::sleep_for(std::chrono::microseconds(300));
          say("killing t=" + std::to_string(elastic::internal::monotonic_ns()));
          ::kill(::getpid(), SIGKILL);
        });
      }
      if (!group.allreduce(d_grad.span(), comm::reduce_op::sum)) continue;  // redone on the new group
      check(cudaMemcpy(grad.p, d_grad.p, o.dim * sizeof(std::int64_t), cudaMemcpyDeviceToHost), "cudaMemcpy gradient");
      step.before_update();
      for (std::size_t k = 0; k < o.dim; ++k) {
        w[k] -= lr * static_cast<float>(static_cast<double>(grad.p[k]) / scale / static_cast<double>(o.batch));
      }
      check(cudaMemcpy(d_w.p, w.data(), o.dim * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy weights");
      const auto crc = elastic::internal::crc32c(w.data(), w.size() * sizeof(float));
      samples_seen += o.batch;
      char line[160];
      std::snprintf(line, sizeof line, "step=%llu world=%d rank=%d t=%lld crc=%08x",
                    static_cast<unsigned long long>(idx + 1), group.size(), group.rank(),
                    static_cast<long long>(elastic::internal::monotonic_ns()), crc);
      say(line);
      if (o.step_sleep.count() > 0) std::this_thread::sleep_for(o.step_sleep);
    }
    // The crc covers the host weights, the device weights and the value.
    std::vector<float> dev(o.dim);
    check(cudaMemcpy(dev.data(), d_w.p, o.dim * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy final weights");
    std::uint32_t all = elastic::internal::crc32c(w.data(), w.size() * sizeof(float));
    all = elastic::internal::crc32c(dev.data(), dev.size() * sizeof(float), all);
    all = elastic::internal::crc32c(&samples_seen, sizeof samples_seen, all);
    char line[200];
    std::snprintf(line, sizeof line, "final step=%llu crc=%08x reason=%s redone=%llu roots=%d",
                  static_cast<unsigned long long>(loop.completed_steps()), all,
                  std::string(elastic::to_string(loop.reason())).c_str(),
                  static_cast<unsigned long long>(loop.redone_steps()), live_bootstrap_roots());
    say(line);
    return loop.exit_code();
  } catch (const elastic::error& e) {
    say("error code=" + std::string(elastic::to_string(e.code())) + " " + e.what());
    return 3;
  }
}
