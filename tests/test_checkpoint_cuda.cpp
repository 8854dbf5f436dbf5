// Device snapshots on a real GPU: built wherever the CUDA toolkit is, run where a GPU is
// (label "gpu"). The copy runs on the engine's side stream; the fence is queued on ours.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <numeric>
#include <vector>

#include <elastic/checkpoint.hpp>

#include "support/catch.hpp"
#include "support/process.hpp"

namespace ck = elastic::checkpoint;

namespace {
void ok(cudaError_t rc) { REQUIRE(rc == cudaSuccess); }

struct device_buffer {
  float* p = nullptr;
  std::size_t n;
  explicit device_buffer(std::size_t count) : n(count) { ok(cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(float))); }
  ~device_buffer() { cudaFree(p); }
  std::vector<float> read() const {
    std::vector<float> h(n);
    ok(cudaMemcpy(h.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost));
    return h;
  }
};
}  // namespace

TEST_CASE("a device buffer is snapshotted behind the fence and restored bit for bit", "[gpu]") {
  elastic::test::temp_dir tmp;
  const std::size_t n = 16u << 20;  // 64 MiB
  std::vector<float> truth(n);
  std::iota(truth.begin(), truth.end(), 1.0f);
  device_buffer w(n);
  ok(cudaMemcpy(w.p, truth.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  std::vector<float> host_m(1000, 2.0f);
  cudaStream_t stream;
  ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  ck::state st;
  st.add("w", elastic::device_span(w.p, n)).add("m", host_m);
  {
    ck::checkpointer c(st, {.dir = tmp.file("ckpt"), .events = elastic::event_log()});
    c.snapshot(1, {}, stream);
    c.before_update(stream);
    // The "optimizer update", queued after the fence on the same stream.
    ok(cudaMemsetAsync(w.p, 0, n * sizeof(float), stream));
    host_m.assign(1000, 0.0f);
    c.wait_durable();
  }
  ok(cudaStreamSynchronize(stream));
  CHECK(w.read() == std::vector<float>(n, 0.0f));
  ck::checkpointer c(st, {.dir = tmp.file("ckpt"), .events = elastic::event_log()});
  REQUIRE(c.restore()->step == 1);
  CHECK(w.read() == truth);
  CHECK(host_m == std::vector<float>(1000, 2.0f));
  cudaStreamDestroy(stream);
}
