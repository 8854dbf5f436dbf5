// Step deadlines that set themselves (loop_options::auto_timeout; checkpoint/detail/
// step_deadlines.hpp): the rule on its own, then real workers under a real elastic-run that
// gives no --step-timeout: a hang is warned of at the deadline its observed steps set and killed
// at the second expiry, a healthy run whose steps vary +-50 % and whose checkpoint steps are 20x
// slower is never killed, and in a 4-rank group the deadlines are agreed and only the rank that
// hangs is killed. Stragglers: the rule, and real evictions. (The trace matrix of realistic
// slowness is test_deadline_traces.cpp.)
#include <sys/wait.h>

#include <algorithm>
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
#include <elastic/checkpoint/detail/straggler_watch.hpp>
#include <elastic/events.hpp>
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

TEST_CASE("the rule: the kill comes at max(10x the warning, the kill floor), and warm-up steps get no warning") {
  auto o = rule_options();
  o.warmup_steps = 3;
  o.kill_floor = 2s;
  ck::detail::step_deadlines d(o);
  CHECK(d.limits(false).kill.count() == 0);  // nothing observed: no deadline at all
  for (int i = 0; i < 3; ++i) d.observe(9.0, false);  // warming up: not observed
  for (int i = 0; i < 40; ++i) d.observe(0.05, false);
  d.set(d.propose());
  CHECK(d.limits(false).warn == 250ms);  // 5 x p99
  CHECK(d.limits(false).kill == 2500ms);  // 10 x the warning, above the 2 s floor
  o.kill_floor = 60s;
  ck::detail::step_deadlines floored(o);
  for (int i = 0; i < 43; ++i) floored.observe(0.05, false);
  floored.set(floored.propose());
  CHECK(floored.limits(false).kill == 60s);  // the floor: a one-off slow step is not a hang
  floored.skip(2);  // a rebuilt group's first steps: the kill stays, no warning
  CHECK(floored.limits(false).warn.count() == 0);
  CHECK(floored.limits(false).kill == 60s);
}

TEST_CASE("stragglers: slowness that stays with a rank is reported, never evicted") {
  ck::detail::straggler_watch w({1.5, 2});
  const elastic::event_log log;  // drops everything
  const std::vector<double> means{0.030, 0.010, 0.011, 0.010};  // rank 0 logs and saves: 3x
  std::vector<double> flags(4, 0.0);
  for (int window = 0; window < 6; ++window) {
    // Whatever the round: the process holding rank 0 is never found slow at another rank.
    if (window == 3) w.reset();
    for (const auto& f : w.compare(25 * (window + 1), means, flags, 0, true, true, log)) CHECK_FALSE(f.evict);
    flags[0] = w.flags(0);
    CHECK(flags[0] == 0);
  }
}

TEST_CASE("stragglers: slowness that follows its process to another rank is evicted, and an evicted slot slow again stops evictions") {
  ck::detail::straggler_watch slow({1.5, 2});
  const elastic::event_log log;  // drops everything
  std::vector<double> flags(4, 0.0);
  // Round 1: this process is rank 2, 3x the others, two windows in a row: reported only.
  for (int k = 0; k < 2; ++k) {
    const auto found = slow.compare(25 * (k + 1), std::vector<double>{0.01, 0.01, 0.03, 0.01}, flags, 2, false, true, log);
    REQUIRE(found.size() == static_cast<std::size_t>(k));
    if (k == 1) CHECK_FALSE(found.front().evict);
  }
  // Round 2 (rank 0 died): it is rank 1 now, still slow: its slowness followed it.
  slow.reset();
  flags.assign(3, 0.0);
  flags[1] = slow.flags(1);
  CHECK(static_cast<unsigned>(flags[1]) == ck::detail::slow_at_another_rank);
  std::vector<ck::detail::straggler_finding> found;
  for (int k = 0; k < 2; ++k) found = slow.compare(100 + 25 * k, std::vector<double>{0.01, 0.03, 0.01}, flags, 1, false, true, log);
  REQUIRE(found.size() == 1);
  CHECK(found.front().rank == 1);
  CHECK(found.front().evict);
  // Its slot comes back (restarted) as slow as before: evictions stop, for every rank.
  ck::detail::straggler_watch back({1.5, 2}, /*slot_evicted=*/true), other({1.5, 2});
  flags.assign(3, 0.0);
  flags[2] = back.flags(2);
  for (int k = 0; k < 2; ++k) {
    for (auto* w : {&back, &other}) {
      for (const auto& f : w->compare(200 + 25 * k, std::vector<double>{0.01, 0.01, 0.03}, flags, w == &back ? 2 : 0,
                                      w == &other, true, log)) {
        CHECK_FALSE(f.evict);
      }
    }
  }
  CHECK((static_cast<unsigned>(other.flags(0)) & ck::detail::evictions_stopped) != 0);
}

#if defined(ELASTIC_RUN_TOOL)
TEST_CASE("under elastic-run without --step-timeout, a hung step is warned of at the deadline its observed steps set, then killed") {
  elastic::test::temp_dir dir;
  const char* id = "auto-hang";
  // 40 ms steps +-50 %, checkpoints every 25 steps; step 120 hangs. No restarts: the kill ends it.
  // The kill floor is 2 s here (5 minutes by default): the kill comes at max(10 x warning, 2 s).
  launched l(id, {"--nproc-per-node", "1", "--max-restarts", "0", "--auto-kill-floor", "2"},
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
  // It was warned of at the deadline the observed steps set (README: max(5 x p99, 2 x max), at
  // least 100 ms; an update is logged when it moves more than 10 %), and killed at 10x that
  // warning or the floor, whichever is later; its log says so before the kill. How far p99 is
  // from the median depends on the machine's load, so the warning is not compared with p50.
  const auto warnings = elastic::test::events_named(events, "watchdog_warning");
  REQUIRE(warnings.size() == 1);
  const double p50 = number(updates.back(), "p50_ms"), warn = number(warnings.front(), "warn_ms");
  const double p99 = number(updates.back(), "p99_ms"), slowest = number(updates.back(), "max_ms");
  const double in_force = number(updates.back(), "step_timeout_ms");
  const double limit = number(kills.front(), "limit_ms");
  CHECK(p50 >= 20);
  const double rule = std::max({5 * p99, 2 * slowest, 100.0});
  CHECK(in_force >= 0.99 * rule);
  CHECK(in_force <= 1.01 * rule);
  CHECK(warn >= 0.89 * in_force);
  CHECK(warn <= 1.12 * in_force + 1);
  CHECK(limit >= 2000);
  CHECK(limit >= 9.9 * warn);
  CHECK(limit <= std::max(2000.0, 10 * warn) + 50);
  const std::string log = l.log(0);
  CHECK(log.find("hang 120") != std::string::npos);
  CHECK(log.find("past its warning") != std::string::npos);
  CHECK(log.find("past its warning") < log.find("killed"));
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
  launched l(id, {"--nproc-per-node", "4", "--min-ranks", "2", "--max-restarts", "3", "--auto-kill-floor", "2"},
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
TEST_CASE("a rank whose compute is 3x the others' is reported as a straggler, and evicted only once its slowness followed it to another rank") {
  elastic::test::temp_dir dir;
  const char* id = "straggler";
  bool evict = false, renumber = false;
  SECTION("reported") {}
  SECTION("--evict-stragglers, its rank never changes: reported, not evicted") { evict = true; }
  SECTION("--evict-stragglers, rank 0 dies and it moves from rank 2 to rank 1, still slow: evicted once, not a failure") {
    evict = renumber = true;
  }
  std::vector<std::string> options{"--nproc-per-node", "4", "--min-ranks", "2", "--max-restarts", "3"};
  if (evict) options.push_back("--evict-stragglers");
  // Worker 2 sleeps 3 x 20 ms in each step of its first life: its own compute, not a wait.
  std::vector<std::string> program{ELASTIC_DIGITS_TRAIN, "--steps", "250", "--every", "50", "--step-sleep-ms", "20",
                                   "--ckpt", dir.file("ckpt"), "--slow-rank", "2", "--slow-factor", "3"};
  if (renumber) program.insert(program.end(), {"--kill-rank", "0", "--kill-at", "80"});
  launched l(id, options, program);
  const std::string err = l.err();
  INFO(err);
  CHECK(l.code == 0);
  const std::string events = l.events_file();
  const auto found = elastic::test::events_named(events, "straggler");
  REQUIRE_FALSE(found.empty());
  INFO(found.front());
  CHECK(found.front().find("\"straggler_rank\":2") != std::string::npos);
  CHECK(found.front().find("\"follows\":\"unknown\"") != std::string::npos);
  CHECK(number(found.front(), "ratio") >= 1.5);
  CHECK(err.find("straggler        rank 2:") != std::string::npos);
  const auto evicted = elastic::test::events_named(events, "straggler_evicted");
  if (renumber) {
    REQUIRE(evicted.size() == 1);
    CHECK(evicted.front().find("\"group_rank\":1") != std::string::npos);  // no longer the rank 2 it was slow at first
    CHECK(err.find("evicted          1 straggler(s)") != std::string::npos);
    CHECK(err.find("not counted against --max-restarts") != std::string::npos);
    CHECK(err.find("failures         1 (") != std::string::npos);  // the SIGKILL, not the eviction
  } else {
    CHECK(evicted.empty());
    CHECK(elastic::test::events_named(events, "worker_restart").empty());
  }
}
#endif
