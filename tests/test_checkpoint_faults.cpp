// The training loop against real signals: SIGTERM preemption, a second SIGTERM, SIGKILL at
// random moments (hundreds of times), and bit-exact resumption after all of them.
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <elastic/checkpoint.hpp>

#include "support/catch.hpp"
#include "support/process.hpp"

using namespace std::chrono_literals;
using elastic::test::child_process;
namespace ck = elastic::checkpoint;

namespace {

struct result {
  std::string reason;
  std::uint64_t step = 0;
  std::string checksum;
};

std::optional<result> parse_end(const std::optional<std::string>& line) {
  if (!line || line->rfind("end ", 0) != 0) return std::nullopt;
  std::istringstream in(line->substr(4));
  result r;
  in >> r.reason >> r.step >> r.checksum;
  return r;
}

child_process trainer(const std::string& dir, const std::string& events, std::uint64_t steps, std::uint64_t every,
                      std::vector<std::string> extra = {}) {
  std::vector<std::string> argv{ELASTIC_TRAIN_WORKER, dir, std::to_string(steps), std::to_string(every)};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return child_process::spawn(argv, {{"ELASTIC_EVENTS", events}});
}

/// Runs an undisturbed trainer to the end; its checksum is what every disturbed run must reach.
result reference(const std::string& dir, const std::string& events, std::uint64_t steps, std::uint64_t every,
                 std::vector<std::string> extra = {}) {
  auto w = trainer(dir, events, steps, every, extra);
  REQUIRE(w.read_line(30s) == "start 0");
  auto r = parse_end(w.read_line(600s));
  REQUIRE(r);
  REQUIRE(w.exit_code(30s) == 0);
  return *r;
}

std::uint64_t start_step(child_process& w) {
  const auto line = w.read_line(60s);
  REQUIRE(line);
  REQUIRE(line->rfind("start ", 0) == 0);
  return std::stoull(line->substr(6));
}

}  // namespace

TEST_CASE("SIGTERM ends the loop with a durable checkpoint and exit 75, and the resumed run is bit-exact") {
  elastic::test::temp_dir tmp;
  const auto events = tmp.file("events.jsonl");
  const auto want = reference(tmp.file("ref"), events, 400, 50, {"--sleep-us", "1000"});

  const auto dir = tmp.file("ckpt");
  auto w = trainer(dir, events, 400, 50, {"--sleep-us", "1000"});
  CHECK(start_step(w) == 0);
  std::this_thread::sleep_for(120ms);
  w.kill(SIGTERM);
  const auto r = parse_end(w.read_line(30s));
  REQUIRE(r);
  CHECK(r->reason == "preempted");
  CHECK(w.exit_code(30s) == elastic::exit_preempted);
  REQUIRE(r->step > 0);
  REQUIRE(r->step < 400);
  // The final checkpoint is of the very step the loop stopped at.
  CHECK(ck::storage::list_steps(dir).front() == r->step);
  CHECK(elastic::test::events_named(events, "loop_preempted").size() == 1);

  auto again = trainer(dir, events, 400, 50, {"--sleep-us", "1000"});
  CHECK(start_step(again) == r->step);
  const auto done = parse_end(again.read_line(60s));
  REQUIRE(done);
  CHECK(done->reason == "finished");
  CHECK(done->checksum == want.checksum);
  CHECK(again.exit_code(30s) == 0);
}

TEST_CASE("SIGTERM during steps, snapshots and writes always leaves a valid final checkpoint") {
  elastic::test::temp_dir tmp;
  const auto events = tmp.file("events.jsonl");
  // 16 MiB of state checkpointed every 2 steps: most notices land while a snapshot is being
  // copied or written.
  const std::vector<std::string> extra{"--size", "2000000", "--sleep-us", "300"};
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> delay_ms(20, 300);
  for (int t = 0; t < 12; ++t) {
    INFO("trial " << t);
    const auto dir = tmp.file("ckpt-" + std::to_string(t));
    auto w = trainer(dir, events, 1000000, 2, extra);
    CHECK(start_step(w) == 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms(rng)));
    w.kill(SIGTERM);
    const auto r = parse_end(w.read_line(60s));
    REQUIRE(r);
    CHECK(r->reason == "preempted");
    CHECK(w.exit_code(30s) == elastic::exit_preempted);
    REQUIRE_FALSE(ck::storage::list_steps(dir).empty());
    CHECK(ck::storage::list_steps(dir).front() == r->step);
    // It loads: the next run starts exactly there.
    auto again = trainer(dir, events, r->step + 1, 2, extra);
    CHECK(start_step(again) == r->step);
    CHECK(again.exit_code(60s) == 0);
  }
  CHECK(elastic::test::events_named(events, "checkpoint_skipped").empty());
}

TEST_CASE("a second SIGTERM exits 75 at once and the previous checkpoint stands") {
  elastic::test::temp_dir tmp;
  const auto dir = tmp.file("ckpt"), events = tmp.file("events.jsonl");
  // Big state and frequent checkpoints: the second signal lands while one is being written.
  auto w = trainer(dir, events, 100000, 5, {"--size", "4000000", "--sleep-us", "500"});
  CHECK(start_step(w) == 0);
  std::this_thread::sleep_for(400ms);
  w.kill(SIGTERM);
  w.kill(SIGTERM);
  CHECK(w.exit_code(30s) == elastic::exit_preempted);
  // Whatever was committed verifies: the next run resumes from it without skipping anything.
  const auto steps = ck::storage::list_steps(dir);
  REQUIRE_FALSE(steps.empty());
  auto again = trainer(dir, events, steps.front() + 1, 5, {"--size", "4000000"});
  CHECK(start_step(again) == steps.front());
  CHECK(again.exit_code(60s) == 0);
  CHECK(elastic::test::events_named(events, "checkpoint_skipped").empty());
}

TEST_CASE("SIGKILL at random moments never leaves a partial checkpoint, and the run still ends bit-exact") {
  elastic::test::temp_dir tmp;
  const auto events = tmp.file("events.jsonl");
  const std::uint64_t every = 3, endless = 1000000000;
  const std::vector<std::string> extra{"--size", "50000", "--sleep-us", "100"};
  // Kill delays scale with the speed of this build (sanitizers are slower), so that kills land
  // in steps, snapshots and writes alike: up to ~40 steps' worth after the restore.
  const auto t0 = std::chrono::steady_clock::now();
  reference(tmp.file("calibrate"), events, 300, every, extra);
  const auto per_step_us =
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count() / 300;

  const auto dir = tmp.file("ckpt");
  std::mt19937 rng(12345);
  std::uniform_int_distribution<long> delay_us(0, std::max<long>(40000, 40 * per_step_us));
  const int trials = 200;
  std::uint64_t last = 0;
  int survived = 0;
  for (int t = 0; t < trials; ++t) {
    auto w = trainer(dir, events, endless, every, extra);
    const auto s = start_step(w);
    INFO("trial " << t);
    // Never behind the newest step committed before; never a partial one (checked by restore).
    CHECK(s == last);
    std::this_thread::sleep_for(std::chrono::microseconds(delay_us(rng)));
    w.kill(SIGKILL);
    const auto st = w.wait_for(30s);
    REQUIRE(st);
    if (!WIFSIGNALED(*st)) ++survived;
    const auto committed = ck::storage::list_steps(dir);
    last = committed.empty() ? 0 : committed.front();
  }
  CHECK(survived == 0);
  CHECK(last > 0);
  CHECK(elastic::test::events_named(events, "checkpoint_skipped").empty());

  // The interrupted run, finished, equals an undisturbed run of the same length.
  const std::uint64_t steps = last + 100;
  auto w = trainer(dir, events, steps, every, extra);
  CHECK(start_step(w) == last);
  const auto done = parse_end(w.read_line(120s));
  REQUIRE(done);
  CHECK(done->reason == "finished");
  CHECK(w.exit_code(30s) == 0);
  // The sleep only paces the trials; the state does not depend on it, so the reference of
  // (possibly) tens of thousands of steps runs without it.
  CHECK(done->checksum == reference(tmp.file("ref"), events, steps, every, {"--size", "50000"}).checksum);
}

TEST_CASE("a step that hangs past its timeout is killed by the watchdog") {
  // Covered with the timer tests' hosted watchdog: here only that the loop opens the scope.
  elastic::test::temp_dir tmp;
  const auto dir = tmp.file("ckpt"), events = tmp.file("events.jsonl");
  auto w = trainer(dir, events, 50, 10, {"--timeout-ms", "5000"});
  CHECK(start_step(w) == 0);
  const auto r = parse_end(w.read_line(30s));
  REQUIRE(r);
  CHECK(r->reason == "finished");
  CHECK(w.exit_code(30s) == 0);
}

TEST_CASE("the adaptive policy picks an interval and says so") {
  elastic::test::temp_dir tmp;
  const auto dir = tmp.file("ckpt"), events = tmp.file("events.jsonl");
  auto w = trainer(dir, events, 300, 1, {"--size", "1000000", "--sleep-us", "200", "--adaptive", "0.01"});
  CHECK(start_step(w) == 0);
  const auto line = w.read_line(60s);
  const auto r = parse_end(line);
  REQUIRE(r);
  CHECK(w.exit_code(30s) == 0);
  const auto policy = elastic::test::events_named(events, "checkpoint_policy");
  REQUIRE_FALSE(policy.empty());
  CHECK(policy.back().find("\"every_steps\":") != std::string::npos);
}
