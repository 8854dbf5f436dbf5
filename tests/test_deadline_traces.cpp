// One deadline model (README, "Step deadlines that set themselves"): realistic step-time traces
// played by 4 real workers (support/trace_worker.cpp, written as the README's section 3 shows)
// under a real elastic-run with automatic step deadlines. In none is a healthy rank killed or
// evicted, and a real hang at the end of each is still killed (its rank only). Then the README's
// settings as written, with one worker hung inside an allreduce: that worker alone is killed,
// 10 times out of 10.
//
// Time is scaled down as in every test here: steps of 10 ms, and a kill floor of 5 s
// (--auto-kill-floor) where a real run has minutes; the warning and the kill multiple are the
// defaults. Each case prints one line of the trace matrix (kills, warnings, when the hang was
// killed) for the closing note of the change that brought it.
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "support/catch.hpp"
#include "support/launched_run.hpp"
#include "support/process.hpp"

#include <elastic/internal/json.hpp>

using namespace std::chrono_literals;
using elastic::internal::json;

namespace {

/// elastic-run with 4 trace workers, min 2 ranks, the automatic deadlines (no --step-timeout).
/// Its checkpoints go under `ckpt` (a temp_dir of the caller's: the run's own is not made yet
/// when its command line is).
struct trace_run : elastic::test::launched_run {
  int code = -1;
  trace_run(const std::string& id, std::vector<std::string> options, const std::vector<std::string>& trace,
            const elastic::test::temp_dir& ckpt)
      : launched_run(ELASTIC_RUN_TOOL, id, with_defaults(std::move(options)), program(trace, ckpt)) {}

  static std::vector<std::string> with_defaults(std::vector<std::string> o) {
    o.insert(o.begin(), {"--nproc-per-node", "4", "--min-ranks", "2", "--max-restarts", "3"});
    return o;
  }
  static std::vector<std::string> program(const std::vector<std::string>& trace, const elastic::test::temp_dir& ckpt) {
    std::vector<std::string> p{ELASTIC_TRACE_WORKER, "--ckpt", ckpt.file("ckpt")};
    p.insert(p.end(), trace.begin(), trace.end());
    return p;
  }
  [[nodiscard]] std::string events_file() const { return dir.path() + "/" + run + "/events.jsonl"; }
  [[nodiscard]] std::vector<std::string> named(const std::string& e) const {
    return elastic::test::events_named(events_file(), e);
  }
  /// The pid of each slot's first life.
  [[nodiscard]] std::map<long, long> first_pids() const {
    std::map<long, long> out;
    for (const auto& l : named("worker_start")) {
      const auto j = json::parse(l);
      out.emplace(j.at("slot").as_int64(), j.at("worker_pid").as_int64());
    }
    return out;
  }
};

long field(const std::string& line, const char* name) { return json::parse(line).at(name).as_int64(); }
double number(const std::string& line, const char* name) { return json::parse(line).at(name).as_double(); }

/// Plays `trace` with slot `hung` hanging in its step `hang_at`; checks the run finished, that
/// the hung worker was the only one killed, that nobody was evicted, and prints the matrix's
/// line (with whether the hang was warned of first).
void play(const std::string& name, const std::string& id, std::vector<std::string> trace,
          std::vector<std::string> options = {}, long hung = 1, long hang_at = 170) {
  trace.insert(trace.end(), {"--step-ms", "10", "--hang-slot", std::to_string(hung), "--hang-at", std::to_string(hang_at)});
  options.insert(options.end(), {"--auto-kill-floor", "5"});
  elastic::test::temp_dir ckpt;
  trace_run r(id, options, trace, ckpt);
  r.code = r.finish(400s);
  INFO(name);
  INFO(r.err());
  CHECK(r.code == 0);
  const auto kills = r.named("watchdog_kill");
  const auto pids = r.first_pids();
  REQUIRE(pids.count(hung) == 1);
  const long hung_pid = pids.at(hung);
  std::size_t healthy_kills = 0;
  double killed_after = -1, limit = -1;
  for (const auto& k : kills) {
    if (field(k, "target_pid") == hung_pid) {
      killed_after = number(k, "held_ms") / 1e3;
      limit = number(k, "limit_ms") / 1e3;
    } else {
      ++healthy_kills;
      UNSCOPED_INFO("a healthy rank was killed: " << k);
    }
  }
  CHECK(healthy_kills == 0);
  CHECK(killed_after > 0);  // the real hang was caught
  std::size_t warnings = 0, hung_warned = 0;
  for (const auto& w : r.named("watchdog_warning")) (field(w, "target_pid") == hung_pid ? hung_warned : warnings)++;
  // Told of once before it was killed, unless the hang fell in the first steps after a rebuild
  // (a restarted rank joining late on a slow machine), which are never warned of.
  CHECK(hung_warned <= 1);
  if (hung_warned == 0) WARN("the hung step was not warned of: it came right after a rebuild");
  CHECK(r.named("straggler_evicted").empty());
  const std::size_t rebuilds = r.named("group_rebuilt").size();
  std::printf("trace matrix | %s | healthy kills %zu | evictions %zu | warnings of healthy steps %zu | hang warned "
              "%zu, killed after %.1f s (kill deadline %.1f s) | group_rebuilt events %zu | exit %d\n",
              name.c_str(), healthy_kills, r.named("straggler_evicted").size(), warnings, hung_warned, killed_after,
              limit, rebuilds, r.code);
  std::fflush(stdout);
}

}  // namespace

TEST_CASE("trace: a periodic evaluation pass 50x a step on every rank kills nobody and a hang is still killed") {
  play("evaluation 50x every 40 steps", "tr-eval", {"--steps", "220", "--jitter", "0.3", "--eval-every", "40",
                                                     "--eval-x", "50"});
}

TEST_CASE("trace: an evaluation pass 300x a step marked unbounded kills nobody and leaves the deadline tight") {
  play("evaluation 300x every 60 steps, step.unbounded()", "tr-evalu",
       {"--steps", "220", "--jitter", "0.3", "--eval-every", "60", "--eval-x", "300", "--eval-unbounded"});
}

TEST_CASE("trace: rank 0's own work 30x a step every 40 steps, without extend(), kills nobody") {
  play("rank-0-only work 30x every 40 steps", "tr-r0", {"--steps", "220", "--rank0-every", "40", "--rank0-x", "30"});
}

TEST_CASE("trace: rank 0's own work 50x a step after step.extend() kills nobody, not even those waiting for it") {
  play("rank-0-only work 50x every 40 steps, with extend()", "tr-r0x",
       {"--steps", "220", "--rank0-every", "40", "--rank0-x", "50", "--rank0-extend"});
}

TEST_CASE("trace: a restarted rank's warm-up of 3 s kills none of the survivors waiting for it") {
  play("a SIGKILLed rank restarted with a 3 s warm-up", "tr-warm",
       {"--steps", "220", "--kill-slot", "2", "--kill-at", "60", "--warmup-ms", "3000"});
}

TEST_CASE("trace: a survivor's first step after a rebuild 100x slower kills nobody") {
  play("survivors' first step after a rebuild 100x", "tr-rebuild",
       {"--steps", "220", "--kill-slot", "3", "--kill-at", "60", "--rebuild-x", "100"});
}

TEST_CASE("trace: step times drifting to 3x over the run kill nobody") {
  play("gradual drift to 3x", "tr-drift", {"--steps", "220", "--jitter", "0.3", "--drift", "3"});
}

TEST_CASE("trace: a data stall of 100x a step on one rank kills nobody") {
  play("a data stall 100x on one rank", "tr-stall", {"--steps", "220", "--stall-slot", "2", "--stall-at", "90",
                                                      "--stall-x", "100"});
}

TEST_CASE("trace: a straggler bound to rank 0 is reported, and with --evict-stragglers never evicted") {
  play("rank 0 computes 2.5x (rank-bound straggler), --evict-stragglers", "tr-strag",
       {"--steps", "220", "--rank0-slow", "2.5"}, {"--evict-stragglers"});
}

TEST_CASE("the README's settings, one worker hung inside an allreduce: that worker alone is killed, 10 times out of 10") {
  // Ten independent runs, a few at a time: each has one worker (a different slot each time) hang
  // inside step 230's allreduce, by a SIGSTOP (a frozen process) or in a signal handler (its
  // heartbeat and other threads live on). The communicator's timeout is the README's 10 s; by
  // step 230 two checkpoints (every 100 steps) have given the checkpoint steps a deadline of
  // their own, as in a long run: the bound that once killed every rank waiting (twice the
  // longest step deadline) would be in force.
  constexpr int trials = 10, at_once = 3;
  int exactly_one = 0;
  for (int first = 0; first < trials; first += at_once) {
    std::vector<std::unique_ptr<elastic::test::temp_dir>> ckpts;
    std::vector<std::unique_ptr<trace_run>> runs;
    std::vector<long> slots;
    for (int t = first; t < std::min(trials, first + at_once); ++t) {
      const long slot = t % 4;
      slots.push_back(slot);
      ckpts.push_back(std::make_unique<elastic::test::temp_dir>());
      runs.push_back(std::make_unique<trace_run>(
          "readme-" + std::to_string(t), std::vector<std::string>{},
          std::vector<std::string>{"--steps", "260", "--hang-inside-slot", std::to_string(slot), "--hang-inside-at", "230",
                                   "--hang-inside-how", t % 2 == 0 ? "stop" : "handler"},
          *ckpts.back()));
    }
    for (std::size_t i = 0; i < runs.size(); ++i) {
      auto& r = *runs[i];
      r.code = r.finish(300s);
      INFO("trial " << first + static_cast<int>(i) << ", slot " << slots[i]);
      INFO(r.err());
      const auto kills = r.named("watchdog_kill");
      const auto pids = r.first_pids();
      REQUIRE(pids.count(slots[i]) == 1);
      CHECK(r.code == 0);
      CHECK(kills.size() == 1);
      const bool only_it = kills.size() == 1 && field(kills.front(), "target_pid") == pids.at(slots[i]);
      CHECK(only_it);
      if (only_it && r.code == 0) ++exactly_one;
      if (!kills.empty()) {
        std::printf("readme trial %d (slot %ld): killed after %.1f s in scope %s\n", first + static_cast<int>(i),
                    slots[i], number(kills.front(), "held_ms") / 1e3,
                    json::parse(kills.front()).at("scope").as_string().c_str());
      }
    }
  }
  std::printf("readme settings: exactly the hung worker killed in %d of %d trials\n", exactly_one, trials);
  CHECK(exactly_one == trials);
}
