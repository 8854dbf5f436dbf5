// The waits of a Gloo context's collectives, which gloo_communicator's revoke() wakes. Needs Gloo
// (elastic::gloo).
//
// Shutting a pair's socket down (detail/gloo_revoke.hpp) fails the pair, and Gloo 0.5's
// Pair::signalException then hands its error to the buffers queued on it: receives posted and
// sends not yet started. Not to an unbound buffer whose send is already on the wire (queued in
// the pair's tx_, half written because the peer stopped reading) nor one whose receive has begun:
// those wait on to their timeout, although the pair is closed. That is what a peer frozen in the
// middle of a transfer leaves behind (seen: a survivor's allreduce in UnboundBuffer::waitSend for
// 60 s after its watcher's revoke; still so in Gloo's main branch in 2026).
//
// So every unbound buffer the collectives make goes through a transport context of ours that
// hands out the tcp transport's buffer behind a thin forwarder, which notes the buffer while it
// lives. A revoke sets a flag and aborts the waits of every buffer noted (abortWaitSend and
// abortWaitRecv, Gloo's own, which leave a wait not yet begun to end at once too); a wait that
// ends so, or starts after the flag, throws gloo::IoException, which the collective passes up
// and the communicator reports as the revoke. The tcp buffer is still what every pair sends
// from and receives into, so Gloo's protocol is untouched, and its destructor still waits out a
// write in progress (gloo/common/memory.h) before the memory behind it can go.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/context.h>
#include <gloo/transport/pair.h>
#include <gloo/transport/unbound_buffer.h>

namespace elastic::inline v1::comm::detail {

/// The unbound buffers alive in one Gloo context, and the revoke that wakes their waits.
class gloo_waits {
 public:
  using buffer = ::gloo::transport::UnboundBuffer;

  /// Notes `b` until forget(b). Throws std::bad_alloc only.
  void note(buffer* b) {
    std::lock_guard lk(mu_);
    live_.push_back(b);
  }

  void forget(buffer* b) noexcept {
    std::lock_guard lk(mu_);
    if (const auto at = std::find(live_.begin(), live_.end(), b); at != live_.end()) live_.erase(at);
  }

  /// Wakes every wait in progress, and makes every later one end at once. Any thread, any number
  /// of times. (A buffer that read the flag just before it was set is noted, so its wait is
  /// aborted here: Gloo keeps an abort for a wait not yet begun.)
  void revoke() noexcept {
    revoked_.store(true, std::memory_order_release);
    std::lock_guard lk(mu_);
    for (buffer* b : live_) {
      b->abortWaitSend();
      b->abortWaitRecv();
    }
  }

  /// Read before every send, receive and wait of a collective: a flag, no lock.
  [[nodiscard]] bool revoked() const noexcept { return revoked_.load(std::memory_order_acquire); }

 private:
  std::mutex mu_;  // held while aborting: a noted buffer is not destroyed under a revoke
  std::vector<buffer*> live_;
  std::atomic<bool> revoked_{false};
};

/// The tcp transport's unbound buffer behind a forwarder that a revoke can wake.
class gloo_revocable_buffer final : public ::gloo::transport::UnboundBuffer {
 public:
  gloo_revocable_buffer(std::unique_ptr<::gloo::transport::UnboundBuffer> inner, std::shared_ptr<gloo_waits> waits)
      : UnboundBuffer(inner->ptr, inner->size), inner_(std::move(inner)), waits_(std::move(waits)) {
    waits_->note(inner_.get());
  }
  gloo_revocable_buffer(const gloo_revocable_buffer&) = delete;
  gloo_revocable_buffer& operator=(const gloo_revocable_buffer&) = delete;
  ~gloo_revocable_buffer() override { waits_->forget(inner_.get()); }

  bool waitRecv(int* rank, std::chrono::milliseconds timeout) override {
    check();
    const bool done = inner_->waitRecv(rank, timeout);
    if (!done) check();
    return done;
  }
  bool waitSend(int* rank, std::chrono::milliseconds timeout) override {
    check();
    const bool done = inner_->waitSend(rank, timeout);
    if (!done) check();
    return done;
  }
  void abortWaitRecv() override { inner_->abortWaitRecv(); }
  void abortWaitSend() override { inner_->abortWaitSend(); }
  void send(int dst, std::uint64_t slot, std::size_t offset, std::size_t nbytes) override {
    check();
    inner_->send(dst, slot, offset, nbytes);
  }
  void recv(int src, std::uint64_t slot, std::size_t offset, std::size_t nbytes) override {
    check();
    inner_->recv(src, slot, offset, nbytes);
  }
  void recv(std::vector<int> srcs, std::uint64_t slot, std::size_t offset, std::size_t nbytes) override {
    check();
    inner_->recv(std::move(srcs), slot, offset, nbytes);
  }

 private:
  void check() const {
    if (waits_->revoked()) throw ::gloo::IoException("the communicator was revoked");
  }

  std::unique_ptr<::gloo::transport::UnboundBuffer> inner_;
  std::shared_ptr<gloo_waits> waits_;
};

/// A transport context that forwards to the tcp one and hands out revocable buffers.
class gloo_revocable_transport final : public ::gloo::transport::Context {
 public:
  gloo_revocable_transport(std::shared_ptr<::gloo::transport::Context> inner, std::shared_ptr<gloo_waits> waits)
      : Context(inner->rank, inner->size), inner_(std::move(inner)), waits_(std::move(waits)) {
    setTimeout(inner_->getTimeout());
  }

  std::unique_ptr<::gloo::transport::Pair>& getPair(int rank) override { return inner_->getPair(rank); }
  std::unique_ptr<::gloo::transport::Pair>& createPair(int rank) override { return inner_->createPair(rank); }
  std::unique_ptr<::gloo::transport::UnboundBuffer> createUnboundBuffer(void* ptr, std::size_t size) override {
    return std::make_unique<gloo_revocable_buffer>(inner_->createUnboundBuffer(ptr, size), waits_);
  }

 private:
  std::shared_ptr<::gloo::transport::Context> inner_;
  std::shared_ptr<gloo_waits> waits_;
};

/// gloo::rendezvous::Context whose collectives' buffers `waits` can wake: connect it as usual,
/// then call track() before the first collective.
class gloo_revocable_context final : public ::gloo::rendezvous::Context {
 public:
  using ::gloo::rendezvous::Context::Context;

  /// Puts the forwarding transport in front of the connected one (its pairs stay where they are).
  void track(std::shared_ptr<gloo_waits> waits) {
    transportContext_ = std::make_shared<gloo_revocable_transport>(std::move(transportContext_), std::move(waits));
  }
};

}  // namespace elastic::inline v1::comm::detail
