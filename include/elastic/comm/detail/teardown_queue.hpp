// Where an elastic group's communicators go when it no longer needs them: a thread of the
// group's own that destroys them one after the other, so the training thread never waits for a
// teardown. An NCCL abort ends by joining NCCL's proxy and UDS threads, which sleep in 500 ms
// polls (src/proxy.cc): on the rebuild's critical path that was most of the time a kill cost.
// Closing Gloo's connections takes up to 10 ms per peer. The next communicator is built
// meanwhile; nothing here holds a lock a rebuild takes.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <stop_token>
#include <thread>
#include <utility>

namespace elastic::inline v1::comm::detail {

/// Destroys the T handed to it on a thread of its own, in the order given. The destructor
/// destroys whatever is left and joins. `on_done(ms)` (optional, called on that thread, must not
/// throw) reports how long each teardown took.
template <class T>
class teardown_queue {
 public:
  explicit teardown_queue(std::function<void(double)> on_done = {}) : on_done_(std::move(on_done)) {}
  teardown_queue(const teardown_queue&) = delete;
  teardown_queue& operator=(const teardown_queue&) = delete;
  ~teardown_queue() { drain(); }

  /// Takes `victim` (nullptr: nothing) and returns at once. Where no thread can be started (no
  /// memory, no threads left) it is destroyed here instead: late, never lost. Never throws.
  void discard(std::unique_ptr<T> victim) noexcept {
    if (!victim) return;
    try {
      std::lock_guard lk(mu_);
      if (!thread_.joinable()) thread_ = std::jthread([this](std::stop_token st) { work(st); });
      queue_.push_back(std::move(victim));
      cv_.notify_one();
    } catch (...) {
      victim.reset();
    }
  }

  /// Destroys everything handed over so far, then returns (the thread ends; a later discard()
  /// starts another).
  void drain() noexcept {
    std::jthread t;
    {
      std::lock_guard lk(mu_);
      t = std::move(thread_);
    }
    if (t.joinable()) {
      t.request_stop();
      { std::lock_guard lk(mu_); }  // the worker is now waiting (and will be woken) or sees the stop
      cv_.notify_all();
      t.join();
    }
    std::deque<std::unique_ptr<T>> left;
    {
      std::lock_guard lk(mu_);
      left.swap(queue_);
    }
    left.clear();
  }

  /// How many teardowns have finished (for tests and events).
  [[nodiscard]] std::uint64_t finished() const noexcept {
    std::lock_guard lk(mu_);
    return finished_;
  }

 private:
  void work(std::stop_token st) noexcept {
    std::unique_lock lk(mu_);
    for (;;) {
      cv_.wait(lk, [&] { return !queue_.empty() || st.stop_requested(); });
      if (queue_.empty()) return;
      std::unique_ptr<T> victim = std::move(queue_.front());
      queue_.pop_front();
      lk.unlock();
      const auto t0 = std::chrono::steady_clock::now();
      victim.reset();  // destructors of communicators never throw
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (on_done_) on_done_(ms);
      lk.lock();
      ++finished_;
    }
  }

  std::function<void(double)> on_done_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<T>> queue_;
  std::uint64_t finished_ = 0;
  std::jthread thread_;  // last: joined (in drain) before the rest goes
};

}  // namespace elastic::inline v1::comm::detail
