// A trainer for tests/test_preemption.cpp: how a training_loop ends under signals, failed
// checkpoints, several standalone ranks and bad settings.
//
//   elastic_preempt_worker --dir DIR [options]
//     --steps N            total steps (default: until preempted)
//     --every N            checkpoint every N steps (default 10)
//     --size N             floats of state over all ranks (default 262144); each rank holds a
//                          slice of it (a shard), so every rank writes its own part
//     --rank R --world W   else ELASTIC_RANK / ELASTIC_WORLD_SIZE (or 0 of 1)
//     --sleep-us N         per step (default 1000)
//     --slow-rank R --slow-sleep-us N   rank R sleeps N per step instead
//     --timeout-ms N       the step timer scope (default: ELASTIC_STEP_TIMEOUT)
//     --fsize-limit-at S   before step S, limit the size of files this process writes (a full
//                          disk, as far as the checkpoint data file can tell)
//     --restore-fsize      lift the limit again once a checkpoint has failed
//     --slow-final-ms N    after a notice, the snapshot's capture (the final one) takes N ms
//     --stop-at S          call loop.stop() in step S
//     --linger-ms N        after the loop, N ms more before exiting (a teardown: a group to leave)
//     --ignore-term        SIGTERM is ignored before the loop installs its handlers
//
// stdout, one line each, flushed:
//   start STEP                       restored, about to train
//   limited STEP / restored STEP     the file size limit was set / lifted in step STEP
//   end REASON STEP EXIT             the loop ended; EXIT is the exit code it asks for
//   gone                             the loop is destroyed (--linger-ms starts)
//   error CODE MESSAGE               an elastic::error left the loop (exit 1)
#include <signal.h>
#include <sys/resource.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <elastic/checkpoint.hpp>

namespace {

struct options {
  std::string dir;
  std::uint64_t steps = 0, every = 10;
  std::size_t size = 262144;
  int rank = -1, world = -1;
  long sleep_us = 1000, slow_sleep_us = -1;
  int slow_rank = -1;
  long timeout_ms = 0;
  long fsize_limit_at = -1;
  bool restore_fsize = false;
  long slow_final_ms = 0;
  long stop_at = -1;
  long linger_ms = 0;
  bool ignore_term = false;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "elastic_preempt_worker: %s\n", why.c_str());
  std::exit(2);
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--restore-fsize") {
      o.restore_fsize = true;
      continue;
    }
    if (a == "--ignore-term") {
      o.ignore_term = true;
      continue;
    }
    if (i + 1 >= argc) usage("missing value for " + std::string(a));
    const char* v = argv[++i];
    const long long n = std::strtoll(v, nullptr, 10);
    if (a == "--dir") o.dir = v;
    else if (a == "--steps") o.steps = static_cast<std::uint64_t>(n);
    else if (a == "--every") o.every = static_cast<std::uint64_t>(n);
    else if (a == "--size") o.size = static_cast<std::size_t>(n);
    else if (a == "--rank") o.rank = static_cast<int>(n);
    else if (a == "--world") o.world = static_cast<int>(n);
    else if (a == "--sleep-us") o.sleep_us = static_cast<long>(n);
    else if (a == "--slow-rank") o.slow_rank = static_cast<int>(n);
    else if (a == "--slow-sleep-us") o.slow_sleep_us = static_cast<long>(n);
    else if (a == "--timeout-ms") o.timeout_ms = static_cast<long>(n);
    else if (a == "--fsize-limit-at") o.fsize_limit_at = static_cast<long>(n);
    else if (a == "--slow-final-ms") o.slow_final_ms = static_cast<long>(n);
    else if (a == "--stop-at") o.stop_at = static_cast<long>(n);
    else if (a == "--linger-ms") o.linger_ms = static_cast<long>(n);
    else usage("unknown option " + std::string(a));
  }
  if (o.dir.empty()) usage("--dir is required");
  return o;
}

void say(const std::string& line) {
  std::fputs((line + "\n").c_str(), stdout);
  std::fflush(stdout);
}

void set_fsize_limit(rlim_t bytes) {
  rlimit r{};
  ::getrlimit(RLIMIT_FSIZE, &r);
  r.rlim_cur = bytes == RLIM_INFINITY ? r.rlim_max : bytes;
  ::setrlimit(RLIMIT_FSIZE, &r);
}

/// Replicated state whose capture can be made slow: it stands for a large state that takes a
/// while to copy, so that a test can signal the process while its final checkpoint is taken.
struct capture_delay {
  long ms = 0;
};
template <class Archive>
void elastic_checkpoint(Archive& ar, capture_delay& d) {
  if (d.ms > 0 && elastic::preemption_handler::requested()) std::this_thread::sleep_for(std::chrono::milliseconds(d.ms));
  long zero = 0;
  ar(zero);
}

int train(const options& o) {
  // Past the size limit, a write fails with EFBIG instead of killing the process.
  ::signal(SIGXFSZ, SIG_IGN);
  try {
    // The world and this rank's slice of the state, as the loop will resolve them (a bad
    // setting is left for the loop to refuse: that is what the tests look at).
    const int world = o.world >= 0 ? o.world : static_cast<int>(elastic::internal::env_index_or_none("ELASTIC_WORLD_SIZE").value_or(1));
    const int rank = o.rank >= 0 ? o.rank : static_cast<int>(elastic::internal::env_index_or_none("ELASTIC_RANK").value_or(0));
    const std::size_t w = static_cast<std::size_t>(std::max(world, 1));
    const std::size_t r = static_cast<std::size_t>(std::clamp(rank, 0, std::max(world - 1, 0)));
    const std::size_t lo = o.size * r / w, hi = o.size * (r + 1) / w;
    std::vector<float> weights(hi - lo, 0.0f);
    std::uint64_t step_value = 0;
    capture_delay delay{o.slow_final_ms};
    elastic::checkpoint::state st;
    st.add_shard("weights", std::span<float>(weights), lo, o.size).add_value("step", step_value).add_object("delay", delay);

    elastic::training_loop loop({.dir = o.dir,
                                 .steps = o.steps,
                                 .every_steps = o.every,
                                 .keep_last = 3,
                                 .step_timeout = std::chrono::milliseconds(o.timeout_ms),
                                 .rank = o.rank,
                                 .world_size = o.world},
                                st);
    say("start " + std::to_string(loop.start_step()));
    const long sleep_us = rank == o.slow_rank && o.slow_sleep_us >= 0 ? o.slow_sleep_us : o.sleep_us;
    bool limited = false;
    for (auto& step : loop) {
      const auto i = static_cast<long>(step.index());
      if (i == o.fsize_limit_at) {
        loop.checkpointer().wait_durable();  // what came before is committed: only what follows fails
        set_fsize_limit(64 * 1024);  // the state's part is larger: its data file cannot be written
        limited = true;
        say("limited " + std::to_string(i));
      }
      if (limited && o.restore_fsize && loop.checkpointer().stats().failed > 0) {
        set_fsize_limit(RLIM_INFINITY);
        limited = false;
        say("restored " + std::to_string(i));
      }
      if (i == o.stop_at) loop.stop();
      if (sleep_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
      step.before_update();
      for (auto& x : weights) x += 1.0f;
      step_value = step.index() + 1;
    }
    say("end " + std::string(elastic::to_string(loop.reason())) + " " + std::to_string(loop.completed_steps()) + " " +
        std::to_string(loop.exit_code()));
    return loop.exit_code();
  } catch (const elastic::error& e) {
    say("error " + std::string(elastic::to_string(e.code())) + " " + e.what());
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const options o = parse(argc, argv);
  if (o.ignore_term) ::signal(SIGTERM, SIG_IGN);
  const int code = train(o);
  if (o.linger_ms > 0) {
    // The loop and its signal handlers are gone; the process is not, yet (a group to leave).
    say("gone");
    std::this_thread::sleep_for(std::chrono::milliseconds(o.linger_ms));
  }
  return code;
}
