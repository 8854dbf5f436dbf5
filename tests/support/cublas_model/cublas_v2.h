// A stand-in for the few cuBLAS calls examples/cuda_train.cpp makes, for builds against the NCCL
// model (tests/nccl_model), which has no cuBLAS: the same names, types and values as the real
// <cublas_v2.h> (CUDA 13.0), computed on the host through the model's public CUDA calls (each call
// waits for its stream, copies its operands out, computes, copies the result back). Slow, exact
// and in one fixed order, which is all the GPU demo's dry run asks. Not cuBLAS.
#ifndef ELASTIC_TESTS_CUBLAS_MODEL_CUBLAS_V2_H
#define ELASTIC_TESTS_CUBLAS_MODEL_CUBLAS_V2_H

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_ALLOC_FAILED = 3,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_EXECUTION_FAILED = 13,
} cublasStatus_t;

typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;

struct cublasContext;
typedef struct cublasContext* cublasHandle_t;

cublasStatus_t cublasCreate(cublasHandle_t* handle);
cublasStatus_t cublasDestroy(cublasHandle_t handle);
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream);
cublasStatus_t cublasScopy(cublasHandle_t handle, int n, const float* x, int incx, float* y, int incy);
cublasStatus_t cublasSaxpy(cublasHandle_t handle, int n, const float* alpha, const float* x, int incx, float* y,
                           int incy);
cublasStatus_t cublasSnrm2(cublasHandle_t handle, int n, const float* x, int incx, float* result);
cublasStatus_t cublasSgemv(cublasHandle_t handle, cublasOperation_t trans, int m, int n, const float* alpha,
                           const float* A, int lda, const float* x, int incx, const float* beta, float* y, int incy);

#ifdef __cplusplus
}
#endif

#endif  // ELASTIC_TESTS_CUBLAS_MODEL_CUBLAS_V2_H
