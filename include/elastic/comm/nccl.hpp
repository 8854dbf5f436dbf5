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
// Ordering. A collective runs after the work that produced its buffer: on the caller's stream
// when one was given (stream order does it), else on a stream of our own that first waits, by an
// event, for everything queued on the legacy default stream (where kernels launched without a
// stream go, and which every blocking stream synchronises with). Completion is an event recorded
// right after the collective, so work queued on the same stream later (by another thread, say)
// never delays or times out the collective.
//
// Nothing here can block forever. The communicator is non-blocking (config.blocking = 0; an
// NCCL_COMM_BLOCKING=1 in the environment, which would override it, is refused): init, shrink,
// grow and every collective return at once and we poll against a deadline. A watcher thread polls
// the asynchronous error every few milliseconds, so a peer's failure flips ok() false even between
// collectives. A collective also runs inside an elastic::expires(timeout + margin) scope.
// Every NCCL call goes through one process-wide lock (detail::nccl_call): two threads inside one
// communicator are forbidden, and so is issuing operations to communicators of one device from
// several threads at once. The exception is abort() of a whole communicator: once its
// asynchronous jobs have settled it runs outside the lock, alone on its communicator (comm_mu_),
// since it joins NCCL's threads (hundreds of ms) and must not hold up the calls that build and
// use the next communicator (see detail::abort_settled).
//
// Recovery (detail::recovery_calls(): what the loaded libnccl exports, less known-bad releases):
//   revoke()  stops in-flight work (ncclCommRevoke, 2.28.7) and keeps the handle for shrink(): what
//             a survivor does when a peer departs, since within a host NCCL reports no error
//             for a dead peer (NVIDIA/nccl#279) and the collective would spin until its timeout.
//             Without ncclCommRevoke it only marks the communicator failed; shrink() then passes
//             NCCL_SHRINK_ABORT, which stops the stuck work first.
//   shrink()  the survivors' communicator (ncclCommShrink, 2.27). NCCL refuses an empty exclude
//             list, and a parent carrying a network error (sticky): callers fall back to a fresh
//             init whenever shrink fails.
//   grow()    adds newcomers (ncclCommGrow, 2.29.2): rank 0 makes grow_unique_id(), every existing
//             rank calls grow(), each newcomer join_grown().
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
#include <elastic/comm/detail/nccl_handle.hpp>
#include <elastic/comm/detail/nccl_runtime.hpp>
#include <elastic/comm/half.hpp>
#include <elastic/error.hpp>
#include <elastic/internal/cuda.hpp>
#include <elastic/internal/periodic_thread.hpp>
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
/// passes to nccl_communicator. The process that made it hosts the bootstrap root (a thread that
/// lives until every rank has connected), so it must stay alive until they have.
inline std::string nccl_unique_id() {
  ncclUniqueId id;
  if (ncclResult_t r = detail::nccl_call([&] { return ncclGetUniqueId(&id); }); r != ncclSuccess) {
    throw detail::nccl_failure(r, "ncclGetUniqueId (making the bootstrap id for a new NCCL communicator)", nullptr);
  }
  return std::string(id.internal, sizeof(id.internal));
}

/// An NCCL communicator over `size()` ranks, one CUDA device per rank.
///
/// Collectives take spans over device memory on device(), are enqueued on stream() and return once
/// they completed on the GPU (so buffers may be read at once); each is bounded by timeout(). Not
/// thread-safe: one thread drives the collectives; ok(), last_error(), revoke() and abort() may be
/// called from any thread.
class nccl_communicator {
 public:
  /// Collectives take device memory; elastic_group resyncs device state through it directly.
  static constexpr bool takes_device_memory = true;
  /// Device memory each communicator allocates with itself for the host collectives
  /// (broadcast_host, allreduce_host) and barrier(): a resync's few words allocate nothing.
  static constexpr std::size_t scratch_bytes = 64 * 1024;
  /// Whether revoke() stops in-flight work with ncclCommRevoke (see detail::recovery_calls()).
  static bool can_revoke() { return detail::recovery_calls().revoke; }
  /// Whether shrink() is offered by the libnccl this process runs with.
  static bool can_shrink() { return detail::recovery_calls().shrink; }
  /// Whether grow()/join_grown() are offered by the libnccl this process runs with.
  static bool can_grow() { return detail::recovery_calls().grow; }

  /// Joins rank `rank` of `size` on CUDA device `device`, from the leader's nccl_unique_id()
  /// `bootstrap`. Waits at most `timeout` for every rank to connect (then aborts and throws
  /// errc::timeout). `stream` is where the collectives run; nullptr makes a non-blocking stream of
  /// our own, ordered after the legacy default stream. A stream of the caller's must belong to
  /// `device` and outlive the communicator. `check` runs every few ms while connecting and may
  /// throw to give up.
  nccl_communicator(std::string_view bootstrap, int rank, int size, int device, std::chrono::milliseconds timeout,
                    cudaStream_t stream = nullptr, nccl_options options = {}, const detail::creation_check& check = {})
      : nccl_communicator(private_tag{}, rank, size, device, timeout, stream, options) {
    ncclUniqueId id = to_unique_id(bootstrap, "nccl communicator: the bootstrap id");
    detail::cuda::device_scope on(device_);
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    ncclConfig_t config = nonblocking_config();
    ncclComm_t comm = nullptr;
    const ncclResult_t r =
        detail::nccl_call([&] { return ncclCommInitRankConfig(&comm, size_, id, rank_, &config); });
    adopt_new_handle(r, comm, deadline, "connecting (ncclCommInitRankConfig)", check);
  }

  /// Joins a communicator that existing ranks are growing (ncclCommGrow) as its rank `rank` of
  /// `size`, from the id rank 0 made with grow_unique_id(). Needs can_grow().
  static std::unique_ptr<nccl_communicator> join_grown(std::string_view grow_id, int rank, int size, int device,
                                                       std::chrono::milliseconds timeout, cudaStream_t stream = nullptr,
                                                       nccl_options options = {},
                                                       const detail::creation_check& check = {}) {
    if (!can_grow()) throw no_call("ncclCommGrow", "2.29.2", rank);
    std::unique_ptr<nccl_communicator> next(
        new nccl_communicator(private_tag{}, rank, size, device, timeout, stream, options));
    const ncclUniqueId id = to_unique_id(grow_id, "nccl join_grown: the grow id");
    detail::cuda::device_scope on(device);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    ncclConfig_t config = nonblocking_config();
    auto slot = std::make_unique<detail::handle_slot>();
    const ncclResult_t r = detail::nccl_call(
        [&] { return detail::nccl_grow_fn()(nullptr, size, &id, rank, &slot->comm, &config); });
    next->adopt_new_handle(r, slot->comm, deadline, "joining a grown communicator (ncclCommGrow)", check);
    return next;
  }

  nccl_communicator(const nccl_communicator&) = delete;
  nccl_communicator& operator=(const nccl_communicator&) = delete;
  nccl_communicator(nccl_communicator&&) = delete;  // the watcher thread holds `this`
  nccl_communicator& operator=(nccl_communicator&&) = delete;

  /// Stops the watcher and aborts the NCCL communicator (local: never waits for peers), then
  /// frees its events, stream and device memory on its own device.
  ~nccl_communicator() {
    detail::cuda::device_switch on(device_);  // the teardown may run on a thread that never set one
    give_up(true);
    done_ = {};
    ready_ = {};
    scratch_ = {};
    owned_stream_ = {};
  }

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return size_; }
  [[nodiscard]] int device() const noexcept { return device_; }
  [[nodiscard]] cudaStream_t stream() const noexcept { return stream_; }
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return timeout_; }

  /// False once a collective or the watcher saw an error, or revoke()/abort() was called.
  [[nodiscard]] bool ok() const noexcept { return !failed_.load(std::memory_order_acquire); }

  /// True once NCCL reported an asynchronous error for it (ncclCommGetAsyncError: a peer's
  /// connection broke, say). NCCL keeps it (sticky) and refuses to shrink such a communicator.
  [[nodiscard]] bool async_error() const noexcept { return async_failed_.load(std::memory_order_acquire); }

  /// The error that broke the communicator, if one did (revoke() and abort() leave none).
  [[nodiscard]] std::optional<error> last_error() const {
    std::lock_guard lk(error_mu_);
    return last_error_;
  }

  /// Gives the communicator up: stops the watcher, ncclCommAbort (in-flight work on the GPU is
  /// cancelled, resources freed) with its device current. Every later call throws. Never throws.
  void abort() noexcept { give_up(false); }

  /// Stops this communicator's in-flight work without freeing it, so that shrink() can follow:
  /// what a survivor calls when the rendezvous reports a departure while a collective may wait
  /// for the dead peer. With ncclCommRevoke (2.28.7) the work stops now; without, shrink() stops
  /// it (NCCL_SHRINK_ABORT). Every later collective throws errc::aborted at once. A revoke that
  /// NCCL refuses is recorded (last_error()), and shrink() then refuses too. Never throws; may be
  /// called from any thread.
  void revoke() noexcept {
    revoked_by_caller_.store(true, std::memory_order_release);
    failed_.store(true, std::memory_order_release);
    std::lock_guard lk(comm_mu_);
    stop_in_flight_locked();
  }

  /// An event behind the work queued so far on stream(): a successor that uses the same buffers
  /// follow()s it, since a revoked kernel may still be draining, and one NCCL could not revoke
  /// (no ncclCommRevoke) ends only when the abort stops it.
  [[nodiscard]] detail::cuda::event fence() const {
    detail::cuda::device_scope on(device_);
    auto e = detail::cuda::event::create();
    e.record(stream_);
    return e;
  }

  /// Makes every later collective of this communicator wait, on the GPU (the host does not
  /// wait), for the work `fence` captured.
  void follow(const detail::cuda::event& fence) {
    detail::cuda::device_scope on(device_);
    fence.make_wait(stream_);
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

  /// Copies `root`'s HOST words into every rank's `words`, staged through the communicator's own
  /// device scratch (made with it, grown and kept when a call needs more), so a resync's words
  /// cost no cudaMalloc and no cudaFree per call (cudaFree waits for the whole device).
  void broadcast_host(std::span<std::int64_t> words, int root) {
    check_root(root, "broadcast_host");
    check_usable("broadcast_host");
    if (words.empty()) return;
    detail::cuda::device_scope on(device_);
    void* staging = staging_for(words.size_bytes());
    copy(staging, words.data(), words.size_bytes(), cudaMemcpyHostToDevice, "broadcast_host staging in");
    broadcast(std::span<std::int64_t>(static_cast<std::int64_t*>(staging), words.size()), root);
    copy(words.data(), staging, words.size_bytes(), cudaMemcpyDeviceToHost, "broadcast_host staging out");
  }

  /// Element-wise `op` over every rank's HOST `values`, staged through device memory (as
  /// broadcast_host: for a few figures the group agrees on, not for a hot loop).
  void allreduce_host(std::span<double> values, reduce_op op) {
    check_usable("allreduce_host");
    if (values.empty()) return;
    detail::cuda::device_scope on(device_);
    void* staging = staging_for(values.size_bytes());
    copy(staging, values.data(), values.size_bytes(), cudaMemcpyHostToDevice, "allreduce_host staging in");
    allreduce(std::span<double>(static_cast<double*>(staging), values.size()), op);
    copy(values.data(), staging, values.size_bytes(), cudaMemcpyDeviceToHost, "allreduce_host staging out");
  }

  /// Returns once every rank has entered the barrier (an allreduce of one device int).
  void barrier() {
    run("barrier", "nccl barrier", true, [&](ncclComm_t comm) {
      return ncclAllReduce(scratch_.get(), scratch_.get(), 1, ncclInt32, ncclSum, comm, stream_);
    });
  }

  /// The communicator of the ranks not in `excluded_ranks` (ranks of this communicator), made
  /// with ncclCommShrink: every surviving rank calls it with the same list; the new ranks keep
  /// their order and close the gaps. Works on a revoked or broken communicator (that is what it
  /// is for), not on an aborted one, nor with an empty list (NCCL rejects one in every release
  /// that has the call: build a new communicator instead). Waits at most `timeout`; on the
  /// deadline this communicator is aborted too. Throws when NCCL refuses, e.g. a parent that
  /// carries a network error: then build a new one from a fresh nccl_unique_id().
  [[nodiscard]] std::unique_ptr<nccl_communicator> shrink(std::span<const int> excluded_ranks,
                                                          std::chrono::milliseconds timeout,
                                                          const detail::creation_check& check = {}) {
    if (!can_shrink()) throw no_call("ncclCommShrink", "2.27", rank_);
    std::vector<int> excluded = checked_exclusions(excluded_ranks);
    check_management("shrink", timeout);
    detail::refuse_blocking_environment(where("shrink"));
    detail::cuda::device_scope on(device_);
    const int new_rank =
        rank_ - static_cast<int>(std::count_if(excluded.begin(), excluded.end(), [&](int r) { return r < rank_; }));
    std::unique_ptr<nccl_communicator> next(new nccl_communicator(
        private_tag{}, new_rank, size_ - static_cast<int>(excluded.size()), device_, timeout, successor_stream(),
        options_));
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    auto slot = std::make_unique<detail::handle_slot>();
    start_shrink(excluded, *slot, deadline, check);
    // The parent carries the in-progress state; the child exists once it is over.
    detail::await_ready(comm_, deadline, where("shrinking (ncclCommShrink)"), check, [&] {
      abort();                               // joins NCCL's shrink job: nothing writes the slot after this
      detail::abort_handle(slot->comm);      // the half-made child, if NCCL got that far
    });
    if (slot->comm == nullptr) {
      throw error(errc::peer_lost, where("shrink") + ": NCCL reported success but stored no communicator; build a "
                                                     "new one from a fresh nccl_unique_id()");
    }
    next->adopt_new_handle(ncclInProgress, slot->comm, deadline, "shrinking (ncclCommShrink)", check);
    return next;
  }

  /// The id newcomers join a grow of this communicator with (ncclCommGetUniqueId; it also hands
  /// the id to this communicator's boundary ranks). Rank 0 calls it once per grow, before any
  /// rank calls grow(), and publishes it. Needs can_grow().
  [[nodiscard]] std::string grow_unique_id() {
    if (!can_grow()) throw no_call("ncclCommGetUniqueId", "2.29.2", rank_);
    check_usable("grow_unique_id");
    detail::cuda::device_scope on(device_);
    auto scope = elastic::expires(timeout_ + options_.watchdog_margin, "nccl grow id");  // it sends to two ranks
    ncclUniqueId id;
    std::lock_guard lk(comm_mu_);
    if (comm_ == nullptr) check_usable("grow_unique_id");
    const ncclResult_t r = detail::nccl_call([&] { return detail::nccl_comm_unique_id_fn()(comm_, &id); });
    if (r != ncclSuccess) throw detail::nccl_failure(r, where("ncclCommGetUniqueId"), comm_);
    return std::string(id.internal, sizeof(id.internal));
  }

  /// The communicator of these ranks and `new_size - size()` newcomers (ncclCommGrow): every rank
  /// of this communicator calls it, rank 0 with the id it made by grow_unique_id() (the others
  /// with an empty one); ranks keep their numbers, newcomers take size() .. new_size-1. This
  /// communicator must be healthy and stays usable. Waits at most `timeout`. Needs can_grow().
  [[nodiscard]] std::unique_ptr<nccl_communicator> grow(int new_size, std::string_view root_id,
                                                        std::chrono::milliseconds timeout,
                                                        const detail::creation_check& check = {}) {
    if (!can_grow()) throw no_call("ncclCommGrow", "2.29.2", rank_);
    if (new_size <= size_) {
      throw error(errc::invalid_argument,
                  fmt::format("{}: new size {} must exceed the current {}", where("grow"), new_size, size_));
    }
    check_usable("grow");
    check_management("grow", timeout);
    detail::refuse_blocking_environment(where("grow"));
    std::optional<ncclUniqueId> id;
    if (!root_id.empty()) id = to_unique_id(root_id, where("grow") + ": the grow id");
    detail::cuda::device_scope on(device_);
    std::unique_ptr<nccl_communicator> next(
        new nccl_communicator(private_tag{}, rank_, new_size, device_, timeout, successor_stream(), options_));
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    ncclConfig_t config = nonblocking_config();
    auto slot = std::make_unique<detail::handle_slot>();
    ncclResult_t r = ncclSuccess;
    {
      // A boundary rank's ncclCommGrow waits inside NCCL for the id rank 0's ncclCommGetUniqueId
      // sends: bounded by the watchdog, should rank 0 never send it.
      auto scope = elastic::expires(timeout + options_.watchdog_margin, "nccl grow");
      std::lock_guard lk(comm_mu_);
      if (comm_ == nullptr) check_usable("grow");
      r = detail::nccl_call([&] {
        return detail::nccl_grow_fn()(comm_, new_size, id ? &*id : nullptr, -1, &slot->comm, &config);
      });
    }
    next->adopt_new_handle(r, slot->comm, deadline, "growing (ncclCommGrow)", check);
    return next;
  }

 private:
  struct private_tag {};

  // The fields, the stream and events, the barrier word; the handle comes later.
  nccl_communicator(private_tag, int rank, int size, int device, std::chrono::milliseconds timeout,
                    cudaStream_t stream, nccl_options options)
      : rank_(rank), size_(size), device_(device), timeout_(timeout), options_(options) {
    check_arguments();
    detail::refuse_blocking_environment(where("init"));
    detail::cuda::device_scope on(device_);
    adopt_stream(stream);
    ready_ = detail::cuda::event::create();
    done_ = detail::cuda::event::create();
    scratch_ = detail::cuda::device_bytes(scratch_bytes);
  }

  // abort(), or the destructor's teardown (`teardown`): the destructor runs on the group's
  // teardown thread beside the next communicator's calls, so its ncclCommAbort goes outside the
  // process-wide lock once the communicator has no asynchronous job in flight (a revoke still
  // draining is waited for, briefly; any other job, a shrink stuck on a peer say, gets the
  // locked abort at once). abort() is for giving up now, from any thread: always locked.
  void give_up(bool teardown) noexcept {
    aborted_.store(true, std::memory_order_release);
    failed_.store(true, std::memory_order_release);
    std::lock_guard once(abort_mu_);  // two threads aborting at once must not both join
    watcher_.stop();  // the watcher never calls abort(), so this never joins its own thread
    std::lock_guard lk(comm_mu_);
    if (comm_ == nullptr) return;
    detail::cuda::device_switch on(device_);
    if (!teardown) {
      detail::abort_handle(comm_);
    } else {
      const bool draining = revoke_draining_.load(std::memory_order_acquire) && !shrink_started_;
      detail::abort_settled(comm_, draining ? std::min(timeout_, std::chrono::milliseconds(2000))
                                            : std::chrono::milliseconds(0));
    }
    comm_ = nullptr;
  }

  // Staging for `bytes` of host collective: the scratch, grown (doubling, kept) when it is too
  // small, so a resync of a large host state allocates once per communicator, not per call.
  void* staging_for(std::size_t bytes) {
    if (bytes > scratch_size_) {
      std::size_t n = scratch_size_ * 2;
      while (n < bytes) n *= 2;
      scratch_ = detail::cuda::device_bytes(n);
      scratch_size_ = n;
    }
    return scratch_.get();
  }

  static ncclConfig_t nonblocking_config() noexcept {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    return config;
  }

  static ncclUniqueId to_unique_id(std::string_view blob, std::string_view what) {
    if (blob.size() != NCCL_UNIQUE_ID_BYTES) {
      throw error(errc::invalid_argument,
                  fmt::format("{} has {} bytes, NCCL wants {}: pass the 128 bytes the maker returned, unchanged", what,
                              blob.size(), NCCL_UNIQUE_ID_BYTES));
    }
    ncclUniqueId id;
    std::memcpy(id.internal, blob.data(), NCCL_UNIQUE_ID_BYTES);
    return id;
  }

  // shrink()'s ranks to exclude, sorted and without repeats; throws for an empty list, or one
  // that is out of range or is this rank.
  std::vector<int> checked_exclusions(std::span<const int> excluded_ranks) const {
    if (excluded_ranks.empty()) {
      throw error(errc::invalid_argument,
                  where("shrink") + ": no rank to exclude; NCCL rejects an empty exclude list (every release from "
                                    "2.27.3 to 2.30.7): with nobody gone, keep this communicator, or build a new one");
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
    return excluded;
  }

  // What shrink() and grow() ask of this communicator before they start.
  void check_management(std::string_view what, std::chrono::milliseconds timeout) const {
    if (aborted_.load(std::memory_order_acquire)) {
      throw error(errc::aborted, fmt::format("{}: the communicator was aborted; {} before abort(), or build a new "
                                             "one from a fresh nccl_unique_id()",
                                             where(what), what));
    }
    if (revoke_failed_.load(std::memory_order_acquire)) {
      throw error(errc::peer_lost, fmt::format("{}: ncclCommRevoke failed earlier, so NCCL's in-flight work may still "
                                               "run: build a new communicator from a fresh nccl_unique_id()",
                                               where(what)));
    }
    if (timeout.count() <= 0) {
      throw error(errc::invalid_argument,
                  fmt::format("{}: timeout {} ms must be positive", where(what), timeout.count()));
    }
  }

  // Calls ncclCommShrink (once a revoked communicator is quiescent), non-blocking; the child will
  // be stored into `slot`. Throws when NCCL refuses at once (a sticky network error, say).
  void start_shrink(std::vector<int>& excluded, detail::handle_slot& slot,
                    std::chrono::steady_clock::time_point deadline, const detail::creation_check& check) {
    if (revoked_.load(std::memory_order_acquire)) {
      // Revoke leaves the communicator in progress until it is quiescent; then it may be shrunk.
      detail::await_ready(handle_or_throw("shrink"), deadline, where("waiting for the revoked communicator"), check,
                          [this] { abort(); });
    }
    std::lock_guard lk(comm_mu_);
    if (comm_ == nullptr) check_usable("shrink");
    // Work may still be in flight on a failed communicator that was not revoked (no ncclCommRevoke
    // here): NCCL_SHRINK_ABORT stops it first. A healthy or revoked one has none outstanding.
    const bool stuck = !ok() && !revoked_.load(std::memory_order_acquire);
    const int flags = stuck ? detail::nccl_shrink_abort : detail::nccl_shrink_default;
    shrink_started_ = true;
    ncclConfig_t config = nonblocking_config();
    const ncclResult_t r = detail::nccl_call([&] {
      return detail::nccl_shrink_fn()(comm_, excluded.data(), static_cast<int>(excluded.size()), &slot.comm, &config,
                                      flags);
    });
    if (r != ncclSuccess && r != ncclInProgress) throw detail::nccl_failure(r, where("ncclCommShrink"), comm_);
  }

  ncclComm_t handle_or_throw(std::string_view what) {
    std::lock_guard lk(comm_mu_);
    if (comm_ == nullptr) check_usable(what);
    return comm_;
  }

  // Takes `comm`, whose creation call returned `r`: polls it until ready (init, grow and a shrink's
  // child carry their own state), then starts the watcher. On failure it is aborted and we throw.
  void adopt_new_handle(ncclResult_t r, ncclComm_t comm, std::chrono::steady_clock::time_point deadline,
                        std::string_view what, const detail::creation_check& check) {
    if (r != ncclSuccess && r != ncclInProgress) {
      error e = detail::nccl_failure(r, where(what), comm);
      detail::abort_handle(comm);
      throw e;
    }
    if (comm == nullptr) {
      throw error(errc::peer_lost, where(what) + ": NCCL returned no communicator; build one from the next round");
    }
    detail::await_ready(comm, deadline, where(what), check, [&] { detail::abort_handle(comm); });
    comm_ = comm;
    try {
      watcher_ = internal::periodic_thread(options_.watch_interval, [this] { return watch(); });
    } catch (...) {
      detail::abort_handle(comm_);
      comm_ = nullptr;
      throw;
    }
  }

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

  // The caller's stream, or a non-blocking one of our own (then collectives first wait for the
  // legacy default stream: see the file comment).
  void adopt_stream(cudaStream_t stream) {
    if (stream != nullptr) {
      stream_ = stream;
      return;
    }
    owned_stream_ = detail::cuda::stream::create();
    stream_ = owned_stream_.get();
  }

  // A shrunk or grown communicator runs where this one does: on the caller's stream if it was
  // given one, else on a stream of its own.
  cudaStream_t successor_stream() const noexcept { return owned_stream_ ? nullptr : stream_; }

  // The watcher's tick: polls the asynchronous error so a peer's failure is noticed between
  // collectives; false (the thread ends) once the communicator is gone or broken.
  bool watch() noexcept {
    std::lock_guard cl(comm_mu_);
    if (comm_ == nullptr) return false;
    ncclResult_t state = ncclSuccess;
    try {
      state = detail::async_state(comm_);
      if (state != ncclSuccess && state != ncclInProgress) {
        async_failed_.store(true, std::memory_order_release);
        record(detail::nccl_failure(state, where("watcher (ncclCommGetAsyncError)"), comm_));
        stop_in_flight_locked();
        return false;
      }
    } catch (...) {
      return false;  // only a failed allocation for the message can land here
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

  // After a failure: with revoke, stop in-flight work now and keep the handle for shrink(). A
  // revoke NCCL refuses is recorded: shrink() is then refused and the caller re-initialises.
  // Without revoke, leave it: shrink() uses NCCL_SHRINK_ABORT, abort()/the destructor abort it.
  void stop_in_flight_locked() noexcept {
    if (comm_ == nullptr || revoked_.load(std::memory_order_acquire) || !can_revoke()) return;
    revoked_.store(true, std::memory_order_release);
    const ncclResult_t r = detail::nccl_call([&] { return detail::nccl_revoke_fn()(comm_, detail::nccl_revoke_default); });
    if (r == ncclInProgress) revoke_draining_.store(true, std::memory_order_release);
    if (r == ncclSuccess || r == ncclInProgress) return;
    // ncclCommRevoke ends by reporting the communicator's asynchronous state, so a network error
    // the communicator already carried (sticky) comes back here though the revoke took place.
    // Anything else means it did not.
    if (r != ncclRemoteError && r != ncclSystemError) revoke_failed_.store(true, std::memory_order_release);
    else async_failed_.store(true, std::memory_order_release);
    try {
      record(detail::nccl_failure(r, where("ncclCommRevoke"), comm_));
    } catch (...) {
      failed_.store(true, std::memory_order_release);
    }
  }

  static error no_call(std::string_view call, std::string_view since, int rank) {
    const auto& calls = detail::recovery_calls();
    return error(errc::not_supported,
                 fmt::format("nccl on rank {}: {} is not used here: it needs NCCL {}; this program was built against "
                             "{} and runs with {}{}{}: build a new communicator from a fresh nccl_unique_id()",
                             rank, call, since, detail::nccl_version_string(NCCL_VERSION_CODE),
                             detail::nccl_version_string(calls.version), calls.warning.empty() ? "" : "; ",
                             calls.warning));
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

  // Enqueues one collective with `enqueue(comm)` after the producer's work, and polls until the
  // GPU finished it, NCCL reported an error, or the timeout ran out. Any failure breaks the
  // communicator for good, except a malformed argument.
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

  // Hands the collective to NCCL after the producer's work, and records the completion event
  // behind it; a failure to enqueue throws (and, unless the call was merely malformed, breaks
  // the communicator).
  template <class Enqueue>
  void enqueue_collective(std::string_view what, Enqueue&& enqueue) {
    if (owned_stream_) {
      ready_.record(cudaStreamLegacy);  // the caller's kernels on the default stream come first
      ready_.make_wait(stream_);
    }
    std::lock_guard lk(comm_mu_);
    if (comm_ == nullptr) check_usable(what);
    const ncclResult_t r = detail::nccl_call([&] { return enqueue(comm_); });
    if (r != ncclSuccess && r != ncclInProgress) {
      error e = detail::nccl_failure(r, where(what), comm_);
      if (!detail::leaves_usable(r)) {
        record(e);
        stop_in_flight_locked();
      }
      throw e;
    }
  }

  // Polls until the enqueued collective finished on the GPU; throws (breaking the communicator)
  // on an NCCL or CUDA error, an error the watcher saw, a revoke or abort, or the deadline.
  // A non-blocking communicator may answer ncclInProgress and put the kernel on the stream only
  // later (src/group.cc launches it from a thread of its own): the completion event is recorded
  // once the state is ncclSuccess, never before, or it would precede the kernel.
  void wait_for_completion(std::string_view what, std::chrono::steady_clock::time_point deadline) {
    int spins = 0;
    bool recorded = false;
    for (;;) {
      const ncclResult_t state = poll_async_error(what);
      if (!ok()) check_usable(what);  // the watcher saw an error, or a revoke came
      if (state == ncclSuccess && !recorded) {
        done_.record(stream_);  // behind the kernel, now that it is on the stream
        recorded = true;
      }
      if (recorded && gpu_finished(what)) return;  // fully enqueued, and done
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
    const ncclResult_t state = detail::async_state(comm_);
    if (state != ncclSuccess && state != ncclInProgress) {
      async_failed_.store(true, std::memory_order_release);
      error e = detail::nccl_failure(state, where(what), comm_);
      record(e);
      stop_in_flight_locked();
      throw e;
    }
    return state;
  }

  // Whether the collective has finished: the event recorded right behind it, not the whole
  // stream (work queued after it must not count). A CUDA error throws.
  bool gpu_finished(std::string_view what) {
    try {
      return done_.query();
    } catch (const error& e) {
      error failure(errc::device_error, where(what) + ": " + e.message());
      record(failure);
      throw failure;
    }
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

  int rank_;
  int size_;
  int device_;
  std::chrono::milliseconds timeout_;
  nccl_options options_;
  detail::cuda::stream owned_stream_;  // declared before comm users: freed last
  cudaStream_t stream_ = nullptr;
  detail::cuda::event ready_;  // recorded on the legacy default stream before each collective (own stream)
  detail::cuda::event done_;   // recorded right behind each collective
  detail::cuda::device_bytes scratch_;  // the barrier's word, and the host collectives' staging
  std::size_t scratch_size_ = scratch_bytes;
  mutable std::mutex comm_mu_;  // guards comm_ (its lifetime)
  ncclComm_t comm_ = nullptr;
  std::atomic<bool> revoked_{false};        // ncclCommRevoke was called (set under comm_mu_)
  std::atomic<bool> revoke_failed_{false};  // ... and NCCL refused it
  std::atomic<bool> failed_{false};
  std::atomic<bool> aborted_{false};
  std::atomic<bool> revoked_by_caller_{false};
  std::atomic<bool> async_failed_{false};  // ncclCommGetAsyncError reported an error (sticky in NCCL)
  std::atomic<bool> revoke_draining_{false};  // ncclCommRevoke answered ncclInProgress: its job drains
  bool shrink_started_ = false;  // ncclCommShrink was called (its job may hold the state): under comm_mu_
  mutable std::mutex error_mu_;
  std::optional<error> last_error_;
  std::mutex abort_mu_;
  internal::periodic_thread watcher_;  // last: stopped (in abort(), from the destructor) before anything above goes
};

static_assert(communicator<nccl_communicator>);

}  // namespace elastic::inline v1::comm
