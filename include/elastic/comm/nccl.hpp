// The NCCL backend: GPU collectives over device memory. Link elastic::nccl (it defines
// ELASTIC_WITH_NCCL=1 and links elastic::cuda).
//
//   // the rendezvous leader:
//   std::string blob = elastic::comm::nccl_unique_id();   // 128 bytes, published in the round
//   // every rank, with the leader's blob:
//   elastic::comm::nccl_communicator c(blob, rank, size, /*device=*/local_rank, 30s);
//   c.allreduce(std::span<float>(device_ptr, n), elastic::comm::reduce_op::avg);
//
// Every span handed to a collective views DEVICE memory on the communicator's device (cudaMalloc,
// cudaMallocManaged or a framework's tensor storage); only broadcast_host() takes host memory.
//
// Nothing here can block forever. The communicator is created non-blocking (config.blocking = 0):
// init and every collective return at once and we poll ncclCommGetAsyncError / cudaStreamQuery
// against a deadline. A watcher thread polls the asynchronous error every few milliseconds, so a
// peer's failure flips ok() false even between collectives. A collective also runs inside an
// elastic::expires(timeout + margin) scope: should NCCL itself hang in a call we cannot bound, the
// watchdog kills the process.
//
// Recovery, by what the NCCL headers declare AND the libnccl loaded at run time exports (a
// program built against new headers often runs with an older library, a PyTorch wheel's say, and
// a call to a missing symbol would end the process; so both are looked up once with dlsym):
//   ncclCommRevoke  a failed collective, or revoke(), revokes the communicator (in-flight work
//                   stops, the handle stays usable for management); shrink() builds the survivors'.
//   ncclCommShrink  without revoke: shrink() passes NCCL_SHRINK_ABORT for a broken communicator,
//                   which stops its in-flight work first.
//   neither         can_shrink() is false, shrink() throws; the caller aborts and re-initialises
//                   from a fresh nccl_unique_id() (what elastic_group does anyway after joins).
#pragma once

#include <elastic/config.hpp>

#if !ELASTIC_WITH_NCCL
#error "elastic/comm/nccl.hpp needs NCCL: link elastic::nccl (which sets ELASTIC_WITH_NCCL=1)"
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <dlfcn.h>

#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <nccl.h>

#include <elastic/comm/communicator.hpp>
#include <elastic/comm/half.hpp>
#include <elastic/error.hpp>
#include <elastic/timer/expires.hpp>

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 18, 0)
#error "elastic/comm/nccl.hpp needs NCCL >= 2.18 (non-blocking communicators, ncclGetLastError)"
#endif

namespace elastic::comm {

/// Tuning of an nccl_communicator; the defaults suit training.
struct nccl_options {
  /// How often the watcher thread polls ncclCommGetAsyncError.
  std::chrono::microseconds watch_interval{std::chrono::milliseconds(2)};
  /// How long past its own timeout a collective may stay inside NCCL before the watchdog (if one
  /// serves this process) kills it: the timer scope is timeout + watchdog_margin.
  std::chrono::milliseconds watchdog_margin{std::chrono::seconds(10)};
};

namespace detail {

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

inline error cuda_failure(cudaError_t rc, std::string_view where) {
  return error(errc::device_error,
               fmt::format("{} failed: CUDA {}: {}", where, cudaGetErrorName(rc), cudaGetErrorString(rc)));
}

/// Makes `device` current for this thread, and the previous one again on leaving.
class device_scope {
 public:
  explicit device_scope(int device) {
    if (cudaError_t rc = cudaGetDevice(&previous_); rc != cudaSuccess) throw cuda_failure(rc, "cudaGetDevice");
    if (previous_ != device) {
      if (cudaError_t rc = cudaSetDevice(device); rc != cudaSuccess) {
        throw cuda_failure(rc, fmt::format("cudaSetDevice({})", device));
      }
      restore_ = true;
    }
  }
  device_scope(const device_scope&) = delete;
  device_scope& operator=(const device_scope&) = delete;
  ~device_scope() {
    if (restore_) cudaSetDevice(previous_);
  }

 private:
  int previous_ = 0;
  bool restore_ = false;
};

/// Device memory of our own (barrier word, host staging), freed on destruction.
class device_bytes {
 public:
  device_bytes() = default;
  explicit device_bytes(std::size_t bytes) {
    if (cudaError_t rc = cudaMalloc(&p_, bytes); rc != cudaSuccess) {
      throw cuda_failure(rc, fmt::format("cudaMalloc({} bytes)", bytes));
    }
  }
  device_bytes(device_bytes&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  device_bytes& operator=(device_bytes&& o) noexcept {
    std::swap(p_, o.p_);
    return *this;
  }
  ~device_bytes() {
    if (p_ != nullptr) cudaFree(p_);
  }
  [[nodiscard]] void* get() const noexcept { return p_; }

 private:
  void* p_ = nullptr;
};

template <class T>
constexpr ncclDataType_t nccl_type() noexcept {
  if constexpr (std::is_same_v<T, float>) return ncclFloat32;
  else if constexpr (std::is_same_v<T, double>) return ncclFloat64;
  else if constexpr (std::is_same_v<T, std::int32_t>) return ncclInt32;
  else if constexpr (std::is_same_v<T, std::int64_t>) return ncclInt64;
  else if constexpr (std::is_same_v<T, float16>) return ncclFloat16;
  else return ncclBfloat16;  // nccl.h declares it for CUDA >= 11, which elastic::cuda requires
}

}  // namespace detail

/// A fresh NCCL bootstrap id: 128 opaque bytes that the rendezvous leader publishes and every rank
/// passes to nccl_communicator. The process that made it hosts the bootstrap root, so it must stay
/// alive until every rank has connected.
inline std::string nccl_unique_id() {
  ncclUniqueId id;
  if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) {
    throw detail::nccl_failure(r, "ncclGetUniqueId (making the bootstrap id for a new NCCL communicator)", nullptr);
  }
  return std::string(id.internal, sizeof(id.internal));
}

/// An NCCL communicator over `size()` ranks, one CUDA device per rank.
///
/// Collectives take spans over device memory on device(), are enqueued on stream() and return once
/// they completed on the GPU (so buffers may be read at once); each is bounded by timeout(). Not
/// thread-safe: one thread drives the collectives; ok(), last_error() and abort() may be called from
/// any thread.
class nccl_communicator {
 public:
  /// Collectives take device memory; elastic_group resyncs device state through it directly.
  static constexpr bool takes_device_memory = true;
  /// Whether the headers and the libnccl this process runs with both have ncclCommRevoke (2.28).
  static bool can_revoke() noexcept {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
    return detail::nccl_revoke_fn() != nullptr;
#else
    return false;
#endif
  }
  /// Whether the headers and the libnccl this process runs with both have ncclCommShrink (2.27).
  static bool can_shrink() noexcept {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
    return detail::nccl_shrink_fn() != nullptr;
#else
    return false;
#endif
  }

  /// Joins rank `rank` of `size` on CUDA device `device`, from the leader's nccl_unique_id()
  /// `bootstrap`. Waits at most `timeout` for every rank to connect (then aborts and throws
  /// errc::timeout). `stream` is where the collectives run: nullptr makes a non-blocking stream
  /// of our own; a stream of the caller's must belong to `device` and outlive the communicator.
  nccl_communicator(std::string_view bootstrap, int rank, int size, int device, std::chrono::milliseconds timeout,
                    cudaStream_t stream = nullptr, nccl_options options = {})
      : rank_(rank), size_(size), device_(device), timeout_(timeout), options_(options) {
    if (bootstrap.size() != NCCL_UNIQUE_ID_BYTES) {
      throw error(errc::invalid_argument,
                  fmt::format("nccl communicator: the bootstrap id has {} bytes, NCCL wants {}: pass the string "
                              "nccl_unique_id() returned on the leader, unchanged",
                              bootstrap.size(), NCCL_UNIQUE_ID_BYTES));
    }
    check_arguments();
    detail::device_scope on(device_);
    adopt_stream(stream);
    barrier_word_ = detail::device_bytes(sizeof(std::int32_t));
    ncclUniqueId id;
    std::memcpy(id.internal, bootstrap.data(), NCCL_UNIQUE_ID_BYTES);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    ncclComm_t comm = nullptr;
    const ncclResult_t r = ncclCommInitRankConfig(&comm, size_, id, rank_, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      error e = detail::nccl_failure(r, where("ncclCommInitRankConfig"), comm);
      if (comm != nullptr) ncclCommAbort(comm);
      throw e;
    }
    finish_creation(comm, deadline, "connecting (ncclCommInitRankConfig)");
  }

  nccl_communicator(const nccl_communicator&) = delete;
  nccl_communicator& operator=(const nccl_communicator&) = delete;

  /// Stops the watcher and aborts the NCCL communicator: local, never waits for peers (a clean
  /// ncclCommFinalize would wait for every rank, possibly forever).
  ~nccl_communicator() { abort(); }

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return size_; }
  [[nodiscard]] int device() const noexcept { return device_; }
  [[nodiscard]] cudaStream_t stream() const noexcept { return stream_; }
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return timeout_; }

  /// False once a collective or the watcher saw an error, or abort() was called.
  [[nodiscard]] bool ok() const noexcept { return !failed_.load(std::memory_order_acquire); }

  /// The error that broke the communicator, if one did (abort() leaves none).
  [[nodiscard]] std::optional<error> last_error() const {
    std::lock_guard lk(error_mu_);
    return last_error_;
  }

  /// Gives the communicator up: stops the watcher, ncclCommAbort (in-flight work on the GPU is
  /// cancelled, resources freed). Every later call throws at once. Never throws.
  void abort() noexcept {
    aborted_.store(true, std::memory_order_release);
    failed_.store(true, std::memory_order_release);
    std::lock_guard once(abort_mu_);  // two threads aborting at once must not both join
    if (watcher_.joinable()) {
      watcher_.request_stop();
      wake_.notify_all();
      if (watcher_.get_id() != std::this_thread::get_id()) watcher_.join();
    }
    std::lock_guard lk(comm_mu_);
    if (comm_ != nullptr) {
      int previous = -1;
      const bool switched = cudaGetDevice(&previous) == cudaSuccess && previous != device_ &&
                            cudaSetDevice(device_) == cudaSuccess;
      ncclCommAbort(comm_);
      comm_ = nullptr;
      if (switched) cudaSetDevice(previous);
    }
  }

  /// Stops this communicator's work without freeing it, so that shrink() can follow: what a
  /// survivor calls when the rendezvous reports a departure while collectives may be stuck on the
  /// dead peer. With NCCL >= 2.28 in-flight work is cancelled now (ncclCommRevoke); before that,
  /// shrink() cancels it (NCCL_SHRINK_ABORT). Every later collective throws at once. Never throws;
  /// may be called from any thread.
  void revoke() noexcept {
    revoked_by_caller_.store(true, std::memory_order_release);
    failed_.store(true, std::memory_order_release);
    std::lock_guard lk(comm_mu_);
    stop_in_flight_locked();
  }

  /// Combines the device buffer `buf` across the ranks, in place (sum, or ncclAvg: integers
  /// divide with truncation toward zero). bf16/fp16 reduce natively in NCCL.
  template <reducible T>
  void allreduce(std::span<T> buf, reduce_op op) {
    run("allreduce", "nccl allreduce", !buf.empty(), [&](ncclComm_t comm) {
      return ncclAllReduce(buf.data(), buf.data(), buf.size(), detail::nccl_type<T>(),
                           op == reduce_op::avg ? ncclAvg : ncclSum, comm, stream_);
    });
  }

  /// Copies `root`'s device buffer `buf` into every rank's `buf`.
  template <reducible T>
  void broadcast(std::span<T> buf, int root) {
    check_root(root, "broadcast");
    run("broadcast", "nccl broadcast", !buf.empty(), [&](ncclComm_t comm) {
      return ncclBroadcast(buf.data(), buf.data(), buf.size_bytes(), ncclUint8, root, comm, stream_);
    });
  }

  /// Copies `root`'s HOST words into every rank's `words`, staged through device memory (one
  /// cudaMalloc per call: for the small host state elastic_group resyncs, not for a hot loop).
  void broadcast_host(std::span<std::int64_t> words, int root) {
    check_root(root, "broadcast_host");
    check_usable("broadcast_host");
    if (words.empty()) return;
    detail::device_scope on(device_);
    detail::device_bytes staging(words.size_bytes());
    copy(staging.get(), words.data(), words.size_bytes(), cudaMemcpyHostToDevice, "broadcast_host staging in");
    auto* d = static_cast<std::int64_t*>(staging.get());
    broadcast(std::span<std::int64_t>(d, words.size()), root);
    copy(words.data(), staging.get(), words.size_bytes(), cudaMemcpyDeviceToHost, "broadcast_host staging out");
  }

  /// Returns once every rank has entered the barrier (an allreduce of one device int).
  void barrier() {
    run("barrier", "nccl barrier", true, [&](ncclComm_t comm) {
      return ncclAllReduce(barrier_word_.get(), barrier_word_.get(), 1, ncclInt32, ncclSum, comm, stream_);
    });
  }

  /// The communicator of the ranks not in `excluded_ranks` (ranks of this communicator), made
  /// with ncclCommShrink: every surviving rank calls it with the same list; the new ranks keep
  /// their order and close the gaps. Works on a broken communicator (that is what it is for),
  /// not on an aborted one. The new communicator gets a stream of its own unless this one ran on
  /// the caller's stream, and waits at most `timeout` for the survivors. Needs can_shrink().
  [[nodiscard]] std::unique_ptr<nccl_communicator> shrink(std::span<const int> excluded_ranks,
                                                          std::chrono::milliseconds timeout) {
    if (!can_shrink()) throw no_shrink();  // also where the headers predate it
#if NCCL_VERSION_CODE < NCCL_VERSION(2, 27, 0)
    (void)excluded_ranks;
    (void)timeout;
    return nullptr;  // not reached
#else
    if (aborted_.load(std::memory_order_acquire)) {
      throw error(errc::aborted, where("shrink") + ": the communicator was aborted; shrink before abort(), "
                                                   "or build a new one from a fresh nccl_unique_id()");
    }
    std::vector<int> excluded(excluded_ranks.begin(), excluded_ranks.end());
    std::sort(excluded.begin(), excluded.end());
    excluded.erase(std::unique(excluded.begin(), excluded.end()), excluded.end());
    for (int r : excluded) {
      if (r < 0 || r >= size_ || r == rank_) {
        throw error(errc::invalid_argument,
                    fmt::format("{}: excluded rank {} is {}", where("shrink"), r,
                                r == rank_ ? "this rank itself: an excluded rank must not call shrink()"
                                           : fmt::format("out of range 0..{}", size_ - 1)));
      }
    }
    if (timeout.count() <= 0) {
      throw error(errc::invalid_argument,
                  fmt::format("{}: timeout {} ms must be positive", where("shrink"), timeout.count()));
    }
    nccl_options options = options_;
    detail::device_scope on(device_);
    // The new rank is this rank less the excluded ranks below it (NCCL closes the gaps in order).
    const int new_rank =
        rank_ - static_cast<int>(std::count_if(excluded.begin(), excluded.end(), [&](int r) { return r < rank_; }));
    std::unique_ptr<nccl_communicator> next(new nccl_communicator(
        private_tag{}, new_rank, size_ - static_cast<int>(excluded.size()), device_, timeout, options));
    next->adopt_stream(owned_stream_ ? nullptr : stream_);
    next->barrier_word_ = detail::device_bytes(sizeof(std::int32_t));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    ncclComm_t comm = nullptr;
    ncclResult_t r;
    {
      std::unique_lock lk(comm_mu_);
      if (comm_ == nullptr) {
        throw error(errc::aborted, where("shrink") + ": the communicator was aborted");
      }
      // A revoked communicator is ready for management once NCCL says it is quiescent.
      while (revoked_) {
        ncclResult_t state = ncclSuccess;
        if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess || state != ncclInProgress) break;
        if (std::chrono::steady_clock::now() >= deadline) {
          throw error(errc::timeout, where("shrink") + ": the revoked communicator did not quiesce in time; abort "
                                                       "it and build a new one from a fresh nccl_unique_id()");
        }
        lk.unlock();
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        lk.lock();
        if (comm_ == nullptr) throw error(errc::aborted, where("shrink") + ": the communicator was aborted");
      }
      // A broken communicator may still have work in flight: once revoked (NCCL >= 2.28) it is
      // stopped already; otherwise NCCL_SHRINK_ABORT stops it before shrinking.
      const int flags = ok() || revoked_ ? NCCL_SHRINK_DEFAULT : NCCL_SHRINK_ABORT;
      r = detail::nccl_shrink_fn()(comm_, excluded.data(), static_cast<int>(excluded.size()), &comm, &config, flags);
    }
    if (r != ncclSuccess && r != ncclInProgress) {
      error e = detail::nccl_failure(r, where("ncclCommShrink"), comm);
      if (comm != nullptr) ncclCommAbort(comm);
      throw e;
    }
    next->finish_creation(comm, deadline, "shrinking (ncclCommShrink)");
    return next;
#endif
  }

  nccl_communicator(nccl_communicator&&) = delete;  // the watcher thread holds `this`
  nccl_communicator& operator=(nccl_communicator&&) = delete;

 private:
  struct private_tag {};

  // A communicator being made by shrink(): the handle comes later, from finish_creation().
  nccl_communicator(private_tag, int rank, int size, int device, std::chrono::milliseconds timeout,
                    nccl_options options)
      : rank_(rank), size_(size), device_(device), timeout_(timeout), options_(options) {}

  void check_arguments() const {
    if (size_ < 1 || rank_ < 0 || rank_ >= size_) {
      throw error(errc::invalid_argument,
                  fmt::format("nccl communicator: rank {} of size {} is out of range: need 0 <= rank < size", rank_,
                              size_));
    }
    if (device_ < 0) {
      throw error(errc::invalid_argument, fmt::format("nccl communicator: device {} is not a CUDA device", device_));
    }
    if (timeout_.count() <= 0) {
      throw error(errc::invalid_argument,
                  fmt::format("nccl communicator: timeout {} ms must be positive", timeout_.count()));
    }
  }

  std::string where(std::string_view what) const {
    return fmt::format("nccl {} on rank {} of {} (device {}, timeout {} ms)", what, rank_, size_, device_,
                       timeout_.count());
  }

  void adopt_stream(cudaStream_t stream) {
    if (stream != nullptr) {
      stream_ = stream;
      return;
    }
    if (cudaError_t rc = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking); rc != cudaSuccess) {
      throw detail::cuda_failure(rc, where("cudaStreamCreateWithFlags"));
    }
    owned_stream_.reset(stream_);
  }

  // Polls a communicator being created until NCCL says it is ready; on a deadline or an error it
  // aborts the half-made communicator and throws. On success it owns `comm` and starts the watcher.
  void finish_creation(ncclComm_t comm, std::chrono::steady_clock::time_point deadline, std::string_view what) {
    for (;;) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
      if (r != ncclSuccess) state = r;
      if (state == ncclSuccess) break;
      if (state != ncclInProgress) {
        error e = detail::nccl_failure(state, where(what), comm);
        ncclCommAbort(comm);
        throw e;
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        ncclCommAbort(comm);
        throw error(errc::timeout, fmt::format("{} timed out: not every rank connected in time; a peer may have "
                                               "died, be slow to start, or hold another bootstrap id. Build a new "
                                               "communicator from the next rendezvous round",
                                               where(what)));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    comm_ = comm;
    try {
      watcher_ = std::jthread([this](std::stop_token st) { watch(st); });
    } catch (...) {
      ncclCommAbort(comm_);
      comm_ = nullptr;
      throw;
    }
  }

  // The watcher: polls the asynchronous error so a peer's failure is noticed between collectives.
  // It holds comm_mu_ only for the poll, so abort() can always get in.
  void watch(std::stop_token st) {
    std::mutex m;
    std::unique_lock lk(m);
    while (!st.stop_requested()) {
      wake_.wait_for(lk, st, options_.watch_interval, [] { return false; });
      if (st.stop_requested()) return;
      ncclResult_t state = ncclSuccess;
      {
        std::lock_guard cl(comm_mu_);
        if (comm_ == nullptr) return;
        if (ncclResult_t r = ncclCommGetAsyncError(comm_, &state); r != ncclSuccess) state = r;
        if (state != ncclSuccess && state != ncclInProgress) {
          record(detail::nccl_failure(state, where("watcher (ncclCommGetAsyncError)"), comm_));
          stop_in_flight_locked();
          return;
        }
      }
    }
  }

  void record(error e) {
    {
      std::lock_guard lk(error_mu_);
      if (!last_error_) last_error_ = std::move(e);
    }
    failed_.store(true, std::memory_order_release);
  }

  // After a failure: with revoke, stop in-flight work now and keep the handle for shrink().
  // Without, leave it: shrink() uses NCCL_SHRINK_ABORT, abort()/the destructor abort it.
  void stop_in_flight_locked() noexcept {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
    if (comm_ != nullptr && !revoked_ && can_revoke()) {
      detail::nccl_revoke_fn()(comm_, NCCL_REVOKE_DEFAULT);
      revoked_ = true;
    }
#endif
  }

  error no_shrink() const {
    return error(errc::not_supported,
                 fmt::format("nccl shrink on rank {}: ncclCommShrink needs NCCL 2.27; this program was built against "
                             "{} and runs with {}: abort and build a new communicator from a fresh nccl_unique_id()",
                             rank_, NCCL_VERSION_CODE, detail::nccl_runtime_version()));
  }

  void check_root(int root, std::string_view what) const {
    if (root < 0 || root >= size_) {
      throw error(errc::invalid_argument,
                  fmt::format("nccl {}: root {} is out of range for a communicator of size {}", what, root, size_));
    }
  }

  void check_usable(std::string_view what) const {
    if (aborted_.load(std::memory_order_acquire)) {
      throw error(errc::aborted, where(what) + ": the communicator was aborted; build a new one for the next round");
    }
    if (failed_.load(std::memory_order_acquire)) {
      std::lock_guard lk(error_mu_);
      if (!last_error_ && revoked_by_caller_.load(std::memory_order_acquire)) {
        throw error(errc::aborted,
                    where(what) + ": the communicator was revoked; shrink() it or build a new one for the next round");
      }
      // record() sets last_error_ before failed_, so the fallbacks are for form's sake.
      const errc code = last_error_ ? last_error_->code() : errc::peer_lost;
      throw error(code,
                  fmt::format("{}: the communicator is broken by an earlier failure ({}); build a new one "
                              "for the next round (or shrink() it)",
                              where(what), last_error_ ? last_error_->message() : "unknown"),
                  last_error_ ? last_error_->os_code() : std::error_code());
    }
  }

  void copy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind, std::string_view what) {
    if (cudaError_t rc = cudaMemcpyAsync(dst, src, bytes, kind, stream_); rc != cudaSuccess) {
      throw detail::cuda_failure(rc, where(what));
    }
    if (cudaError_t rc = cudaStreamSynchronize(stream_); rc != cudaSuccess) {
      throw detail::cuda_failure(rc, where(what));
    }
  }

  // Enqueues one collective with `enqueue(comm)` and polls until the GPU finished it, NCCL
  // reported an error, or the timeout ran out. Any failure breaks the communicator for good.
  template <class Enqueue>
  void run(std::string_view what, std::string_view scope_name, bool nonempty, Enqueue&& enqueue) {
    check_usable(what);
    if (!nonempty) return;  // every rank passes the same length, so every rank skips
    auto scope = elastic::expires(timeout_ + options_.watchdog_margin, scope_name);
    detail::device_scope on(device_);
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    {
      std::lock_guard lk(comm_mu_);
      if (comm_ == nullptr) check_usable(what);
      const ncclResult_t r = enqueue(comm_);
      if (r != ncclSuccess && r != ncclInProgress) {
        error e = detail::nccl_failure(r, where(what), comm_);
        if (classify_fatal(r)) {
          record(e);
          stop_in_flight_locked();
        }
        throw e;
      }
    }
    int spins = 0;
    for (;;) {
      ncclResult_t state = ncclSuccess;
      {
        std::lock_guard lk(comm_mu_);
        if (comm_ == nullptr) check_usable(what);  // aborted from another thread
        if (ncclResult_t r = ncclCommGetAsyncError(comm_, &state); r != ncclSuccess) state = r;
        if (state != ncclSuccess && state != ncclInProgress) {
          error e = detail::nccl_failure(state, where(what), comm_);
          record(e);
          stop_in_flight_locked();
          throw e;
        }
      }
      if (!ok()) check_usable(what);  // the watcher saw an error
      if (state == ncclSuccess) {  // fully enqueued; has the GPU finished it?
        const cudaError_t q = cudaStreamQuery(stream_);
        if (q == cudaSuccess) return;
        if (q != cudaErrorNotReady) {
          error e = detail::cuda_failure(q, where(what) + ": cudaStreamQuery");
          record(e);
          throw e;
        }
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        error e(errc::timeout, fmt::format("{} timed out: the collective did not finish on the GPU in time; a peer "
                                           "may have died or hung. The communicator is broken: build a new one for "
                                           "the next round (or shrink() it)",
                                           where(what)));
        {
          std::lock_guard lk(comm_mu_);
          record(e);
          stop_in_flight_locked();
        }
        throw e;
      }
      // Spin briefly for short collectives, then sleep so a long wait costs no core.
      if (++spins < 64) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
  }

  // A malformed call leaves the communicator usable; anything else breaks it.
  static bool classify_fatal(ncclResult_t r) noexcept { return r != ncclInvalidArgument && r != ncclInvalidUsage; }

  struct stream_deleter {
    void operator()(cudaStream_t s) const noexcept { cudaStreamDestroy(s); }
  };

  int rank_;
  int size_;
  int device_;
  std::chrono::milliseconds timeout_;
  nccl_options options_;
  std::unique_ptr<CUstream_st, stream_deleter> owned_stream_;  // declared before comm users: freed last
  cudaStream_t stream_ = nullptr;
  detail::device_bytes barrier_word_;
  mutable std::mutex comm_mu_;  // guards comm_ (its lifetime) and revoked_
  ncclComm_t comm_ = nullptr;
  bool revoked_ = false;
  std::atomic<bool> failed_{false};
  std::atomic<bool> aborted_{false};
  std::atomic<bool> revoked_by_caller_{false};
  mutable std::mutex error_mu_;
  std::optional<error> last_error_;
  std::mutex abort_mu_;
  std::condition_variable_any wake_;
  std::jthread watcher_;  // last: stopped (in abort(), from the destructor) before anything above goes
};

static_assert(communicator<nccl_communicator>);

}  // namespace elastic::comm
