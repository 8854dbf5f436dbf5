// elastic-run with real worker processes (tests/support/agent_worker.cpp): restarts, used-up
// restarts, preemptions, the SIGTERM grace, logs, orphans, the hosted watchdog, the worker
// environment, bad command lines, and two launchers meeting through one etcd.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <elastic/detail/process.hpp>
#include <elastic/rendezvous/shm_store.hpp>

#include "support/catch.hpp"
#include "support/process.hpp"
#if defined(ELASTIC_ETCD_SERVER) && defined(ELASTIC_GROUP_WORKER)
#include "support/etcd_server.hpp"
#include "support/fleet.hpp"
#endif

namespace {

using namespace std::chrono_literals;
using elastic::test::child_process;
using elastic::test::temp_dir;

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

/// elastic-run with its logs under `dir`, run id `run`, then `args` (options, "--", program).
struct launch {
  temp_dir dir;
  std::string run;
  child_process proc;
  std::vector<std::string> console;

  launch(std::string run_id, std::vector<std::string> options, std::vector<std::string> program)
      : run(std::move(run_id)) {
    std::vector<std::string> argv{ELASTIC_RUN_TOOL, "--run-id", run, "--log-dir", dir.path()};
    argv.insert(argv.end(), options.begin(), options.end());
    argv.push_back("--");
    argv.insert(argv.end(), program.begin(), program.end());
    proc = child_process::spawn(argv);
  }
  std::string log(int slot) const { return slurp(dir.path() + "/" + run + "/rank-" + std::to_string(slot) + ".log"); }
  std::string events() const { return slurp(dir.path() + "/" + run + "/events.jsonl"); }
  /// The exit code once elastic-run ended (reading its console meanwhile), or -1.
  int finish(std::chrono::milliseconds timeout = 60s) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < until) {
      while (auto l = proc.read_line(0ms)) console.push_back(*l);
      if (auto st = proc.wait_for(10ms)) {
        while (auto l = proc.read_line(0ms)) console.push_back(*l);
        return WIFEXITED(*st) ? WEXITSTATUS(*st) : -1;
      }
    }
    return -1;
  }
};

const std::string worker = ELASTIC_AGENT_WORKER;

bool wait_for_file(const std::string& path, std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (!std::filesystem::exists(path) || std::filesystem::file_size(path) == 0) {
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

pid_t read_pid(const std::string& path) { return static_cast<pid_t>(std::stol(slurp(path))); }

}  // namespace

TEST_CASE("a crashed worker is restarted while the others keep running") {
  launch l("crash", {"--nproc-per-node", "3", "--max-restarts", "2"}, {worker, "crash-once"});
  REQUIRE(l.finish() == 0);
  const std::string crashed = l.log(1);
  CHECK(crashed.find("slot 1 crashes") != std::string::npos);
  CHECK(crashed.find("killed by SIGABRT") != std::string::npos);
  CHECK(count(crashed, "started: pid") == 2);
  CHECK(count(l.log(0), "started: pid") == 1);  // the others were not touched
  CHECK(count(l.log(2), "started: pid") == 1);
  CHECK(count(l.events(), "\"event\":\"worker_restart\"") == 1);
}

TEST_CASE("restarts used up: the others are stopped and elastic-run exits 1") {
  launch l("exhaust", {"--nproc-per-node", "3", "--max-restarts", "2", "--grace", "5"}, {worker, "crash-always"});
  REQUIRE(l.finish() == 1);
  CHECK(count(l.log(0), "started: pid") == 3);  // the first life and 2 restarts
  CHECK(count(l.log(0), "exited with code 3") == 3);
  for (int s : {1, 2}) {
    CHECK(l.log(s).find("terminating: exit 75") != std::string::npos);  // SIGTERMed, not killed
  }
  CHECK(l.events().find("restarts are used up") != std::string::npos);
}

TEST_CASE("a worker that exits 75 is restarted without counting a failure") {
  launch l("preempt", {"--nproc-per-node", "2", "--max-restarts", "0"}, {worker, "preempt-once"});
  REQUIRE(l.finish() == 0);
  CHECK(count(l.log(0), "started: pid") == 2);
  CHECK(l.log(0).find("exited with code 75 (preempted") != std::string::npos);
}

TEST_CASE("SIGTERM: workers exit 75 within the grace, a straggler is SIGKILLed, elastic-run exits 75") {
  temp_dir pids;
  launch l("term", {"--nproc-per-node", "3", "--grace", "1"}, {worker, "wait", pids.file("pid")});
  for (int s = 0; s < 3; ++s) REQUIRE(wait_for_file(pids.file("pid." + std::to_string(s)), 20s));
  std::this_thread::sleep_for(100ms);  // each has reached its pause()
  const auto t0 = std::chrono::steady_clock::now();
  l.proc.kill(SIGTERM);
  REQUIRE(l.finish(20s) == 75);
  CHECK(std::chrono::steady_clock::now() - t0 < 10s);
  CHECK(l.log(0).find("exited with code 75") != std::string::npos);
  CHECK(l.log(2).find("exited with code 75") != std::string::npos);
  CHECK(l.log(1).find("did not exit within the grace: SIGKILL") != std::string::npos);
  for (int s = 0; s < 3; ++s) CHECK_FALSE(elastic::detail::process_alive(read_pid(pids.file("pid." + std::to_string(s))), 0));
}

TEST_CASE("no orphans: the workers die with elastic-run, even when it is SIGKILLed") {
  temp_dir pids;
  launch l("orphans", {"--nproc-per-node", "3"}, {worker, "wait", pids.file("pid")});
  for (int s = 0; s < 3; ++s) REQUIRE(wait_for_file(pids.file("pid." + std::to_string(s)), 20s));
  l.proc.kill(SIGKILL);
  l.finish(10s);
  const auto until = std::chrono::steady_clock::now() + 5s;
  bool gone = false;
  while (!gone && std::chrono::steady_clock::now() < until) {
    gone = true;
    for (int s = 0; s < 3; ++s) gone = gone && !elastic::detail::process_alive(read_pid(pids.file("pid." + std::to_string(s))), 0);
    if (!gone) std::this_thread::sleep_for(10ms);
  }
  CHECK(gone);
}

TEST_CASE("a hung worker is killed by the watchdog elastic-run hosts, and restarted") {
  launch l("hang", {"--nproc-per-node", "2", "--max-restarts", "1"}, {worker, "hang"});
  REQUIRE(l.finish() == 0);
  CHECK(l.log(0).find("hanging") != std::string::npos);
  CHECK(l.log(0).find("killed by SIGKILL (the watchdog") != std::string::npos);
  CHECK(count(l.log(0), "started: pid") == 2);
  CHECK(l.events().find("\"event\":\"watchdog_kill\"") != std::string::npos);
  CHECK(l.events().find("\"watchdog\":true") != std::string::npos);
}

TEST_CASE("worker output goes to the console with a rank prefix and to a log that outlives the worker") {
  launch l("logs", {"--nproc-per-node", "2", "--max-restarts", "2"}, {worker, "lines", "200"});
  REQUIRE(l.finish() == 0);
  for (int s : {0, 1}) {
    const std::string log = l.log(s);
    CHECK(count(log, "out line 199\n") == 2);  // both lives, the SIGKILLed one included
    CHECK(count(log, "err line 199\n") == 2);
    CHECK(log.find("killed by SIGKILL") != std::string::npos);
  }
  std::size_t prefixed = 0;
  for (const auto& line : l.console) {
    CHECK((line.rfind("[rank 0] ", 0) == 0 || line.rfind("[rank 1] ", 0) == 0));
    prefixed += line.find("out line") != std::string::npos ? 1 : 0;
  }
  CHECK(prefixed == 2 * 2 * 200);
}

TEST_CASE("the worker environment follows the contract") {
  temp_dir out;
  launch l("envrun", {"--nproc-per-node", "2", "--nnodes", "1:2", "--step-timeout", "2.5", "--grace", "7"},
           {worker, "env", out.file("env")});
  REQUIRE(l.finish() == 0);
  const std::string e1 = slurp(out.file("env.1"));
  for (const char* want : {"ELASTIC_RUN_ID=envrun\n", "ELASTIC_RANK=1\n", "ELASTIC_LOCAL_RANK=1\n", "ELASTIC_WORLD_SIZE=2\n",
                           "ELASTIC_LOCAL_WORLD_SIZE=2\n", "ELASTIC_RESTART_COUNT=0\n", 
                           "ELASTIC_RDZV=shm://elastic-envrun\n", "ELASTIC_MIN_NODES=2\n", "ELASTIC_MAX_NODES=4\n",
                           "ELASTIC_STEP_TIMEOUT=2.500\n", "ELASTIC_GRACE=7.000\n", "RANK=1\n", "WORLD_SIZE=2\n",
                           "LOCAL_RANK=1\n", "ELASTIC_HOST_ADDR=127.0.0.1\n"}) {
    CHECK(e1.find(want) != std::string::npos);
  }
  CHECK(e1.find("ELASTIC_EVENTS=" + l.dir.path() + "/envrun/events.jsonl\n") != std::string::npos);
  CHECK(e1.find("ELASTIC_PARTICIPANT_ID=") != std::string::npos);
  CHECK(e1.find("ELASTIC_WATCHDOG=elastic-envrun-") != std::string::npos);
  CHECK(slurp(out.file("env.0")).find("ELASTIC_RANK=0\n") != std::string::npos);
}

TEST_CASE("a dead worker's alive key is retired at once, so the group need not wait for its lease") {
  const std::string store = elastic::test::unique_name("agentstore");
  {
    launch l("retire", {"--nproc-per-node", "1", "--max-restarts", "1", "--rdzv", "shm://" + store}, {worker, "retire"});
    REQUIRE(l.finish() == 0);
    CHECK(l.log(0).find("key-present=0") != std::string::npos);
  }
  elastic::rendezvous::shm_store::remove(store);
}

TEST_CASE("bad command lines are refused with exit 2 and the reason") {
  for (const auto& args : std::vector<std::vector<std::string>>{{"--nproc-per-node", "0", "--", worker},
                                                                {"--nnodes", "3:2", "--", worker},
                                                                {"--grace", "soon", "--", worker},
                                                                {"--bogus", "--", worker},
                                                                {"--rdzv", "http://x", "--", worker},
                                                                {"--host-addr", "a b", "--", worker},
                                                                {"--nproc-per-node", "2"}}) {
    std::vector<std::string> argv{ELASTIC_RUN_TOOL};
    argv.insert(argv.end(), args.begin(), args.end());
    auto p = child_process::spawn(argv);
    const auto code = p.exit_code(10s);
    INFO(args.front());
    CHECK(code == 2);
  }
  temp_dir d;
  auto p = child_process::spawn({ELASTIC_RUN_TOOL, "--log-dir", d.path(), "--", "/nonexistent/trainer"});
  CHECK(p.exit_code(10s) == 1);  // cannot start the program: a failure, not a usage error
}

#if defined(ELASTIC_ETCD_SERVER) && defined(ELASTIC_GROUP_WORKER)
TEST_CASE("two launchers meet through one etcd and train as one group") {
  elastic::test::etcd_server etcd;
  temp_dir ckpt;
  const std::vector<std::string> program{ELASTIC_GROUP_WORKER, "--store", etcd.url(), "--run-id", "twohosts", "--min",
                                         "2", "--max", "2", "--steps", "30", "--dir", ckpt.path(), "--dim", "4096"};
  const std::vector<std::string> options{"--nproc-per-node", "1", "--nnodes", "2:2", "--rdzv", etcd.url()};
  launch a("twohosts", options, program);
  launch b("twohosts", options, program);
  REQUIRE(a.finish(120s) == 0);
  REQUIRE(b.finish(120s) == 0);
  std::vector<std::string> joined, finals;
  for (auto* l : {&a, &b}) {
    const std::string log = l->log(0);
    const auto j = log.find("joined ");
    REQUIRE(j != std::string::npos);
    joined.push_back(log.substr(j, log.find('\n', j) - j));
    const auto f = log.find("final ");
    REQUIRE(f != std::string::npos);
    finals.push_back(elastic::test::field(log.substr(f, log.find('\n', f) - f), "crc"));
  }
  CHECK(elastic::test::field(joined[0], "world") == "2");
  CHECK(elastic::test::field(joined[1], "world") == "2");
  CHECK(elastic::test::field(joined[0], "rank") != elastic::test::field(joined[1], "rank"));
  CHECK(finals[0] == finals[1]);
}
#endif
