#include "nccl_calls.hpp"

#include <pthread.h>
#include <unistd.h>

#include <map>
#include <mutex>

#include "contract.hpp"
#include "settings.hpp"
#include "util.hpp"

namespace nccl_model {
namespace {

using contract::rule;

// Which user threads are inside which NCCL call on which communicator, and which are aborting.
struct inside_call {
  const char* api;
  ncclComm_t comm;
};
struct abort_call {
  unsigned long thread;  // the thread aborting
  bool pending;          // the communicator had an asynchronous job in flight (state ncclInProgress)
};
struct process_calls {
  std::mutex mu;
  std::map<unsigned long, inside_call> inside;  // pthread_self() -> its call
  std::map<ncclComm_t, abort_call> aborting;    // communicator -> its abort
};

// Why the rule is what it is, for the messages.
constexpr const char* abort_rule_source =
    "NCCL user guide, Fault Tolerance: 'make sure no thread is calling any NCCL operations while calling "
    "ncclCommAbort'; real NCCL 2.28.9 tolerated an abort beside calls on other communicators only when the "
    "aborted one had no asynchronous job in flight (a revoke still draining: pthread_join failed with ESRCH "
    "and a rank crashed, scripts/gpu_check.sh on an H200, 2026-11-27): see README.md";

process_calls& calls() {
  static auto* p = new process_calls();
  return *p;
}

unsigned long me() { return static_cast<unsigned long>(::pthread_self()); }

std::string thread_text(unsigned long t) { return strprintf("thread %#lx", t); }

}  // namespace

std::string this_thread_name() { return thread_text(me()); }

api_call::api_call(const char* api, ncclComm_t h, kind k, bool tolerate_dead) : api_(api), handle_(h) {
  handle_status st{};
  if (h != nullptr) comm_ = find_comm(h, &st);
  enter_process(k);
  if (h == nullptr) return;
  if (!comm_) {
    bad_handle_ = true;
    if (!tolerate_dead && contract::enabled(rule::dead_handle)) {
      contract::violation(rule::dead_handle,
                          st == handle_status::dead
                              ? strprintf("%s on communicator %p after ncclCommAbort/ncclCommDestroy", api, static_cast<void*>(h))
                              : strprintf("%s on %p, which is not a communicator of this process", api, static_cast<void*>(h)),
                          this_thread_name() + ", pid " + std::to_string(::getpid()),
                          "a communicator handle is invalid once ncclCommAbort or ncclCommDestroy returned (nccl.h: "
                          "they free the communicator object)");
    }
    return;
  }
  enter_comm(k);
}

void api_call::enter_process(kind k) {
  process_calls& p = calls();
  std::lock_guard lk(p.mu);
  if (contract::enabled(rule::abort_alone)) {
    // A call beside an abort: never on the communicator aborted; on another one only when the
    // aborted one had no asynchronous job in flight.
    for (const auto& [c, a] : p.aborting) {
      if (a.thread == me() || (c != handle_ && !a.pending)) continue;
      contract::violation(rule::abort_alone,
                          strprintf("%s while ncclCommAbort runs on %s %s", api_, thread_text(a.thread).c_str(),
                                    c == handle_ ? "on the same communicator"
                                                 : "on a communicator whose asynchronous job was in flight"),
                          this_thread_name() + ", pid " + std::to_string(::getpid()), abort_rule_source);
    }
  }
  const bool pending = k == kind::abort && comm_ && comm_->async.load(std::memory_order_acquire) == ncclInProgress;
  if (k == kind::abort && contract::enabled(rule::abort_alone)) {
    for (const auto& [t, call] : p.inside) {
      if (t == me() || (call.comm != handle_ && !pending)) continue;
      contract::violation(rule::abort_alone,
                          strprintf("ncclCommAbort while %s is inside %s %s", thread_text(t).c_str(), call.api,
                                    call.comm == handle_ ? "on the same communicator"
                                                         : "(the aborted communicator's asynchronous job is in flight)"),
                          this_thread_name() + ", pid " + std::to_string(::getpid()), abort_rule_source);
    }
  }
  p.inside[me()] = {api_, handle_};
  if (k == kind::abort && handle_ != nullptr) {
    p.aborting[handle_] = {me(), pending};
    aborting_ = true;
  }
}

void api_call::enter_comm(kind k) {
  communicator& c = *comm_;
  {
    std::lock_guard lk(c.call_mu);
    if (c.caller != 0 && c.caller != me() && contract::enabled(rule::one_thread)) {
      contract::violation(rule::one_thread,
                          strprintf("%s while %s is inside %s on the same communicator", api_,
                                    thread_text(c.caller).c_str(), c.caller_api),
                          this_thread_name() + ", " + c.describe(),
                          "NCCL operations on one communicator must not be issued from several threads at once "
                          "(NCCL user guide, Thread Safety)");
    }
    c.caller = me();
    c.caller_api = api_;
    ++c.call_depth;
    holds_comm_ = true;
  }
  if (k == kind::plain && c.async.load(std::memory_order_acquire) == ncclInProgress &&
      contract::enabled(rule::in_progress)) {
    contract::violation(rule::in_progress, strprintf("%s on a communicator whose state is ncclInProgress", api_),
                        this_thread_name() + ", " + c.describe(),
                        "after a call returns ncclInProgress only ncclCommGetAsyncError (poll it until ncclSuccess), "
                        "ncclCommAbort and ncclCommRevoke may follow (src/init.cc ncclCommEnsureReady: 'Attempt to use "
                        "communicator before the previous operation returned ncclSuccess')");
  }
}

api_call::~api_call() {
  if (holds_comm_) {
    std::lock_guard lk(comm_->call_mu);
    if (--comm_->call_depth == 0) {
      comm_->caller = 0;
      comm_->caller_api = nullptr;
    }
  }
  {
    process_calls& p = calls();
    std::lock_guard lk(p.mu);
    p.inside.erase(me());
    if (aborting_) p.aborting.erase(handle_);
  }
  if (settings::get().trace) {
    const std::string line =
        strprintf("nccl-model %d %s: %s(%p%s) -> %s\n", static_cast<int>(::getpid()), this_thread_name().c_str(), api_,
                  static_cast<void*>(handle_),
                  comm_ ? strprintf(", rank %d of %d, device %d", comm_->rank, comm_->nranks, comm_->device).c_str() : "",
                  ncclGetErrorString(result_));
    (void)!::write(STDERR_FILENO, line.data(), line.size());
  }
}

}  // namespace nccl_model
