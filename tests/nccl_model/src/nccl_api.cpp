// The C API of the NCCL model: each entry point enters an api_call (the contract checker), makes
// NCCL's first argument checks in NCCL's order, and calls the operation (operations.hpp).
#include <cstring>
#include <random>

#pragma GCC visibility push(default)
#include <nccl.h>
#include <nccl_model.h>
#pragma GCC visibility pop

#include "bootstrap.hpp"
#include "contract.hpp"
#include "nccl_calls.hpp"
#include "operations.hpp"
#include "settings.hpp"
#include "util.hpp"

using nccl_model::api_call;
using kind = nccl_model::api_call::kind;

namespace {

// CommCheck (src/misc/argcheck.cc): a NULL communicator, or (checker off) a dead one.
bool comm_missing(const api_call& call, const char* opname) {
  if (call.comm()) return false;
  nccl_model::warn(call.bad_handle() ? "Error: corrupted comm object detected"
                                     : nccl_model::strprintf("%s : comm argument is NULL", opname));
  return true;
}

ncclResult_t null_argument(const char* opname, const char* what) {
  nccl_model::warn(nccl_model::strprintf("%s : %s argument is NULL", opname, what));
  return ncclInvalidArgument;
}

// An enum argument as the integer the caller passed: a value outside the enumeration (a bad
// datatype, say) must be checked, not loaded as the enum (undefined behaviour).
template <class E>
int raw(const E& e) {
  static_assert(sizeof(E) == sizeof(int));
  int v = 0;
  std::memcpy(&v, &e, sizeof v);
  return v;
}

ncclResult_t collective(const char* api, ncclComm_t comm, const nccl_model::collective& op, cudaStream_t stream) {
  api_call call(api, comm, kind::plain);
  if (comm_missing(call, api)) return call.done(ncclInvalidArgument);
  return call.done(nccl_model::enqueue_collective(call.comm(), op, stream));
}

}  // namespace

extern "C" {

int elastic_nccl_model_live_roots(void) { return nccl_model::boot::live_roots(); }
int elastic_nccl_model_live_comms(void) { return nccl_model::live_comms(); }

ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return ncclInvalidArgument;
  *version = nccl_model::settings::get().version;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t code) {
  switch (code) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    case ncclTimeout: return "timeout";
    default: return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t comm) {
  api_call call("ncclGetLastError", comm, kind::in_progress_ok, /*tolerate_dead=*/true);
  if (call.comm() && !call.comm()->last_error.empty()) return call.comm()->last_error.get();
  return nccl_model::process_last_error().get();
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  api_call call("ncclGetUniqueId", nullptr, kind::plain);
  if (uniqueId == nullptr) return call.done(null_argument("GetUniqueId", "out"));
  std::uint64_t magic = 0;
  {
    std::random_device rd;  // getRandomData: a fresh communicator magic
    magic = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
  }
  std::string why;
  if (!nccl_model::boot::start_root(magic, nccl_model::boot::id_kind::init, 0, uniqueId, &why)) {
    nccl_model::warn("bootstrap: cannot start the root: " + why);
    return call.done(ncclSystemError);
  }
  return call.done(ncclSuccess);
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t* config) {
  api_call call("ncclCommInitRankConfig", nullptr, kind::plain);
  return call.done(nccl_model::init_rank(comm, nranks, commId, rank, config, false));
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  // Outside a group NCCL runs this init inline (ncclAsyncLaunch at group depth 0): it always blocks.
  api_call call("ncclCommInitRank", nullptr, kind::plain);
  return call.done(nccl_model::init_rank(comm, nranks, commId, rank, nullptr, true));
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  api_call call("ncclCommGetAsyncError", comm, kind::in_progress_ok);
  if (comm_missing(call, "ncclGetAsyncError")) return call.done(ncclInvalidArgument);
  if (asyncError == nullptr) return call.done(null_argument("ncclGetAsyncError", "asyncError"));
  auto& c = *call.comm();
  c.complete_launch();  // held kernels go on their streams now (communicator::defer_launch)
  *asyncError = c.state();
  return call.done(ncclSuccess);
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  api_call call("ncclCommCount", comm, kind::plain);
  if (comm_missing(call, "CommCount")) return call.done(ncclInvalidArgument);
  if (count == nullptr) return call.done(null_argument("CommCount", "count"));
  if (const ncclResult_t r = call.comm()->ensure_ready("ncclCommCount"); r != ncclSuccess) return call.done(r);
  *count = call.comm()->nranks;
  return call.done(ncclSuccess);
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  api_call call("ncclCommCuDevice", comm, kind::plain);
  if (comm_missing(call, "CommCuDevice")) return call.done(ncclInvalidArgument);
  if (device == nullptr) return call.done(null_argument("CommCuDevice", "devid"));
  if (const ncclResult_t r = call.comm()->ensure_ready("ncclCommCuDevice"); r != ncclSuccess) return call.done(r);
  *device = call.comm()->device;
  return call.done(ncclSuccess);
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  api_call call("ncclCommUserRank", comm, kind::plain);
  if (comm_missing(call, "CommUserRank")) return call.done(ncclInvalidArgument);
  if (rank == nullptr) return call.done(null_argument("CommUserRank", "rank"));
  if (const ncclResult_t r = call.comm()->ensure_ready("ncclCommUserRank"); r != ncclSuccess) return call.done(r);
  *rank = call.comm()->rank;
  return call.done(ncclSuccess);
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  api_call call("ncclCommFinalize", comm, kind::plain);
  if (comm == nullptr) return call.done(ncclSuccess);
  if (comm_missing(call, "ncclCommFinalize")) return call.done(ncclInvalidArgument);
  if (call.comm()->revoked.load() && nccl_model::contract::enabled(nccl_model::contract::rule::finalize_after_revoke)) {
    nccl_model::contract::violation(nccl_model::contract::rule::finalize_after_revoke, "ncclCommFinalize after ncclCommRevoke",
                                    nccl_model::this_thread_name() + ", " + call.comm()->describe(),
                                    "nccl.h: 'Calling ncclCommFinalize after revoke is invalid': use ncclCommDestroy "
                                    "or ncclCommAbort once the revoked communicator is quiescent");
  }
  return call.done(nccl_model::finalize(call.comm()));
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  api_call call("ncclCommDestroy", comm, kind::plain);
  if (comm == nullptr) return call.done(ncclSuccess);
  if (comm_missing(call, "ncclCommDestroy")) return call.done(ncclInvalidArgument);
  return call.done(nccl_model::destroy(call.comm()));
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  api_call call("ncclCommAbort", comm, kind::abort);
  if (comm == nullptr) return call.done(ncclSuccess);
  if (comm_missing(call, "ncclCommAbort")) return call.done(ncclInvalidArgument);
  call.comm()->complete_launch();  // ncclCommEnsureReady ends the group job first; the kernels stop at once
  return call.done(nccl_model::abort(call.comm()));
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config) {
  (void)color;
  (void)key;
  (void)config;
  api_call call("ncclCommSplit", comm, kind::plain);
  if (comm_missing(call, "ncclCommSplit")) return call.done(ncclInvalidArgument);
  if (newcomm != nullptr) *newcomm = nullptr;
  call.comm()->warn("ncclCommSplit is not modelled");
  return call.done(ncclInvalidUsage);
}

ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount, ncclComm_t* newcomm,
                            ncclConfig_t* config, int shrinkFlags) {
  api_call call("ncclCommShrink", comm, kind::plain);
  if (comm_missing(call, "ncclCommShrink")) return call.done(ncclInvalidArgument);
  auto& c = *call.comm();
  if ((shrinkFlags & NCCL_SHRINK_ABORT) == 0 && !c.revoked.load() && c.outstanding_kernels() > 0 &&
      nccl_model::contract::enabled(nccl_model::contract::rule::shrink_outstanding)) {
    nccl_model::contract::violation(
        nccl_model::contract::rule::shrink_outstanding,
        nccl_model::strprintf("ncclCommShrink with NCCL_SHRINK_DEFAULT while %d operation(s) of the parent are unfinished",
                              c.outstanding_kernels()),
        nccl_model::this_thread_name() + ", " + c.describe(),
        "NCCL_SHRINK_DEFAULT needs a quiescent parent (nccl.h: NCCL_SHRINK_ABORT 'first terminate ongoing parent "
        "operations'; user guide: no outstanding operations): pass NCCL_SHRINK_ABORT or revoke the parent first");
  }
  return call.done(nccl_model::shrink(call.comm(), excludeRanksList, excludeRanksCount, newcomm, config, shrinkFlags));
}

#if NCCL_MODEL_HAS_REVOKE
ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags) {
  api_call call("ncclCommRevoke", comm, kind::in_progress_ok);
  if (comm == nullptr) return call.done(ncclSuccess);
  if (comm_missing(call, "ncclCommRevoke")) return call.done(ncclInvalidArgument);
  call.comm()->complete_launch();  // as ncclCommEnsureReady in ncclCommRevoke: the launch ends first
  return call.done(nccl_model::revoke(call.comm(), revokeFlags));
}
#endif

#if NCCL_MODEL_HAS_GROW
ncclResult_t ncclCommGetUniqueId(ncclComm_t comm, ncclUniqueId* uniqueId) {
  api_call call("ncclCommGetUniqueId", comm, kind::plain);
  if (comm_missing(call, "ncclCommGetUniqueId")) return call.done(ncclInvalidArgument);
  return call.done(nccl_model::grow_unique_id(call.comm(), uniqueId));
}

ncclResult_t ncclCommGrow(ncclComm_t comm, int nRanks, const ncclUniqueId* uniqueId, int rank, ncclComm_t* newcomm,
                          ncclConfig_t* config) {
  api_call call("ncclCommGrow", comm, kind::plain);
  if (comm != nullptr && comm_missing(call, "ncclCommGrow")) return call.done(ncclInvalidArgument);
  return call.done(nccl_model::grow(call.comm(), nRanks, uniqueId, rank, newcomm, config));
}
#endif

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  return collective("ncclAllReduce", comm,
                    {nccl_model::collective_kind::all_reduce, sendbuff, recvbuff, count, raw(datatype), raw(op), 0}, stream);
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  return collective("ncclBroadcast", comm,
                    {nccl_model::collective_kind::broadcast, sendbuff, recvbuff, count, raw(datatype), ncclSum, root}, stream);
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
  return collective("ncclAllGather", comm,
                    {nccl_model::collective_kind::all_gather, sendbuff, recvbuff, sendcount, raw(datatype), ncclSum, 0},
                    stream);
}

ncclResult_t ncclGroupStart() {
  api_call call("ncclGroupStart", nullptr, kind::plain);
  return call.done(nccl_model::group_start());
}

ncclResult_t ncclGroupEnd() {
  api_call call("ncclGroupEnd", nullptr, kind::plain);
  return call.done(nccl_model::group_end());
}

}  // extern "C"
