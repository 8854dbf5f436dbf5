// What the NCCL backend asks of the libnccl this process runs with: its version, the calls newer
// than the headers' minimum (looked up with dlsym, never linked), how a failed call maps to an
// elastic::error, and the NCCL type of each reducible element. Needs ELASTIC_WITH_NCCL.
//
// A program built against new headers often runs with an older library (a PyTorch wheel's, say),
// and a call to a symbol that library lacks would end the process: so ncclCommShrink (2.27) and
// ncclCommRevoke (2.28) are found at run time, and are nullptr where the library predates them.
#pragma once

#include <elastic/config.hpp>

#if !ELASTIC_WITH_NCCL
#error "elastic/comm/detail/nccl_runtime.hpp needs NCCL: link elastic::nccl (which sets ELASTIC_WITH_NCCL=1)"
#endif

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include <dlfcn.h>

#include <fmt/format.h>
#include <nccl.h>

#include <elastic/comm/half.hpp>
#include <elastic/error.hpp>

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

#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
inline auto nccl_shrink_fn() noexcept {
  static const auto fn = reinterpret_cast<decltype(&ncclCommShrink)>(nccl_symbol("ncclCommShrink"));
  return fn;
}
#endif
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
inline auto nccl_revoke_fn() noexcept {
  static const auto fn = reinterpret_cast<decltype(&ncclCommRevoke)>(nccl_symbol("ncclCommRevoke"));
  return fn;
}
#endif

/// The code a failed NCCL call maps to, with the advice a person can act on.
inline std::pair<errc, std::string_view> classify(ncclResult_t r) noexcept {
  switch (r) {
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return {errc::invalid_argument, "a call was malformed (a bad pointer, count, rank or device): fix the caller"};
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

/// An elastic::error for result `r` of `what`, with NCCL's own texts.
inline error nccl_failure(ncclResult_t r, std::string_view where, ncclComm_t comm) {
  const auto [code, advice] = classify(r);
  const char* last = ncclGetLastError(comm);
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
