// How a non-blocking NCCL communicator comes into being, as NCCL 2.27 .. 2.30 do it
// (src/init.cc): the rules the communicator's init, shrink and grow share.
//
// - ncclCommInitRankConfig and ncclCommGrow store the new handle before they return; its state
//   is ncclInProgress until it is ready, so the NEW handle is polled.
// - ncclCommShrink leaves *newcomm NULL ("newcomm should be NCCL_COMM_NULL until comm split fully
//   complete") and stores the child later, from NCCL's own thread; the in-progress state lives
//   on the PARENT. So the out-pointer must live in storage that outlives the call (a heap slot
//   owned until the creation ended), the parent is polled, and the child is read only after the
//   parent's state is no longer ncclInProgress (an acquire in ncclCommGetAsyncError).
// - On the deadline the parent is aborted first (that joins NCCL's creation job, so nothing
//   writes the slot after it), then the child if the slot holds one.
// - A unique id's bootstrap root (a thread in the process that made the id) waits without a
//   timeout until every rank has checked in: release_bootstrap_root() ends it after a failure.
#pragma once

#include <elastic/config.hpp>

#if !ELASTIC_WITH_NCCL
#error "elastic/comm/detail/nccl_handle.hpp needs NCCL: link elastic::nccl (which sets ELASTIC_WITH_NCCL=1)"
#endif

#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include <nccl.h>

#include <elastic/comm/detail/nccl_runtime.hpp>
#include <elastic/error.hpp>
#include <elastic/internal/cuda.hpp>

namespace elastic::inline v1::comm::detail {

/// Called between polls of a communicator being made: throws to give the creation up (a peer
/// voted to fall back, a preemption notice came). Empty: never.
using creation_check = std::function<void()>;

/// The out-pointer of a creation call, on the heap so that NCCL's thread may store into it after
/// the call returned. Owned until the creation ended one way or the other.
struct handle_slot {
  ncclComm_t comm = nullptr;
};

/// The state of `comm` as ncclCommGetAsyncError says it (its own failure counts as the state).
inline ncclResult_t async_state(ncclComm_t comm) {
  return nccl_call([&] {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    return r != ncclSuccess ? r : state;
  });
}

/// Aborts `comm` (nullptr: nothing) under the process-wide NCCL lock, as NCCL's guide asks ("make
/// sure no thread is calling any NCCL operations while calling ncclCommAbort"): for handles that
/// may have an asynchronous job in flight (half-made ones, a creation given up). Never throws.
inline void abort_handle(ncclComm_t comm) noexcept {
  if (comm == nullptr) return;
  try {
    nccl_call([&] { return ncclCommAbort(comm); });
  } catch (...) {
  }
}

/// Aborts `comm`, which no other thread may be using (its owner's lock is held), first letting any
/// asynchronous job of it settle (a revoke draining its kernels: polled under the lock, up to
/// `patience`), then WITHOUT the process-wide lock: ncclCommAbort ends by joining NCCL's proxy and
/// UDS threads, which sleep in 500 ms polls (src/proxy.cc), and the thread building the next
/// communicator must not wait for that. On NCCL 2.28.9 an abort beside other threads' calls
/// crashed a rank (pthread_join ESRCH inside NCCL) when the aborted communicator's revoke job was
/// still in flight, never once it had settled (scripts/gpu_check.sh on an H200, 2026-11-27). A job
/// that does not settle in time gets the locked abort. Never throws.
inline void abort_settled(ncclComm_t comm, std::chrono::milliseconds patience) noexcept {
  if (comm == nullptr) return;
  try {
    const auto until = std::chrono::steady_clock::now() + patience;
    bool settled = false;
    for (;;) {
      const ncclResult_t state = nccl_call([&] {
        ncclResult_t st = ncclSuccess;
        const ncclResult_t r = ncclCommGetAsyncError(comm, &st);
        return r != ncclSuccess ? r : st;
      });
      if (state != ncclInProgress) {
        settled = true;
        break;
      }
      if (std::chrono::steady_clock::now() >= until) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (!settled) {
      abort_handle(comm);
      return;
    }
  } catch (...) {
    abort_handle(comm);
    return;
  }
  (void)ncclCommAbort(comm);
}

/// Polls `watched` until it is no longer in progress. ncclSuccess returns; another state throws
/// nccl_failure(`where`). On the deadline, or when `check` throws, `on_give_up()` runs first
/// (it aborts what is half-made), then the error is thrown.
template <class GiveUp>
void await_ready(ncclComm_t watched, std::chrono::steady_clock::time_point deadline, const std::string& where,
                 const creation_check& check, GiveUp&& on_give_up) {
  auto last_check = std::chrono::steady_clock::now();
  for (;;) {
    const ncclResult_t state = async_state(watched);
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) {
      error e = nccl_failure(state, where, watched);
      on_give_up();
      throw e;
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      on_give_up();
      throw error(errc::timeout, where + " timed out: not every rank took part in time; a peer may have died, be "
                                         "slow to start, or hold another id. Build a new communicator from the next "
                                         "rendezvous round");
    }
    if (check && now - last_check >= std::chrono::milliseconds(5)) {
      last_check = now;
      try {
        check();
      } catch (...) {
        on_give_up();
        throw;
      }
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

/// Ends the bootstrap root thread that nccl_unique_id() left in this process for `id`, after a
/// communicator of `size` ranks made from it failed: the root waits (src/bootstrap.cc
/// bootstrapRoot, no timeout) until every rank has checked in, so a rank that died before it
/// connected would keep it, and its listening socket, forever. A second check-in as rank 0 makes
/// the root give up ("rank 0 of N ranks has already checked in"): that check-in is a throwaway
/// non-blocking init, given `patience` to reach the root and then aborted. Call it only in the
/// process that made `id` and whose rank 0 had connected. Never throws.
inline void release_bootstrap_root(std::string_view id, int size, int device,
                                   std::chrono::milliseconds patience = std::chrono::milliseconds(100)) noexcept {
  if (id.size() != NCCL_UNIQUE_ID_BYTES || size < 2) return;  // one rank: the root is done already
  try {
    internal::cuda::device_scope on(device);
    ncclUniqueId uid;
    std::memcpy(uid.internal, id.data(), NCCL_UNIQUE_ID_BYTES);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t probe = nullptr;
    const ncclResult_t r = nccl_call([&] { return ncclCommInitRankConfig(&probe, size, uid, 0, &config); });
    if (r == ncclSuccess || r == ncclInProgress) {
      // The root drops the duplicate's connection as it leaves, which fails the probe's init.
      const auto until = std::chrono::steady_clock::now() + patience;
      while (std::chrono::steady_clock::now() < until && async_state(probe) == ncclInProgress) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
    }
    abort_handle(probe);
  } catch (...) {
  }
}

}  // namespace elastic::inline v1::comm::detail
