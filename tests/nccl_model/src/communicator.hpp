// A communicator of the NCCL model: its identity, its ring, its asynchronous state, its kernels in
// flight, and the one background job (init, shrink, grow, finalize, revoke) it may be running.
//
// State (src/init.cc, ncclCommGetAsyncError): `async` is what a non-blocking call leaves behind
// (ncclInProgress while a job runs, then its result); `proxy_error` is the network failure a
// kernel saw, sticky: ncclCommGetAsyncError reports `async` unless it is ncclSuccess, and then
// `proxy_error`, for ever, also after ncclCommRevoke.
//
// Kernels: every collective takes a ticket when enqueued; kernels run one at a time in ticket
// order (NCCL orders a communicator's operations), each polling stop() at least every
// millisecond while it talks to its ring neighbours.
#pragma once

#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap.hpp"
#include "cuda_model.hpp"
#include "errors.hpp"
#include "handles.hpp"
#include "socket.hpp"

namespace nccl_model {

class communicator : public std::enable_shared_from_this<communicator> {
 public:
  // ---- identity (fixed once the job that builds the communicator has finished) ----
  ncclComm_t handle = nullptr;
  int rank = -1;
  int nranks = 0;
  int device = 0;
  bool blocking = true;
  ncclConfig_t config{};
  std::uint64_t magic = 0;
  int child_count = 0;                   // children made so far (shrink, grow): their magics
  std::vector<boot::peer_info> peers;    // every rank's, in rank order
  boot::mailbox mailbox;                 // this communicator's listener
  net::fd to_succ;                       // ring: to rank+1
  net::fd from_pred;                     // ring: from rank-1
  std::atomic<bool> grow_id_pending{false};  // ncclCommGetUniqueId made a grow id not yet consumed
  std::weak_ptr<communicator> parent;    // a child being built: whose abort also stops it

  // ---- state ----
  std::atomic<ncclResult_t> async{ncclInProgress};
  std::atomic<ncclResult_t> proxy_error{ncclSuccess};
  std::atomic<bool> aborted{false};     // ncclCommAbort: everything stops for good
  std::atomic<bool> revoked{false};     // ncclCommRevoke: kernels stop, no new ones
  std::atomic<bool> launch_pending{false};  // collectives launched but not yet polled (see defer_launch)
  std::atomic<bool> built{false};      // the job that made it finished well: a ring, a peer table
  bool finalize_called = false;
  error_text last_error;

  // ---- the contract: which user thread is inside a call on this communicator (nccl_calls.cpp) ----
  std::mutex call_mu;
  unsigned long caller = 0;  // pthread_self() of that thread, 0: none
  const char* caller_api = nullptr;
  int call_depth = 0;

  /// "communicator 0x… (rank r of n, device d)", for messages.
  [[nodiscard]] std::string describe() const;

  /// Records an error text for this communicator (and process-wide, as NCCL's WARN does).
  void warn(const std::string& text);
  /// Sets the sticky proxy error (first one wins) with its text.
  void set_proxy_error(ncclResult_t r, const std::string& text);
  /// What ncclCommGetAsyncError reports.
  [[nodiscard]] ncclResult_t state() const noexcept;
  /// ncclCommEnsureReady: ncclSuccess, the async error, or ncclInvalidArgument while in progress.
  ncclResult_t ensure_ready(const char* op);

  // ---- kernels ----
  /// Takes a ticket for a collective about to be enqueued.
  std::uint64_t take_ticket();
  /// Whether kernel `ticket` must stop now (abort, revoke, or cancelled by NCCL_SHRINK_ABORT).
  [[nodiscard]] bool kernel_must_stop(std::uint64_t ticket) const noexcept;
  /// Blocks until it is kernel `ticket`'s turn; false if it must stop instead. On true the kernel
  /// counts as running until kernel_done().
  bool kernel_begin(std::uint64_t ticket);
  /// Ends kernel `ticket` (`ran`: kernel_begin returned true).
  void kernel_done(std::uint64_t ticket, bool ran);
  /// Kernels enqueued and not yet finished.
  [[nodiscard]] int outstanding_kernels();
  /// NCCL_SHRINK_ABORT: stops every kernel enqueued so far and waits for the running one to end.
  void cancel_kernels();
  /// Waits until no kernel is outstanding, or `give_up()`.
  bool wait_kernels_drained(const std::function<bool()>& give_up);

  // ---- launches of a non-blocking communicator ----
  /// NCCL's group launch on a non-blocking communicator (src/group.cc ncclGroupEndInternal): the
  /// call returns ncclInProgress, the state is ncclInProgress, and the kernel is NOT on the stream
  /// yet (a cudaStreamQuery in between says the stream is idle). The model holds the kernel until
  /// the next ncclCommGetAsyncError (or revoke/abort), which puts it on its stream and reports
  /// ncclSuccess: where NCCL's launch thread is merely quick, the model waits for the poll.
  void defer_launch(std::shared_ptr<cuda::stream> s, std::function<void()> work);
  /// Puts every held kernel on its stream and ends the launch's ncclInProgress.
  void complete_launch();

  // ---- the background job ----
  /// Runs `job` on a thread of its own (NCCL's async job thread); jobs run one after the other.
  /// `also` (a child the job builds) counts the job as its own too: its wait_job() waits for it.
  void start_job(std::function<void()> job, std::shared_ptr<communicator> also = nullptr);
  /// Waits until every job started so far has finished.
  void wait_job();
  /// Whether the communicator's own work must stop: aborted, or the parent it is built from was.
  [[nodiscard]] bool must_stop() const noexcept;
  /// A stop condition for sockets: must_stop().
  net::stop_fn stopper();

  /// Closes the ring and the listener (after abort: no kernel or job uses them any more).
  void close_transport();

 private:
  struct held_kernel {
    std::shared_ptr<cuda::stream> stream;
    std::function<void()> work;
  };
  std::mutex launch_mu_;
  std::vector<held_kernel> launches_;
  std::mutex proxy_mu_;  // orders concurrent set_proxy_error calls (two kernels, say)
  std::mutex kmu_;
  std::condition_variable kcv_;
  std::uint64_t next_ticket_ = 0;
  std::uint64_t next_to_run_ = 0;
  std::atomic<std::uint64_t> cancel_below_{0};
  int outstanding_ = 0;
  int running_ = 0;

  std::mutex jmu_;
  std::condition_variable jcv_;
  int jobs_ = 0;          // started and not finished
  std::mutex job_turn_;   // held by the job that runs; the others wait for it
};

/// The registry of live communicators (handles never reused).
std::shared_ptr<communicator> find_comm(ncclComm_t h, handle_status* status);
ncclComm_t register_comm(const std::shared_ptr<communicator>& c);
/// Retires the handle: later use is a contract violation.
void retire_comm(ncclComm_t h);
int live_comms();

/// This process's peer_info for a communicator of `c` (rank, device, version, host, listener).
boot::peer_info my_info(const communicator& c);

/// Checks a new communicator's table (src/init.cc initTransportsRank, after the first allgather):
/// every rank runs the same NCCL version, and no two ranks on one host share a GPU unless
/// NCCL_MULTI_RANK_GPU_ENABLE allows it (2.30.3 and later). ncclSuccess or the error, with `*why`.
ncclResult_t check_peers(const std::vector<boot::peer_info>& peers, int me, std::string* why);

/// Waits out ELASTIC_NCCL_MODEL_INIT_DELAY_MS from `started`, or until `c.must_stop()`.
void hold_init_delay(const communicator& c, std::chrono::steady_clock::time_point started);

/// The blocking-free path of NCCL < 2.28: freeing the communicator's device buffers with cudaFree
/// synchronises the whole device (README: "abort in the 2.27 model").
bool frees_with_device_sync();

}  // namespace nccl_model
