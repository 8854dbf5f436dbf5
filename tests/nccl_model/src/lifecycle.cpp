// A communicator's life in the NCCL model: config parsing, init, finalize, destroy, abort, revoke
// (src/init.cc at v2.30.7-1 unless a comment says otherwise).
#include <cstring>

#include "bootstrap.hpp"
#include "cuda_model.hpp"
#include "faults.hpp"
#include "operations.hpp"
#include "settings.hpp"
#include "util.hpp"

namespace nccl_model {
namespace {

bool undef_or(int v, int a, int b) { return v == NCCL_CONFIG_UNDEF_INT || v == a || v == b; }

// The init job (ncclCommInitRankFunc): check in at the root, check the peers, build the ring.
void run_init(const std::shared_ptr<communicator>& c, const boot::id_payload& id) {
  const auto started = std::chrono::steady_clock::now();
  const net::stop_fn stop = [c] { return c->must_stop() || c->revoked.load(); };
  std::string why;
  std::vector<boot::peer_info> table;
  ncclResult_t r = ncclSuccess;
  boot::outcome o = boot::check_in(id, c->nranks, c->rank, my_info(*c), table, stop, &why);
  if (o == boot::outcome::ok) {
    r = check_peers(table, c->rank, &why);
    if (r == ncclSuccess) o = boot::connect_ring(c->mailbox, c->magic, c->rank, table, c->to_succ, c->from_pred, stop, &why);
  }
  if (r == ncclSuccess && o == boot::outcome::ok) {
    c->peers = std::move(table);
    hold_init_delay(*c, started);
  }
  if (r == ncclSuccess && (o == boot::outcome::stopped || stop())) {
    r = ncclInternalError;
    why = "ncclCommInitRank: stopped by ncclCommAbort/ncclCommRevoke before it completed";
  } else if (r == ncclSuccess && o == boot::outcome::failed) {
    r = ncclRemoteError;
  }
  if (r != ncclSuccess) {
    c->warn(why);
  } else {
    c->built.store(true);
  }
  c->async.store(r, std::memory_order_release);
}

}  // namespace

ncclResult_t parse_config(const ncclConfig_t* in, ncclConfig_t& out, std::string* why) {
  const ncclConfig_t defaults = NCCL_CONFIG_INITIALIZER;
  out = defaults;
  if (in == nullptr) return ncclSuccess;
  // A config from older headers is shorter: only its own `size` bytes are read.
  std::size_t size = 0;
  std::memcpy(&size, in, sizeof size);
  std::memcpy(static_cast<void*>(&out), in, size < sizeof out ? size : sizeof out);
  if (out.magic != NCCL_API_MAGIC) {
    *why = "ncclConfig_t argument not initialized via NCCL_CONFIG_INITIALIZER";
    return ncclInvalidArgument;
  }
  if (out.version < static_cast<unsigned>(NCCL_VERSION(2, 14, 0))) out.blocking = defaults.blocking;
  if (!undef_or(out.blocking, 0, 1)) {
    *why = strprintf("Invalid config blocking attribute value %d", out.blocking);
    return ncclInvalidArgument;
  }
  if (out.cgaClusterSize != NCCL_CONFIG_UNDEF_INT && out.cgaClusterSize < 0) {
    *why = strprintf("Invalid config cgaClusterSize attribute value %d", out.cgaClusterSize);
    return ncclInvalidArgument;
  }
  // As NCCL's check, including its quirk: minCTAs set without maxCTAs is refused (UNDEF is INT_MIN).
  if ((out.minCTAs != NCCL_CONFIG_UNDEF_INT && out.minCTAs <= 0) ||
      (out.maxCTAs != NCCL_CONFIG_UNDEF_INT && out.maxCTAs <= 0) || out.minCTAs > out.maxCTAs) {
    *why = strprintf("Invalid config min/max channels attribute value %d/%d", out.minCTAs, out.maxCTAs);
    return ncclInvalidArgument;
  }
  if (!undef_or(out.splitShare, 0, 1)) {
    *why = strprintf("Invalid config splitShare attribute value %d", out.splitShare);
    return ncclInvalidArgument;
  }
  if (!undef_or(out.shrinkShare, 0, 1)) {
    *why = strprintf("Invalid config shrinkShare attribute value %d", out.shrinkShare);
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

bool blocking_of(const ncclConfig_t& config) {
  const int env = settings::get().comm_blocking;
  if (env == 0 || env == 1) return env == 1;
  return config.blocking != 0;  // NCCL_CONFIG_DEFAULT: blocking unless set to 0
}

ncclResult_t init_rank(ncclComm_t* out, int nranks, const ncclUniqueId& id, int rank, const ncclConfig_t* config,
                       bool force_blocking) {
  // ncclCommInitRankDev starts with cudaFree(NULL), which makes a context on the current device.
  cuda::enter_api("cudaFree(NULL), which ncclCommInitRank makes first", false);
  if (out == nullptr) {
    warn("CommInitRank : newcomm argument is NULL");
    return ncclInvalidArgument;
  }
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    warn(strprintf("Invalid rank requested : %d/%d", rank, nranks));
    return ncclInvalidArgument;
  }
  auto c = std::make_shared<communicator>();
  std::string why;
  if (const ncclResult_t r = parse_config(config, c->config, &why); r != ncclSuccess) {
    warn(why);
    return r;
  }
  boot::id_payload p;
  if (!boot::decode(id, p) || p.kind != boot::id_kind::init) {
    warn("ncclCommInitRank: the unique id was not made by ncclGetUniqueId (of the NCCL model); a grow id from "
         "ncclCommGetUniqueId goes to ncclCommGrow");
    return ncclInvalidArgument;
  }
  c->rank = rank;
  c->nranks = nranks;
  c->device = cuda::current_device();
  c->blocking = force_blocking || blocking_of(c->config);
  c->magic = p.magic;
  if (!c->mailbox.open(&why)) {
    warn("ncclCommInitRank: " + why);
    return ncclSystemError;
  }
  *out = register_comm(c);
  c->start_job([c, p] { run_init(c, p); });
  return job_result(*c);
}

ncclResult_t job_result(communicator& c) {
  if (c.blocking) c.wait_job();
  return c.state();
}

ncclResult_t finalize(const std::shared_ptr<communicator>& c) {
  if (const ncclResult_t r = c->ensure_ready("ncclCommFinalize"); r != ncclSuccess) return r;
  if (c->finalize_called) {
    c->warn("ncclCommFinalize: the communicator was finalized already");
    return ncclInvalidArgument;
  }
  c->finalize_called = true;
  c->async.store(ncclInProgress, std::memory_order_release);
  // commDestroySync: the communicator's work drains, then it is quiescent.
  c->start_job([c] {
    if (c->wait_kernels_drained([&] { return c->must_stop(); })) c->async.store(ncclSuccess, std::memory_order_release);
  });
  return job_result(*c);
}

ncclResult_t destroy(const std::shared_ptr<communicator>& c) {
  // ncclCommDestroy: NCCLCHECK(ncclCommEnsureReady(comm)): a communicator with an error is not
  // destroyed (the caller must abort it).
  if (const ncclResult_t r = c->ensure_ready("ncclCommDestroy"); r != ncclSuccess) return r;
  // commReclaim -> commDestroySync for a communicator that was not finalized: waits for its work,
  // however long that takes (behind a kernel that never ends: for ever, as NCCL).
  if (!c->finalize_called) c->wait_kernels_drained([] { return false; });
  c->wait_job();
  c->close_transport();
  retire_comm(c->handle);
  return ncclSuccess;
}

ncclResult_t abort(const std::shared_ptr<communicator>& c) {
  // setCommAbortFlags: kernels and jobs (a child being built included) stop within a millisecond.
  c->aborted.store(true, std::memory_order_release);
  c->wait_job();
  c->cancel_kernels();  // waits for a running kernel to notice
  // NCCL < 2.28 frees the communicator's device buffers with cudaFree (src/include/alloc.h
  // ncclCudaFree), which synchronises the device: behind another communicator's stuck kernel on
  // the same GPU, abort never returns.
  if (frees_with_device_sync()) cuda::synchronize_device(c->device);
  c->close_transport();
  retire_comm(c->handle);
  return ncclSuccess;
}

ncclResult_t revoke(const std::shared_ptr<communicator>& c, int flags) {
  if (flags != NCCL_REVOKE_DEFAULT) {
    c->warn(strprintf("ncclCommRevoke: revokeFlags %d: only NCCL_REVOKE_DEFAULT (0) is supported", flags));
    return ncclInvalidArgument;
  }
  if (faults::get().fail_revoke) {
    c->warn("ncclCommRevoke: injected failure (ELASTIC_NCCL_MODEL_FAIL_REVOKE)");
    return ncclInternalError;
  }
  if (c->finalize_called || c->revoked.load()) {
    c->warn(c->revoked.load() ? "ncclCommRevoke: the communicator was revoked already"
                              : "ncclCommRevoke: the communicator is being finalized or destroyed");
    return ncclInvalidArgument;
  }
  // setCommAbortFlags(comm, 1); revokedFlag = 1; finalizeCalled = true; then commRevokeAsync waits
  // for the communicator's work and turns the state back to ncclSuccess (if it was ever built).
  c->revoked.store(true, std::memory_order_release);
  c->finalize_called = true;
  c->async.store(ncclInProgress, std::memory_order_release);
  c->start_job([c] {
    if (!c->wait_kernels_drained([&] { return c->must_stop(); })) return;
    if (c->built.load()) c->async.store(ncclSuccess, std::memory_order_release);
  });
  return job_result(*c);
}

}  // namespace nccl_model
