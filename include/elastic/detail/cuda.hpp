// The CUDA runtime calls the library makes (checkpoint snapshots, NCCL groups), as RAII types.
// In a build without CUDA (ELASTIC_WITH_CUDA=0) the types exist with the same shape and the
// device operations throw, so the callers compile one way and the CPU path is what runs.
#pragma once

#include <cstddef>
#include <string>
#include <utility>

#include <elastic/config.hpp>
#include <elastic/error.hpp>

#if ELASTIC_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace elastic::detail::cuda {

#if ELASTIC_WITH_CUDA
using stream_t = cudaStream_t;
using event_t = cudaEvent_t;

inline void check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) {
    throw error(errc::device_error, std::string("CUDA: ") + what + " failed: " + cudaGetErrorName(rc) + ": " +
                                        cudaGetErrorString(rc));
  }
}
#else
using stream_t = void*;
using event_t = void*;

[[noreturn]] inline void unavailable(const char* what) {
  throw error(errc::not_supported,
              std::string("CUDA: ") + what + " needs a build with CUDA (link elastic::cuda, ELASTIC_WITH_CUDA=1)");
}
#endif

inline constexpr bool available = ELASTIC_WITH_CUDA != 0;

/// A non-blocking stream of our own: the snapshot copies run on it, beside the user's work.
class stream {
 public:
  stream() = default;
  static stream create() {
    stream s;
#if ELASTIC_WITH_CUDA
    check(cudaStreamCreateWithFlags(&s.s_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
#else
    unavailable("a side stream");
#endif
    return s;
  }
  stream(stream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  stream& operator=(stream&& o) noexcept {
    std::swap(s_, o.s_);
    return *this;
  }
  ~stream() {
#if ELASTIC_WITH_CUDA
    if (s_) cudaStreamDestroy(s_);
#endif
  }
  [[nodiscard]] stream_t get() const noexcept { return s_; }
  explicit operator bool() const noexcept { return s_ != nullptr; }

 private:
  stream_t s_ = nullptr;
};

/// An event without timing (cheaper to record and wait on).
class event {
 public:
  event() = default;
  static event create() {
    event e;
#if ELASTIC_WITH_CUDA
    check(cudaEventCreateWithFlags(&e.e_, cudaEventDisableTiming), "cudaEventCreateWithFlags");
#else
    unavailable("an event");
#endif
    return e;
  }
  event(event&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  event& operator=(event&& o) noexcept {
    std::swap(e_, o.e_);
    return *this;
  }
  ~event() {
#if ELASTIC_WITH_CUDA
    if (e_) cudaEventDestroy(e_);
#endif
  }
  [[nodiscard]] event_t get() const noexcept { return e_; }
  explicit operator bool() const noexcept { return e_ != nullptr; }

  void record(stream_t s) {
#if ELASTIC_WITH_CUDA
    check(cudaEventRecord(e_, s), "cudaEventRecord");
#else
    (void)s;
    unavailable("cudaEventRecord");
#endif
  }
  void synchronize() const {
#if ELASTIC_WITH_CUDA
    check(cudaEventSynchronize(e_), "cudaEventSynchronize");
#else
    unavailable("cudaEventSynchronize");
#endif
  }
  /// Makes `s` wait on the GPU for this event: no host stall.
  void make_wait(stream_t s) const {
#if ELASTIC_WITH_CUDA
    check(cudaStreamWaitEvent(s, e_, 0), "cudaStreamWaitEvent");
#else
    (void)s;
    unavailable("cudaStreamWaitEvent");
#endif
  }

 private:
  event_t e_ = nullptr;
};

inline void copy_to_host_async(void* dst, const void* src, std::size_t n, stream_t s) {
#if ELASTIC_WITH_CUDA
  check(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync device to host");
#else
  (void)dst, (void)src, (void)n, (void)s;
  unavailable("a device-to-host copy");
#endif
}

/// Synchronous host-to-device copy, used on restore (from pinned staging).
inline void copy_to_device(void* dst, const void* src, std::size_t n) {
#if ELASTIC_WITH_CUDA
  check(cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice), "cudaMemcpy host to device");
#else
  (void)dst, (void)src, (void)n;
  unavailable("a host-to-device copy");
#endif
}

}  // namespace elastic::detail::cuda
