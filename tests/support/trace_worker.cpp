// A trainer written as the README's section 3 shows (a gloo_group with min 2 and max 4 ranks, a
// communicator timeout of 10 s, a training_loop checkpointing every 100 steps, under elastic-run
// and its automatic step deadlines), whose step times follow a trace: the deadline model's tests
// (test_deadline_traces.cpp) play realistic slowness at it, then a real hang.
//
//   trace_worker --ckpt DIR --steps N [options]        (under elastic-run; the state is 64 floats)
//     --step-ms T               each step computes T ms (a sleep), times the jitter and the drift
//     --jitter F                ... times a factor drawn from [1 - F, 1 + F] (its own generator)
//     --drift D                 ... times 1 + (D - 1) * step / N: a slow drift to D times
//     --eval-every K --eval-x X every K steps every rank evaluates for X * T ms more
//     --eval-unbounded          ... inside step.unbounded()
//     --rank0-every K --rank0-x X  every K steps rank 0 alone works X * T ms more (logging, saving)
//     --rank0-extend            ... after step.extend() by that much
//     --rank0-slow F            rank 0 computes F times as long in every step (rank-bound slowness)
//     --stall-slot S --stall-at STEP --stall-x X  slot S's loader stalls X * T ms once, at STEP
//     --kill-slot S --kill-at STEP    slot S SIGKILLs itself at STEP (its first life)
//     --warmup-ms W             a restarted life's first step takes W ms more (CUDA/NCCL init)
//     --rebuild-x X             every survivor's first step after a rebuild takes X * T ms more
//     --hang-slot S --hang-at STEP    slot S stops making progress at STEP (its first life)
//     --hang-inside-slot S --hang-inside-at STEP --hang-inside-how stop|handler
//                               slot S hangs inside STEP's allreduce (its first life): SIGSTOPs
//                               itself, or its main thread blocks in a signal handler (the
//                               process and its heartbeat live on)
//     --comm-timeout-ms C       the communicator's timeout (default 10000, the README's)
// Prints "finished at step N" at the end (rank 0), and exits with the loop's exit code.
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <elastic/elastic.hpp>

#include "splitmix.hpp"

namespace {

using namespace std::chrono_literals;

struct options {
  std::string ckpt;
  std::uint64_t steps = 200;
  double step_ms = 20, jitter = 0, drift = 1;
  long eval_every = 0, rank0_every = 0;
  double eval_x = 0, rank0_x = 0, rank0_slow = 1, stall_x = 0, rebuild_x = 0;
  bool eval_unbounded = false, rank0_extend = false;
  long stall_slot = -1, stall_at = -1, kill_slot = -1, kill_at = -1, hang_slot = -1, hang_at = -1;
  long hang_inside_slot = -1, hang_inside_at = -1;
  std::string hang_inside_how = "stop";
  double warmup_ms = 0;
  long comm_timeout_ms = 10000;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "trace_worker: %s\n", why.c_str());
  std::exit(2);
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(a + " needs a value");
      return argv[++i];
    };
    const auto number = [&] { return std::atof(value().c_str()); };
    if (a == "--ckpt") o.ckpt = value();
    else if (a == "--steps") o.steps = static_cast<std::uint64_t>(number());
    else if (a == "--step-ms") o.step_ms = number();
    else if (a == "--jitter") o.jitter = number();
    else if (a == "--drift") o.drift = number();
    else if (a == "--eval-every") o.eval_every = static_cast<long>(number());
    else if (a == "--eval-x") o.eval_x = number();
    else if (a == "--eval-unbounded") o.eval_unbounded = true;
    else if (a == "--rank0-every") o.rank0_every = static_cast<long>(number());
    else if (a == "--rank0-x") o.rank0_x = number();
    else if (a == "--rank0-extend") o.rank0_extend = true;
    else if (a == "--rank0-slow") o.rank0_slow = number();
    else if (a == "--stall-slot") o.stall_slot = static_cast<long>(number());
    else if (a == "--stall-at") o.stall_at = static_cast<long>(number());
    else if (a == "--stall-x") o.stall_x = number();
    else if (a == "--kill-slot") o.kill_slot = static_cast<long>(number());
    else if (a == "--kill-at") o.kill_at = static_cast<long>(number());
    else if (a == "--warmup-ms") o.warmup_ms = number();
    else if (a == "--rebuild-x") o.rebuild_x = number();
    else if (a == "--hang-slot") o.hang_slot = static_cast<long>(number());
    else if (a == "--hang-at") o.hang_at = static_cast<long>(number());
    else if (a == "--hang-inside-slot") o.hang_inside_slot = static_cast<long>(number());
    else if (a == "--hang-inside-at") o.hang_inside_at = static_cast<long>(number());
    else if (a == "--hang-inside-how") o.hang_inside_how = value();
    else if (a == "--comm-timeout-ms") o.comm_timeout_ms = static_cast<long>(number());
    else usage("unknown option " + a);
  }
  if (o.ckpt.empty()) usage("--ckpt DIR is required");
  if (o.hang_inside_how != "stop" && o.hang_inside_how != "handler") usage("--hang-inside-how is stop or handler");
  return o;
}

void sleep_ms(double ms) {
  if (ms > 0) std::this_thread::sleep_for(std::chrono::microseconds(static_cast<long>(ms * 1e3)));
}

using elastic::test::splitmix;

// The main thread, caught inside a collective: it never returns from this handler.
void hang_here(int) {
  for (;;) ::pause();
}

}  // namespace

int main(int argc, char** argv) {
  const options o = parse(argc, argv);
  try {
    const long slot = static_cast<long>(elastic::env_int("ELASTIC_LOCAL_RANK", 0, 65535).value_or(0));
    const bool first_life = elastic::env_int("ELASTIC_RESTART_COUNT", 0, 1'000'000'000).value_or(0) == 0;
    const auto url = elastic::env_string("ELASTIC_RDZV");
    if (!url) usage("run me under elastic-run (ELASTIC_RDZV is not set)");
    auto store = elastic::rendezvous::open_store(*url);

    std::vector<float> weights(64, 0.0f);
    elastic::checkpoint::state st;
    st.add("weights", weights);
    // The README's settings, as written there.
    elastic::comm::gloo_group group(*store, {.rendezvous = {.min_ranks = 2, .max_ranks = 4}},
                                    elastic::comm::gloo_factory(std::chrono::milliseconds(o.comm_timeout_ms)));
    elastic::training_loop loop({.dir = o.ckpt, .steps = o.steps, .every_steps = 100, .group = &group}, st);

    std::uint64_t pace = 7 + static_cast<std::uint64_t>(slot);
    std::vector<float> grads(weights.size());
    std::size_t rebuilds = group.rebuilds();
    bool first_step = true;
    const pthread_t main_thread = ::pthread_self();
    for (auto& step : loop) {
      const long s = static_cast<long>(step.index());
      const int rank = group.rank();
      double ms = o.step_ms;
      if (o.jitter > 0) ms *= 1 + o.jitter * (static_cast<double>(splitmix(pace) % 2001) / 1000.0 - 1);
      ms *= 1 + (o.drift - 1) * static_cast<double>(s) / static_cast<double>(o.steps);
      if (rank == 0) ms *= o.rank0_slow;
      if (first_step && !first_life) ms += o.warmup_ms;  // a restarted worker warms up
      if (group.rebuilds() != rebuilds) {
        rebuilds = group.rebuilds();
        if (!first_step) ms += o.rebuild_x * o.step_ms;  // a survivor re-shards its loader
      }
      first_step = false;
      if (first_life && slot == o.stall_slot && s == o.stall_at) ms += o.stall_x * o.step_ms;
      sleep_ms(ms);
      if (first_life && slot == o.kill_slot && s == o.kill_at) {
        std::printf("slot %ld SIGKILLs itself at step %ld (injected)\n", slot, s);
        std::fflush(stdout);
        ::kill(::getpid(), SIGKILL);
      }
      if (first_life && slot == o.hang_slot && s == o.hang_at) {
        std::printf("slot %ld hangs in step %ld (injected)\n", slot, s);
        std::fflush(stdout);
        for (;;) std::this_thread::sleep_for(1s);
      }
      if (o.eval_every > 0 && s > 0 && s % o.eval_every == 0) {
        if (o.eval_unbounded) {
          auto eval = step.unbounded();
          sleep_ms(o.eval_x * o.step_ms);
        } else {
          sleep_ms(o.eval_x * o.step_ms);
        }
      }
      if (rank == 0 && o.rank0_every > 0 && s > 0 && s % o.rank0_every == 0) {
        const double extra = o.rank0_x * o.step_ms;
        if (o.rank0_extend) step.extend(std::chrono::milliseconds(static_cast<long>(extra * 2 + 1000)));
        sleep_ms(extra);
      }
      std::jthread injector;
      if (first_life && s == o.hang_inside_at && slot != o.hang_inside_slot) {
        std::this_thread::sleep_for(300ms);  // the rank that hangs is in the allreduce first, waiting for us
      }
      if (first_life && slot == o.hang_inside_slot && s == o.hang_inside_at) {
        std::printf("slot %ld hangs inside the allreduce of step %ld (injected: %s)\n", slot, s,
                    o.hang_inside_how.c_str());
        std::fflush(stdout);
        const bool stop = o.hang_inside_how == "stop";
        if (!stop) {
          struct sigaction sa {};
          sa.sa_handler = hang_here;
          ::sigaction(SIGUSR2, &sa, nullptr);
        }
        // This rank enters the allreduce first and waits there for the others (300 ms late):
        // it is caught inside, mid-wait.
        injector = std::jthread([stop, main_thread] {
          std::this_thread::sleep_for(100ms);
          if (stop) ::kill(::getpid(), SIGSTOP);
          else ::pthread_kill(main_thread, SIGUSR2);
        });
      }
      for (std::size_t k = 0; k < grads.size(); ++k) grads[k] = static_cast<float>((s + 1) % 7) * 1e-3f;
      if (!group.allreduce(std::span<float>(grads), elastic::comm::reduce_op::avg)) continue;  // redone
      step.before_update();
      for (std::size_t k = 0; k < weights.size(); ++k) weights[k] -= grads[k];
    }
    if (group.rank() == 0) {
      std::printf("%s at step %llu\n", loop.reason() == elastic::loop_reason::preempted ? "preempted" : "finished",
                  static_cast<unsigned long long>(loop.completed_steps()));
    }
    return loop.exit_code();
  } catch (const elastic::error& e) {
    std::fprintf(stderr, "trace_worker: %s\n", e.what());
    return 1;
  }
}
