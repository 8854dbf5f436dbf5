// How a training loop ends, with real processes (tests/support/preempt_worker.cpp) and real
// signals: one notice that arrives twice, a checkpoint that failed once, a final checkpoint that
// fails, standalone ranks that must stop at the same step, and settings that are malformed.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <elastic/checkpoint.hpp>

#include "support/catch.hpp"
#include "support/other_user.hpp"
#include "support/process.hpp"

using namespace std::chrono_literals;
using elastic::test::child_process;
using elastic::test::temp_dir;
namespace ck = elastic::checkpoint;

namespace {

using env_list = std::vector<std::pair<std::string, std::string>>;

/// A preempt_worker whose stdout is kept line by line.
struct worker {
  child_process proc;
  std::vector<std::string> lines;

  worker(const std::string& dir, const std::string& events, std::vector<std::string> args, env_list env = {}) {
    std::vector<std::string> argv{ELASTIC_PREEMPT_WORKER, "--dir", dir};
    argv.insert(argv.end(), args.begin(), args.end());
    env.emplace_back("ELASTIC_EVENTS", events);
    proc = child_process::spawn(argv, env);
  }

  /// The first line starting with `prefix`, reading more for up to `timeout`.
  std::optional<std::string> line(const std::string& prefix, std::chrono::milliseconds timeout = 60s) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    for (std::size_t i = 0;; ++i) {
      for (; i < lines.size(); ++i)
        if (lines[i].rfind(prefix, 0) == 0) return lines[i];
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
      if (left.count() <= 0) return std::nullopt;
      auto l = proc.read_line(left);
      if (!l) return std::nullopt;
      lines.push_back(*l);
      --i;
    }
  }

  /// The loop's end: reason, steps done, and the exit code it asked for.
  struct ending {
    std::string reason;
    std::uint64_t step = 0;
    int exit = -1;
  };
  std::optional<ending> end(std::chrono::milliseconds timeout = 60s) {
    const auto l = line("end ", timeout);
    if (!l) return std::nullopt;
    std::istringstream in(l->substr(4));
    ending e;
    in >> e.reason >> e.step >> e.exit;
    return e;
  }

  int exit_code(std::chrono::milliseconds timeout = 60s) {
    while (auto l = proc.read_line(0ms)) lines.push_back(*l);
    return proc.exit_code(timeout).value_or(-1);
  }

  std::string transcript() const {
    std::string out;
    for (const auto& l : lines) out += "  " + l + "\n";
    return out;
  }
};

std::uint64_t newest_step(const std::string& dir) {
  const auto steps = ck::storage::list_steps(dir);
  return steps.empty() ? 0 : steps.front();
}

bool has(const std::string& event, const std::string& text) { return event.find(text) != std::string::npos; }

/// The loop stopped for a notice with its final checkpoint: exit 75, the newest committed step
/// is the one it stopped at, and its loop_preempted event says it made it durable.
void check_final_committed(worker& w, const std::string& dir, const std::string& events, std::uint64_t step) {
  CHECK(w.exit_code() == elastic::exit_preempted);
  CHECK(newest_step(dir) == step);
  const auto ends = elastic::test::events_named(events, "loop_preempted");
  REQUIRE(ends.size() == 1);
  CHECK(has(ends[0], "\"final_checkpoint\":true"));
}

}  // namespace

// --- One notice, several routes (Slurm, systemd and elastic-run all signal the worker) ---------

TEST_CASE("two SIGTERMs back to back are one notice: the final checkpoint is written and the run exits 75") {
  temp_dir tmp;
  const auto dir = tmp.file("ckpt"), events = tmp.file("events.jsonl");
  worker w(dir, events, {"--every", "50", "--size", "2000000"});
  REQUIRE(w.line("start "));
  std::this_thread::sleep_for(300ms);
  w.proc.kill(SIGTERM);  // from the platform
  w.proc.kill(SIGTERM);  // and forwarded by the launcher
  const auto e = w.end();
  INFO(w.transcript());
  REQUIRE(e);
  CHECK(e->reason == "preempted");
  check_final_committed(w, dir, events, e->step);
}

TEST_CASE("a SIGTERM after the 2 s window exits 75 at once and the previous checkpoint stands") {
  temp_dir tmp;
  const auto dir = tmp.file("ckpt"), events = tmp.file("events.jsonl");
  // The final snapshot's capture takes 30 s, far past the second signal.
  worker w(dir, events, {"--every", "20", "--slow-final-ms", "30000"}, {{"ELASTIC_GRACE", "60"}});
  REQUIRE(w.line("start "));
  REQUIRE_FALSE(elastic::test::wait_for_events(events, "checkpoint_commit", 1, 60s).empty());
  w.proc.kill(SIGTERM);
  std::this_thread::sleep_for(2500ms);  // past the window: this one means "now"
  w.proc.kill(SIGTERM);
  CHECK(w.exit_code(20s) == elastic::exit_preempted);
  CHECK_FALSE(w.line("end ", 0ms));  // it did not wait for the final checkpoint
  CHECK(elastic::test::events_named(events, "loop_preempted").empty());
  // What was committed loads: the next run resumes from it.
  const auto committed = newest_step(dir);
  REQUIRE(committed > 0);
  worker again(dir, events, {"--steps", std::to_string(committed + 5), "--every", "20"});
  CHECK(again.line("start ") == "start " + std::to_string(committed));
  CHECK(again.exit_code() == 0);
}

// Slurm signals a job's processes one after another: a copy of the notice can reach a worker
// whose loop has already ended and restored the handlers it found.
TEST_CASE("a copy of the notice that comes after the loop has ended does not kill the process on its way out") {
  temp_dir tmp;
  const auto dir = tmp.file("ckpt"), events = tmp.file("events.jsonl");
  worker w(dir, events, {"--every", "50", "--linger-ms", "1000"});
  REQUIRE(w.line("start "));
  std::this_thread::sleep_for(300ms);
  const auto notice = std::chrono::steady_clock::now();
  w.proc.kill(SIGTERM);
  const auto e = w.end();
  REQUIRE(w.line("gone"));
  const auto late = std::chrono::steady_clock::now() - notice;
  w.proc.kill(SIGTERM);  // the copy, late
  INFO(w.transcript());
  REQUIRE(e);
  if (late > 1500ms) {
    WARN("the loop took " << std::chrono::duration_cast<std::chrono::milliseconds>(late).count()
                          << " ms to end: the copy may be past the 2 s window, not checked");
    return;
  }
  check_final_committed(w, dir, events, e->step);
}

TEST_CASE("past the notice's window, a signal to a process whose loop has ended does what it did before the loop") {
  temp_dir tmp;
  const auto dir = tmp.file("ckpt"), events = tmp.file("events.jsonl");
  SECTION("the default: SIGTERM ends it") {
    worker w(dir, events, {"--every", "50", "--linger-ms", "30000"});
    REQUIRE(w.line("start "));
    w.proc.kill(SIGTERM);
    REQUIRE(w.line("gone"));
    std::this_thread::sleep_for(2500ms);
    w.proc.kill(SIGTERM);
    INFO(w.transcript());
    CHECK(w.proc.killed_by(SIGTERM, 20s));
  }
  SECTION("ignored before the loop: ignored after it") {
    worker w(dir, events, {"--every", "50", "--linger-ms", "4000", "--ignore-term"});
    REQUIRE(w.line("start "));
    w.proc.kill(SIGTERM);  // the loop's handler takes this one: a notice
    REQUIRE(w.line("gone"));
    std::this_thread::sleep_for(2500ms);
    w.proc.kill(SIGTERM);
    INFO(w.transcript());
    CHECK(w.exit_code(20s) == elastic::exit_preempted);
  }
}

// --- The exit code follows the newest outcome --------------------------------------------------

TEST_CASE("a checkpoint that failed once does not fail a run that later commits its final step") {
  temp_dir tmp;
  const auto dir = tmp.file("ckpt"), events = tmp.file("events.jsonl");
  worker w(dir, events, {"--steps", "80", "--every", "10", "--fsize-limit-at", "19", "--restore-fsize"});
  const auto e = w.end();
  INFO(w.transcript());
  REQUIRE(w.line("restored "));
  REQUIRE(e);
  CHECK(e->reason == "finished");
  CHECK(w.exit_code() == 0);
  CHECK_FALSE(elastic::test::events_named(events, "checkpoint_failed").empty());
  CHECK(newest_step(dir) == 80);
}

TEST_CASE("a checkpoint that failed once does not turn a later preemption into a failure") {
  temp_dir tmp;
  const auto dir = tmp.file("ckpt"), events = tmp.file("events.jsonl");
  worker w(dir, events, {"--every", "10", "--fsize-limit-at", "19", "--restore-fsize"});
  REQUIRE(w.line("restored "));
  std::this_thread::sleep_for(100ms);
  w.proc.kill(SIGTERM);
  const auto e = w.end();
  INFO(w.transcript());
  REQUIRE(e);
  CHECK(e->reason == "preempted");
  CHECK(w.exit_code() == elastic::exit_preempted);
  CHECK_FALSE(elastic::test::events_named(events, "checkpoint_failed").empty());
  CHECK(newest_step(dir) == e->step);
  const auto ends = elastic::test::events_named(events, "loop_preempted");
  REQUIRE(ends.size() == 1);
  CHECK(has(ends[0], "\"final_checkpoint\":true"));
}

TEST_CASE("a preempted run whose final checkpoint fails still exits 75, says so, and the previous step stands") {
  temp_dir tmp;
  const auto dir = tmp.file("ckpt"), events = tmp.file("events.jsonl");
  worker w(dir, events, {"--every", "10", "--fsize-limit-at", "25"});  // the disk is full from step 25 on
  REQUIRE(w.line("limited "));
  w.proc.kill(SIGTERM);
  const auto e = w.end();
  INFO(w.transcript());
  REQUIRE(e);
  CHECK(e->reason == "preempted");
  CHECK(e->exit == elastic::exit_preempted);
  CHECK(w.exit_code() == elastic::exit_preempted);
  CHECK(newest_step(dir) == 20);
  const auto ends = elastic::test::events_named(events, "loop_preempted");
  REQUIRE(ends.size() == 1);
  CHECK(has(ends[0], "\"final_checkpoint\":false"));
  CHECK(has(ends[0], "\"final_checkpoint_error\":\""));
}

TEST_CASE("a finished run whose final checkpoint fails throws: the last state is not saved") {
  temp_dir tmp;
  const auto dir = tmp.file("ckpt"), events = tmp.file("events.jsonl");
  worker w(dir, events, {"--steps", "30", "--every", "10", "--fsize-limit-at", "25"});
  const auto err = w.line("error ");
  INFO(w.transcript());
  REQUIRE(err);
  CHECK(w.exit_code() == 1);
  CHECK(newest_step(dir) == 20);
}

// --- Standalone ranks that checkpoint together stop at the same step --------------------------

namespace {

/// Rank r of 2 sharing `dir`, rank 1 three times slower, so that they are far apart when a
/// notice comes.
worker rank_of_two(int r, const std::string& dir, const std::string& events, std::vector<std::string> extra = {},
                   env_list env = {}) {
  std::vector<std::string> args{"--rank", std::to_string(r), "--world", "2", "--every", "0", "--sleep-us", "1000",
                                "--slow-rank", "1", "--slow-sleep-us", "3000"};
  args.insert(args.end(), extra.begin(), extra.end());
  return worker(dir, events, args, std::move(env));
}

/// Both ranks ended preempted (75) at one final step, the newest committed one.
void ended_at_one_step(worker& r0, worker& r1, const std::string& dir) {
  const auto e1 = r1.end();
  const auto e0 = r0.end();
  INFO(r0.transcript() << r1.transcript());
  REQUIRE(e0);
  REQUIRE(e1);
  CHECK(e0->reason == "preempted");
  CHECK(e1->reason == "preempted");
  CHECK(e0->step == e1->step);
  CHECK(r0.exit_code() == elastic::exit_preempted);
  CHECK(r1.exit_code() == elastic::exit_preempted);
  CHECK(newest_step(dir) == e0->step);
}

}  // namespace

TEST_CASE("a rank signalled alone brings its peer to the same final step, which is committed") {
  temp_dir tmp;
  const auto dir = tmp.file("ckpt"), events = tmp.file("events.jsonl");
  auto r0 = rank_of_two(0, dir, events, {}, {{"ELASTIC_GRACE", "60"}});
  auto r1 = rank_of_two(1, dir, events, {}, {{"ELASTIC_GRACE", "60"}});
  REQUIRE(r0.line("start "));
  REQUIRE(r1.line("start "));
  std::this_thread::sleep_for(800ms);
  r1.proc.kill(SIGTERM);  // the slow rank only: rank 0 learns of it from rank 1's proposal
  ended_at_one_step(r0, r1, dir);
  const auto ends = elastic::test::events_named(events, "loop_preempted");
  CHECK(ends.size() == 2);
  CHECK(std::count_if(ends.begin(), ends.end(), [](auto& l) { return has(l, "\"final_checkpoint\":true"); }) == 1);
  // The agreement leaves nothing behind.
  for (const auto& d : std::filesystem::directory_iterator(dir)) CHECK(d.path().filename().string().rfind(".final-", 0) != 0);
}

TEST_CASE("standalone ranks that finish agree on the last step and commit it") {
  temp_dir tmp;
  const auto dir = tmp.file("ckpt"), events = tmp.file("events.jsonl");
  auto r0 = rank_of_two(0, dir, events, {"--steps", "150"});
  auto r1 = rank_of_two(1, dir, events, {"--steps", "150"});
  const auto e0 = r0.end(), e1 = r1.end();
  INFO(r0.transcript() << r1.transcript());
  REQUIRE(e0);
  REQUIRE(e1);
  CHECK(e0->reason == "finished");
  CHECK(e1->reason == "finished");
  CHECK(r0.exit_code() == 0);
  CHECK(r1.exit_code() == 0);
  CHECK(newest_step(dir) == 150);
}

TEST_CASE("a dead rank makes its peer wait out the grace and exit 75, the previous step standing") {
  temp_dir tmp;
  const auto dir = tmp.file("ckpt"), events = tmp.file("events.jsonl");
  {  // An earlier incarnation committed step 40.
    auto r0 = rank_of_two(0, dir, events, {"--steps", "40"});
    auto r1 = rank_of_two(1, dir, events, {"--steps", "40"});
    CHECK(r0.exit_code() == 0);
    CHECK(r1.exit_code() == 0);
    REQUIRE(newest_step(dir) == 40);
  }
  auto r0 = rank_of_two(0, dir, events, {}, {{"ELASTIC_GRACE", "2"}});
  auto r1 = rank_of_two(1, dir, events, {}, {{"ELASTIC_GRACE", "2"}});
  REQUIRE(r0.line("start ") == "start 40");
  REQUIRE(r1.line("start ") == "start 40");
  r1.proc.kill(SIGKILL);
  REQUIRE(r1.proc.wait_for(10s));
  r0.proc.kill(SIGTERM);
  INFO(r0.transcript());
  CHECK(r0.exit_code(60s) == elastic::exit_preempted);
  CHECK(newest_step(dir) == 40);
}

TEST_CASE("proposals left by a killed incarnation are stale: the next incarnation trains on undisturbed") {
  temp_dir tmp;
  const auto dir = tmp.file("ckpt"), events = tmp.file("events.jsonl");
  // A killed incarnation that resumed at step 0 left proposals of processes that are gone.
  std::filesystem::create_directories(dir + "/.final-000000000000");
  child_process gone = child_process::spawn({"/bin/true"});
  REQUIRE(gone.exit_code(10s) == 0);
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  struct stat st {};
  ::stat("/proc/self/ns/pid", &st);
  for (int r : {0, 1}) {
    std::ofstream(dir + "/.final-000000000000/rank-" + std::to_string(r))
        << "7 preempted " << host << " " << st.st_ino << " " << gone.pid() << " 12345 unlocked";
  }
  auto r0 = rank_of_two(0, dir, events, {"--steps", "120"});
  auto r1 = rank_of_two(1, dir, events, {"--steps", "120"});
  const auto e0 = r0.end(), e1 = r1.end();
  INFO(r0.transcript() << r1.transcript());
  REQUIRE(e0);
  REQUIRE(e1);
  CHECK(e0->reason == "finished");
  CHECK(e0->step == 120);
  CHECK(e1->step == 120);
  CHECK(r0.exit_code() == 0);
  CHECK(r1.exit_code() == 0);
  CHECK(newest_step(dir) == 120);
}

TEST_CASE("a proposal left by a killed incarnation in another pid namespace is ignored: the ranks end at one committed step") {
  if (::geteuid() != 0) elastic::test::skip_test("needs root to make pid namespaces");
  if (::access("/usr/bin/unshare", X_OK) != 0) elastic::test::skip_test("no /usr/bin/unshare (util-linux)");
  temp_dir tmp;
  const auto dir = tmp.file("ckpt"), events = tmp.file("events.jsonl");
  const std::string stale = dir + "/.final-000000000000/rank-1";
  {
    // The killed incarnation: its rank 1 ran in a container of its own (pid namespace), got the
    // notice, proposed its step and was SIGKILLed while waiting for its rank 0.
    std::vector<std::string> argv{"/usr/bin/unshare", "--pid", "--fork", "--mount-proc", "--kill-child",
                                  ELASTIC_PREEMPT_WORKER, "--dir", dir, "--rank", "1", "--world", "2", "--every",
                                  "0", "--sleep-us", "1000"};
    child_process old = child_process::spawn(argv, {{"ELASTIC_EVENTS", events}, {"ELASTIC_GRACE", "60"}});
    const auto first = old.read_line(60s);
    if (!first || first->rfind("start ", 0) != 0) elastic::test::skip_test("unshare --pid is not permitted here");
    std::this_thread::sleep_for(300ms);
    // Its pid here: unshare's child (pid 1 in its namespace).
    long rank_pid = 0;
    std::ifstream("/proc/" + std::to_string(old.pid()) + "/task/" + std::to_string(old.pid()) + "/children") >> rank_pid;
    REQUIRE(rank_pid > 0);
    ::kill(static_cast<pid_t>(rank_pid), SIGTERM);
    const auto until = std::chrono::steady_clock::now() + 30s;
    while (!std::filesystem::exists(stale) && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(5ms);
    REQUIRE(std::filesystem::exists(stale));
    old.kill(SIGKILL);  // unshare, and with it (--kill-child) the rank
    REQUIRE(old.wait_for(10s));
  }
  std::string left;
  std::getline(std::ifstream(stale), left);
  INFO("stale proposal: " << left);
  // This incarnation's rank 0 starts first and trains a while before its rank 1 starts (and
  // removes its own leftover): rank 0 must not take the stale proposal for its peer's.
  auto r0 = rank_of_two(0, dir, events, {}, {{"ELASTIC_GRACE", "60"}});
  REQUIRE(r0.line("start ") == "start 0");
  std::this_thread::sleep_for(500ms);
  auto r1 = rank_of_two(1, dir, events, {}, {{"ELASTIC_GRACE", "60"}});
  REQUIRE(r1.line("start ") == "start 0");
  std::this_thread::sleep_for(300ms);
  r0.proc.kill(SIGTERM);
  r1.proc.kill(SIGTERM);
  ended_at_one_step(r0, r1, dir);
}

#if defined(ELASTIC_RUN_TOOL)
TEST_CASE("two standalone ranks under elastic-run agree on the preemption step and commit it") {
  temp_dir tmp;
  const auto dir = tmp.file("ckpt"), events = tmp.file("events.jsonl"), logs = tmp.file("logs");
  // elastic-run gives each worker ELASTIC_RANK and ELASTIC_WORLD_SIZE=2; rank 1 is slower.
  child_process run = child_process::spawn({ELASTIC_RUN_TOOL, "--run-id", elastic::test::unique_name("agree"),
                                            "--nproc-per-node", "2", "--grace", "60", "--quiet", "--log-dir", logs,
                                            "--events", events, "--", ELASTIC_PREEMPT_WORKER, "--dir", dir, "--every", "0", "--sleep-us",
                                            "1000", "--slow-rank", "1", "--slow-sleep-us", "3000"});
  REQUIRE(elastic::test::wait_for_events(events, "loop_start", 2, 60s).size() == 2);
  std::this_thread::sleep_for(800ms);
  run.kill(SIGTERM);
  const int code = run.exit_code(120s).value_or(-1);
  // Both ranks ended at one step, and that step is committed.
  std::vector<std::string> ends;
  for (const auto& f : std::filesystem::recursive_directory_iterator(logs)) {
    if (f.path().filename().string().rfind("rank-", 0) != 0) continue;
    std::ifstream in(f.path());
    for (std::string l; std::getline(in, l);)
      if (l.rfind("end ", 0) == 0) ends.push_back(l);
  }
  INFO("exit " << code);
  CHECK(code == elastic::exit_preempted);
  REQUIRE(ends.size() == 2);
  CHECK(ends[0] == ends[1]);
  std::istringstream in(ends[0].substr(4));
  std::string reason;
  std::uint64_t step = 0;
  in >> reason >> step;
  CHECK(reason == "preempted");
  CHECK(step > 0);
  CHECK(newest_step(dir) == step);
}
#endif

// --- Settings ----------------------------------------------------------------------------------

namespace {

/// The error line of a worker that must refuse its settings.
std::string refused(const std::string& dir, env_list env, std::vector<std::string> args = {"--steps", "5"}) {
  temp_dir tmp;
  worker w(dir, tmp.file("events.jsonl"), std::move(args), std::move(env));
  const auto err = w.line("error ", 30s);
  CHECK(w.exit_code() == 1);
  return err.value_or("(no error line: " + w.transcript() + ")");
}

}  // namespace

TEST_CASE("malformed or out-of-range settings are refused, naming the variable and what it takes") {
  temp_dir tmp;
  const auto dir = tmp.file("ckpt");
  SECTION("a step timeout that would round to no timeout") {
    const auto e = refused(dir, {{"ELASTIC_STEP_TIMEOUT", "0.0001"}});
    CHECK(has(e, "ELASTIC_STEP_TIMEOUT='0.0001'"));
    CHECK(has(e, "0 (no timeout) or 0.001 to 1000000 seconds"));
  }
  SECTION("a step timeout that is not a number") {
    CHECK(has(refused(dir, {{"ELASTIC_STEP_TIMEOUT", "5s"}}), "ELASTIC_STEP_TIMEOUT='5s' is not a number of seconds"));
  }
  SECTION("a grace out of range") {
    CHECK(has(refused(dir, {{"ELASTIC_GRACE", "-1"}}), "ELASTIC_GRACE='-1' is out of range"));
  }
  SECTION("a rank that is not below the world size") {
    const auto e = refused(dir, {{"ELASTIC_RANK", "2"}, {"ELASTIC_WORLD_SIZE", "2"}});
    CHECK(has(e, "ELASTIC_RANK=2 is not below ELASTIC_WORLD_SIZE=2"));
  }
  SECTION("a world size that is not a number") {
    CHECK(has(refused(dir, {{"ELASTIC_WORLD_SIZE", "two"}}), "ELASTIC_WORLD_SIZE='two' is not an integer"));
  }
}

TEST_CASE("a step timeout with an ELASTIC_WATCHDOG that cannot be attached is refused") {
  temp_dir tmp;
  const auto e = refused(tmp.file("ckpt"), {{"ELASTIC_WATCHDOG", elastic::test::unique_name("no-such-watchdog")}},
                         {"--steps", "5", "--timeout-ms", "5000"});
  CHECK(has(e, "ELASTIC_WATCHDOG='no-such-watchdog"));
  CHECK(has(e, "would not be enforced"));
}

TEST_CASE("without ELASTIC_WATCHDOG a step timeout runs unwatched and says so once") {
  temp_dir tmp;
  const auto events = tmp.file("events.jsonl");
  worker w(tmp.file("ckpt"), events, {"--steps", "20", "--timeout-ms", "5000"});
  const auto e = w.end();
  REQUIRE(e);
  CHECK(e->reason == "finished");
  CHECK(w.exit_code() == 0);
  CHECK(elastic::test::events_named(events, "timer_unwatched").size() == 1);
}
