// nccl_model_probe: the programs the NCCL model's tests run, one scenario per invocation
// ("nccl_model_probe SCENARIO key=value..."), talking to the test on a line protocol: the probe
// prints what it observed on stdout, the test answers on stdin when a scenario must wait for it
// (a peer was killed, go on). Each scenario is written against the public headers only, as the
// library is; the calls that NCCL 2.27 lacks are looked up with dlsym, so one binary runs with
// either model build.
#pragma once

#include <dlfcn.h>

#include <chrono>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <nccl_model.h>

namespace probe {

using namespace std::chrono_literals;

struct args {
  std::map<std::string, std::string> kv;
  [[nodiscard]] int num(const std::string& k, int def = 0) const {
    auto it = kv.find(k);
    return it == kv.end() ? def : std::atoi(it->second.c_str());
  }
  [[nodiscard]] std::string text(const std::string& k, const std::string& def = "") const {
    auto it = kv.find(k);
    return it == kv.end() ? def : it->second;
  }
};

/// One line on stdout, flushed at once.
__attribute__((format(printf, 1, 2))) inline void say(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::vprintf(fmt, ap);
  va_end(ap);
  std::printf("\n");
  std::fflush(stdout);
}

/// Ends the probe with exit code 3 and a reason on stdout.
[[noreturn]] inline void fail(const std::string& why) {
  say("FAIL %s", why.c_str());
  std::exit(3);
}

inline void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail(std::string(what) + ": " + cudaGetErrorName(e));
}

/// The next line the test writes to our stdin (blocks).
std::string wait_for_test();

std::string hex(const void* p, std::size_t n);
ncclUniqueId id_from_hex(const std::string& h);
std::uint64_t digest(const void* p, std::size_t n);

/// ncclCommGetAsyncError until it is not ncclInProgress (or `limit` passes: returns ncclInProgress).
ncclResult_t wait_ready(ncclComm_t c, std::chrono::milliseconds limit = 20s);
/// A non-blocking (or blocking) communicator on the current device, ready (else the probe fails).
ncclComm_t init(const ncclUniqueId& id, int nranks, int rank, bool blocking = false);
/// Waits until `s` has finished; false after `limit`.
bool wait_stream(cudaStream_t s, std::chrono::milliseconds limit = 20s);
/// Whether a collective was accepted: ncclSuccess, or ncclInProgress on a non-blocking
/// communicator (NCCL's group launch; poll ncclCommGetAsyncError before the next call).
inline bool enqueued(ncclResult_t r) { return r == ncclSuccess || r == ncclInProgress; }

/// Reads a communicator slot that a model thread may write (as real NCCL writes *newcomm).
inline ncclComm_t load_comm(ncclComm_t* slot) { return __atomic_load_n(slot, __ATOMIC_ACQUIRE); }

/// A call that NCCL 2.27 lacks, found at run time; nullptr where the library has none.
template <class F>
F symbol(const char* name) {
  return reinterpret_cast<F>(::dlsym(RTLD_DEFAULT, name));
}
using revoke_fn = ncclResult_t (*)(ncclComm_t, int);
using grow_fn = ncclResult_t (*)(ncclComm_t, int, const ncclUniqueId*, int, ncclComm_t*, ncclConfig_t*);
using grow_id_fn = ncclResult_t (*)(ncclComm_t, ncclUniqueId*);
ncclResult_t revoke(ncclComm_t c);

// Scenario groups.
int run_ranks(const std::string& scenario, const args& a);     // probe_ranks.cpp
int run_single(const std::string& scenario, const args& a);    // probe_single.cpp
int run_contract(const std::string& scenario, const args& a);  // probe_contract.cpp
int run_cuda(const std::string& scenario, const args& a);      // probe_cuda.cpp

}  // namespace probe
