// The CUDA model's internal interface: what the C API in memory.cpp/streams.cpp/cuda_state.cpp
// is built on, and what the NCCL model calls directly (it never goes through the C API, so its
// calls are not checked as a user's would be).
//
// Device memory is host memory the caller cannot touch: cudaMalloc hands out an address inside
// a PROT_NONE reservation (a host dereference faults, as on a real GPU without HMM) and keeps the
// bytes in a separate heap buffer that only streams reach, through locate().
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "util.hpp"

namespace nccl_model::cuda {

// ---- threads (cuda_state.cpp) ----------------------------------------------------------------

/// The calling thread's current device (0 if it never called cudaSetDevice).
NCCL_MODEL_EXPORT int current_device() noexcept;
/// Whether the calling thread called cudaSetDevice successfully.
NCCL_MODEL_EXPORT bool device_was_set() noexcept;
/// Marks the calling thread as the model's own: exempt from the no-device rule.
NCCL_MODEL_EXPORT void mark_internal_thread() noexcept;
/// ELASTIC_NCCL_MODEL_GPUS (default 1).
NCCL_MODEL_EXPORT int device_count() noexcept;
/// Checks the CUDA contract rules for API call `api` (aborts on a violation): never from a host
/// function; unless `context_free`, only from a thread that set its device.
NCCL_MODEL_EXPORT void enter_api(const char* api, bool context_free) noexcept;
/// Records `e` as the thread's last error and returns it.
NCCL_MODEL_EXPORT cudaError_t fail(cudaError_t e) noexcept;
/// Marks the calling thread as running a host function (cudaLaunchHostFunc) or not.
NCCL_MODEL_EXPORT void set_in_host_function(bool on) noexcept;

// ---- memory (memory.cpp) ---------------------------------------------------------------------

enum class memory_kind { pageable, device, pinned, managed };

/// Where a pointer lives: for registered memory, the allocation it is in; `host` is where the
/// model may read and write those bytes, `bytes_left` how many follow `host` in the allocation.
struct region {
  memory_kind kind = memory_kind::pageable;
  int device = -1;
  std::byte* host = nullptr;
  std::size_t bytes_left = 0;
};

/// What `p` points into. Pageable (unregistered) memory is itself, with SIZE_MAX bytes left.
NCCL_MODEL_EXPORT region locate(const void* p) noexcept;

// ---- streams (streams.cpp) -------------------------------------------------------------------

class stream;

/// The stream behind handle `s` for `api`: nullptr/cudaStreamLegacy/cudaStreamPerThread is the
/// legacy stream of `device`. A destroyed handle is a contract violation; an unknown one gives
/// nullptr and `*err` = cudaErrorInvalidResourceHandle.
NCCL_MODEL_EXPORT std::shared_ptr<stream> resolve_stream(cudaStream_t s, int device, const char* api,
                                                         cudaError_t* err) noexcept;
/// The device a stream belongs to.
NCCL_MODEL_EXPORT int stream_device(const stream& s) noexcept;
/// Enqueues `work` on `s` with the legacy-stream ordering rules of CUDA (see streams.cpp); returns
/// its position, for wait_for().
NCCL_MODEL_EXPORT std::uint64_t enqueue(const std::shared_ptr<stream>& s, std::function<void()> work);
/// Waits until `s` has finished the work at position `seq` and everything before it.
NCCL_MODEL_EXPORT void wait_for(const std::shared_ptr<stream>& s, std::uint64_t seq);
/// Waits until every stream of `device` has finished what was enqueued on it before this call
/// (what cudaFree does first).
NCCL_MODEL_EXPORT void synchronize_device(int device);
/// Whether every stream of `device` has nothing unfinished.
NCCL_MODEL_EXPORT bool device_idle(int device);

}  // namespace nccl_model::cuda
