// Scenarios that break one rule of the contract each: the model must abort the process with its
// message (the test checks SIGABRT and stderr). "reached" on stdout means it did not.
#include <atomic>
#include <thread>

#include "probe.hpp"

namespace probe {
namespace {

ncclUniqueId fresh_id() {
  ncclUniqueId id;
  if (ncclGetUniqueId(&id) != ncclSuccess) fail("ncclGetUniqueId");
  return id;
}

[[noreturn]] void reached() {
  say("reached");
  std::exit(0);
}

// A one-rank communicator whose first collective (ELASTIC_NCCL_MODEL_HANG_OP=1) never ends.
struct stuck {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  void* buf = nullptr;
  explicit stuck(bool blocking) {
    check_cuda(cudaSetDevice(0), "cudaSetDevice");
    comm = init(fresh_id(), 1, 0, blocking);
    check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    check_cuda(cudaMalloc(&buf, 64), "cudaMalloc");
    if (!enqueued(ncclAllReduce(buf, buf, 16, ncclFloat32, ncclSum, comm, stream))) fail("ncclAllReduce");
    if (wait_ready(comm) != ncclSuccess) fail("the launch");  // a hung kernel reports nothing
  }
};

// Starts a thread stuck inside a blocking ncclCommFinalize (it waits for the hung kernel).
std::thread finalize_forever(ncclComm_t c) {
  std::thread t([c] {
    cudaSetDevice(0);
    ncclCommFinalize(c);
  });
  std::this_thread::sleep_for(200ms);
  return t;
}

int run(const std::string& rule) {
  if (rule == "in-progress") {
    check_cuda(cudaSetDevice(0), "cudaSetDevice");
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t c = nullptr;
    ncclCommInitRankConfig(&c, 2, fresh_id(), 0, &config);  // stays in progress: rank 1 never comes
    int n = 0;
    ncclCommCount(c, &n);
    reached();
  }
  if (rule == "one-thread") {
    stuck s(/*blocking=*/true);
    std::thread t = finalize_forever(s.comm);
    ncclResult_t st;
    ncclCommGetAsyncError(s.comm, &st);
    t.detach();
    reached();
  }
  if (rule == "abort-beside-a-call") {
    stuck s(/*blocking=*/true);
    std::thread t = finalize_forever(s.comm);
    ncclCommAbort(s.comm);
    t.detach();
    reached();
  }
  if (rule == "abort-beside-another-communicator") {  // allowed: reaches
    stuck s(/*blocking=*/true);
    std::thread t = finalize_forever(s.comm);
    ncclComm_t other = init(fresh_id(), 1, 0);
    ncclCommAbort(other);
    t.detach();
    say("reached");
    std::_Exit(0);  // not exit(): the finalize on the other thread never ends
  }
  if (rule == "abort-pending-beside-a-call") {  // the aborted one's init is still in flight
    stuck s(/*blocking=*/true);
    std::thread t = finalize_forever(s.comm);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t half = nullptr;
    ncclUniqueId id = fresh_id();
    ncclCommInitRankConfig(&half, 2, id, 0, &config);  // rank 1 never comes: in progress
    ncclCommAbort(half);
    t.detach();
    reached();
  }
  if (rule == "call-during-abort") {  // with ELASTIC_NCCL_MODEL_VERSION=22707: abort waits for the device
    stuck s(/*blocking=*/false);
    ncclComm_t other = init(fresh_id(), 1, 0);
    std::thread t([other] {
      cudaSetDevice(0);
      ncclCommAbort(other);
    });
    std::this_thread::sleep_for(200ms);
    ncclResult_t st;
    ncclCommGetAsyncError(other, &st);
    t.detach();
    reached();
  }
  if (rule == "async-launch") {
    check_cuda(cudaSetDevice(0), "cudaSetDevice");
    ncclComm_t c = init(fresh_id(), 1, 0);
    void* d = nullptr;
    check_cuda(cudaMalloc(&d, 64), "cudaMalloc");
    ncclAllReduce(d, d, 16, ncclFloat32, ncclSum, c, nullptr);
    ncclAllReduce(d, d, 16, ncclFloat32, ncclSum, c, nullptr);  // without polling in between
    reached();
  }
  if (rule == "shrink-outstanding") {
    stuck s(/*blocking=*/false);
    int exclude[1] = {1};
    ncclComm_t child = nullptr;
    ncclCommShrink(s.comm, exclude, 1, &child, nullptr, NCCL_SHRINK_DEFAULT);
    reached();
  }
  if (rule == "finalize-after-revoke") {
    check_cuda(cudaSetDevice(0), "cudaSetDevice");
    ncclComm_t c = init(fresh_id(), 1, 0);
    revoke(c);
    wait_ready(c);
    ncclCommFinalize(c);
    reached();
  }
  if (rule == "use-after-abort" || rule == "use-after-destroy") {
    check_cuda(cudaSetDevice(0), "cudaSetDevice");
    ncclComm_t c = init(fresh_id(), 1, 0);
    if (rule == "use-after-abort") {
      ncclCommAbort(c);
    } else {
      ncclCommDestroy(c);
    }
    int n = 0;
    ncclCommCount(c, &n);
    reached();
  }
  if (rule == "cuda-no-device") {
    void* p = nullptr;
    cudaMalloc(&p, 64);
    reached();
  }
  if (rule == "cuda-in-host-function") {
    check_cuda(cudaSetDevice(0), "cudaSetDevice");
    cudaLaunchHostFunc(nullptr, [](void*) { cudaStreamQuery(nullptr); }, nullptr);
    cudaStreamSynchronize(nullptr);
    reached();
  }
  if (rule == "stream-after-destroy") {
    check_cuda(cudaSetDevice(0), "cudaSetDevice");
    cudaStream_t s = nullptr;
    cudaStreamCreate(&s);
    cudaStreamDestroy(s);
    cudaStreamQuery(s);
    reached();
  }
  return -1;
}

}  // namespace

int run_contract(const std::string& scenario, const args&) {
  const std::string prefix = "contract-";
  if (scenario.rfind(prefix, 0) != 0) return -1;
  return run(scenario.substr(prefix.size()));
}

}  // namespace probe
