/* A MODEL of <cuda_runtime.h> (see cuda_runtime_api.h): the C API plus the C++ conveniences of
 * the real header that take typed pointers. Not NVIDIA's header. */
#ifndef ELASTIC_NCCL_MODEL_CUDA_RUNTIME_H
#define ELASTIC_NCCL_MODEL_CUDA_RUNTIME_H

#include "cuda_runtime_api.h"

#if defined(__cplusplus)
/* As the real cuda_runtime.h: typed overloads and cudaEventCreate/cudaMallocHost with flags. */
static inline cudaError_t cudaEventCreate(cudaEvent_t* event, unsigned int flags) {
  return ::cudaEventCreateWithFlags(event, flags);
}
static inline cudaError_t cudaMallocHost(void** ptr, size_t size, unsigned int flags) {
  return ::cudaHostAlloc(ptr, size, flags);
}
template <class T>
static inline cudaError_t cudaMalloc(T** devPtr, size_t size) {
  return ::cudaMalloc((void**)(void*)devPtr, size);
}
template <class T>
static inline cudaError_t cudaMallocHost(T** ptr, size_t size, unsigned int flags = 0) {
  return ::cudaMallocHost((void**)(void*)ptr, size, flags);
}
template <class T>
static inline cudaError_t cudaHostAlloc(T** ptr, size_t size, unsigned int flags) {
  return ::cudaHostAlloc((void**)(void*)ptr, size, flags);
}
template <class T>
static inline cudaError_t cudaMallocManaged(T** devPtr, size_t size, unsigned int flags = cudaMemAttachGlobal) {
  return ::cudaMallocManaged((void**)(void*)devPtr, size, flags);
}
#endif

#endif /* ELASTIC_NCCL_MODEL_CUDA_RUNTIME_H */
