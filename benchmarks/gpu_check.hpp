// The GPU benchmarks' first question: is there a device? Without one each row reports the
// reason and measures nothing, so the programs build and run anywhere the toolkit is.
#pragma once

#include <string>

#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

namespace elastic::bench {

/// True if a CUDA device answers; otherwise marks `state` skipped with CUDA's reason.
inline bool have_gpu(benchmark::State& state) {
  int n = 0;
  const cudaError_t rc = cudaGetDeviceCount(&n);
  if (rc != cudaSuccess || n < 1) {
    state.SkipWithError((std::string("no CUDA device: ") +
                         (rc != cudaSuccess ? cudaGetErrorString(rc) : "none visible")).c_str());
    return false;
  }
  return true;
}

}  // namespace elastic::bench
