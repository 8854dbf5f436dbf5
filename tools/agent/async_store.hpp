// The launcher's store calls, on a thread of their own. The supervision loop forwards signals,
// restarts workers and keeps the logs; a store that does not answer (an etcd that is down, frozen
// or unreachable: each call may retry for seconds) must never hold it. So the loop only queues
// calls here and goes on; the thread makes them, with short per-call timeouts, says on an eventfd
// when one is done, and reports failures back as messages the loop logs when it next looks.
//
// Calls are made in the order they were queued; each has a ticket, so that the loop can wait
// (in poll, not in the call) for one to be done, and can cancel one it no longer wants made.
//
// At the end the thread is given a bounded while to make the calls still queued (the last
// workers' alive keys), then it is left: a call stuck in the network is abandoned (the thread is
// detached; everything it uses is its own, shared with nobody), and the process exits without
// waiting for it.
#pragma once

#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <elastic/config.hpp>
#include <elastic/internal/file.hpp>
#include <elastic/error.hpp>
#include <elastic/rendezvous/open_store.hpp>
#include <elastic/rendezvous/store.hpp>

namespace elastic::agent {

namespace detail {
/// Set once a store thread was left running at exit: the program should end with _Exit, not
/// run static destructors under a thread still inside a library call.
inline std::atomic<bool> store_thread_abandoned{false};
}  // namespace detail

/// Per-call bounds for an etcd store: the loop never waits for them, but the end of the run does
/// (boundedly), and a queue must not fall minutes behind.
struct store_call_limits {
  std::chrono::milliseconds connect_timeout{500};
  std::chrono::milliseconds request_timeout{2000};
  std::chrono::milliseconds unavailable_timeout{3000};
};

class async_store {
 public:
  using limits = store_call_limits;
  /// Names a queued call; 0 names none.
  using ticket = std::uint64_t;

  async_store() = default;

  /// Serves `url` on a new thread. `opened`, if given, is the store already open (the launcher
  /// opens its own shm store itself, to lock it); otherwise the thread opens `url` first.
  async_store(std::string url, std::unique_ptr<rendezvous::store> opened, limits lim = {})
      : state_(std::make_shared<state>()) {
    state_->url = std::move(url);
    state_->store = std::move(opened);
    state_->lim = lim;
    state_->done_fd = elastic::internal::unique_fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    if (!state_->done_fd) throw os_error("cannot make an eventfd for the store thread");
    thread_ = std::thread([s = state_] { s->run(); });
  }

  async_store(const async_store&) = delete;
  async_store& operator=(const async_store&) = delete;
  ~async_store() { stop(std::chrono::seconds(2)); }

  /// Queues `store.erase(key)`; never blocks. Returns its ticket (0 when it was dropped).
  ticket erase(std::string key) {
    return call("the erase of " + key, [key](rendezvous::store& s) { (void)s.erase(key); });
  }

  /// Queues `fn(store)`, named `what` in the messages of a failure; never blocks. Returns its
  /// ticket (0 when it was dropped). `fn` runs on the store's thread: it must own what it uses.
  ticket call(std::string what, std::function<void(rendezvous::store&)> fn) {
    if (!state_) return 0;
    std::lock_guard lk(state_->mu);
    if (state_->jobs.size() >= max_queued) {
      state_->errors.push_back("store calls are " + std::to_string(max_queued) + " behind; dropped " + what);
      return 0;
    }
    const ticket t = ++state_->last_ticket;
    state_->jobs.push_back({t, std::move(what), std::move(fn)});
    state_->cv.notify_one();
    return t;
  }

  /// True once the call `t` was made (or failed, or was cancelled or dropped).
  [[nodiscard]] bool done(ticket t) const {
    if (!state_ || t == 0) return true;
    std::lock_guard lk(state_->mu);
    return state_->done_through >= t;
  }

  /// The call `t` is not wanted any more: if it has not started, it is never made.
  void cancel(ticket t) {
    if (!state_ || t == 0) return;
    std::lock_guard lk(state_->mu);
    if (state_->done_through < t) state_->cancelled.insert(t);
  }

  /// Readable (POLLIN) after a call was done; read_done() makes it quiet again.
  [[nodiscard]] int done_fd() const noexcept { return state_ ? state_->done_fd.get() : -1; }
  void read_done() const noexcept {
    std::uint64_t n;
    if (state_) (void)!::read(state_->done_fd.get(), &n, sizeof n);
  }

  /// Messages of the calls that failed since the last look.
  std::vector<std::string> take_errors() {
    if (!state_) return {};
    std::lock_guard lk(state_->mu);
    return std::exchange(state_->errors, {});
  }

  /// Asks the thread to make what is queued within `limit` and stop, waits that long for it,
  /// and leaves it behind (detached) if it is still stuck in a call then.
  void stop(std::chrono::milliseconds limit) noexcept {
    if (!state_ || !thread_.joinable()) return;
    std::unique_lock lk(state_->mu);
    state_->stopping = true;
    state_->drain_until = std::chrono::steady_clock::now() + limit;
    state_->cv.notify_all();
    const bool ended = state_->cv.wait_for(lk, limit + std::chrono::milliseconds(100), [&] { return state_->ended; });
    lk.unlock();
    if (ended) {
      thread_.join();
    } else {
      detail::store_thread_abandoned.store(true);
      thread_.detach();
    }
  }

 private:
  static constexpr std::size_t max_queued = 4096;

  struct job {
    ticket id;
    std::string what;
    std::function<void(rendezvous::store&)> fn;
  };

  struct state {
    mutable std::mutex mu;
    std::condition_variable cv;
    std::deque<job> jobs;
    std::set<ticket> cancelled;
    ticket last_ticket = 0;
    ticket done_through = 0;
    std::vector<std::string> errors;
    bool stopping = false;
    std::chrono::steady_clock::time_point drain_until{};
    bool ended = false;
    elastic::internal::unique_fd done_fd;
    std::string url;
    std::unique_ptr<rendezvous::store> store;
    limits lim;

    void run() noexcept {
      try {
        if (!store) {
#if ELASTIC_WITH_ETCD
          rendezvous::etcd_options o;
          o.connect_timeout = lim.connect_timeout;
          o.request_timeout = lim.request_timeout;
          o.unavailable_timeout = lim.unavailable_timeout;
          store = rendezvous::open_store(url, o);
#else
          store = rendezvous::open_store(url);
#endif
        }
      } catch (const std::exception& e) {
        fail(std::string("cannot open the store: ") + e.what());
      }
      std::unique_lock lk(mu);
      for (;;) {
        cv.wait(lk, [&] { return stopping || !jobs.empty(); });
        if (stopping && (jobs.empty() || std::chrono::steady_clock::now() >= drain_until)) break;
        job j = std::move(jobs.front());
        jobs.pop_front();
        const bool wanted = cancelled.erase(j.id) == 0;
        lk.unlock();
        if (wanted) {
          try {
            if (store) j.fn(*store);
          } catch (const std::exception& e) {
            fail(j.what + " failed: " + e.what());
          }
        }
        lk.lock();
        done_through = j.id;
        const std::uint64_t one = 1;
        (void)!::write(done_fd.get(), &one, sizeof one);
      }
      ended = true;
      cv.notify_all();
      lk.unlock();
      // The store goes with the state, when the last of its owners lets go.
    }

    void fail(std::string message) noexcept {
      try {
        std::lock_guard lk(mu);
        errors.push_back(std::move(message));
      } catch (...) {
      }
    }
  };

  std::shared_ptr<state> state_;
  std::thread thread_;
};

}  // namespace elastic::agent
