// The CUDA runtime calls the library makes (checkpoint snapshots, NCCL groups), as RAII types:
// the one CUDA RAII set of the library (streams, events, the current device, device memory) and
// the one function that turns a failed CUDA call into an elastic::error (errc::device_error).
// In a build without CUDA (ELASTIC_WITH_CUDA=0) the types exist with the same shape and the
// device operations throw, so the callers compile one way and the CPU path is what runs.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>

#include <elastic/config.hpp>
#include <elastic/error.hpp>

#if ELASTIC_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace elastic::inline v1::internal::cuda {

#if ELASTIC_WITH_CUDA
using stream_t = cudaStream_t;
using event_t = cudaEvent_t;

/// The error for a failed CUDA call: "`prefix``where` failed: `label``name`: `text`". The two
/// prefix/label shapes are the two message forms callers (and their tests) rely on: check()'s
/// "CUDA: cudaMemcpy failed: NAME: TEXT" and the NCCL groups' "WHERE failed: CUDA NAME: TEXT".
inline error failure(cudaError_t rc, std::string_view where, std::string_view prefix = {},
                     std::string_view label = "CUDA ") {
  std::string m(prefix);
  m.append(where).append(" failed: ").append(label).append(cudaGetErrorName(rc)).append(": ");
  m.append(cudaGetErrorString(rc));
  return error(errc::device_error, std::move(m));
}

/// Throws failure() for `rc` unless it is cudaSuccess.
inline void check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) throw failure(rc, what, "CUDA: ", "");
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
  /// Takes ownership of `s`, a stream the caller made: destroyed with this object.
  static stream adopt(stream_t s) noexcept {
    stream r;
    r.s_ = s;
    return r;
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
  /// Whether the work this event captured has finished; a CUDA error throws.
  [[nodiscard]] bool query() const {
#if ELASTIC_WITH_CUDA
    const cudaError_t rc = cudaEventQuery(e_);
    if (rc == cudaErrorNotReady) return false;
    check(rc, "cudaEventQuery");
    return true;
#else
    unavailable("cudaEventQuery");
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

/// Synchronous device-to-host copy (an elastic group moving a device slice).
inline void copy_to_host(void* dst, const void* src, std::size_t n) {
#if ELASTIC_WITH_CUDA
  check(cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost), "cudaMemcpy device to host");
#else
  (void)dst, (void)src, (void)n;
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

/// Makes `device` current for this thread, and the previous one again on leaving. It always
/// calls cudaSetDevice, even when cudaGetDevice already says `device`: a thread that never set a
/// device reads 0 there, and a CUDA call from it would open a context on GPU 0 of every rank (a
/// reaper or copier thread of a rank on GPU 3, say). The previous device is restored only when it
/// differs, for the same reason.
class device_scope {
 public:
  explicit device_scope(int device) {
#if ELASTIC_WITH_CUDA
    if (cudaError_t rc = cudaGetDevice(&previous_); rc != cudaSuccess) throw failure(rc, "cudaGetDevice");
    if (cudaError_t rc = cudaSetDevice(device); rc != cudaSuccess) {
      throw failure(rc, "cudaSetDevice(" + std::to_string(device) + ")");
    }
    restore_ = previous_ != device;
#else
    (void)device;
    unavailable("cudaSetDevice");
#endif
  }
  device_scope(const device_scope&) = delete;
  device_scope& operator=(const device_scope&) = delete;
  ~device_scope() {
#if ELASTIC_WITH_CUDA
    if (restore_) cudaSetDevice(previous_);
#endif
  }

 private:
  int previous_ = 0;
  bool restore_ = false;
};

/// device_scope for teardown paths, which must not throw: switches to `device` if CUDA lets it,
/// and back to the previous device when that differed.
class device_switch {
 public:
  explicit device_switch(int device) noexcept {
#if ELASTIC_WITH_CUDA
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = device;
    restore_ = cudaSetDevice(device) == cudaSuccess && previous_ != device;
#else
    (void)device;
#endif
  }
  device_switch(const device_switch&) = delete;
  device_switch& operator=(const device_switch&) = delete;
  ~device_switch() {
#if ELASTIC_WITH_CUDA
    if (restore_) cudaSetDevice(previous_);
#endif
  }

 private:
  int previous_ = 0;
  bool restore_ = false;
};

/// Makes `device` current for the rest of this thread's life, for threads of our own (a copier):
/// never throws; false when CUDA refused.
inline bool adopt_device(int device) noexcept {
#if ELASTIC_WITH_CUDA
  return cudaSetDevice(device) == cudaSuccess;
#else
  (void)device;
  return false;
#endif
}

/// The device current on this thread (0 where CUDA cannot say, or in a build without CUDA).
inline int current_device() noexcept {
#if ELASTIC_WITH_CUDA
  int d = 0;
  return cudaGetDevice(&d) == cudaSuccess ? d : 0;
#else
  return 0;
#endif
}

/// Device memory of our own (a barrier word, host staging), freed on destruction.
class device_bytes {
 public:
  device_bytes() = default;
  explicit device_bytes(std::size_t bytes) {
#if ELASTIC_WITH_CUDA
    if (cudaError_t rc = cudaMalloc(&p_, bytes); rc != cudaSuccess) {
      throw failure(rc, "cudaMalloc(" + std::to_string(bytes) + " bytes)");
    }
#else
    (void)bytes;
    unavailable("cudaMalloc");
#endif
  }
  device_bytes(device_bytes&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  device_bytes& operator=(device_bytes&& o) noexcept {
    std::swap(p_, o.p_);
    return *this;
  }
  ~device_bytes() {
#if ELASTIC_WITH_CUDA
    if (p_ != nullptr) cudaFree(p_);
#endif
  }
  [[nodiscard]] void* get() const noexcept { return p_; }

 private:
  void* p_ = nullptr;
};

}  // namespace elastic::inline v1::internal::cuda
