// The NCCL operations of the model, below the C API (nccl_api.cpp checks the contract and the
// arguments NCCL checks first, then calls these). Each cites the NCCL function it models.
#pragma once

#include <nccl.h>

#include <memory>
#include <string>

#include "communicator.hpp"

namespace nccl_model {

// ---- lifecycle.cpp ----
/// parseCommConfig (src/init.cc): NULL is the default config; ncclInvalidArgument with `*why`.
ncclResult_t parse_config(const ncclConfig_t* in, ncclConfig_t& out, std::string* why);
/// The config's blocking mode after NCCL_COMM_BLOCKING (envConfigOverride).
bool blocking_of(const ncclConfig_t& config);
/// ncclCommInitRankDev: `force_blocking` for ncclCommInitRank, which runs its job inline.
ncclResult_t init_rank(ncclComm_t* out, int nranks, const ncclUniqueId& id, int rank, const ncclConfig_t* config,
                       bool force_blocking);
/// What a call that started a job returns: blocking: waits for the job and returns its result;
/// non-blocking: the state now (ncclInProgress, typically).
ncclResult_t job_result(communicator& c);
ncclResult_t finalize(const std::shared_ptr<communicator>& c);
ncclResult_t destroy(const std::shared_ptr<communicator>& c);
ncclResult_t abort(const std::shared_ptr<communicator>& c);
ncclResult_t revoke(const std::shared_ptr<communicator>& c, int flags);

// ---- shrink.cpp ----
ncclResult_t shrink(const std::shared_ptr<communicator>& parent, int* exclude, int count, ncclComm_t* newcomm,
                    const ncclConfig_t* config, int flags);

// ---- grow.cpp ----
ncclResult_t grow_unique_id(const std::shared_ptr<communicator>& c, ncclUniqueId* id);
ncclResult_t grow(const std::shared_ptr<communicator>& parent, int nranks, const ncclUniqueId* id, int rank,
                  ncclComm_t* newcomm, const ncclConfig_t* config);

// ---- collectives.cpp ----
enum class collective_kind { all_reduce, broadcast, all_gather };
struct collective {
  collective_kind kind = collective_kind::all_reduce;
  const void* send = nullptr;
  void* recv = nullptr;
  std::size_t count = 0;  // elements per rank (all_gather: sendcount)
  int type = ncclFloat32;  // as the caller passed them: not yet known to be valid enum values
  int op = ncclSum;
  int root = 0;
  [[nodiscard]] ncclDataType_t data_type() const { return static_cast<ncclDataType_t>(type); }  // once checked
  [[nodiscard]] ncclRedOp_t red_op() const { return static_cast<ncclRedOp_t>(op); }
};
/// ncclEnqueueCheck + taskAppend (src/enqueue.cc): validates and puts the kernel on `stream`.
ncclResult_t enqueue_collective(const std::shared_ptr<communicator>& c, const collective& op, cudaStream_t stream);
/// ncclGroupStart/End: collectives between them are held and enqueued at the outermost end.
ncclResult_t group_start();
ncclResult_t group_end();

}  // namespace nccl_model
