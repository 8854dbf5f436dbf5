// The gloo backend: CPU collectives over TCP (Debian: libgloo-dev), bootstrapped through our
// key-value store. Link elastic::gloo (it defines ELASTIC_WITH_GLOO=1).
//
// Gloo 0.5 (Debian's 0.0~git20220518) is used through its options API (AllreduceOptions,
// BroadcastOptions, BarrierOptions), each with a per-call timeout. revoke() ends a collective in
// flight on another thread at once (detail/gloo_revoke.hpp, detail/gloo_waits.hpp), as an elastic
// group's watcher does when a member's heartbeat lapses: a peer frozen with its sockets open
// never makes Gloo fail.
#pragma once

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <elastic/checkpoint/preemption.hpp>
#include <elastic/comm/communicator.hpp>
#include <elastic/comm/detail/gloo_revoke.hpp>
#include <elastic/comm/detail/gloo_store_adapter.hpp>
#include <elastic/comm/detail/gloo_waits.hpp>
#include <elastic/error.hpp>
#include <elastic/rendezvous/store.hpp>

namespace elastic::inline v1::comm {

namespace detail {

/// Gloo writes to its TCP peers without MSG_NOSIGNAL: a write to a peer that just died (or on a
/// connection revoke() shut down) raises SIGPIPE, whose default action kills the survivor that
/// was about to recover. The disposition is the process's own, so it is changed only while it is
/// the default (a handler the program installed is left alone); the write then fails with EPIPE
/// and the collective throws.
inline void ignore_sigpipe() noexcept {
  struct sigaction old {};
  if (::sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) ::signal(SIGPIPE, SIG_IGN);
}

}  // namespace detail

/// A Gloo communicator over TCP: `size` ranks that meet under `prefix` in `store`.
///
/// The constructor blocks until every rank has connected (bounded by `timeout`); every
/// collective is bounded by `timeout` too. Not thread-safe: one thread drives the collectives;
/// ok(), last_error(), abort() and revoke() may be called from any thread.
class gloo_communicator {
 public:
  /// Connects rank `rank` of `size` through `store` under `prefix` (fresh for each round: Gloo's
  /// keys must not be left over from an earlier group). `hostname` is the address this rank
  /// listens on and publishes to its peers: loopback by default, for ranks on one host.
  gloo_communicator(rendezvous::store& store, std::string prefix, int rank, int size,
                    std::chrono::milliseconds timeout, std::string hostname = "127.0.0.1")
      : rank_(rank), size_(size), timeout_(timeout), prefix_(std::move(prefix)) {
    if (size < 1 || rank < 0 || rank >= size) {
      throw error(errc::invalid_argument,
                  fmt::format("gloo communicator: rank {} of size {} is out of range: need 0 <= rank < size", rank, size));
    }
    if (timeout.count() <= 0) {
      throw error(errc::invalid_argument,
                  fmt::format("gloo communicator: timeout {} ms must be positive", timeout.count()));
    }
    try {
      ::gloo::transport::tcp::attr attr;
      attr.hostname = std::move(hostname);
      device_ = ::gloo::transport::tcp::CreateDevice(attr);
      auto context = std::make_shared<detail::gloo_revocable_context>(rank, size);
      context->setTimeout(timeout);
      gloo_store_adapter adapter(store, prefix_, timeout);
      context->connectFullMesh(adapter, device_);
      context->track(waits_);
      sockets_ = detail::gloo_pair_sockets(*context);
      context_ = std::move(context);
    } catch (const error&) {
      throw;
    } catch (...) {
      throw translate(std::current_exception(), "connecting");
    }
  }

  gloo_communicator(const gloo_communicator&) = delete;
  gloo_communicator& operator=(const gloo_communicator&) = delete;
  /// Closes the connections (peers blocked on this rank see their collective fail).
  ~gloo_communicator() = default;

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return size_; }
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return timeout_; }

  /// False once a collective failed or abort() or revoke() was called; it is then unusable.
  [[nodiscard]] bool ok() const noexcept { return !failed_.load(std::memory_order_acquire); }

  /// The error that broke the communicator, if one did (abort() and revoke() leave none).
  [[nodiscard]] std::optional<error> last_error() const {
    std::lock_guard lk(mu_);
    return last_error_;
  }

  /// Gives the communicator up: every later call throws at once. A collective already running
  /// in another thread is not interrupted (revoke() does that), its timeout still bounds it.
  void abort() noexcept {
    aborted_.store(true, std::memory_order_release);
    failed_.store(true, std::memory_order_release);
  }

  /// Gives the communicator up because the group lost a member (`why` says which): a collective
  /// running in another thread throws errc::peer_lost with `why` now, not at its timeout, and so
  /// does every later call. The connections close, so the peers' collectives with this rank fail
  /// too. Any thread, while the communicator lives; a second call keeps the first reason.
  void revoke(std::string_view why = "the communicator was revoked") noexcept {
    {
      std::lock_guard lk(mu_);
      if (revoked_.load(std::memory_order_relaxed)) return;
      try {
        revoked_why_ = std::string(why);
      } catch (...) {  // no memory for the words: the revoke matters more
      }
      revoked_.store(true, std::memory_order_release);
    }
    failed_.store(true, std::memory_order_release);
    detail::ignore_sigpipe();  // a send racing the shutdown below fails, and kills nobody
    sockets_.shut_down();
    // The pairs fail now, but Gloo leaves a transfer already on the wire waiting (gloo_waits.hpp).
    waits_->revoke();
  }

  /// Combines `buf` across the ranks, in place. bfloat16/float16 buffers are widened to float in a
  /// scratch buffer (one allocation per call), reduced in float and rounded back once: Gloo 0.5
  /// has no bf16 type, and one rounding at the end is more accurate than rounding after every
  /// partial sum as a reduction in 16 bits would (every rank gets the same bits either way).
  template <reducible T>
  void allreduce(std::span<T> buf, reduce_op op) {
    if constexpr (is_half_v<T>) {
      check_usable("allreduce");
      if (buf.empty()) return;
      std::vector<float> wide(buf.size());
      std::transform(buf.begin(), buf.end(), wide.begin(), [](T h) { return static_cast<float>(h); });
      allreduce(std::span<float>(wide), op);
      std::transform(wide.begin(), wide.end(), buf.begin(), [](float x) { return T(x); });
    } else {
      check_usable("allreduce");
      if (buf.empty()) return;  // every rank passes the same length, so every rank skips
      run("allreduce", [&] {
        ::gloo::AllreduceOptions opts(context_);
        opts.setOutput(buf.data(), buf.size());
        opts.setReduceFunction(
            static_cast<void (*)(void*, const void*, const void*, std::size_t)>(&::gloo::sum<T>));
        opts.setTag(next_tag());
        opts.setTimeout(timeout_);
        ::gloo::allreduce(opts);
      });
      if (op == reduce_op::avg && size_ > 1) {
        const T n = static_cast<T>(size_);
        for (T& x : buf) x /= n;
      }
    }
  }

  /// Copies `root`'s `buf` into every rank's `buf` (bytes only: 16-bit floats travel as they are).
  template <reducible T>
  void broadcast(std::span<T> buf, int root) {
    check_usable("broadcast");
    if (root < 0 || root >= size_) {
      throw error(errc::invalid_argument,
                  fmt::format("gloo broadcast: root {} is out of range for a communicator of size {}", root, size_));
    }
    if (buf.empty()) return;
    run("broadcast", [&] {
      ::gloo::BroadcastOptions opts(context_);
      if constexpr (is_half_v<T>) {
        opts.setOutput(reinterpret_cast<std::uint16_t*>(buf.data()), buf.size());
      } else {
        opts.setOutput(buf.data(), buf.size());
      }
      opts.setRoot(root);
      opts.setTag(next_tag());
      opts.setTimeout(timeout_);
      ::gloo::broadcast(opts);
    });
  }

  /// Returns once every rank has entered the barrier.
  void barrier() {
    check_usable("barrier");
    run("barrier", [&] {
      ::gloo::BarrierOptions opts(context_);
      opts.setTag(next_tag());
      opts.setTimeout(timeout_);
      ::gloo::barrier(opts);
    });
  }

 private:
  // Every rank issues the same collectives in the same order, so a counter gives each one the
  // same tag on every rank and keeps a late message of one collective out of the next.
  std::uint32_t next_tag() noexcept { return tag_++; }

  void check_usable(std::string_view what) const {
    if (aborted_.load(std::memory_order_acquire)) {
      throw error(errc::aborted,
                  fmt::format("gloo {} on rank {}: the communicator under '{}' was aborted; build a new one for "
                              "the next round",
                              what, rank_, prefix_));
    }
    if (revoked_.load(std::memory_order_acquire)) {
      std::lock_guard lk(mu_);
      throw error(errc::peer_lost, fmt::format("gloo {} on rank {}: the communicator under '{}' was revoked ({}); "
                                               "build a new one for the next round",
                                               what, rank_, prefix_, revoked_why_));
    }
    if (failed_.load(std::memory_order_acquire)) {
      std::lock_guard lk(mu_);
      // run() sets last_error_ before failed_, so the fallbacks are for form's sake.
      const errc code = last_error_ ? last_error_->code() : errc::peer_lost;
      throw error(code,
                  fmt::format("gloo {} on rank {}: the communicator under '{}' is broken by an earlier failure ({}); "
                              "build a new one for the next round",
                              what, rank_, prefix_, last_error_ ? last_error_->message() : "unknown"),
                  last_error_ ? last_error_->os_code() : std::error_code());
    }
  }

  template <class F>
  void run(std::string_view what, F&& f) {
    try {
      f();
    } catch (...) {
      error e = translate(std::current_exception(), what);
      {
        std::lock_guard lk(mu_);
        last_error_ = e;
      }
      failed_.store(true, std::memory_order_release);
      throw e;
    }
  }

  static bool says_timeout(std::string_view msg) {
    std::string lower(msg);
    std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
    return lower.find("timed out") != std::string::npos || lower.find("timeout") != std::string::npos;
  }

  /// A Gloo exception (or ours) as an elastic::error that says which collective and rank.
  error translate(std::exception_ptr ep, std::string_view what) const {
    const std::string where =
        fmt::format("gloo {} on rank {} of {} (store prefix '{}', timeout {} ms)", what, rank_, size_, prefix_,
                    timeout_.count());
    if (revoked_.load(std::memory_order_acquire)) {
      // Whatever Gloo threw after a revoke (the revoke's own error, or a peer's connection that
      // the same loss closed first), the loss is the cause.
      std::lock_guard lk(mu_);
      return error(errc::peer_lost, fmt::format("{} stopped: the communicator was revoked: {}", where, revoked_why_));
    }
    try {
      std::rethrow_exception(ep);
    } catch (const error& e) {
      return error(e.code(), fmt::format("{} failed: {}", where, e.message()), e.os_code());
    } catch (const ::gloo::IoException& e) {
      if (says_timeout(e.what())) {
        return error(errc::timeout, fmt::format("{} timed out: a peer did not answer in time, it may have died or "
                                                "hung ({})", where, e.what()));
      }
      return error(errc::peer_lost,
                   fmt::format("{} failed: a connection to a peer broke, it probably died ({})", where, e.what()));
    } catch (const ::gloo::EnforceNotMet& e) {
      return error(errc::corrupt, fmt::format("{} failed: a peer sent data that does not fit, ranks may disagree "
                                              "on sizes or the connection broke ({})", where, e.what()));
    } catch (const std::exception& e) {
      // Gloo's other failures come from its transport too; either way this communicator is lost.
      if (says_timeout(e.what())) return error(errc::timeout, fmt::format("{} timed out ({})", where, e.what()));
      return error(errc::peer_lost, fmt::format("{} failed ({})", where, e.what()));
    } catch (...) {
      return error(errc::peer_lost, fmt::format("{} failed with an unknown exception", where));
    }
  }

  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  std::string prefix_;
  std::shared_ptr<::gloo::transport::Device> device_;
  std::shared_ptr<::gloo::Context> context_;
  detail::gloo_pair_sockets sockets_;  // its pairs' connections, for revoke()
  std::shared_ptr<detail::gloo_waits> waits_ = std::make_shared<detail::gloo_waits>();  // its collectives' waits
  std::uint32_t tag_ = 0;
  std::atomic<bool> failed_{false};
  std::atomic<bool> aborted_{false};
  std::atomic<bool> revoked_{false};
  mutable std::mutex mu_;
  std::optional<error> last_error_;
  std::string revoked_why_;  // guarded by mu_; set once, before revoked_
};

static_assert(communicator<gloo_communicator>);

}  // namespace elastic::inline v1::comm
