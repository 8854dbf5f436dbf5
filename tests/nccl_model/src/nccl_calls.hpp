// The contract checker's NCCL side: every NCCL API call that touches state goes through an
// api_call, which enforces the rules that concern threads and handles before the call runs:
//  - no call on a communicator while ncclCommAbort runs on it, and no ncclCommAbort while another
//    thread is inside a call on that communicator (NCCL user guide, Fault Tolerance: "make sure no
//    thread is calling any NCCL operations while calling ncclCommAbort", read as the communicator
//    being aborted; other, independent communicators may be used meanwhile, as PyTorch's watchdog
//    does: README.md says why, and where real NCCL was checked);
//  - one thread at a time inside calls on one communicator (user guide, Thread Safety);
//  - no use of a communicator after ncclCommAbort/ncclCommDestroy;
//  - nothing but ncclCommGetAsyncError, ncclCommAbort, ncclCommRevoke and ncclGetLastError while the
//    communicator is ncclInProgress (src/init.cc ncclCommEnsureReady: "Attempt to use communicator
//    before the previous operation returned ncclSuccess").
// It also writes the ELASTIC_NCCL_MODEL_TRACE line when the call returns.
#pragma once

#include <nccl.h>

#include <memory>
#include <string>

#include "communicator.hpp"

namespace nccl_model {

class api_call {
 public:
  enum class kind {
    plain,          // the in-progress rule applies
    in_progress_ok, // ncclCommGetAsyncError, ncclCommRevoke, ncclGetLastError
    abort,          // ncclCommAbort: alone on its communicator
  };

  /// Enters API call `api` on handle `h` (may be NULL). With `tolerate_dead`, a dead or unknown
  /// handle is not a violation (ncclGetLastError ignores its argument in NCCL).
  api_call(const char* api, ncclComm_t h, kind k, bool tolerate_dead = false);
  ~api_call();
  api_call(const api_call&) = delete;
  api_call& operator=(const api_call&) = delete;

  /// The live communicator, or nullptr (NULL, or a dead handle with the checker off).
  [[nodiscard]] const std::shared_ptr<communicator>& comm() const noexcept { return comm_; }
  /// Whether the handle was not NULL and yet is not a live communicator (checker off).
  [[nodiscard]] bool bad_handle() const noexcept { return bad_handle_; }
  /// Records the result (for the trace line) and returns it.
  ncclResult_t done(ncclResult_t r) noexcept {
    result_ = r;
    return r;
  }

 private:
  void enter_process(kind k);
  void enter_comm(kind k);

  const char* api_;
  ncclComm_t handle_;
  std::shared_ptr<communicator> comm_;
  bool bad_handle_ = false;
  bool aborting_ = false;
  bool holds_comm_ = false;
  ncclResult_t result_ = ncclSuccess;
};

/// The thread's name in messages ("thread 0x7f…").
std::string this_thread_name();

}  // namespace nccl_model
