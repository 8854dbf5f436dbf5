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
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <nccl.h>

#include <elastic/comm/communicator.hpp>
#include <elastic/comm/detail/nccl_runtime.hpp>
#include <elastic/comm/half.hpp>
#include <elastic/internal/cuda.hpp>
#include <elastic/internal/periodic_thread.hpp>
#include <elastic/error.hpp>
#include <elastic/timer/expires.hpp>

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 18, 0)
#error "elastic/comm/nccl.hpp needs NCCL >= 2.18 (non-blocking communicators, ncclGetLastError)"
#endif

namespace elastic::inline v1::comm {

namespace detail {
namespace cuda = internal::cuda;
}  // namespace detail

/// Tuning of an nccl_communicator; the defaults suit training.
struct nccl_options {
  /// How often the watcher thread polls ncclCommGetAsyncError.
  std::chrono::microseconds watch_interval{std::chrono::milliseconds(2)};
  /// How long past its own timeout a collective may stay inside NCCL before the watchdog (if one
  /// serves this process) kills it: the timer scope is timeout + watchdog_margin.
  std::chrono::milliseconds watchdog_margin{std::chrono::seconds(10)};
};

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
    detail::cuda::device_scope on(device_);
    adopt_stream(stream);
    barrier_word_ = detail::cuda::device_bytes(sizeof(std::int32_t));
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
    watcher_.stop();  // the watcher never calls abort(), so this never joins its own thread
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
    detail::cuda::device_scope on(device_);
    detail::cuda::device_bytes staging(words.size_bytes());
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
    std::vector<int> excluded = checked_exclusions(excluded_ranks);
    if (timeout.count() <= 0) {
      throw error(errc::invalid_argument,
                  fmt::format("{}: timeout {} ms must be positive", where("shrink"), timeout.count()));
    }
    detail::cuda::device_scope on(device_);
    std::unique_ptr<nccl_communicator> next = make_successor(excluded, timeout);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    ncclComm_t comm = nullptr;
    if (const ncclResult_t r = start_shrink(excluded, deadline, comm); r != ncclSuccess && r != ncclInProgress) {
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

#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
  // shrink()'s ranks to exclude, sorted and without repeats; throws for one that is out of range
  // or is this rank.
  std::vector<int> checked_exclusions(std::span<const int> excluded_ranks) const {
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
    return excluded;
  }

  // The communicator shrink() returns, before it has its handle: its rank, size, stream and
  // barrier word. The caller has made device_ current.
  std::unique_ptr<nccl_communicator> make_successor(const std::vector<int>& excluded,
                                                    std::chrono::milliseconds timeout) const {
    // The new rank is this rank less the excluded ranks below it (NCCL closes the gaps in order).
    const int new_rank =
        rank_ - static_cast<int>(std::count_if(excluded.begin(), excluded.end(), [&](int r) { return r < rank_; }));
    std::unique_ptr<nccl_communicator> next(new nccl_communicator(
        private_tag{}, new_rank, size_ - static_cast<int>(excluded.size()), device_, timeout, options_));
    next->adopt_stream(owned_stream_ ? nullptr : stream_);
    next->barrier_word_ = detail::cuda::device_bytes(sizeof(std::int32_t));
    return next;
  }

  // Calls ncclCommShrink on this communicator (once a revoked one is quiescent), non-blocking:
  // `comm` receives the half-made new handle. Throws if abort() took the handle meanwhile.
  ncclResult_t start_shrink(std::vector<int>& excluded, std::chrono::steady_clock::time_point deadline,
                            ncclComm_t& comm) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    std::unique_lock lk(comm_mu_);
    if (comm_ == nullptr) {
      throw error(errc::aborted, where("shrink") + ": the communicator was aborted");
    }
    wait_until_quiescent(lk, deadline);
    // A broken communicator may still have work in flight: once revoked (NCCL >= 2.28) it is
    // stopped already; otherwise NCCL_SHRINK_ABORT stops it before shrinking.
    const int flags = ok() || revoked_ ? NCCL_SHRINK_DEFAULT : NCCL_SHRINK_ABORT;
    return detail::nccl_shrink_fn()(comm_, excluded.data(), static_cast<int>(excluded.size()), &comm, &config,
                                    flags);
  }

  // A revoked communicator is ready for management once NCCL says it is quiescent. `lk` holds
  // comm_mu_; it is let go between polls so that abort() can get in.
  void wait_until_quiescent(std::unique_lock<std::mutex>& lk, std::chrono::steady_clock::time_point deadline) {
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
  }
#endif

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
      throw detail::cuda::failure(rc, where("cudaStreamCreateWithFlags"));
    }
    owned_stream_ = detail::cuda::stream::adopt(stream_);
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
      watcher_ = internal::periodic_thread(options_.watch_interval, [this] { return watch(); });
    } catch (...) {
      ncclCommAbort(comm_);
      comm_ = nullptr;
      throw;
    }
  }

  // The watcher's tick: polls the asynchronous error so a peer's failure is noticed between
  // collectives; false (the thread ends) once the communicator is gone or broken. It holds
  // comm_mu_ only for the poll, so abort() can always get in.
  bool watch() noexcept {
    std::lock_guard cl(comm_mu_);
    if (comm_ == nullptr) return false;
    ncclResult_t state = ncclSuccess;
    if (ncclResult_t r = ncclCommGetAsyncError(comm_, &state); r != ncclSuccess) state = r;
    if (state != ncclSuccess && state != ncclInProgress) {
      record(detail::nccl_failure(state, where("watcher (ncclCommGetAsyncError)"), comm_));
      stop_in_flight_locked();
      return false;
    }
    return true;
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
      throw detail::cuda::failure(rc, where(what));
    }
    if (cudaError_t rc = cudaStreamSynchronize(stream_); rc != cudaSuccess) {
      throw detail::cuda::failure(rc, where(what));
    }
  }

  // Enqueues one collective with `enqueue(comm)` and polls until the GPU finished it, NCCL
  // reported an error, or the timeout ran out. Any failure breaks the communicator for good.
  template <class Enqueue>
  void run(std::string_view what, std::string_view scope_name, bool nonempty, Enqueue&& enqueue) {
    check_usable(what);
    if (!nonempty) return;  // every rank passes the same length, so every rank skips
    auto scope = elastic::expires(timeout_ + options_.watchdog_margin, scope_name);
    detail::cuda::device_scope on(device_);
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    enqueue_collective(what, std::forward<Enqueue>(enqueue));
    wait_for_completion(what, deadline);
  }

  // Hands the collective to NCCL; a failure to enqueue it throws (and, unless the call was merely
  // malformed, breaks the communicator).
  template <class Enqueue>
  void enqueue_collective(std::string_view what, Enqueue&& enqueue) {
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

  // Polls until the enqueued collective finished on the GPU; throws (breaking the communicator)
  // on an NCCL or CUDA error, an error the watcher saw, an abort, or the deadline.
  void wait_for_completion(std::string_view what, std::chrono::steady_clock::time_point deadline) {
    int spins = 0;
    for (;;) {
      const ncclResult_t state = poll_async_error(what);
      if (!ok()) check_usable(what);  // the watcher saw an error
      if (state == ncclSuccess && gpu_finished(what)) return;  // fully enqueued, and done
      if (std::chrono::steady_clock::now() >= deadline) throw collective_timed_out(what);
      // Spin briefly for short collectives, then sleep so a long wait costs no core.
      if (++spins < 64) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
  }

  // NCCL's asynchronous state: ncclSuccess (enqueued) or ncclInProgress; anything else throws.
  ncclResult_t poll_async_error(std::string_view what) {
    std::lock_guard lk(comm_mu_);
    if (comm_ == nullptr) check_usable(what);  // aborted from another thread
    ncclResult_t state = ncclSuccess;
    if (ncclResult_t r = ncclCommGetAsyncError(comm_, &state); r != ncclSuccess) state = r;
    if (state != ncclSuccess && state != ncclInProgress) {
      error e = detail::nccl_failure(state, where(what), comm_);
      record(e);
      stop_in_flight_locked();
      throw e;
    }
    return state;
  }

  // Whether the work on stream_ has finished; a CUDA error throws.
  bool gpu_finished(std::string_view what) {
    const cudaError_t q = cudaStreamQuery(stream_);
    if (q == cudaSuccess) return true;
    if (q != cudaErrorNotReady) {
      error e = detail::cuda::failure(q, where(what) + ": cudaStreamQuery");
      record(e);
      throw e;
    }
    return false;
  }

  // The error for a collective past its deadline, recorded (and in-flight work stopped) first.
  error collective_timed_out(std::string_view what) {
    error e(errc::timeout, fmt::format("{} timed out: the collective did not finish on the GPU in time; a peer "
                                       "may have died or hung. The communicator is broken: build a new one for "
                                       "the next round (or shrink() it)",
                                       where(what)));
    std::lock_guard lk(comm_mu_);
    record(e);
    stop_in_flight_locked();
    return e;
  }

  // A malformed call leaves the communicator usable; anything else breaks it.
  static bool classify_fatal(ncclResult_t r) noexcept { return r != ncclInvalidArgument && r != ncclInvalidUsage; }

  int rank_;
  int size_;
  int device_;
  std::chrono::milliseconds timeout_;
  nccl_options options_;
  detail::cuda::stream owned_stream_;  // declared before comm users: freed last
  cudaStream_t stream_ = nullptr;
  detail::cuda::device_bytes barrier_word_;
  mutable std::mutex comm_mu_;  // guards comm_ (its lifetime) and revoked_
  ncclComm_t comm_ = nullptr;
  bool revoked_ = false;
  std::atomic<bool> failed_{false};
  std::atomic<bool> aborted_{false};
  std::atomic<bool> revoked_by_caller_{false};
  mutable std::mutex error_mu_;
  std::optional<error> last_error_;
  std::mutex abort_mu_;
  internal::periodic_thread watcher_;  // last: stopped (in abort(), from the destructor) before anything above goes
};

static_assert(communicator<nccl_communicator>);

}  // namespace elastic::inline v1::comm
