// A small deterministic trainer for the checkpoint tests: real state (weights, optimizer
// moments, an RNG, a data loader object), real checkpoints, real signals.
//
//   train_worker DIR STEPS EVERY [options]
//     --size N          weights (floats), default 65536
//     --sleep-us N      per step, default 0
//     --rank R --world W  (sharded weights: each rank holds a slice of the global vector)
//     --timeout-ms N    step timer scope
//     --adaptive F      max_overhead for the adaptive interval
//     --no-final        no checkpoint at the end
//     --keep N          keep_last, default 3
//     --jitter F        each step sleeps sleep-us times a factor drawn from [1 - F, 1 + F]
//     --slow-every K X  steps whose index is K modulo EVERY sleep X times longer (checkpoint steps)
//     --hang-at S       step S never ends (prints "hang S" first): for the watchdog
//
// Prints "start STEP" once restored, then at the end "end REASON STEP CHECKSUM" where the
// checksum covers every byte of state, and exits with the loop's exit code. An elastic::error
// prints "error CODE MESSAGE" (on one line) and exits 1; any other exception is not caught, so
// that one leaving the library shows as std::terminate (SIGABRT).
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <elastic/checkpoint.hpp>
#include <elastic/internal/crc32c.hpp>

#include "splitmix.hpp"

namespace {

struct loader {
  std::uint64_t epoch = 0;
  std::uint64_t cursor = 0;
  std::vector<std::uint32_t> order;
  std::string name = "synthetic";
};

template <class Archive>
void elastic_checkpoint(Archive& ar, loader& l) {
  ar(l.epoch, l.cursor, l.order, l.name);
}

using elastic::test::splitmix;

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: train_worker DIR STEPS EVERY [options]\n");
    return 2;
  }
  const std::string dir = argv[1];
  const std::uint64_t steps = std::strtoull(argv[2], nullptr, 10);
  const std::uint64_t every = std::strtoull(argv[3], nullptr, 10);
  std::size_t size = 65536;
  long sleep_us = 0, timeout_ms = 0;
  int rank = 0, world = 1;
  double adaptive = 0;
  bool final_ckpt = true;
  std::size_t keep = 3;
  double jitter = 0, slow_factor = 1;
  long slow_phase = -1;
  long long hang_at = -1;
  std::uint64_t pace = 7;  // the jitter's own generator
  for (int i = 4; i < argc; ++i) {
    std::string_view a = argv[i];
    auto next = [&] { return i + 1 < argc ? argv[++i] : (std::fprintf(stderr, "missing value\n"), std::exit(2), argv[0]); };
    if (a == "--size") size = std::strtoull(next(), nullptr, 10);
    else if (a == "--sleep-us") sleep_us = std::atol(next());
    else if (a == "--rank") rank = std::atoi(next());
    else if (a == "--world") world = std::atoi(next());
    else if (a == "--timeout-ms") timeout_ms = std::atol(next());
    else if (a == "--adaptive") adaptive = std::atof(next());
    else if (a == "--no-final") final_ckpt = false;
    else if (a == "--keep") keep = std::strtoull(next(), nullptr, 10);
    else if (a == "--jitter") jitter = std::atof(next());
    else if (a == "--slow-every") {
      slow_phase = std::atol(next());
      slow_factor = std::atof(next());
    } else if (a == "--hang-at") hang_at = std::atoll(next());
    else {
      std::fprintf(stderr, "unknown option %s\n", argv[i]);
      return 2;
    }
  }
  // The global model is `size` floats; this rank holds an even slice of it.
  const std::size_t lo = size * static_cast<std::size_t>(rank) / static_cast<std::size_t>(world);
  const std::size_t hi = size * static_cast<std::size_t>(rank + 1) / static_cast<std::size_t>(world);
  std::vector<float> w(hi - lo), m(hi - lo);
  for (std::size_t i = lo; i < hi; ++i) w[i - lo] = static_cast<float>(i % 97) / 97.0f;
  std::uint64_t rng = 42, step_value = 0;
  loader data;
  data.order.resize(64);
  for (std::uint32_t i = 0; i < 64; ++i) data.order[i] = i;

  elastic::checkpoint::state st;
  if (world > 1) st.add_shard("weights", std::span<float>(w), lo, size);
  else st.add("weights", w);
  if (world > 1) st.add_shard("adam_m", std::span<float>(m), lo, size);
  else st.add("adam_m", m);
  st.add_value("rng", rng);
  st.add_value("step", step_value);
  st.add_object("loader", data);

  try {
    elastic::training_loop loop({.dir = dir,
                                 .steps = steps,
                                 .every_steps = every,
                                 .keep_last = keep,
                                 .step_timeout = std::chrono::milliseconds(timeout_ms),
                                 .max_overhead = adaptive,
                                 .checkpoint_at_end = final_ckpt,
                                 .rank = rank,
                                 .world_size = world},
                                st);
    std::printf("start %" PRIu64 "\n", loop.start_step());
    std::fflush(stdout);
    for (auto& step : loop) {
      // "forward/backward": a gradient from the batch the loader and the RNG pick.
      const std::uint32_t sample = data.order[data.cursor];
      const float g = static_cast<float>(splitmix(rng) % 1000) / 1000.0f - 0.5f + 0.001f * static_cast<float>(sample);
      if (sleep_us) {
        // The jitter's draws come from their own generator: the state's checksum does not see them.
        double f = 1 + jitter * (static_cast<double>(splitmix(pace) % 2001) / 1000.0 - 1);
        if (slow_phase >= 0 && every > 0 && step.index() % every == static_cast<std::uint64_t>(slow_phase)) f *= slow_factor;
        std::this_thread::sleep_for(std::chrono::microseconds(static_cast<long>(static_cast<double>(sleep_us) * f)));
      }
      if (hang_at >= 0 && step.index() == static_cast<std::uint64_t>(hang_at)) {
        std::printf("hang %lld\n", hang_at);
        std::fflush(stdout);
        for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
      }
      step.before_update();
      for (std::size_t i = 0; i < w.size(); ++i) {
        m[i] = 0.9f * m[i] + 0.1f * g * w[i];
        w[i] -= 0.01f * m[i];
      }
      if (++data.cursor == data.order.size()) {
        data.cursor = 0;
        ++data.epoch;
        for (std::size_t i = data.order.size() - 1; i > 0; --i) std::swap(data.order[i], data.order[splitmix(rng) % (i + 1)]);
      }
      step_value = step.index() + 1;
    }
    std::uint32_t crc = elastic::internal::crc32c(w.data(), w.size() * sizeof(float));
    crc = elastic::internal::crc32c(m.data(), m.size() * sizeof(float), crc);
    crc = elastic::internal::crc32c(&rng, sizeof rng, crc);
    crc = elastic::internal::crc32c(data.order.data(), data.order.size() * sizeof(std::uint32_t), crc);
    std::printf("end %s %" PRIu64 " %08x %" PRIu64 " %" PRIu64 "\n", std::string(to_string(loop.reason())).c_str(),
                loop.completed_steps(), crc, step_value, loop.interval_steps());
    std::fflush(stdout);
    return loop.exit_code();
  } catch (const elastic::error& e) {
    std::string what = e.what();
    for (char& c : what)
      if (c == '\n') c = ' ';
    std::printf("error %s %s\n", std::string(elastic::to_string(e.code())).c_str(), what.c_str());
    std::fflush(stdout);
    std::fprintf(stderr, "train_worker: %s\n", e.what());
    return 1;
  }
}
