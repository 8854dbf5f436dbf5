// ncclCommShrink in the NCCL model (src/init.cc ncclCommShrink, ncclCommInitChildComm,
// ncclCommInitRankFunc, getParentRanks at v2.30.7-1).
//
// The survivors build the child's ring over the PARENT's listeners (the parent's data ring may be
// broken by the very failure the shrink recovers from): each connects to its next survivor's
// parent listener with a hello that carries its exclude list, and accepts its previous survivor's.
// A survivor whose list differs is refused, and both sides fail. Then the child's peer table goes
// around the new ring. While this runs the PARENT is ncclInProgress and the caller's *newcomm is
// NULL; the job stores the child into *newcomm from its own thread, later, and only then sets the
// parent back to ncclSuccess.
#include <algorithm>

#include "cuda_model.hpp"
#include "faults.hpp"
#include "operations.hpp"
#include "util.hpp"

namespace nccl_model {
namespace {

std::string list_text(const std::vector<int>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

struct shrink_plan {
  std::vector<int> excluded;   // sorted parent ranks
  std::vector<int> survivors;  // parent ranks, in order: the child's ranks
  ncclComm_t* newcomm = nullptr;
  bool parent_was_revoked = false;
};

// The handshake with the ring neighbours; on failure `*why` and the result say what went wrong.
ncclResult_t join_child_ring(communicator& parent, communicator& child, const shrink_plan& plan,
                             const net::stop_fn& stop, std::string* why) {
  const int n = static_cast<int>(plan.survivors.size());
  const int me = child.rank;
  const int succ = plan.survivors[static_cast<std::size_t>((me + 1) % n)];
  const int pred = plan.survivors[static_cast<std::size_t>((me + n - 1) % n)];
  const std::vector<std::int32_t> mine(plan.excluded.begin(), plan.excluded.end());
  boot::outcome o = boot::send_hello(parent.peers[static_cast<std::size_t>(succ)].listen_port, boot::hello_kind::shrink,
                                     child.magic, parent.rank, mine, child.to_succ, stop, why);
  if (o != boot::outcome::ok) return o == boot::outcome::stopped ? ncclInternalError : ncclRemoteError;
  boot::hello h;
  std::vector<std::int32_t> theirs;
  o = parent.mailbox.accept([&](const boot::hello& x) { return x.kind == boot::hello_kind::shrink && x.magic == child.magic; },
                            child.from_pred, h, theirs, stop);
  if (o != boot::outcome::ok) return o == boot::outcome::stopped ? ncclInternalError : ncclRemoteError;
  const bool same = theirs == mine && h.from_rank == pred;
  const char verdict = same ? 1 : 0;
  (void)net::send_all(child.from_pred.get(), &verdict, 1, stop);
  if (!same) {
    *why = strprintf("ncclCommShrink: rank %d excluded %s but rank %d excluded %s: every surviving rank must pass the "
                     "same excludeRanksList",
                     h.from_rank, list_text(std::vector<int>(theirs.begin(), theirs.end())).c_str(), parent.rank,
                     list_text(plan.excluded).c_str());
    return ncclInvalidUsage;
  }
  char answer = 0;
  if (net::recv_all(child.to_succ.get(), &answer, 1, stop) != net::io::ok) {
    *why = strprintf("ncclCommShrink: rank %d went away during the shrink handshake", succ);
    return stop() ? ncclInternalError : ncclRemoteError;
  }
  if (answer != 1) {
    *why = strprintf("ncclCommShrink: rank %d refused this rank's excludeRanksList %s: every surviving rank must pass "
                     "the same list", succ, list_text(plan.excluded).c_str());
    return ncclInvalidUsage;
  }
  return ncclSuccess;
}

ncclResult_t build_child(communicator& parent, communicator& child, const shrink_plan& plan, const net::stop_fn& stop,
                         std::string* why) {
  const int n = static_cast<int>(plan.survivors.size());
  std::vector<boot::peer_info> table(static_cast<std::size_t>(n));
  table[static_cast<std::size_t>(child.rank)] = my_info(child);
  if (n > 1) {
    if (const ncclResult_t r = join_child_ring(parent, child, plan, stop, why); r != ncclSuccess) return r;
    if (boot::ring_allgather(table, child.rank, child.to_succ.get(), child.from_pred.get(), stop, why) !=
        boot::outcome::ok) {
      return stop() ? ncclInternalError : ncclRemoteError;
    }
  }
  child.peers = std::move(table);
  return ncclSuccess;
}

void publish(ncclComm_t* slot, ncclComm_t value) {
  // COMPILER_ATOMIC_STORE(job->newcomm, comm): into the caller's variable, from this thread.
  __atomic_store_n(slot, value, __ATOMIC_RELEASE);
}

void run_shrink(const std::shared_ptr<communicator>& parent, const std::shared_ptr<communicator>& child,
                const shrink_plan& plan) {
  const auto started = std::chrono::steady_clock::now();
  const net::stop_fn stop = [&] { return child->must_stop() || (!plan.parent_was_revoked && parent->revoked.load()); };
  std::string why;
  ncclResult_t r = ncclSuccess;
  const auto injected = faults::get().fail_shrink;
  if (injected != faults::shrink_failure::none) {
    hold_init_delay(*child, started);
    why = "ncclCommShrink: injected failure (ELASTIC_NCCL_MODEL_FAIL_SHRINK)";
    r = ncclSystemError;
  } else {
    r = build_child(*parent, *child, plan, stop, &why);
    if (r == ncclSuccess) hold_init_delay(*child, started);
    if (r == ncclSuccess && stop()) r = ncclInternalError, why = "ncclCommShrink: stopped before it completed";
  }
  if (r == ncclSuccess) {
    child->built.store(true);
    child->async.store(ncclSuccess, std::memory_order_release);
    publish(plan.newcomm, child->handle);
    parent->async.store(ncclSuccess, std::memory_order_release);
    return;
  }
  child->warn(why);
  child->async.store(r, std::memory_order_release);
  if (stop() || injected == faults::shrink_failure::publish) {
    // Stopped by the parent's abort or revoke, or as NCCL on any failure: the half-made child goes
    // into *newcomm all the same (ncclCommInitRankFunc, label exit); the caller must abort it.
    publish(plan.newcomm, child->handle);
  } else {
    child->close_transport();
    retire_comm(child->handle);
  }
  if (injected != faults::shrink_failure::none) {
    parent->set_proxy_error(ncclSystemError, why);
    parent->async.store(ncclSuccess, std::memory_order_release);
  } else if (!parent->must_stop()) {
    parent->warn(why);
    parent->async.store(r, std::memory_order_release);
  }
}

// ncclCommInitChildComm's checks of the exclude list (it sorts the caller's array in place).
ncclResult_t check_exclusions(communicator& parent, int* exclude, int count, std::vector<int>& out) {
  if (exclude == nullptr) {
    parent.warn("ncclCommShrink : excludeRanksList argument is NULL");
    return ncclInvalidArgument;
  }
  if (count <= 0) {
    parent.warn(strprintf("ncclCommShrink: excludeRanksCount is %d: an empty exclude list is rejected (it must be > 0)",
                          count));
    return ncclInvalidArgument;
  }
  std::sort(exclude, exclude + count);
  if (std::binary_search(exclude, exclude + count, parent.rank)) {
    parent.warn(strprintf("ncclCommShrink: rank %d is in excludeRanksList: an excluded rank must not call ncclCommShrink",
                          parent.rank));
    return ncclInvalidArgument;
  }
  out.assign(exclude, exclude + count);
  for (std::size_t i = 0; i < out.size(); ++i) {
    // NCCL does not check these; it would size the child wrongly (nranks - excludeRanksCount).
    if (out[i] < 0 || out[i] >= parent.nranks || (i > 0 && out[i] == out[i - 1])) {
      parent.warn(strprintf("ncclCommShrink: excludeRanksList %s holds rank %d %s (the model refuses what NCCL would "
                            "turn into a child of the wrong size)",
                            list_text(out).c_str(), out[i], out[i] < 0 || out[i] >= parent.nranks ? "out of range" : "twice"));
      return ncclInvalidArgument;
    }
  }
  return ncclSuccess;
}

}  // namespace

ncclResult_t shrink(const std::shared_ptr<communicator>& parent, int* exclude, int count, ncclComm_t* newcomm,
                    const ncclConfig_t* config, int flags) {
  // ncclCommShrink: NCCL_SHRINK_ABORT first stops the parent's operations in flight.
  if ((flags & NCCL_SHRINK_ABORT) != 0) parent->cancel_kernels();
  if (newcomm == nullptr) {
    parent->warn("ncclCommShrink : newcomm argument is NULL");
    return ncclInvalidArgument;
  }
  shrink_plan plan;
  if (const ncclResult_t r = check_exclusions(*parent, exclude, count, plan.excluded); r != ncclSuccess) return r;
  // ncclCommEnsureReady: the parent's error, the sticky proxy error included, ends the shrink here.
  if (const ncclResult_t r = parent->ensure_ready("ncclCommShrink"); r != ncclSuccess) return r;
  *newcomm = nullptr;  // "*newcomm should be NCCL_COMM_NULL until comm split fully complete"

  auto child = std::make_shared<communicator>();
  std::string why;
  if (config == nullptr) {
    child->config = parent->config;  // copyCommConfig
  } else if (const ncclResult_t r = parse_config(config, child->config, &why); r != ncclSuccess) {
    parent->warn(why);
    return r;
  }
  for (int r = 0; r < parent->nranks; ++r) {
    if (!std::binary_search(plan.excluded.begin(), plan.excluded.end(), r)) plan.survivors.push_back(r);
  }
  child->rank = static_cast<int>(std::lower_bound(plan.survivors.begin(), plan.survivors.end(), parent->rank) -
                                 plan.survivors.begin());
  child->nranks = static_cast<int>(plan.survivors.size());
  child->device = parent->device;
  child->blocking = blocking_of(child->config);
  child->parent = parent;
  child->magic = hash_combine(parent->magic, static_cast<std::uint64_t>(++parent->child_count));
  child->async.store(ncclInProgress);
  if (!child->mailbox.open(&why)) {
    parent->warn("ncclCommShrink: " + why);
    return ncclSystemError;
  }
  register_comm(child);
  plan.newcomm = newcomm;
  plan.parent_was_revoked = parent->revoked.load();
  parent->async.store(ncclInProgress, std::memory_order_release);
  parent->start_job([parent, child, plan] { run_shrink(parent, child, plan); }, child);
  // The job belongs to the parent (ncclAsyncLaunch(job, ..., comm)): its blocking mode decides.
  // Non-blocking, ncclCommShrink returns ncclSuccess, not ncclInProgress: the ncclInProgress of
  // ncclGroupEndInternal passes NCCLCHECK and the call returns `res`; the PARENT's state says
  // ncclInProgress. Blocking, the group end waits and a failure of the job is returned.
  if (!parent->blocking) return ncclSuccess;
  parent->wait_job();
  const ncclResult_t r = parent->state();
  return r == ncclInProgress ? ncclSuccess : r;
}

}  // namespace nccl_model
