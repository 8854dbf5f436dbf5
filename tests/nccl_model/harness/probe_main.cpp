#include <cstring>
#include <iostream>

#include "probe.hpp"

namespace probe {

std::string wait_for_test() {
  std::string l;
  if (!std::getline(std::cin, l)) std::exit(4);  // the test went away
  return l;
}

std::string hex(const void* p, std::size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (std::size_t i = 0; i < n; ++i) {
    const auto b = static_cast<const unsigned char*>(p)[i];
    s += digits[b >> 4];
    s += digits[b & 15];
  }
  return s;
}

ncclUniqueId id_from_hex(const std::string& h) {
  ncclUniqueId id;
  std::memset(&id, 0, sizeof id);
  for (std::size_t i = 0; i + 1 < h.size() && i / 2 < sizeof id.internal; i += 2) {
    id.internal[i / 2] = static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16));
  }
  return id;
}

std::uint64_t digest(const void* p, std::size_t n) {
  std::uint64_t h = 1469598103934665603ULL;  // FNV-1a
  for (std::size_t i = 0; i < n; ++i) h = (h ^ static_cast<const unsigned char*>(p)[i]) * 1099511628211ULL;
  return h;
}

ncclResult_t wait_ready(ncclComm_t c, std::chrono::milliseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  ncclResult_t state = ncclInProgress;
  for (;;) {
    if (ncclCommGetAsyncError(c, &state) != ncclSuccess) fail("ncclCommGetAsyncError failed");
    if (state != ncclInProgress || std::chrono::steady_clock::now() >= until) return state;
    std::this_thread::sleep_for(1ms);
  }
}

ncclComm_t init(const ncclUniqueId& id, int nranks, int rank, bool blocking) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = blocking ? 1 : 0;
  ncclComm_t c = nullptr;
  const ncclResult_t r = ncclCommInitRankConfig(&c, nranks, id, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) fail(std::string("init: ") + ncclGetErrorString(r));
  if (const ncclResult_t s = wait_ready(c); s != ncclSuccess) {
    fail(std::string("init state: ") + ncclGetErrorString(s) + ": " + ncclGetLastError(c));
  }
  return c;
}

bool wait_stream(cudaStream_t s, std::chrono::milliseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  for (;;) {
    const cudaError_t q = cudaStreamQuery(s);
    if (q == cudaSuccess) return true;
    if (q != cudaErrorNotReady) fail(std::string("cudaStreamQuery: ") + cudaGetErrorName(q));
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(1ms);
  }
}

ncclResult_t revoke(ncclComm_t c) {
  auto fn = symbol<revoke_fn>("ncclCommRevoke");
  if (fn == nullptr) fail("this libnccl has no ncclCommRevoke");
  return fn(c, NCCL_REVOKE_DEFAULT);
}

}  // namespace probe

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: nccl_model_probe SCENARIO [key=value...]\n");
    return 2;
  }
  probe::args a;
  for (int i = 2; i < argc; ++i) {
    const std::string s = argv[i];
    const auto eq = s.find('=');
    a.kv[s.substr(0, eq)] = eq == std::string::npos ? "" : s.substr(eq + 1);
  }
  const std::string scenario = argv[1];
  for (auto* run : {probe::run_ranks, probe::run_single, probe::run_contract, probe::run_cuda}) {
    if (const int rc = run(scenario, a); rc >= 0) return rc;
  }
  std::fprintf(stderr, "nccl_model_probe: unknown scenario '%s'\n", scenario.c_str());
  return 2;
}
