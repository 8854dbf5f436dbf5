/* A MODEL of NCCL 2.30.7's nccl.h, for CPU-only CI (tests/nccl_model/README.md). Not NVIDIA's
 * header and not NCCL: the declarations below have the names, signatures, types, enum values and
 * macros of the real src/nccl.h.in at tag v2.30.7-1, so code built against it builds unchanged
 * against real NCCL. Only the calls the model implements are declared (the p-prefixed profiling
 * aliases, windows, point-to-point and the other collectives are not): using one is a compile
 * error here rather than a surprise at run time. */
#ifndef NCCL_H_
#define NCCL_H_

#include <cuda_runtime.h>

#define NCCL_MAJOR 2
#define NCCL_MINOR 30
#define NCCL_PATCH 7
#define NCCL_SUFFIX ""

#define NCCL_VERSION_CODE 23007
#define NCCL_VERSION(X, Y, Z) (((X) <= 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z) : (X) * 10000 + (Y) * 100 + (Z))

#ifdef __cplusplus
extern "C" {
#endif

#include <limits.h>
#include <stdint.h>

/* Opaque handle to communicator */
typedef struct ncclComm* ncclComm_t;
#define NCCL_COMM_NULL NULL

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

/* Error type */
typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclTimeout = 8,
  ncclNumResults = 9
} ncclResult_t;

#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL
#define NCCL_SPLIT_NOCOLOR -1
#define NCCL_UNDEF_FLOAT -1.0f

/* Internal use only */
#define NCCL_API_MAGIC 0xcafebeef

/* ncclCommShrink flags */
#define NCCL_SHRINK_DEFAULT 0x00 /* shrink the parent communicator */
#define NCCL_SHRINK_ABORT 0x01   /* first terminate ongoing parent operations, then shrink */

/* ncclCommRevoke flags */
#define NCCL_REVOKE_DEFAULT 0x00 /* reserved for future use; must be 0 */

/* Communicator configuration (the v2.30 layout: ncclConfig_v23000). */
typedef struct ncclConfig_v23000 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
  int cgaClusterSize;
  int minCTAs;
  int maxCTAs;
  const char* netName;
  int splitShare;
  int trafficClass;
  const char* commName;
  int collnetEnable;
  int CTAPolicy;
  int shrinkShare;
  int nvlsCTAs;
  int nChannelsPerNetPeer;
  int nvlinkCentricSched;
  int graphUsageMode;
  int numRmaCtx;
  int maxP2pPeers;
  int graphStreamOrdering;
} ncclConfig_t;

/* Config initializer must be assigned to initialize config structure when it is created. */
#define NCCL_CONFIG_INITIALIZER {                  \
  sizeof(ncclConfig_t), /* size */                 \
  NCCL_API_MAGIC, /* magic */                      \
  NCCL_VERSION_CODE, /* version */                 \
  NCCL_CONFIG_UNDEF_INT, /* blocking */            \
  NCCL_CONFIG_UNDEF_INT, /* cgaClusterSize */      \
  NCCL_CONFIG_UNDEF_INT, /* minCTAs */             \
  NCCL_CONFIG_UNDEF_INT, /* maxCTAs */             \
  NCCL_CONFIG_UNDEF_PTR, /* netName */             \
  NCCL_CONFIG_UNDEF_INT, /* splitShare */          \
  NCCL_CONFIG_UNDEF_INT, /* trafficClass */        \
  NCCL_CONFIG_UNDEF_PTR, /* commName */            \
  NCCL_CONFIG_UNDEF_INT, /* collnetEnable */       \
  NCCL_CONFIG_UNDEF_INT, /* CTAPolicy */           \
  NCCL_CONFIG_UNDEF_INT, /* shrinkShare */         \
  NCCL_CONFIG_UNDEF_INT, /* nvlsCTAs */            \
  NCCL_CONFIG_UNDEF_INT, /* nChannelsPerNetPeer */ \
  NCCL_CONFIG_UNDEF_INT, /* nvlinkCentricSched */  \
  NCCL_CONFIG_UNDEF_INT, /* graphUsageMode */      \
  NCCL_CONFIG_UNDEF_INT, /* numRmaCtx */           \
  NCCL_CONFIG_UNDEF_INT, /* maxP2pPeers */         \
  NCCL_CONFIG_UNDEF_INT, /* graphStreamOrdering */ \
}

/* Reduction operation selector */
typedef enum { ncclNumOps_dummy = 5 } ncclRedOp_dummy_t;
typedef enum {
  ncclSum = 0,
  ncclProd = 1,
  ncclMax = 2,
  ncclMin = 3,
  ncclAvg = 4,
  ncclNumOps = 5,
  ncclMaxRedOp = 0x7fffffff >> (32 - 8 * sizeof(ncclRedOp_dummy_t))
} ncclRedOp_t;

/* Data types */
typedef enum {
  ncclInt8 = 0,
  ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclHalf = 6,
  ncclFloat32 = 7,
  ncclFloat = 7,
  ncclFloat64 = 8,
  ncclDouble = 8,
  ncclBfloat16 = 9,
  ncclFloat8e4m3 = 10,
  ncclFloat8e5m2 = 11,
  ncclNumTypes = 12
} ncclDataType_t;

ncclResult_t ncclGetVersion(int* version);
ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId);
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t* config);
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank);
ncclResult_t ncclCommFinalize(ncclComm_t comm);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags);
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config);
ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount, ncclComm_t* newcomm,
                            ncclConfig_t* config, int shrinkFlags);
ncclResult_t ncclCommGetUniqueId(ncclComm_t comm, ncclUniqueId* uniqueId);
ncclResult_t ncclCommGrow(ncclComm_t comm, int nRanks, const ncclUniqueId* uniqueId, int rank, ncclComm_t* newcomm,
                          ncclConfig_t* config);
const char* ncclGetErrorString(ncclResult_t result);
const char* ncclGetLastError(ncclComm_t comm);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError);
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count);
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank);

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream);

ncclResult_t ncclGroupStart();
ncclResult_t ncclGroupEnd();

#ifdef __cplusplus
} /* end extern "C" */
#endif

#endif /* NCCL_H_ */
