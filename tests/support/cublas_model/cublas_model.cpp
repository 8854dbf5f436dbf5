// The host-side stand-in for cuBLAS declared in cublas_v2.h beside this file (see there).
#include "cublas_v2.h"

#include <cmath>
#include <cstddef>
#include <vector>

struct cublasContext {
  cudaStream_t stream = nullptr;
};

namespace {

// Strided vectors only as unit strides: all cuda_train uses; anything else is refused, not guessed.
bool unit(int inc) { return inc == 1; }

// Waits for the handle's stream (what a kernel on it would come after), then copies `n` floats.
bool fetch(cublasHandle_t h, const float* device, std::size_t n, std::vector<float>& host) {
  host.resize(n);
  if (cudaStreamSynchronize(h->stream) != cudaSuccess) return false;
  return n == 0 || cudaMemcpy(host.data(), device, n * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess;
}
bool store(float* device, const std::vector<float>& host) {
  return host.empty() ||
         cudaMemcpy(device, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess;
}

}  // namespace

extern "C" {

cublasStatus_t cublasCreate(cublasHandle_t* handle) {
  if (handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *handle = new cublasContext;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t handle) {
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasScopy(cublasHandle_t h, int n, const float* x, int incx, float* y, int incy) {
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (n < 0 || !unit(incx) || !unit(incy)) return CUBLAS_STATUS_INVALID_VALUE;
  std::vector<float> v;
  return fetch(h, x, static_cast<std::size_t>(n), v) && store(y, v) ? CUBLAS_STATUS_SUCCESS
                                                                     : CUBLAS_STATUS_EXECUTION_FAILED;
}

cublasStatus_t cublasSaxpy(cublasHandle_t h, int n, const float* alpha, const float* x, int incx, float* y, int incy) {
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (n < 0 || alpha == nullptr || !unit(incx) || !unit(incy)) return CUBLAS_STATUS_INVALID_VALUE;
  std::vector<float> vx, vy;
  if (!fetch(h, x, static_cast<std::size_t>(n), vx) || !fetch(h, y, static_cast<std::size_t>(n), vy)) {
    return CUBLAS_STATUS_EXECUTION_FAILED;
  }
  for (std::size_t i = 0; i < vy.size(); ++i) vy[i] += *alpha * vx[i];
  return store(y, vy) ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

cublasStatus_t cublasSnrm2(cublasHandle_t h, int n, const float* x, int incx, float* result) {
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (n < 0 || result == nullptr || !unit(incx)) return CUBLAS_STATUS_INVALID_VALUE;
  std::vector<float> v;
  if (!fetch(h, x, static_cast<std::size_t>(n), v)) return CUBLAS_STATUS_EXECUTION_FAILED;
  double sum = 0;
  for (float f : v) sum += static_cast<double>(f) * f;
  *result = static_cast<float>(std::sqrt(sum));
  return CUBLAS_STATUS_SUCCESS;
}

// y = alpha op(A) x + beta y, A column-major m x n with leading dimension lda.
cublasStatus_t cublasSgemv(cublasHandle_t h, cublasOperation_t trans, int m, int n, const float* alpha, const float* A,
                           int lda, const float* x, int incx, const float* beta, float* y, int incy) {
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (m < 0 || n < 0 || lda < m || lda < 1 || alpha == nullptr || beta == nullptr || !unit(incx) || !unit(incy)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  const auto rows = static_cast<std::size_t>(m), cols = static_cast<std::size_t>(n), ld = static_cast<std::size_t>(lda);
  const std::size_t xn = trans == CUBLAS_OP_N ? cols : rows, yn = trans == CUBLAS_OP_N ? rows : cols;
  std::vector<float> a, vx, vy;
  if (!fetch(h, A, cols == 0 ? 0 : ld * (cols - 1) + rows, a) || !fetch(h, x, xn, vx) || !fetch(h, y, yn, vy)) {
    return CUBLAS_STATUS_EXECUTION_FAILED;
  }
  for (std::size_t i = 0; i < yn; ++i) {
    float dot = 0;
    for (std::size_t k = 0; k < xn; ++k) dot += (trans == CUBLAS_OP_N ? a[k * ld + i] : a[i * ld + k]) * vx[k];
    // cuBLAS reads y only when beta is not 0 (fresh device memory may hold anything).
    vy[i] = *alpha * dot + (*beta == 0.0f ? 0.0f : *beta * vy[i]);
  }
  return store(y, vy) ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

}  // extern "C"
