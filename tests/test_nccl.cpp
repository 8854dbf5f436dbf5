// The NCCL communicator, one rank (label gpu against real NCCL; the same source runs against the
// NCCL model under label nccl-model). Multi-rank cases are tests/test_nccl_group.cpp: they give
// each rank its own NCCL_HOSTID so several share one GPU.
//
// These check every collective and type on one rank, the init deadline (a second rank that never
// comes), abort, revoke, shrink's argument checks, a collective that cannot finish (its stream is
// held by a host callback) timing out, completion timed by the collective's own event, and the
// refusal of NCCL_COMM_BLOCKING.
#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <elastic/comm/detail/nccl_warm_up.hpp>
#include <elastic/comm/nccl.hpp>

#include <dirent.h>
#include <dlfcn.h>

#include <cstdlib>
#include <fstream>

#include "support/catch.hpp"
#include "support/errors.hpp"
#include "support/eventually.hpp"
#include "support/other_user.hpp"

using namespace std::chrono_literals;
using elastic::errc;
using elastic::test::error_of;
namespace comm = elastic::comm;

static_assert(comm::communicator<comm::nccl_communicator>);
static_assert(comm::nccl_communicator::takes_device_memory);

namespace {

void require_gpu() {
  int n = 0;
  const cudaError_t rc = cudaGetDeviceCount(&n);
  INFO("cudaGetDeviceCount: " << cudaGetErrorString(rc));
  REQUIRE(rc == cudaSuccess);
  REQUIRE(n >= 1);
  // Every thread that uses CUDA sets its device first (the model insists, as it should).
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
}

void cuda_ok(cudaError_t rc) {
  INFO(cudaGetErrorName(rc) << ": " << cudaGetErrorString(rc));
  REQUIRE(rc == cudaSuccess);
}

/// A device copy of `host`, freed on destruction.
template <class T>
struct device_vector {
  T* p = nullptr;
  std::size_t n = 0;
  explicit device_vector(const std::vector<T>& host) : n(host.size()) {
    cuda_ok(cudaMalloc(&p, n * sizeof(T)));
    cuda_ok(cudaMemcpy(p, host.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  ~device_vector() { cudaFree(p); }
  std::span<T> span() { return {p, n}; }
  std::vector<T> host() const {
    std::vector<T> out(n);
    cuda_ok(cudaMemcpy(out.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return out;
  }
};

/// NCCL's bootstrap root threads alive in this process: the model counts them; real NCCL names
/// them "NCCL BootstrapR" (src/bootstrap.cc), which /proc shows.
int bootstrap_roots() {
  using fn = int (*)();
  if (auto f = reinterpret_cast<fn>(::dlsym(RTLD_DEFAULT, "elastic_nccl_model_live_roots"))) return f();
  int n = 0;
  if (DIR* d = ::opendir("/proc/self/task")) {
    while (const dirent* e = ::readdir(d)) {
      std::ifstream comm(std::string("/proc/self/task/") + e->d_name + "/comm");
      std::string name;
      if (std::getline(comm, name) && name == "NCCL BootstrapR") ++n;
    }
    ::closedir(d);
  }
  return n;
}

template <class T>
std::vector<std::uint8_t> bytes_of(const std::vector<T>& v) {
  std::vector<std::uint8_t> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

/// On one rank, sum and average give back the buffer unchanged, bit for bit.
template <class T>
void check_identity(comm::nccl_communicator& c, std::vector<T> values) {
  for (auto op : {comm::reduce_op::sum, comm::reduce_op::avg}) {
    device_vector<T> d(values);
    c.allreduce(d.span(), op);
    CHECK(bytes_of(d.host()) == bytes_of(values));
    device_vector<T> b(values);
    c.broadcast(b.span(), 0);
    CHECK(bytes_of(b.host()) == bytes_of(values));
  }
}

template <class T>
std::vector<T> ramp(std::size_t n) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    if constexpr (comm::is_half_v<T>) {
      v[i] = T(static_cast<float>(i % 97) * 0.25f - 3.0f);
    } else {
      v[i] = static_cast<T>(static_cast<long long>(i % 1000) - 500);
    }
  }
  return v;
}

}  // namespace

TEST_CASE("a single-rank nccl communicator reduces and broadcasts every type to itself", "[nccl]") {
  require_gpu();
  comm::nccl_communicator c(comm::nccl_unique_id(), 0, 1, 0, 20s);
  CHECK(c.rank() == 0);
  CHECK(c.size() == 1);
  CHECK(c.device() == 0);
  CHECK(c.ok());
  constexpr std::size_t n = 100003;
  check_identity(c, ramp<float>(n));
  check_identity(c, ramp<double>(n));
  check_identity(c, ramp<std::int32_t>(n));
  check_identity(c, ramp<std::int64_t>(n));
  check_identity(c, ramp<comm::bfloat16>(n));
  check_identity(c, ramp<comm::float16>(n));
  c.barrier();
  std::vector<float> empty;
  c.allreduce(std::span<float>(empty), comm::reduce_op::sum);  // nothing to do, no error
  CHECK(c.ok());
  CHECK_FALSE(c.last_error().has_value());
}

TEST_CASE("broadcast_host moves host words through the device", "[nccl]") {
  require_gpu();
  comm::nccl_communicator c(comm::nccl_unique_id(), 0, 1, 0, 20s);
  std::vector<std::int64_t> words = {1, -2, 1LL << 40};
  c.broadcast_host(std::span<std::int64_t>(words), 0);
  CHECK(words == std::vector<std::int64_t>{1, -2, 1LL << 40});
}

TEST_CASE("a communicator runs on the caller's stream when given one", "[nccl]") {
  require_gpu();
  cudaStream_t s = nullptr;
  cuda_ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  {
    comm::nccl_communicator c(comm::nccl_unique_id(), 0, 1, 0, 20s, s);
    CHECK(c.stream() == s);
    device_vector<float> d(std::vector<float>(1000, 2.5f));
    c.allreduce(d.span(), comm::reduce_op::sum);
    CHECK(d.host() == std::vector<float>(1000, 2.5f));
  }
  cuda_ok(cudaStreamDestroy(s));  // the communicator left the caller's stream alone
}

TEST_CASE("an nccl init whose peers never come times out and says so", "[nccl]") {
  require_gpu();
  const auto t0 = std::chrono::steady_clock::now();
  const auto e = error_of([] { comm::nccl_communicator c(comm::nccl_unique_id(), 0, 2, 0, 1500ms); });
  const auto took = std::chrono::steady_clock::now() - t0;
  INFO(e.what());
  CHECK(e.code() == errc::timeout);
  CHECK(std::string(e.what()).find("timed out") != std::string::npos);
  CHECK(took >= 1400ms);
  CHECK(took < 10s);
}

TEST_CASE("an aborted nccl communicator refuses every call at once", "[nccl]") {
  require_gpu();
  comm::nccl_communicator c(comm::nccl_unique_id(), 0, 1, 0, 20s);
  device_vector<float> d(std::vector<float>(16, 1.0f));
  c.abort();
  CHECK_FALSE(c.ok());
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(error_of([&] { c.allreduce(d.span(), comm::reduce_op::sum); }).code() == errc::aborted);
  CHECK(error_of([&] { c.broadcast(d.span(), 0); }).code() == errc::aborted);
  CHECK(error_of([&] { c.barrier(); }).code() == errc::aborted);
  CHECK(std::chrono::steady_clock::now() - t0 < 100ms);
  c.abort();  // twice is fine
}

TEST_CASE("bad ranks, sizes, devices, ids and roots get clear errors", "[nccl]") {
  require_gpu();
  const std::string id = comm::nccl_unique_id();
  CHECK(id.size() == 128);
  CHECK(error_of([&] { comm::nccl_communicator c(id, 1, 1, 0, 1s); }).code() == errc::invalid_argument);
  CHECK(error_of([&] { comm::nccl_communicator c(id, 0, 0, 0, 1s); }).code() == errc::invalid_argument);
  CHECK(error_of([&] { comm::nccl_communicator c(id, 0, 1, -1, 1s); }).code() == errc::invalid_argument);
  CHECK(error_of([&] { comm::nccl_communicator c(id, 0, 1, 0, 0ms); }).code() == errc::invalid_argument);
  CHECK(error_of([&] { comm::nccl_communicator c("short", 0, 1, 0, 1s); }).code() == errc::invalid_argument);
  comm::nccl_communicator c(id, 0, 1, 0, 20s);
  device_vector<float> d(std::vector<float>(4, 1.0f));
  CHECK(error_of([&] { c.broadcast(d.span(), 1); }).code() == errc::invalid_argument);
  CHECK(c.ok());  // the caller's mistake leaves the communicator usable
}

TEST_CASE("a collective that cannot finish in time breaks the communicator with a timeout", "[nccl]") {
  require_gpu();
  cudaStream_t s = nullptr;
  cuda_ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  auto release = std::make_unique<std::atomic<bool>>(false);
  {
    comm::nccl_communicator c(comm::nccl_unique_id(), 0, 1, 0, 800ms, s);
    device_vector<float> d(std::vector<float>(1024, 1.0f));
    // Hold the stream: the allreduce queues behind a host callback that waits for the test.
    cuda_ok(cudaLaunchHostFunc(
        s,
        [](void* flag) {
          auto* f = static_cast<std::atomic<bool>*>(flag);
          while (!f->load()) std::this_thread::sleep_for(1ms);
        },
        release.get()));
    const auto t0 = std::chrono::steady_clock::now();
    const auto e = error_of([&] { c.allreduce(d.span(), comm::reduce_op::sum); });
    const auto took = std::chrono::steady_clock::now() - t0;
    INFO(e.what());
    CHECK(e.code() == errc::timeout);
    CHECK(took >= 700ms);
    CHECK(took < 5s);
    CHECK_FALSE(c.ok());
    REQUIRE(c.last_error().has_value());
    CHECK(c.last_error()->code() == errc::timeout);
    CHECK(error_of([&] { c.barrier(); }).code() == errc::timeout);  // later calls fail at once
    release->store(true);
    cuda_ok(cudaStreamSynchronize(s));  // the held work drains before the communicator goes
  }
  cuda_ok(cudaStreamDestroy(s));
}

TEST_CASE("shrink refuses an empty exclude list, itself and strangers before NCCL sees them", "[nccl]") {
  require_gpu();
  comm::nccl_communicator c(comm::nccl_unique_id(), 0, 1, 0, 20s);
  if (!comm::nccl_communicator::can_shrink()) {
    CHECK(error_of([&] { (void)c.shrink({}, 5s); }).code() == errc::not_supported);
    return;
  }
  // NCCL rejects an empty list in every release that has ncclCommShrink (2.27.3 .. 2.30.7).
  const auto empty = error_of([&] { (void)c.shrink({}, 5s); });
  INFO(empty.what());
  CHECK(empty.code() == errc::invalid_argument);
  CHECK(std::string(empty.what()).find("empty exclude list") != std::string::npos);
  const int self = 0;
  CHECK(error_of([&] { (void)c.shrink(std::span<const int>(&self, 1), 5s); }).code() == errc::invalid_argument);
  const int beyond = 3;
  CHECK(error_of([&] { (void)c.shrink(std::span<const int>(&beyond, 1), 5s); }).code() == errc::invalid_argument);
  CHECK(c.ok());  // the caller's mistakes leave it usable
  device_vector<float> d(std::vector<float>(16, 1.0f));
  c.allreduce(d.span(), comm::reduce_op::sum);
  c.abort();
  const int one = 1;
  CHECK(error_of([&] { (void)c.shrink(std::span<const int>(&one, 1), 5s); }).code() == errc::invalid_argument);
}

TEST_CASE("a revoked nccl communicator refuses collectives, and says it was revoked", "[nccl]") {
  require_gpu();
  comm::nccl_communicator c(comm::nccl_unique_id(), 0, 1, 0, 20s);
  device_vector<float> d(std::vector<float>(16, 1.0f));
  c.allreduce(d.span(), comm::reduce_op::sum);
  c.revoke();
  CHECK_FALSE(c.ok());
  CHECK_FALSE(c.last_error().has_value());  // the caller's decision, not a failure
  const auto e = error_of([&] { c.allreduce(d.span(), comm::reduce_op::sum); });
  CHECK(e.code() == errc::aborted);
  CHECK(std::string(e.what()).find("revoked") != std::string::npos);
  c.revoke();  // twice is fine
}

TEST_CASE("a collective is done when it is done, not when the stream it shares goes idle", "[nccl]") {
  require_gpu();
  cudaStream_t s = nullptr;
  cuda_ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  {
    comm::nccl_communicator c(comm::nccl_unique_id(), 0, 1, 0, 1500ms, s);
    device_vector<float> d(std::vector<float>(1024, 3.0f));
    // Another thread keeps the shared stream busy, as a loader pushing copies would: there is
    // always a little queued behind each collective (two 2 ms host functions at most), so the
    // stream is never idle, yet each allreduce must finish (a whole-stream query would time out).
    std::jthread busy([&](std::stop_token st) {
      cudaSetDevice(0);
      cudaEvent_t ev[2];
      cudaEventCreateWithFlags(&ev[0], cudaEventDisableTiming);
      cudaEventCreateWithFlags(&ev[1], cudaEventDisableTiming);
      for (int i = 0; !st.stop_requested(); ++i) {
        cudaLaunchHostFunc(
            s, [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(2)); }, nullptr);
        cudaEventRecord(ev[i % 2], s);
        if (i > 0) cudaEventSynchronize(ev[(i + 1) % 2]);  // the one before: keep the queue short
      }
      cudaEventSynchronize(ev[0]);
      cudaEventSynchronize(ev[1]);
      cudaEventDestroy(ev[0]);
      cudaEventDestroy(ev[1]);
    });
    std::this_thread::sleep_for(50ms);
    for (int i = 0; i < 5; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      c.allreduce(d.span(), comm::reduce_op::sum);
      INFO("allreduce " << i);
      CHECK(std::chrono::steady_clock::now() - t0 < 1400ms);
    }
    CHECK(c.ok());
    busy.request_stop();
    busy.join();
    cuda_ok(cudaStreamSynchronize(s));
  }
  cuda_ok(cudaStreamDestroy(s));
}

TEST_CASE("NCCL_COMM_BLOCKING=1 in the environment is refused, naming it", "[nccl]") {
  require_gpu();
  ::setenv("NCCL_COMM_BLOCKING", "1", 1);
  const auto e = error_of([] { comm::nccl_communicator c(comm::nccl_unique_id(), 0, 1, 0, 5s); });
  ::unsetenv("NCCL_COMM_BLOCKING");
  INFO(e.what());
  CHECK(e.code() == errc::invalid_argument);
  CHECK(std::string(e.what()).find("NCCL_COMM_BLOCKING") != std::string::npos);
}

TEST_CASE("abort from another thread is safe while the watcher runs", "[nccl]") {
  require_gpu();
  for (int i = 0; i < 5; ++i) {
    comm::nccl_communicator c(comm::nccl_unique_id(), 0, 1, 0, 20s, nullptr,
                              comm::nccl_options{.watch_interval = 100us});
    std::this_thread::sleep_for(20ms);  // the watcher polls a healthy communicator: no false alarm
    CHECK(c.ok());
    std::jthread other([&] { c.abort(); });
    other.join();
    CHECK_FALSE(c.ok());
    CHECK_FALSE(c.last_error().has_value());
  }
}

TEST_CASE("the bootstrap root of an id whose communicator failed is released, not left waiting forever", "[nccl]") {
  require_gpu();
  if (::dlsym(RTLD_DEFAULT, "elastic_nccl_model_live_roots") == nullptr) {
    const char* named = std::getenv("NCCL_SET_THREAD_NAME");
    if (named == nullptr || std::string(named) != "1") {
      elastic::test::skip_test("real NCCL names its root thread only with NCCL_SET_THREAD_NAME=1 (CTest sets it)");
    }
  }
  const int before = bootstrap_roots();
  const std::string id = comm::nccl_unique_id();
  CHECK(bootstrap_roots() == before + 1);
  const auto e = error_of([&] { comm::nccl_communicator c(id, 0, 2, 0, 800ms); });  // rank 1 never comes
  CHECK(e.code() == errc::timeout);
  CHECK(bootstrap_roots() == before + 1);  // NCCL's root still waits for rank 1: it never times out
  comm::detail::release_bootstrap_root(id, 2, 0);
  const auto until = std::chrono::steady_clock::now() + 3s;
  while (bootstrap_roots() != before && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(10ms);
  CHECK(bootstrap_roots() == before);
}

TEST_CASE("a warm-up loads NCCL on a thread of its own beside the round's init, fails quietly on a device that is "
          "not there, and is asked for by ELASTIC_NCCL_WARM_UP=1 alone",
          "[nccl]") {
  require_gpu();
  const auto wait_finished = [](const comm::detail::nccl_warm_up& w) {
    return elastic::test::eventually([&] { return w.finished(); }, 60s);
  };
  {
    comm::detail::nccl_warm_up w(0);
    comm::nccl_communicator c(comm::nccl_unique_id(), 0, 1, 0, 20s);  // the round's, meanwhile
    check_identity(c, ramp<float>(1000));
    CHECK(wait_finished(w));
    CHECK(c.ok());
  }
  {
    comm::detail::nccl_warm_up nowhere(4096);  // its communicator cannot be made: nothing leaves the thread
    CHECK(wait_finished(nowhere));
  }
  ::unsetenv("ELASTIC_NCCL_WARM_UP");
  CHECK_FALSE(comm::detail::nccl_warm_up::enabled());  // off unless asked for
  ::setenv("ELASTIC_NCCL_WARM_UP", "0", 1);
  CHECK_FALSE(comm::detail::nccl_warm_up::enabled());
  ::setenv("ELASTIC_NCCL_WARM_UP", "1", 1);
  CHECK(comm::detail::nccl_warm_up::enabled());
  ::setenv("ELASTIC_NCCL_WARM_UP", "yes", 1);
  const auto e = error_of([] { (void)comm::detail::nccl_warm_up::enabled(); });
  CHECK(e.code() == errc::invalid_argument);
  CHECK(std::string(e.what()).find("ELASTIC_NCCL_WARM_UP") != std::string::npos);
  ::unsetenv("ELASTIC_NCCL_WARM_UP");
}
