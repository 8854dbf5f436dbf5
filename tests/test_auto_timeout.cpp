// Step deadlines that set themselves (loop_options::auto_timeout; checkpoint/detail/
// step_deadlines.hpp): the rule on its own, then real workers under a real elastic-run that
// gives no --step-timeout: a hang is killed within 10x the observed step time, a healthy run
// whose steps vary +-50 % and whose checkpoint steps are 20x slower is never killed, and in a
// 4-rank group the deadlines are agreed and only the rank that hangs is killed.
#include <sys/wait.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/launched_run.hpp"
#include "support/process.hpp"

#include <elastic/checkpoint/detail/step_deadlines.hpp>
#include <elastic/internal/json.hpp>

namespace ck = elastic::checkpoint;
using namespace std::chrono_literals;

namespace {

ck::auto_timeout_options rule_options() {
  ck::auto_timeout_options o;
  o.enabled = true;
  return o;
}

double number(const std::string& line, const char* field) {
  return elastic::internal::json::parse(line).at(field).as_double();
}

#if defined(ELASTIC_RUN_TOOL)
/// elastic-run (no --step-timeout) on `program`, waited for (4 minutes at most).
struct launched : elastic::test::launched_run {
  int code;
  launched(const char* id, const std::vector<std::string>& options, const std::vector<std::string>& program)
      : launched_run(ELASTIC_RUN_TOOL, id, options, program), code(finish(240s)) {}
  [[nodiscard]] std::string events_file() const { return dir.path() + "/" + run + "/events.jsonl"; }
};
#endif

}  // namespace

TEST_CASE("the rule: steps varying +-50 % stay far inside the deadline, which stays within 10x their mean") {
  ck::detail::step_deadlines d(rule_options());
  std::mt19937 gen(1);
  std::uniform_real_distribution<double> pace(0.5, 1.5);
  const double t = 0.2;  // the mean step: 200 ms
  for (int i = 0; i < 10 + 19; ++i) d.observe(t * pace(gen), false);
  CHECK(d.propose().ordinary == 0);  // 19 of the 20 samples it needs: no deadline yet
  for (int i = 0; i < 1000; ++i) {
    d.observe(t * pace(gen), false);
    d.set(d.propose());
    const double s = static_cast<double>(d.deadline(false).count()) / 1e3;
    REQUIRE(s >= 3 * 1.5 * t);  // the slowest healthy step has room three times over
    REQUIRE(s <= 10 * t);
  }
}

TEST_CASE("the rule: checkpoint steps 20x slower get a deadline of their own, the ceiling until two snapshots' worth are seen") {
  auto o = rule_options();
  o.warmup_steps = 0;
  ck::detail::step_deadlines d(o);
  for (int i = 0; i < 40; ++i) d.observe(0.05, false);
  d.set(d.propose());
  CHECK(d.deadline(false) == 250ms);  // 5 x p99
  CHECK(d.deadline(true) == std::chrono::duration_cast<std::chrono::milliseconds>(o.ceiling));
  // Two snapshots' worth: the step before each, the one after (20x: its copy), the next.
  for (int k = 0; k < 2; ++k) {
    d.observe(0.05, true);
    d.set(d.propose());
    CHECK(d.deadline(true) == std::chrono::duration_cast<std::chrono::milliseconds>(o.ceiling));
    d.observe(1.0, true);
    d.observe(0.05, true);
  }
  d.set(d.propose());
  CHECK(d.deadline(true) == 5000ms);
  CHECK(d.deadline(false) == 250ms);  // ordinary steps are not slowed by it
}

TEST_CASE("the rule: the floor and the ceiling bound it, and warm-up steps are not observed") {
  auto o = rule_options();
  o.warmup_steps = 5;
  o.floor = 200ms;
  o.ceiling = 2s;
  ck::detail::step_deadlines d(o);
  for (int i = 0; i < 5; ++i) d.observe(100.0, false);  // compiling: not seen
  for (int i = 0; i < 20; ++i) d.observe(0.001, false);
  d.set(d.propose());
  CHECK(d.deadline(false) == 200ms);
  for (int i = 0; i < 200; ++i) d.observe(10.0, false);
  d.set(d.propose());
  CHECK(d.deadline(false) == 2s);
  d.skip(2);  // a rebuilt group's first steps
  d.observe(1e6, false);
  d.observe(1e6, false);
  d.set(d.propose());
  CHECK(d.ordinary().max() == 10.0);
}

#if defined(ELASTIC_RUN_TOOL)
TEST_CASE("under elastic-run without --step-timeout, a hung step is killed within 10x the observed step time") {
  elastic::test::temp_dir dir;
  const char* id = "auto-hang";
  // 40 ms steps +-50 %, checkpoints every 25 steps; step 120 hangs. No restarts: the kill ends it.
  launched l(id, {"--nproc-per-node", "1", "--max-restarts", "0"},
                                {ELASTIC_TRAIN_WORKER, dir.file("ckpt"), "400", "25", "--sleep-us", "40000", "--jitter",
                                 "0.5", "--hang-at", "120"});
  INFO(l.err());
  CHECK(l.code != 0);
  const std::string events = l.events_file();
  const auto updates = elastic::test::events_named(events, "timeouts_updated");
  const auto kills = elastic::test::events_named(events, "watchdog_kill");
  REQUIRE_FALSE(updates.empty());
  REQUIRE(kills.size() == 1);
  INFO(updates.back());
  INFO(kills.front());
  CHECK(kills.front().find("\"scope\":\"step\"") != std::string::npos);
  // The deadline it was killed at is within 10x the step time the loop had observed.
  const double p50 = number(updates.back(), "p50_ms"), limit = number(kills.front(), "limit_ms");
  CHECK(p50 >= 20);
  CHECK(limit <= 10 * p50);
  CHECK(l.log(0).find("hang 120") != std::string::npos);
}

TEST_CASE("under elastic-run without --step-timeout, steps varying +-50 % and checkpoint steps 20x slower are never killed") {
  elastic::test::temp_dir dir;
  const char* id = "auto-healthy";
  std::string slow_phase;
  SECTION("the step after each snapshot is slow") { slow_phase = "0"; }
  SECTION("the step that ends in a snapshot is slow") { slow_phase = "24"; }
  // 20 ms steps +-50 %, every 25th 20x slower (400 ms), 250 steps.
  launched l(id, {"--nproc-per-node", "1", "--max-restarts", "0"},
                                {ELASTIC_TRAIN_WORKER, dir.file("ckpt"), "250", "25", "--sleep-us", "20000", "--jitter",
                                 "0.5", "--slow-every", slow_phase, "20"});
  INFO(l.err());
  CHECK(l.code == 0);
  const std::string events = l.events_file();
  CHECK(elastic::test::events_named(events, "watchdog_kill").empty());
  const auto updates = elastic::test::events_named(events, "timeouts_updated");
  REQUIRE_FALSE(updates.empty());
  INFO(updates.back());
  CHECK(number(updates.back(), "step_timeout_ms") > 0);
  CHECK(number(updates.back(), "checkpoint_step_timeout_ms") >= 400);
}
#endif

#if defined(ELASTIC_RUN_TOOL) && defined(ELASTIC_DIGITS_TRAIN)
TEST_CASE("in a 4-rank group the deadlines are agreed, and only the rank that hangs is killed, not those waiting for it") {
  elastic::test::temp_dir dir;
  const char* id = "auto-group";
  launched l(id, {"--nproc-per-node", "4", "--min-ranks", "2", "--max-restarts", "3"},
                                {ELASTIC_DIGITS_TRAIN, "--steps", "150", "--every", "25", "--step-sleep-ms", "20",
                                 "--ckpt", dir.file("ckpt"), "--hang-rank", "1", "--hang-at", "100"});
  INFO(l.err());
  CHECK(l.code == 0);
  const std::string events = l.events_file();
  const auto kills = elastic::test::events_named(events, "watchdog_kill");
  REQUIRE(kills.size() == 1);
  CHECK(kills.front().find("\"target_rank\":1") != std::string::npos);
  // Every rank's update at step 50 carries the same deadline: the largest any rank proposed.
  std::vector<double> at50;
  for (const auto& u : elastic::test::events_named(events, "timeouts_updated")) {
    if (number(u, "step") == 50) at50.push_back(number(u, "step_timeout_ms"));
  }
  REQUIRE(at50.size() == 4);
  for (double v : at50) CHECK(v == at50.front());
  const auto culprits = elastic::test::events_named(events, "group_culprit");
  REQUIRE_FALSE(culprits.empty());
  CHECK(culprits.front().find("\"culprits\":\"1\"") != std::string::npos);
}
#endif

#if defined(ELASTIC_RUN_TOOL) && defined(ELASTIC_DIGITS_TRAIN)
TEST_CASE("a rank whose compute is 3x the others' is reported as a straggler, and with --evict-stragglers restarted") {
  elastic::test::temp_dir dir;
  const char* id = "straggler";
  bool evict = false;
  SECTION("reported") {}
  SECTION("evicted") { evict = true; }
  std::vector<std::string> options{"--nproc-per-node", "4", "--min-ranks", "2", "--max-restarts", "3"};
  if (evict) options.push_back("--evict-stragglers");
  // Worker 2 sleeps 3 x 20 ms in each step of its first life: its own compute, not a wait.
  launched l(id, options,
                                {ELASTIC_DIGITS_TRAIN, "--steps", "200", "--every", "50", "--step-sleep-ms", "20",
                                 "--ckpt", dir.file("ckpt"), "--slow-rank", "2", "--slow-factor", "3"});
  const std::string err = l.err();
  INFO(err);
  CHECK(l.code == 0);
  const std::string events = l.events_file();
  const auto found = elastic::test::events_named(events, "straggler");
  REQUIRE_FALSE(found.empty());
  INFO(found.front());
  CHECK(found.front().find("\"straggler_rank\":2") != std::string::npos);
  CHECK(number(found.front(), "ratio") >= 1.5);
  CHECK(err.find("straggler        rank 2:") != std::string::npos);
  const auto evicted = elastic::test::events_named(events, "straggler_evicted");
  if (evict) {
    REQUIRE(evicted.size() == 1);
    CHECK(evicted.front().find("\"rank\":2") != std::string::npos);
    CHECK(err.find("evicted          1 straggler(s)") != std::string::npos);
    CHECK(elastic::test::events_named(events, "worker_restart").size() >= 1);
  } else {
    CHECK(evicted.empty());
    CHECK(elastic::test::events_named(events, "worker_restart").empty());
  }
}
#endif
