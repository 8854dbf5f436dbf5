// Scenarios in one process: a communicator of one rank (or two, on two devices of this process).
#include <atomic>
#include <cstring>
#include <string>
#include <thread>

#include "probe.hpp"

namespace probe {
namespace {

using clock = std::chrono::steady_clock;

long long ms_since(clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(clock::now() - t).count();
}

ncclUniqueId fresh_id() {
  ncclUniqueId id;
  if (ncclGetUniqueId(&id) != ncclSuccess) fail("ncclGetUniqueId");
  return id;
}

void expect(const char* what, long long got, long long want) {
  if (got == want) {
    say("ok %s", what);
  } else {
    say("bad %s: got %lld, want %lld", what, got, want);
  }
}

bool contains(const char* text, const char* part) { return text != nullptr && std::strstr(text, part) != nullptr; }

// Non-blocking init returns ncclInProgress at once, then turns ncclSuccess (NCCL_COMM_BLOCKING=1:
// the same call blocks until done).
int init_nonblocking(const args&) {
  check_cuda(cudaSetDevice(0), "cudaSetDevice");
  const ncclUniqueId id = fresh_id();
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t c = nullptr;
  const auto t0 = clock::now();
  const ncclResult_t rc = ncclCommInitRankConfig(&c, 1, id, 0, &config);
  const long long call_ms = ms_since(t0);
  ncclResult_t st = ncclSuccess;
  ncclCommGetAsyncError(c, &st);
  say("init rc=%d state=%d call-ms=%lld", rc, st, call_ms);
  st = wait_ready(c);
  say("ready state=%d ready-ms=%lld", st, ms_since(t0));
  ncclCommAbort(c);
  say("done");
  return 0;
}

void shrink_arguments(ncclComm_t c) {
  ncclComm_t nc = nullptr;
  int self[1] = {0};
  int other[1] = {1};
  expect("shrink with a NULL exclude list", ncclCommShrink(c, nullptr, 1, &nc, nullptr, 0), ncclInvalidArgument);
  expect("shrink with an empty exclude list", ncclCommShrink(c, other, 0, &nc, nullptr, 0), ncclInvalidArgument);
  expect("shrink excluding this rank", ncclCommShrink(c, self, 1, &nc, nullptr, 0), ncclInvalidArgument);
  expect("shrink with a NULL newcomm", ncclCommShrink(c, other, 1, nullptr, nullptr, 0), ncclInvalidArgument);
  expect("shrink excluding a rank out of range", ncclCommShrink(c, other, 1, &nc, nullptr, 0), ncclInvalidArgument);
  ncclResult_t st = ncclInProgress;
  ncclCommGetAsyncError(c, &st);
  expect("a refused shrink leaves the parent ready", st, ncclSuccess);
}

void collective_arguments(ncclComm_t c, cudaStream_t s) {
  void* d = nullptr;
  check_cuda(cudaMalloc(&d, 64), "cudaMalloc");
  float pageable[16] = {};
  expect("allreduce from pageable memory", ncclAllReduce(pageable, d, 16, ncclFloat32, ncclSum, c, s), ncclInvalidArgument);
  say("%s lasterror names the pointer", contains(ncclGetLastError(c), "sendbuff") ? "ok" : "bad");
  int devices = 0;
  cudaGetDeviceCount(&devices);
  if (devices < 2) {  // real hardware with one GPU (the model's checks against real NCCL)
    say("skipped: the checks that need a second device");
    cudaFree(d);
    return;
  }
  void* other = nullptr;
  check_cuda(cudaSetDevice(1), "cudaSetDevice");
  check_cuda(cudaMalloc(&other, 64), "cudaMalloc");
  cudaStream_t s1 = nullptr;
  check_cuda(cudaStreamCreate(&s1), "cudaStreamCreate");
  check_cuda(cudaSetDevice(0), "cudaSetDevice");
  expect("allreduce into another device's memory", ncclAllReduce(d, other, 16, ncclFloat32, ncclSum, c, s), ncclInvalidArgument);
  say("%s lasterror says which device", contains(ncclGetLastError(c), "mismatchs with NCCL device 0") ? "ok" : "bad");
  expect("allreduce beyond the buffer", ncclAllReduce(d, d, 17, ncclFloat32, ncclSum, c, s), ncclInvalidArgument);
  expect("allreduce of an unknown type", ncclAllReduce(d, d, 4, static_cast<ncclDataType_t>(13), ncclSum, c, s), ncclInvalidArgument);
  expect("allreduce with an unknown op", ncclAllReduce(d, d, 4, ncclFloat32, ncclNumOps, c, s), ncclInvalidArgument);
  expect("broadcast from a root out of range", ncclBroadcast(d, d, 4, ncclFloat32, 1, c, s), ncclInvalidArgument);
  expect("allreduce on another device's stream", ncclAllReduce(d, d, 4, ncclFloat32, ncclSum, c, s1), ncclUnhandledCudaError);
  expect("allreduce of nothing", ncclAllReduce(nullptr, nullptr, 0, ncclFloat32, ncclSum, c, s), ncclSuccess);
  // Groups: nothing reaches the stream before ncclGroupEnd.
  expect("ncclGroupEnd without ncclGroupStart", ncclGroupEnd(), ncclInvalidUsage);
  ncclGroupStart();
  expect("allreduce in a group", ncclAllReduce(d, d, 4, ncclFloat32, ncclSum, c, s), ncclSuccess);
  expect("the stream is idle until ncclGroupEnd", cudaStreamQuery(s), cudaSuccess);
  expect("ncclGroupEnd", ncclGroupEnd(), ncclSuccess);
  expect("the group's allreduce ran", wait_stream(s) ? 1 : 0, 1);
  cudaSetDevice(1);
  cudaStreamDestroy(s1);
  cudaFree(other);
  cudaSetDevice(0);
  cudaFree(d);
}

// Argument checks as NCCL makes them, in NCCL's order, and their effect on the state.
int arguments(const args&) {
  check_cuda(cudaSetDevice(0), "cudaSetDevice");
  int v = 0;
  ncclGetVersion(&v);
  say("version %d", v);
  expect("ncclGetUniqueId(NULL)", ncclGetUniqueId(nullptr), ncclInvalidArgument);
  const ncclUniqueId id = fresh_id();
  ncclComm_t c = nullptr;
  expect("init of 0 ranks", ncclCommInitRank(&c, 0, id, 0), ncclInvalidArgument);
  expect("init of rank 1 of 1", ncclCommInitRank(&c, 1, id, 1), ncclInvalidArgument);
  expect("init into NULL", ncclCommInitRank(nullptr, 1, id, 0), ncclInvalidArgument);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.magic = 0;
  expect("init with an uninitialised config", ncclCommInitRankConfig(&c, 1, id, 0, &config), ncclInvalidArgument);
  config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 2;
  expect("init with blocking=2", ncclCommInitRankConfig(&c, 1, id, 0, &config), ncclInvalidArgument);
  config = NCCL_CONFIG_INITIALIZER;
  config.minCTAs = 2;  // NCCL refuses minCTAs without maxCTAs (UNDEF is INT_MIN)
  expect("init with minCTAs and no maxCTAs", ncclCommInitRankConfig(&c, 1, id, 0, &config), ncclInvalidArgument);

  c = init(id, 1, 0, /*blocking=*/true);
  int n = -1, dev = -1, rank = -1;
  ncclCommCount(c, &n);
  ncclCommCuDevice(c, &dev);
  ncclCommUserRank(c, &rank);
  expect("count, device and rank", n * 100 + dev * 10 + rank, 100);
  expect("ncclCommGetAsyncError(NULL)", ncclCommGetAsyncError(nullptr, nullptr), ncclInvalidArgument);
  cudaStream_t s = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  shrink_arguments(c);
  collective_arguments(c, s);
  ncclComm_t split = nullptr;
  expect("ncclCommSplit", ncclCommSplit(c, 0, 0, &split, nullptr), ncclInvalidUsage);
  say("%s split says it is not modelled", contains(ncclGetLastError(c), "not modelled") ? "ok" : "bad");
  if (auto fn = symbol<revoke_fn>("ncclCommRevoke")) {
    expect("revoke with flags 1", fn(c, 1), ncclInvalidArgument);
    expect("revoke", fn(c, NCCL_REVOKE_DEFAULT), ncclSuccess);  // blocking: returns once quiescent
    expect("revoke twice", fn(c, NCCL_REVOKE_DEFAULT), ncclInvalidArgument);
    expect("destroy after revoke", ncclCommDestroy(c), ncclSuccess);
  } else {
    ncclCommAbort(c);
  }
  expect("abort NULL", ncclCommAbort(nullptr), ncclSuccess);
  expect("destroy NULL", ncclCommDestroy(nullptr), ncclSuccess);

  // A malformed collective on a NON-blocking communicator leaves its error as the state
  // (src/enqueue.cc ncclEnqueueCheck, label fail): every later call fails with it.
  ncclComm_t nb = init(fresh_id(), 1, 0, /*blocking=*/false);
  void* d = nullptr;
  check_cuda(cudaMalloc(&d, 64), "cudaMalloc");
  expect("non-blocking: allreduce of an unknown type",
         ncclAllReduce(d, d, 4, static_cast<ncclDataType_t>(13), ncclSum, nb, s), ncclInvalidArgument);
  ncclResult_t st = ncclSuccess;
  ncclCommGetAsyncError(nb, &st);
  expect("non-blocking: the state keeps the error", st, ncclInvalidArgument);
  expect("non-blocking: destroy refuses a communicator with an error", ncclCommDestroy(nb), ncclInvalidArgument);
  expect("non-blocking: it is still alive", elastic_nccl_model_live_comms(), 1);
  expect("non-blocking: abort", ncclCommAbort(nb), ncclSuccess);
  expect("no communicator left", elastic_nccl_model_live_comms(), 0);
  cudaFree(d);
  cudaStreamDestroy(s);
  say("done");
  return 0;
}

// ELASTIC_NCCL_MODEL_HANG_OP=1: the kernel hangs, no error; revoke ends it.
int revoke_hang(const args&) {
  check_cuda(cudaSetDevice(0), "cudaSetDevice");
  ncclComm_t c = init(fresh_id(), 1, 0);
  cudaStream_t s = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  void* d = nullptr;
  check_cuda(cudaMalloc(&d, 64), "cudaMalloc");
  expect("allreduce enqueued", enqueued(ncclAllReduce(d, d, 16, ncclFloat32, ncclSum, c, s)) ? 1 : 0, 1);
  std::this_thread::sleep_for(200ms);
  ncclResult_t st = ncclInProgress;
  ncclCommGetAsyncError(c, &st);
  expect("a hung kernel reports nothing", st, ncclSuccess);
  expect("a hung kernel keeps its stream busy", cudaStreamQuery(s), cudaErrorNotReady);
  const ncclResult_t rc = revoke(c);
  say("revoke rc=%d", rc);
  expect("revoked, then quiescent", wait_ready(c, 5s), ncclSuccess);
  expect("revoke ends the kernel", wait_stream(s, 5s) ? 1 : 0, 1);
  expect("a collective after revoke", ncclAllReduce(d, d, 16, ncclFloat32, ncclSum, c, s), ncclInvalidUsage);
  expect("destroy after revoke", ncclCommDestroy(c), ncclSuccess);
  cudaFree(d);
  cudaStreamDestroy(s);
  say("done");
  return 0;
}

// ELASTIC_NCCL_MODEL_FAIL_OP=2: the second collective sets a sticky ncclSystemError and hangs.
int fail_op(const args&) {
  check_cuda(cudaSetDevice(0), "cudaSetDevice");
  ncclComm_t c = init(fresh_id(), 1, 0);
  cudaStream_t s = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  void* d = nullptr;
  check_cuda(cudaMalloc(&d, 64), "cudaMalloc");
  ncclAllReduce(d, d, 16, ncclFloat32, ncclSum, c, s);
  expect("the first collective completes", wait_ready(c) == ncclSuccess && wait_stream(s) ? 1 : 0, 1);
  ncclAllReduce(d, d, 16, ncclFloat32, ncclSum, c, s);
  ncclResult_t st = ncclSuccess;
  const auto until = clock::now() + 5s;
  while (st == ncclSuccess && clock::now() < until) ncclCommGetAsyncError(c, &st);
  expect("the second one fails", st, ncclSystemError);
  say("%s lasterror names the injection", contains(ncclGetLastError(c), "injected failure of operation 2") ? "ok" : "bad");
  expect("and never completes", wait_stream(s, 200ms) ? 1 : 0, 0);
  if (symbol<revoke_fn>("ncclCommRevoke") != nullptr) {
    revoke(c);
    expect("the error is sticky across revoke", wait_ready(c, 5s), ncclSystemError);
    expect("revoke ends the kernel", wait_stream(s, 5s) ? 1 : 0, 1);
  }
  ncclCommAbort(c);
  expect("abort ends it in any case", wait_stream(s, 5s) ? 1 : 0, 1);
  cudaFree(d);
  cudaStreamDestroy(s);
  say("done");
  return 0;
}

// ELASTIC_NCCL_MODEL_HANG_OP=1: cudaFree waits for the device, behind a kernel that never ends.
int cuda_free_blocks(const args&) {
  check_cuda(cudaSetDevice(0), "cudaSetDevice");
  ncclComm_t c = init(fresh_id(), 1, 0);
  cudaStream_t s = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  void* d = nullptr;
  void* spare = nullptr;
  check_cuda(cudaMalloc(&d, 64), "cudaMalloc");
  check_cuda(cudaMalloc(&spare, 64), "cudaMalloc");
  ncclAllReduce(d, d, 16, ncclFloat32, ncclSum, c, s);
  if (wait_ready(c) != ncclSuccess) fail("the launch");  // now the kernel is on the stream
  std::atomic<bool> freed{false};
  std::thread t([&] {
    cudaSetDevice(0);
    cudaFree(spare);
    freed = true;
  });
  std::this_thread::sleep_for(300ms);
  say("cudaFree returned within 300 ms: %d", freed.load() ? 1 : 0);
  ncclCommAbort(c);
  const auto until = clock::now() + 5s;
  while (!freed && clock::now() < until) std::this_thread::sleep_for(1ms);
  say("cudaFree returned after abort: %d", freed.load() ? 1 : 0);
  t.join();
  cudaFree(d);
  cudaStreamDestroy(s);
  say("done");
  return 0;
}

// ELASTIC_NCCL_MODEL_HANG_OP=1: aborting communicator B while A's kernel hangs on the same GPU.
// NCCL < 2.28 frees with cudaFree there and never returns; 2.28 and later do.
int abort_beside_stuck_kernel(const args&) {
  check_cuda(cudaSetDevice(0), "cudaSetDevice");
  ncclComm_t a = init(fresh_id(), 1, 0);
  ncclComm_t b = init(fresh_id(), 1, 0);
  cudaStream_t s = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  void* d = nullptr;
  check_cuda(cudaMalloc(&d, 64), "cudaMalloc");
  ncclAllReduce(d, d, 16, ncclFloat32, ncclSum, a, s);  // hangs
  if (wait_ready(a) != ncclSuccess) fail("the launch");
  std::atomic<bool> done{false};
  std::thread t([&] {
    cudaSetDevice(0);
    ncclCommAbort(b);
    done = true;
  });
  const auto until = clock::now() + 1s;
  while (!done && clock::now() < until) std::this_thread::sleep_for(1ms);
  if (!done) {
    say("abort-blocked");
    wait_for_test();  // the test kills this process: the deadlock is the point
  }
  say("abort-returned");
  t.join();
  ncclCommAbort(a);
  cudaFree(d);
  cudaStreamDestroy(s);
  say("done");
  return 0;
}

// Bootstrap roots: a failed round leaks its root; a second check-in of one rank ends it early.
int roots(const args&) {
  check_cuda(cudaSetDevice(0), "cudaSetDevice");
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const ncclUniqueId first = fresh_id();
  ncclComm_t lonely = nullptr;
  ncclCommInitRankConfig(&lonely, 2, first, 0, &config);  // rank 1 never comes
  std::this_thread::sleep_for(100ms);
  ncclCommAbort(lonely);
  say("roots after a failed round: %d", elastic_nccl_model_live_roots());

  const ncclUniqueId second = fresh_id();
  say("roots with a fresh id: %d", elastic_nccl_model_live_roots());
  ncclComm_t one = nullptr, twice = nullptr;
  ncclCommInitRankConfig(&one, 2, second, 0, &config);
  ncclCommInitRankConfig(&twice, 2, second, 0, &config);  // rank 0 again: the root gives up
  const auto until = clock::now() + 5s;
  while (elastic_nccl_model_live_roots() > 1 && clock::now() < until) std::this_thread::sleep_for(1ms);
  say("roots after a rank checked in twice: %d", elastic_nccl_model_live_roots());
  say("lasterror: %s", ncclGetLastError(nullptr));
  std::this_thread::sleep_for(100ms);
  ncclResult_t s1 = ncclSuccess, s2 = ncclSuccess;
  ncclCommGetAsyncError(one, &s1);
  ncclCommGetAsyncError(twice, &s2);
  say("both still in progress: %d", s1 == ncclInProgress && s2 == ncclInProgress ? 1 : 0);
  ncclCommAbort(one);
  ncclCommAbort(twice);

  const ncclUniqueId third = fresh_id();
  ncclComm_t of2 = nullptr, of3 = nullptr;
  ncclCommInitRankConfig(&of2, 2, third, 0, &config);
  std::this_thread::sleep_for(50ms);
  ncclCommInitRankConfig(&of3, 3, third, 1, &config);  // another size: the root gives up
  const auto until2 = clock::now() + 5s;
  while (elastic_nccl_model_live_roots() > 1 && clock::now() < until2) std::this_thread::sleep_for(1ms);
  say("roots after a size mismatch: %d", elastic_nccl_model_live_roots());
  say("lasterror: %s", ncclGetLastError(nullptr));
  ncclCommAbort(of2);
  ncclCommAbort(of3);
  say("done");
  return 0;
}

// ELASTIC_NCCL_MODEL_FAIL_SHRINK=1 and _FAIL_REVOKE=1, on a two-rank communicator in one process.
int injected(const args&) {
  const ncclUniqueId id = fresh_id();
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t c0 = nullptr, c1 = nullptr;
  cudaSetDevice(0);
  ncclCommInitRankConfig(&c0, 2, id, 0, &config);
  cudaSetDevice(1);
  ncclCommInitRankConfig(&c1, 2, id, 1, &config);
  if (wait_ready(c0) != ncclSuccess || wait_ready(c1) != ncclSuccess) fail("init");
  cudaSetDevice(0);
  int exclude[1] = {1};
  ncclComm_t child = nullptr;
  expect("shrink starts", ncclCommShrink(c0, exclude, 1, &child, nullptr, NCCL_SHRINK_DEFAULT), ncclSuccess);
  expect("the parent fails, sticky", wait_ready(c0), ncclSystemError);
  expect("newcomm stays NULL", load_comm(&child) == nullptr ? 1 : 0, 1);
  say("%s lasterror names the injection", contains(ncclGetLastError(c0), "injected") ? "ok" : "bad");
  if (symbol<revoke_fn>("ncclCommRevoke") != nullptr) expect("revoke fails", revoke(c0), ncclInternalError);
  ncclCommAbort(c0);
  ncclCommAbort(c1);
  say("done");
  return 0;
}

// A collective on a non-blocking communicator returns ncclInProgress and the communicator stays in
// progress until ncclCommGetAsyncError is asked (rc=0 and ELASTIC_NCCL_MODEL_ASYNC_LAUNCH=0: not).
int async_launch(const args& a) {
  const ncclResult_t launch = static_cast<ncclResult_t>(a.num("rc", ncclInProgress));
  check_cuda(cudaSetDevice(0), "cudaSetDevice");
  ncclComm_t nb = init(fresh_id(), 1, 0, /*blocking=*/false);
  ncclComm_t b = init(fresh_id(), 1, 0, /*blocking=*/true);
  cudaStream_t s = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  void* d = nullptr;
  check_cuda(cudaMalloc(&d, 64), "cudaMalloc");
  expect("a collective returns ncclInProgress", ncclAllReduce(d, d, 16, ncclFloat32, ncclSum, nb, s), launch);
  expect("polled, the launch is done", wait_ready(nb), ncclSuccess);
  expect("the next collective may follow", ncclAllReduce(d, d, 16, ncclFloat32, ncclSum, nb, s), launch);
  expect("polled again", wait_ready(nb), ncclSuccess);
  expect("a blocking communicator is not affected", ncclAllReduce(d, d, 16, ncclFloat32, ncclSum, b, s), ncclSuccess);
  expect("all ran", wait_stream(s) ? 1 : 0, 1);
  ncclCommAbort(nb);
  ncclCommAbort(b);
  cudaFree(d);
  cudaStreamDestroy(s);
  say("done");
  return 0;
}

// What the loaded libnccl is: its version and which of the newer calls it exports.
int version(const args&) {
  int v = 0;
  ncclGetVersion(&v);
  say("version %d revoke=%d shrink=%d grow=%d getuniqueid=%d", v, symbol<void*>("ncclCommRevoke") != nullptr,
      symbol<void*>("ncclCommShrink") != nullptr, symbol<void*>("ncclCommGrow") != nullptr,
      symbol<void*>("ncclCommGetUniqueId") != nullptr);
  return 0;
}

}  // namespace

int run_single(const std::string& scenario, const args& a) {
  if (scenario == "init-nonblocking") return init_nonblocking(a);
  if (scenario == "arguments") return arguments(a);
  if (scenario == "revoke-hang") return revoke_hang(a);
  if (scenario == "fail-op") return fail_op(a);
  if (scenario == "cudafree-blocks") return cuda_free_blocks(a);
  if (scenario == "abort-beside-stuck-kernel") return abort_beside_stuck_kernel(a);
  if (scenario == "roots") return roots(a);
  if (scenario == "injected") return injected(a);
  if (scenario == "version") return version(a);
  if (scenario == "async-launch") return async_launch(a);
  return -1;
}

}  // namespace probe
