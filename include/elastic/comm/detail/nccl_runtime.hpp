// What the NCCL backend asks of the libnccl this process runs with: its version, the calls newer
// than the headers' minimum (looked up with dlsym, never linked), which of the recovery calls the
// group may use with it, the process-wide lock every NCCL call goes through, how a failed call
// maps to an elastic::error, and the NCCL type of each reducible element. Needs ELASTIC_WITH_NCCL.
//
// A program built against new headers often runs with an older library (a PyTorch wheel's, say),
// and a call to a symbol that library lacks would end the process: so ncclCommShrink (2.27),
// ncclCommRevoke (2.28.7) and ncclCommGrow/ncclCommGetUniqueId (2.29.2) are found at run time, and
// are nullptr where the library predates them. The grow calls are declared here because headers
// before 2.29 do not declare them; their signatures are those of NCCL 2.29.2 .. 2.30.7.
#pragma once

#include <elastic/config.hpp>

#if !ELASTIC_WITH_NCCL
#error "elastic/comm/detail/nccl_runtime.hpp needs NCCL: link elastic::nccl (which sets ELASTIC_WITH_NCCL=1)"
#endif

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>

#include <dlfcn.h>

#include <fmt/format.h>
#include <nccl.h>

#include <elastic/comm/half.hpp>
#include <elastic/error.hpp>
#include <elastic/internal/env.hpp>

namespace elastic::inline v1::comm::detail {

/// `name` in the libnccl this process runs with, or nullptr where that library predates it.
inline void* nccl_symbol(const char* name) noexcept {
  // The library that holds ncclGetVersion (found through the address we link against), so that
  // an NCCL loaded RTLD_LOCAL is searched too.
  static void* const library = [] {
    Dl_info info{};
    void* handle = nullptr;
    if (::dladdr(reinterpret_cast<void*>(&ncclGetVersion), &info) != 0 && info.dli_fname != nullptr) {
      handle = ::dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
    }
    return handle != nullptr ? handle : RTLD_DEFAULT;
  }();
  return ::dlsym(library, name);
}

/// The version of the libnccl this process runs with (2.28.3 is 22803), 0 if it cannot say.
inline int nccl_runtime_version() noexcept {
  int v = 0;
  return ncclGetVersion(&v) == ncclSuccess ? v : 0;
}

/// NCCL's own version code for a release (its NCCL_VERSION macro, usable where headers are old).
constexpr int nccl_version_code(int major, int minor, int patch) noexcept {
  return major <= 2 && minor <= 8 ? major * 1000 + minor * 100 + patch : major * 10000 + minor * 100 + patch;
}

/// "2.28.9" for 22809.
inline std::string nccl_version_string(int code) {
  if (code >= 10000) return fmt::format("{}.{}.{}", code / 10000, code / 100 % 100, code % 100);
  return fmt::format("{}.{}.{}", code / 1000, code / 100 % 10, code % 100);
}

using nccl_shrink_t = ncclResult_t (*)(ncclComm_t, int*, int, ncclComm_t*, ncclConfig_t*, int);
using nccl_revoke_t = ncclResult_t (*)(ncclComm_t, int);
using nccl_grow_t = ncclResult_t (*)(ncclComm_t, int, const ncclUniqueId*, int, ncclComm_t*, ncclConfig_t*);
using nccl_comm_unique_id_t = ncclResult_t (*)(ncclComm_t, ncclUniqueId*);

inline nccl_shrink_t nccl_shrink_fn() noexcept {
  static const auto fn = reinterpret_cast<nccl_shrink_t>(nccl_symbol("ncclCommShrink"));
  return fn;
}
inline nccl_revoke_t nccl_revoke_fn() noexcept {
  static const auto fn = reinterpret_cast<nccl_revoke_t>(nccl_symbol("ncclCommRevoke"));
  return fn;
}
inline nccl_grow_t nccl_grow_fn() noexcept {
  static const auto fn = reinterpret_cast<nccl_grow_t>(nccl_symbol("ncclCommGrow"));
  return fn;
}
inline nccl_comm_unique_id_t nccl_comm_unique_id_fn() noexcept {
  static const auto fn = reinterpret_cast<nccl_comm_unique_id_t>(nccl_symbol("ncclCommGetUniqueId"));
  return fn;
}

// The shrink flags as NCCL 2.27+ defines them, for headers that predate them.
inline constexpr int nccl_shrink_default = 0x00;
inline constexpr int nccl_shrink_abort = 0x01;
// ncclCommRevoke's only flag (2.28.7+).
inline constexpr int nccl_revoke_default = 0x00;

/// Which recovery calls the group may use with the libnccl this process runs with, and why not
/// where it may not. Decided once per process.
struct nccl_recovery_calls {
  int version = 0;       ///< the loaded library's version code
  bool revoke = false;   ///< ncclCommRevoke (2.28.7)
  bool shrink = false;   ///< ncclCommShrink (2.27)
  bool grow = false;     ///< ncclCommGrow + ncclCommGetUniqueId (2.29.2)
  std::string warning;   ///< why a call the library has is not used, for the group's event log
  /// Departures are shrunk only in worlds of at least this many ranks; smaller ones re-initialise.
  /// A shrink must wait for the revoked parent to drain (~580 ms on an H200 with 2.28.9: the
  /// revoke's job joins NCCL's proxy thread, which sleeps in 500 ms polls), while a fresh init of
  /// a few ranks took 10-40 ms there; at scale a fresh init costs seconds (NVIDIA/nccl#2397: ~1.3 s
  /// against 60-70 ms for a shrink on A100s over RoCE).
  int shrink_from_world = 9;
};

/// Whether more than one RDMA NIC is visible: ncclCommShrink before 2.30.7 breaks the survivors'
/// IB transport on such hosts when the excluded ranks exit without calling it (NVIDIA/nccl#2397).
inline bool several_rdma_nics() noexcept {
  std::error_code ec;
  int n = 0;
  for (std::filesystem::directory_iterator it("/sys/class/infiniband", ec), end; !ec && it != end; it.increment(ec)) {
    ++n;
  }
  return n > 1;
}

/// The decision for `version` and the symbols found, with the known-bad releases gated:
/// - 2.28.3 .. 2.28.8: NVIDIA's own in-process restart (NVRx) refuses them; here the group
///   gives up revoke/shrink/grow and rebuilds by abort + a fresh init.
/// - below 2.30.7 on a host with several RDMA NICs: shrink is not used (nccl#2397).
/// ELASTIC_NCCL_RECOVERY=reinit turns every in-place call off (for measuring, or a distrust);
/// =inplace shrinks departures whatever the world size (auto: from shrink_from_world ranks).
inline nccl_recovery_calls decide_recovery_calls(int version, bool has_revoke, bool has_shrink, bool has_grow,
                                                 bool multi_nic, std::string_view forced) {
  nccl_recovery_calls c;
  c.version = version;
  c.revoke = has_revoke && version >= nccl_version_code(2, 28, 7);
  c.shrink = has_shrink && version >= nccl_version_code(2, 27, 0);
  c.grow = has_grow && version >= nccl_version_code(2, 29, 2);
  if (forced == "inplace") c.shrink_from_world = 0;
  if (forced == "reinit") {
    c = {version, false, false, false, "ELASTIC_NCCL_RECOVERY=reinit: every rebuild is a fresh init"};
    return c;
  }
  if (version >= nccl_version_code(2, 28, 3) && version <= nccl_version_code(2, 28, 8)) {
    c = {version, false, false, false,
         fmt::format("NCCL {} is in 2.28.3..2.28.8, which NVIDIA's in-process restart (NVRx) refuses: revoke, "
                     "shrink and grow are not used, every rebuild is an abort and a fresh init; use 2.28.9 or newer",
                     nccl_version_string(version))};
    return c;
  }
  if (c.shrink && multi_nic && version < nccl_version_code(2, 30, 7)) {
    c.shrink = false;
    c.warning = fmt::format("NCCL {} on a host with several RDMA NICs: ncclCommShrink before 2.30.7 can break the "
                            "survivors' transport (NVIDIA/nccl#2397), so departures are rebuilt by a fresh init",
                            nccl_version_string(version));
  }
  return c;
}

/// The decision for this process (computed once).
inline const nccl_recovery_calls& recovery_calls() {
  static const nccl_recovery_calls c = [] {
    const auto forced = internal::env_string("ELASTIC_NCCL_RECOVERY").value_or("auto");
    if (forced != "auto" && forced != "reinit" && forced != "inplace") {
      throw error(errc::invalid_argument,
                  fmt::format("ELASTIC_NCCL_RECOVERY='{}': use 'auto' (revoke/shrink/grow where the libnccl has "
                              "them, departures shrunk from 9 ranks on), 'inplace' (shrink at any size) or "
                              "'reinit' (a fresh init for every rebuild)",
                              forced));
    }
    return decide_recovery_calls(nccl_runtime_version(), nccl_revoke_fn() != nullptr, nccl_shrink_fn() != nullptr,
                                 nccl_grow_fn() != nullptr && nccl_comm_unique_id_fn() != nullptr,
                                 several_rdma_nics(), forced);
  }();
  return c;
}

/// Every NCCL call of the library holds this lock: NCCL forbids two threads inside one
/// communicator, any call while ncclCommAbort runs, and issuing operations to communicators of one
/// device from several threads at once; all our calls are non-blocking (microseconds), so one
/// process-wide lock is the simple way to keep these rules while watcher threads poll. The one
/// exception, the abort of a settled communicator (abort_settled), is explained there. It is
/// process-wide state because the library it guards is. Recursive: building an error message
/// asks NCCL for its last error under the same lock.
inline std::recursive_mutex& nccl_api_mutex() noexcept {
  static std::recursive_mutex m;
  return m;
}

/// Calls `f()` under nccl_api_mutex().
template <class F>
auto nccl_call(F&& f) -> decltype(f()) {
  std::lock_guard lk(nccl_api_mutex());
  return std::forward<F>(f)();
}

/// NCCL_COMM_BLOCKING=1 overrides config.blocking = 0 (src/init.cc parseCommConfig): every call
/// would then block inside NCCL, outside any deadline of ours. Refused before a communicator is made.
inline void refuse_blocking_environment(std::string_view where) {
  const auto v = internal::env_string("NCCL_COMM_BLOCKING");
  if (!v || v->empty() || *v == "0") return;
  throw error(errc::invalid_argument,
              fmt::format("{}: NCCL_COMM_BLOCKING={} makes NCCL block inside init, shrink and every collective, where "
                          "no deadline of elastic's can end the wait: unset it (elastic makes non-blocking "
                          "communicators and polls them)",
                          where, *v));
}

/// The code a failed NCCL call maps to, with the advice a person can act on.
inline std::pair<errc, std::string_view> classify(ncclResult_t r) noexcept {
  switch (r) {
    case ncclInvalidArgument:
      return {errc::invalid_argument, "a call was malformed (a bad pointer, count, rank or device): fix the caller"};
    case ncclInvalidUsage:
      return {errc::invalid_argument, "NCCL was used against its rules (its guide: the communicator must then be "
                                      "aborted): the communicator is given up"};
    // NCCL gives no errno, and reports a peer's death as a system (socket) or internal error as
    // often as a remote one: to the caller all three mean the same, this communicator is lost.
    case ncclRemoteError:
      return {errc::peer_lost, "a peer failed or went away: give this communicator up and build the next one "
                               "(shrink() without the dead ranks, or a new nccl_unique_id())"};
    case ncclSystemError:
      return {errc::peer_lost, "a system call or the network failed: give this communicator up and build the next one"};
    case ncclUnhandledCudaError:
      return {errc::device_error, "a CUDA call failed inside NCCL: check the device with nvidia-smi, then rebuild"};
    default:
      return {errc::peer_lost, "give this communicator up and build the next one"};
  }
}

/// Whether a failed call leaves the communicator usable: only a malformed argument does. Any
/// other result, ncclInvalidUsage included (the guide: abort the communicator), breaks it.
constexpr bool leaves_usable(ncclResult_t r) noexcept { return r == ncclInvalidArgument; }

/// An elastic::error for result `r` of `what`, with NCCL's own texts.
inline error nccl_failure(ncclResult_t r, std::string_view where, ncclComm_t comm) {
  const auto [code, advice] = classify(r);
  const char* last = nccl_call([&] { return ncclGetLastError(comm); });
  return error(code, fmt::format("{} failed: NCCL {} ({}); last NCCL error: '{}'; {}", where, ncclGetErrorString(r),
                                 static_cast<int>(r), last != nullptr ? last : "", advice));
}

template <class T>
constexpr ncclDataType_t nccl_type() noexcept {
  if constexpr (std::is_same_v<T, float>) return ncclFloat32;
  else if constexpr (std::is_same_v<T, double>) return ncclFloat64;
  else if constexpr (std::is_same_v<T, std::int32_t>) return ncclInt32;
  else if constexpr (std::is_same_v<T, std::int64_t>) return ncclInt64;
  else if constexpr (std::is_same_v<T, float16>) return ncclFloat16;
  else return ncclBfloat16;  // nccl.h declares it for CUDA >= 11, which elastic::cuda requires
}

}  // namespace elastic::inline v1::comm::detail
