// Scenarios for the CUDA runtime model: stream ordering, events, memory (run with
// ELASTIC_NCCL_MODEL_GPUS=3). Host functions stand in for kernels: they may touch host memory,
// never call CUDA.
#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "probe.hpp"

namespace probe {
namespace {

using clock = std::chrono::steady_clock;

void expect(const char* what, long long got, long long want) {
  if (got == want) {
    say("ok %s", what);
  } else {
    say("bad %s: got %lld, want %lld", what, got, want);
  }
}

// A host function that waits (bounded) until `open` is set, then marks `done`.
struct gate {
  std::atomic<bool> open{false};
  std::atomic<bool> done{false};
  static void run(void* p) {
    auto* g = static_cast<gate*>(p);
    const auto until = clock::now() + 5s;
    while (!g->open && clock::now() < until) std::this_thread::sleep_for(1ms);
    g->done = true;
  }
};

// A host function that records whether `watched` was done when it ran.
struct probe_point {
  const gate* watched = nullptr;
  std::atomic<int> saw{-1};
  static void run(void* p) {
    auto* q = static_cast<probe_point*>(p);
    q->saw = q->watched->done ? 1 : 0;
  }
};

cudaStream_t make_stream(unsigned flags) {
  cudaStream_t s = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&s, flags), "cudaStreamCreateWithFlags");
  return s;
}

void legacy_ordering() {
  cudaStream_t blocking = make_stream(cudaStreamDefault);
  cudaStream_t independent = make_stream(cudaStreamNonBlocking);
  {  // the legacy stream waits for a blocking stream's earlier work
    gate g;
    probe_point q;
    q.watched = &g;
    cudaLaunchHostFunc(blocking, gate::run, &g);
    cudaLaunchHostFunc(nullptr, probe_point::run, &q);
    g.open = true;
    cudaStreamSynchronize(nullptr);
    expect("the legacy stream waits for a blocking stream", q.saw, 1);
  }
  {  // a blocking stream waits for the legacy stream's earlier work; a non-blocking one does not
    // (a copy, not a host function, on the non-blocking stream: CUDA may run the host functions of
    // all streams on one thread, one after the other, and real CUDA does)
    void* d = nullptr;
    check_cuda(cudaMalloc(&d, 64), "cudaMalloc");
    gate g;
    probe_point on_blocking;
    on_blocking.watched = &g;
    cudaLaunchHostFunc(cudaStreamLegacy, gate::run, &g);
    cudaMemsetAsync(d, 1, 64, independent);
    cudaLaunchHostFunc(blocking, probe_point::run, &on_blocking);
    expect("a non-blocking stream does not wait for the legacy stream", wait_stream(independent, 2s) ? 1 : 0, 1);
    expect("while the legacy stream is busy, a blocking stream waits", cudaStreamQuery(blocking), cudaErrorNotReady);
    g.open = true;
    cudaStreamSynchronize(blocking);
    expect("the blocking stream ran after the legacy stream", on_blocking.saw, 1);
    cudaFree(d);
  }
  cudaStreamDestroy(blocking);
  cudaStreamDestroy(independent);
}

void events() {
  cudaStream_t s1 = make_stream(cudaStreamNonBlocking);
  cudaStream_t s2 = make_stream(cudaStreamNonBlocking);
  cudaStream_t s3 = make_stream(cudaStreamNonBlocking);
  cudaEvent_t e = nullptr;
  check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  expect("an event never recorded is complete", cudaEventQuery(e), cudaSuccess);
  gate g;
  cudaLaunchHostFunc(s1, gate::run, &g);
  cudaEventRecord(e, s1);
  expect("an event behind unfinished work is not ready", cudaEventQuery(e), cudaErrorNotReady);
  cudaStreamWaitEvent(s2, e, 0);
  cudaEventRecord(e, s3);  // a later record does not change the wait already enqueued
  expect("the event now marks the idle stream", cudaEventQuery(e), cudaSuccess);
  expect("the waiting stream still waits for what the event captured", cudaStreamQuery(s2), cudaErrorNotReady);
  g.open = true;
  cudaEventRecord(e, s1);
  check_cuda(cudaEventSynchronize(e), "cudaEventSynchronize");
  expect("the waiting stream goes on", wait_stream(s2, 2s) ? 1 : 0, 1);
  cudaEventDestroy(e);
  for (cudaStream_t s : {s1, s2, s3}) cudaStreamDestroy(s);
}

void stream_destroy_drains() {
  if (elastic_nccl_model_live_streams() < 0) return;  // real CUDA (check_real_nccl.py): nothing to count
  // The streams destroyed above end on their own once drained: let them, so the count is stable.
  const auto settle = clock::now() + 5s;
  while (elastic_nccl_model_live_streams() > 1 && clock::now() < settle) std::this_thread::sleep_for(1ms);
  const int before = elastic_nccl_model_live_streams();
  expect("only the legacy stream is left", before, 1);
  cudaStream_t s = make_stream(cudaStreamNonBlocking);
  gate g;
  cudaLaunchHostFunc(s, gate::run, &g);
  const auto t0 = clock::now();
  expect("cudaStreamDestroy returns at once", cudaStreamDestroy(s), cudaSuccess);
  expect("...without waiting for the work", clock::now() - t0 < 500ms ? 1 : 0, 1);
  expect("the destroyed stream still works off its queue", elastic_nccl_model_live_streams(), before + 1);
  g.open = true;
  const auto until = clock::now() + 5s;
  while (elastic_nccl_model_live_streams() > before && clock::now() < until) std::this_thread::sleep_for(1ms);
  expect("then its worker ends", elastic_nccl_model_live_streams(), before);
  expect("and the work was done", g.done ? 1 : 0, 1);
}

void memory() {
  int n = 0;
  cudaGetDeviceCount(&n);
  expect("cudaGetDeviceCount follows ELASTIC_NCCL_MODEL_GPUS", n, 3);
  expect("cudaSetDevice beyond the count", cudaSetDevice(3), cudaErrorInvalidDevice);
  expect("cudaGetLastError reports it once", cudaGetLastError(), cudaErrorInvalidDevice);
  expect("and then no more", cudaGetLastError(), cudaSuccess);
  void* d = nullptr;
  check_cuda(cudaMalloc(&d, 256), "cudaMalloc");
  expect("device memory is 256-byte aligned", reinterpret_cast<std::uintptr_t>(d) % 256, 0);
  std::vector<unsigned char> host(256, 0);
  check_cuda(cudaMemcpy(host.data(), d, 256, cudaMemcpyDeviceToHost), "cudaMemcpy");
  expect("fresh device memory is not zeroed", host[0], 0xa5);
  check_cuda(cudaMemset(d, 7, 256), "cudaMemset");
  check_cuda(cudaMemcpy(host.data(), d, 256, cudaMemcpyDefault), "cudaMemcpy");
  expect("cudaMemset then a copy back", host[255], 7);
  expect("HostToDevice into host memory", cudaMemcpy(host.data(), host.data(), 4, cudaMemcpyHostToDevice),
         cudaErrorInvalidValue);
  expect("DeviceToHost from host memory", cudaMemcpy(host.data(), host.data(), 4, cudaMemcpyDeviceToHost),
         cudaErrorInvalidValue);
  expect("a copy past the allocation", cudaMemcpy(host.data(), d, 257, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
  expect("an unknown direction", cudaMemcpy(host.data(), d, 4, static_cast<cudaMemcpyKind>(7)),
         cudaErrorInvalidMemcpyDirection);
  void* pinned = nullptr;
  check_cuda(cudaMallocHost(&pinned, 64), "cudaMallocHost");
  cudaPointerAttributes attr{};
  cudaPointerGetAttributes(&attr, d);
  expect("attributes of device memory", attr.type * 10 + attr.device, cudaMemoryTypeDevice * 10);
  cudaPointerGetAttributes(&attr, pinned);
  expect("attributes of pinned memory", attr.type, cudaMemoryTypeHost);
  cudaPointerGetAttributes(&attr, host.data());
  expect("attributes of pageable memory", attr.type, cudaMemoryTypeUnregistered);
  expect("cudaFreeHost of device memory", cudaFreeHost(d), cudaErrorInvalidValue);
  expect("cudaFree of pinned memory", cudaFree(pinned), cudaErrorInvalidValue);
  expect("cudaFree", cudaFree(d), cudaSuccess);
  expect("cudaFree twice", cudaFree(d), cudaErrorInvalidValue);
  expect("cudaFree(NULL)", cudaFree(nullptr), cudaSuccess);
  expect("cudaFreeHost", cudaFreeHost(pinned), cudaSuccess);
}

int semantics() {
  check_cuda(cudaSetDevice(0), "cudaSetDevice");
  legacy_ordering();
  events();
  stream_destroy_drains();
  memory();
  say("done");
  return 0;
}

// Device memory is not host memory: dereferencing it on the host faults.
int device_dereference() {
  check_cuda(cudaSetDevice(0), "cudaSetDevice");
  void* d = nullptr;
  check_cuda(cudaMalloc(&d, 64), "cudaMalloc");
  say("dereferencing");
  const int v = *static_cast<volatile int*>(d);
  say("reached %d", v);
  return 0;
}

}  // namespace

int run_cuda(const std::string& scenario, const args&) {
  if (scenario == "cuda-semantics") return semantics();
  if (scenario == "device-dereference") return device_dereference();
  return -1;
}

}  // namespace probe
