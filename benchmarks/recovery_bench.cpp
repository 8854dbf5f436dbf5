// Recovery of an elastic group: 4 worker processes (tests/support/group_worker.cpp) train over
// Gloo on loopback through an shm:// store; one SIGKILLs itself inside an allreduce. Each trial
// splits the time from that kill to the first completed step of the 3 survivors into
//   detection   the kill -> the survivors' collective failed (median over survivors)
//   rendezvous  -> the next round closed with the 3 of them
//   connect     -> their new Gloo communicator is up
//   resync      -> every survivor holds rank 0's step and weights
//   resumed     -> the last survivor completed its first step as a group of 3
// and then restarts the killed rank: rejoin is from its exec to its first step in the group of 4
// (it restores the newest checkpoint and waits to be taken in at the survivors' next safe point).
// Clock readings are CLOCK_MONOTONIC, which every process on the host shares.
//
// The reference point is torchrun's full restart of a comparable job: benchmarks/torchrun_restart.py
// measures it on the same machine. Trials: ELASTIC_RECOVERY_TRIALS (default 10).
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include <elastic/internal/clock.hpp>
#include <elastic/rendezvous/shm_store.hpp>

#include "bench_common.hpp"
#include "support/fleet.hpp"

namespace {

using elastic::test::field;
using elastic::test::fleet;
using elastic::test::num;
using elastic::test::starts_with;

using elastic::bench::median;

double max_of(const std::vector<double>& v) { return v.empty() ? 0 : *std::max_element(v.begin(), v.end()); }

struct trial {
  double detect = 0, rendezvous = 0, connect = 0, resync = 0, resumed = 0, rejoin = 0;
  bool ok = false;
};

trial run_trial(int n) {
  trial t;
  elastic::test::temp_dir dir;
  const std::string store = elastic::test::unique_name("rb");
  const std::vector<std::string> common{"--every", "10", "--dim", "65536", "--timeout-ms", "2000",
                                        "--hb-interval-ms", "100", "--hb-timeout-ms", "500", "--last-call-ms", "300",
                                        "--join-timeout-ms", "30000", "--poll-ms", "20", "--step-sleep-ms", "5"};
  const std::vector<std::string> args{"--dir", dir.file("ckpt"), "--steps", "120", "--min", "2", "--max", "4"};
  fleet f(ELASTIC_GROUP_WORKER, "shm://" + store, "bench" + std::to_string(n), common, dir.file("events.jsonl"));
  for (int i = 0; i < 4; ++i) {
    auto a = args;
    if (i == 2) a.insert(a.end(), {"--kill-self-at", "15"});
    f.start("w" + std::to_string(i), a);
  }
  const auto world_is = [](const char* w) { return [w](const std::string& l) { return field(l, "world") == w; }; };
  const std::vector<std::size_t> survivors{0, 1, 3};
  const bool recovered = f.wait_until(
      [&] {
        return std::all_of(survivors.begin(), survivors.end(),
                           [&](std::size_t i) { return f.find(i, "step=", world_is("3")).has_value(); });
      },
      std::chrono::seconds(60));
  const auto killed = f.find(2, "killing ");
  if (!recovered || !killed) {
    elastic::rendezvous::shm_store::remove(store);
    return t;
  }
  const double t_kill = static_cast<double>(num(*killed, "t"));
  std::vector<double> detect;
  for (auto i : survivors) {
    const auto r = f.find(i, "rebuilt ", world_is("3"));
    const auto s = f.find(i, "step=", world_is("3"));
    if (!r || !s) return t;
    detect.push_back((num(*r, "noticed") - t_kill) / 1e6);
    t.rendezvous = std::max(t.rendezvous, (num(*r, "met") - t_kill) / 1e6);
    t.connect = std::max(t.connect, (num(*r, "connected") - t_kill) / 1e6);
    t.resync = std::max(t.resync, (num(*r, "resynced") - t_kill) / 1e6);
    t.resumed = std::max(t.resumed, (num(*s, "t") - t_kill) / 1e6);
  }
  t.detect = median(detect);
  // Phases as durations, not points in time.
  t.resync -= t.connect;
  t.connect -= t.rendezvous;
  t.rendezvous -= t.detect;

  f.wait_until([&] { return f[2].status.has_value(); }, std::chrono::seconds(5));
  const double t_start = static_cast<double>(elastic::internal::monotonic_ns());
  const auto back = f.start("w2", args);
  const bool rejoined = f.wait_until([&] { return f.find(back, "step=", world_is("4")).has_value(); },
                                     std::chrono::seconds(30));
  if (rejoined) t.rejoin = (num(*f.find(back, "step=", world_is("4")), "t") - t_start) / 1e6;
  f.wait_until([&] { return f.all_ended({0, 1, 3, back}); }, std::chrono::seconds(60));
  elastic::rendezvous::shm_store::remove(store);
  t.ok = rejoined;
  return t;
}

void BM_recovery_after_sigkill_of_1_of_4(benchmark::State& state) {
  const char* env = std::getenv("ELASTIC_RECOVERY_TRIALS");
  const int trials = env ? std::max(1, std::atoi(env)) : 10;
  std::vector<double> detect, rendezvous, connect, resync, resumed, rejoin;
  int failed = 0;
  for (auto _ : state) {
    for (int n = 0; n < trials; ++n) {
      const trial t = run_trial(n);
      if (!t.ok) {
        ++failed;
        continue;
      }
      detect.push_back(t.detect);
      rendezvous.push_back(t.rendezvous);
      connect.push_back(t.connect);
      resync.push_back(t.resync);
      resumed.push_back(t.resumed);
      rejoin.push_back(t.rejoin);
    }
  }
  auto report = [&](const char* name, const std::vector<double>& v) {
    state.counters[std::string(name) + "_med_ms"] = median(v);
    state.counters[std::string(name) + "_max_ms"] = max_of(v);
  };
  report("detect", detect);
  report("rendezvous", rendezvous);
  report("connect", connect);
  report("resync", resync);
  report("kill_to_resumed", resumed);
  report("rejoin", rejoin);
  state.counters["trials"] = static_cast<double>(resumed.size());
  state.counters["failed_trials"] = failed;
}
BENCHMARK(BM_recovery_after_sigkill_of_1_of_4)->Iterations(1)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
