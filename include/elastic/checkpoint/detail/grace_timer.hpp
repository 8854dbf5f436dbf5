// The grace timer of a training loop after a preemption notice (see training_loop.hpp).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <stop_token>
#include <thread>

#include <elastic/checkpoint/preemption.hpp>
#include <elastic/events.hpp>

namespace elastic::inline v1::checkpoint::detail {

/// Exits 75 if the final checkpoint is not durable within the grace: the orchestrator's
/// SIGKILL is coming, and an orderly exit keeps the logs; the previous step stays committed.
class grace_timer {
 public:
  grace_timer(std::chrono::nanoseconds left, const event_log& events, std::uint64_t step)
      : thread_([this, left, events, step](std::stop_token) {
          std::unique_lock lk(mu_);
          if (cv_.wait_for(lk, left, [&] { return done_; })) return;
          events.emit("checkpoint_grace_exceeded", {{"step", step}, {"grace_ms", left.count() / 1e6}});
          std::_Exit(exit_preempted);
        }) {}
  ~grace_timer() {
    {
      std::lock_guard lk(mu_);
      done_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::jthread thread_;
};

}  // namespace elastic::inline v1::checkpoint::detail
