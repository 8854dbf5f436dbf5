// A background thread that does one thing at a fixed interval: the rendezvous heartbeat, the
// group's membership watcher and the NCCL error watcher are each one of these. It can be woken
// early, and it is stopped and joined by its destructor, so an owner that declares it as its last
// member knows it has stopped before the members it uses go away.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <stop_token>
#include <thread>
#include <utility>

namespace elastic::inline v1::internal {

class periodic_thread {
 public:
  periodic_thread() = default;

  /// Starts a thread that calls `tick()` every `interval`, the first time one interval from now.
  /// `tick` returns false to end the thread. It must not throw: it runs where nobody can catch.
  template <class Tick>
  periodic_thread(std::chrono::nanoseconds interval, Tick tick) : wakeup_(std::make_unique<wakeup>()) {
    thread_ = std::jthread([w = wakeup_.get(), interval, tick = std::move(tick)](std::stop_token st) mutable {
      while (w->sleep(st, interval)) {
        if (!tick()) return;
      }
    });
  }

  periodic_thread(periodic_thread&&) noexcept = default;
  periodic_thread& operator=(periodic_thread&& other) noexcept {
    stop();
    thread_ = std::move(other.thread_);
    wakeup_ = std::move(other.wakeup_);
    return *this;
  }
  ~periodic_thread() { stop(); }

  /// Runs the next tick now instead of at the end of the interval.
  void wake() noexcept {
    if (wakeup_) wakeup_->ring();
  }

  /// Asks the thread to end and waits until it has. Idempotent; never call it from `tick`.
  void stop() noexcept {
    if (!thread_.joinable()) return;
    thread_.request_stop();
    thread_.join();
  }

  /// Whether a thread was started and has not been stopped (it may have ended on its own).
  [[nodiscard]] bool started() const noexcept { return thread_.joinable(); }

 private:
  // Lives on the heap so that a moved periodic_thread's running thread keeps pointing at it.
  struct wakeup {
    std::mutex mutex;
    std::condition_variable_any cv;
    bool rung = false;

    // False when a stop was requested; true when the interval passed or wake() was called.
    bool sleep(const std::stop_token& st, std::chrono::nanoseconds interval) {
      std::unique_lock lock(mutex);
      cv.wait_for(lock, st, interval, [this] { return rung; });
      rung = false;
      return !st.stop_requested();
    }
    void ring() noexcept {
      {
        std::lock_guard lock(mutex);
        rung = true;
      }
      cv.notify_all();
    }
  };

  std::unique_ptr<wakeup> wakeup_;
  std::jthread thread_;  // last: joined before wakeup_ goes away
};

}  // namespace elastic::inline v1::internal
