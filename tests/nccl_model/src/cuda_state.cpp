// The CUDA runtime model's per-thread state and the calls that need no device: device count and
// selection, error names and strings, the last error, versions. Also the two CUDA contract rules.
#include <pthread.h>

#include <cstdio>
#include <string>

#pragma GCC visibility push(default)
#include <cuda_runtime_api.h>
#pragma GCC visibility pop

#include "contract.hpp"
#include "cuda_model.hpp"

namespace nccl_model::cuda {
namespace {

struct thread_state {
  int device = 0;
  bool device_set = false;
  bool internal = false;
  bool in_host_function = false;
  cudaError_t last_error = cudaSuccess;
};

thread_state& self() noexcept {
  thread_local thread_state s;
  return s;
}

std::string thread_name() {
  char buf[64];
  std::snprintf(buf, sizeof buf, "thread %#lx", static_cast<unsigned long>(::pthread_self()));
  return buf;
}

}  // namespace

int current_device() noexcept { return self().device; }
bool device_was_set() noexcept { return self().device_set; }
void mark_internal_thread() noexcept { self().internal = true; }
void set_in_host_function(bool on) noexcept { self().in_host_function = on; }

int device_count() noexcept {
  static const int n = [] {
    const auto v = env_integer("ELASTIC_NCCL_MODEL_GPUS");
    if (!v) return 1;
    return static_cast<int>(*v < 0 ? 0 : (*v > 64 ? 64 : *v));
  }();
  return n;
}

void enter_api(const char* api, bool context_free) noexcept {
  const thread_state& t = self();
  if (t.in_host_function && contract::enabled(contract::rule::cuda_in_host_function)) {
    contract::violation(contract::rule::cuda_in_host_function, std::string("a CUDA call (") + api +
                        ") from inside a host function", thread_name(),
                        "CUDA forbids any CUDA API call from a cudaLaunchHostFunc callback (CUDA Runtime API, "
                        "cudaLaunchHostFunc: 'Host functions must not make any CUDA API calls')");
  }
  if (!context_free && !t.internal && !t.device_set && contract::enabled(contract::rule::cuda_no_device)) {
    contract::violation(contract::rule::cuda_no_device, std::string("a CUDA call (") + api +
                        ") from a thread that never set its device", thread_name(),
                        "real CUDA would create a context on GPU 0 here: the current device is per thread and "
                        "defaults to 0, so call cudaSetDevice on every thread that uses CUDA");
  }
}

cudaError_t fail(cudaError_t e) noexcept {
  self().last_error = e;
  return e;
}

}  // namespace nccl_model::cuda

namespace cuda = nccl_model::cuda;

extern "C" {

cudaError_t cudaGetDeviceCount(int* count) {
  cuda::enter_api("cudaGetDeviceCount", true);
  if (count == nullptr) return cuda::fail(cudaErrorInvalidValue);
  *count = cuda::device_count();
  return *count == 0 ? cuda::fail(cudaErrorNoDevice) : cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  cuda::enter_api("cudaGetDevice", true);
  if (device == nullptr) return cuda::fail(cudaErrorInvalidValue);
  *device = cuda::self().device;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  cuda::enter_api("cudaSetDevice", true);
  if (cuda::device_count() == 0) return cuda::fail(cudaErrorNoDevice);
  if (device < 0 || device >= cuda::device_count()) return cuda::fail(cudaErrorInvalidDevice);
  cuda::self().device = device;
  cuda::self().device_set = true;
  return cudaSuccess;
}

const char* cudaGetErrorName(cudaError_t error) {
  cuda::enter_api("cudaGetErrorName", true);
  switch (error) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInitializationError: return "cudaErrorInitializationError";
    case cudaErrorCudartUnloading: return "cudaErrorCudartUnloading";
    case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorDevicesUnavailable: return "cudaErrorDevicesUnavailable";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorIllegalState: return "cudaErrorIllegalState";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorContextIsDestroyed: return "cudaErrorContextIsDestroyed";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorNotPermitted: return "cudaErrorNotPermitted";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
    case cudaErrorUnknown: return "cudaErrorUnknown";
  }
  return "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t error) {
  cuda::enter_api("cudaGetErrorString", true);
  switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInitializationError: return "initialization error";
    case cudaErrorCudartUnloading: return "driver shutting down";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorDevicesUnavailable: return "all CUDA-capable devices are busy or unavailable";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorIllegalState: return "the operation cannot be performed in the present state";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorContextIsDestroyed: return "context is destroyed";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorNotPermitted: return "operation not permitted";
    case cudaErrorNotSupported: return "operation not supported";
    case cudaErrorUnknown: return "unknown error";
  }
  return "unrecognized error code";
}

cudaError_t cudaGetLastError(void) {
  cuda::enter_api("cudaGetLastError", true);
  const cudaError_t e = cuda::self().last_error;
  cuda::self().last_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError(void) {
  cuda::enter_api("cudaPeekAtLastError", true);
  return cuda::self().last_error;
}

cudaError_t cudaRuntimeGetVersion(int* runtimeVersion) {
  cuda::enter_api("cudaRuntimeGetVersion", true);
  if (runtimeVersion == nullptr) return cuda::fail(cudaErrorInvalidValue);
  *runtimeVersion = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int* driverVersion) {
  cuda::enter_api("cudaDriverGetVersion", true);
  if (driverVersion == nullptr) return cuda::fail(cudaErrorInvalidValue);
  *driverVersion = CUDART_VERSION;
  return cudaSuccess;
}

}  // extern "C"
