// NCCL's device code loaded before a process's first communicator needs it. CUDA loads a
// library's kernels into the context lazily, and every NCCL init asks each of NCCL's kernels for
// its attributes: the first init of a process pays for loading them all, 340-460 ms on an H200
// (NCCL's "Init timings", "kernels"), a third of the ~1.2 s in which a restarted rank trained
// again. With ELASTIC_NCCL_WARM_UP=1, nccl_factory starts a warm-up when it is made: a one-rank
// communicator made and aborted on a thread of its own while the process joins its rendezvous (a
// newcomer then waits ~0.5 s for the members' agreed safe point), so the round's init finds the
// kernels loaded: a restarted rank trained again after 0.81-0.87 s instead of 1.18-1.20 s
// (benchmarks/README.md). Off by default: in one of ten GPU scenarios (libnccl 2.28.3, a rank
// hung) the warm-up's abort, beside the round's communicator, never completed in any rank and
// the test timed out; the cause is not known. A warm-up that fails changes nothing: the first init
// loads the kernels itself and reports what is wrong.
#pragma once

#include <elastic/config.hpp>

#if !ELASTIC_WITH_NCCL
#error "elastic/comm/detail/nccl_warm_up.hpp needs NCCL: link elastic::nccl (which sets ELASTIC_WITH_NCCL=1)"
#endif

#include <atomic>
#include <chrono>
#include <stop_token>
#include <thread>

#include <elastic/comm/nccl.hpp>
#include <elastic/error.hpp>
#include <elastic/internal/env.hpp>

namespace elastic::inline v1::comm::detail {

class nccl_warm_up {
 public:
  /// Whether a factory warms NCCL up: when $ELASTIC_NCCL_WARM_UP is 1 (an unreadable value is
  /// errc::invalid_argument).
  static bool enabled() { return internal::env_int("ELASTIC_NCCL_WARM_UP", 0, 1).value_or(0) != 0; }

  /// Starts loading NCCL's kernels for CUDA device `device`. Never throws: without a thread to
  /// spare, the first init loads them as it always did.
  explicit nccl_warm_up(int device) noexcept {
    try {
      thread_ = std::jthread([this, device](std::stop_token st) { run(device, st); });
    } catch (...) {
      done_.store(true, std::memory_order_release);
    }
  }
  nccl_warm_up(const nccl_warm_up&) = delete;
  nccl_warm_up& operator=(const nccl_warm_up&) = delete;
  /// Joins: a warm-up under way ends with its communicator's abort (up to ~1 s: NCCL's proxy
  /// threads end at their next poll); one not yet begun is skipped.
  ~nccl_warm_up() = default;

  /// Whether the warm-up has ended (done or failed).
  [[nodiscard]] bool finished() const noexcept { return done_.load(std::memory_order_acquire); }

 private:
  void run(int device, std::stop_token st) noexcept {
    try {
      if (!st.stop_requested()) nccl_communicator one(nccl_unique_id(), 0, 1, device, std::chrono::seconds(30));
    } catch (...) {  // NOLINT(bugprone-empty-catch): the round's own init reports any error
    }
    done_.store(true, std::memory_order_release);
  }

  std::atomic<bool> done_{false};
  std::jthread thread_;  // last: joined before done_ goes
};

}  // namespace elastic::inline v1::comm::detail
