// Prints the values the NCCL and CUDA headers give to every name the model declares: built once
// against the model's headers and once against the real ones (where the toolkit has them), the two
// outputs must be identical (test "nccl_model.headers declare the real values").
#include <cstddef>
#include <cstdio>

#include <cuda_runtime_api.h>
#include <nccl.h>

#define P(x) std::printf(#x " %lld\n", static_cast<long long>(x));

int main() {
  P(ncclSuccess) P(ncclUnhandledCudaError) P(ncclSystemError) P(ncclInternalError) P(ncclInvalidArgument)
  P(ncclInvalidUsage) P(ncclRemoteError) P(ncclInProgress)
  P(ncclInt8) P(ncclChar) P(ncclUint8) P(ncclInt32) P(ncclInt) P(ncclUint32) P(ncclInt64) P(ncclUint64)
  P(ncclFloat16) P(ncclHalf) P(ncclFloat32) P(ncclFloat) P(ncclFloat64) P(ncclDouble) P(ncclBfloat16)
  P(ncclFloat8e4m3) P(ncclFloat8e5m2) P(ncclNumTypes)
  P(ncclSum) P(ncclProd) P(ncclMax) P(ncclMin) P(ncclAvg) P(ncclNumOps) P(ncclMaxRedOp) P(sizeof(ncclRedOp_t))
  P(NCCL_UNIQUE_ID_BYTES) P(sizeof(ncclUniqueId)) P(NCCL_CONFIG_UNDEF_INT) P(NCCL_SPLIT_NOCOLOR)
  P(NCCL_SHRINK_DEFAULT) P(NCCL_SHRINK_ABORT) P(NCCL_REVOKE_DEFAULT) P(NCCL_VERSION(2, 8, 4)) P(NCCL_VERSION(2, 30, 7))
  P(offsetof(ncclConfig_t, magic)) P(offsetof(ncclConfig_t, version)) P(offsetof(ncclConfig_t, blocking))
  P(offsetof(ncclConfig_t, netName)) P(offsetof(ncclConfig_t, splitShare)) P(offsetof(ncclConfig_t, shrinkShare))
  P(cudaSuccess) P(cudaErrorInvalidValue) P(cudaErrorMemoryAllocation) P(cudaErrorInitializationError)
  P(cudaErrorCudartUnloading) P(cudaErrorInvalidDevicePointer) P(cudaErrorInvalidMemcpyDirection)
  P(cudaErrorDevicesUnavailable) P(cudaErrorNoDevice) P(cudaErrorInvalidDevice) P(cudaErrorInvalidResourceHandle)
  P(cudaErrorIllegalState) P(cudaErrorNotReady) P(cudaErrorIllegalAddress) P(cudaErrorContextIsDestroyed)
  P(cudaErrorLaunchFailure) P(cudaErrorNotPermitted) P(cudaErrorNotSupported) P(cudaErrorUnknown)
  P(cudaMemcpyHostToHost) P(cudaMemcpyHostToDevice) P(cudaMemcpyDeviceToHost) P(cudaMemcpyDeviceToDevice)
  P(cudaMemcpyDefault) P(cudaMemoryTypeUnregistered) P(cudaMemoryTypeHost) P(cudaMemoryTypeDevice)
  P(cudaMemoryTypeManaged) P(sizeof(cudaPointerAttributes)) P(offsetof(cudaPointerAttributes, hostPointer))
  P(cudaStreamDefault) P(cudaStreamNonBlocking) P(reinterpret_cast<std::size_t>(cudaStreamLegacy))
  P(reinterpret_cast<std::size_t>(cudaStreamPerThread)) P(cudaEventDefault) P(cudaEventBlockingSync)
  P(cudaEventDisableTiming) P(cudaEventInterprocess) P(cudaHostAllocDefault) P(cudaHostAllocPortable)
  P(cudaHostAllocMapped) P(cudaHostAllocWriteCombined) P(cudaMemAttachGlobal) P(cudaMemAttachHost)
  P(cudaCpuDeviceId) P(cudaInvalidDeviceId) P(CUDART_VERSION)
  return 0;
}
