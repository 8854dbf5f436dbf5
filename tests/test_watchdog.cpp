// The watchdog against real worker processes: who gets which signal, when, and what is logged.
#include <signal.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <string>

#include <elastic/timer/watchdog.hpp>

#include "support/catch.hpp"
#include "support/hosted_watchdog.hpp"
#include "support/process.hpp"

using namespace std::chrono_literals;
using elastic::test::child_process;
using elastic::test::hosted;


TEST_CASE("a scope that expires kills its process and the kill is logged") {
  hosted h;
  auto w = h.worker("hang", {"200"}, {{"ELASTIC_RANK", "3"}});
  REQUIRE(w.read_line() == "entered");
  REQUIRE(w.killed_by(SIGKILL, 10s));
  const auto kills = elastic::test::wait_for_events(h.events, "watchdog_kill", 1, 5s);
  REQUIRE(kills.size() == 1);
  CHECK(kills[0].find("\"target_pid\":" + std::to_string(w.pid())) != std::string::npos);
  CHECK(kills[0].find("\"scope\":\"hung-step\"") != std::string::npos);
  CHECK(kills[0].find("\"signal\":\"SIGKILL\"") != std::string::npos);
  CHECK(kills[0].find("\"target_rank\":3") != std::string::npos);
  CHECK(kills[0].find("\"limit_ms\":200") != std::string::npos);
  CHECK(h.wd.stats().signals == 1);
}

TEST_CASE("scopes that end in time kill nothing") {
  hosted h;
  auto w = h.worker("churn", {"2", "2000"});
  CHECK(w.read_line(60s) == "done");
  CHECK(w.exit_code(30s) == 0);
  CHECK(elastic::test::events_named(h.events, "watchdog_kill").empty());
}

TEST_CASE("a scope's own signal is sent instead of the default") {
  hosted h;
  auto w = h.worker("hang", {"100", std::to_string(SIGTERM)});
  REQUIRE(w.read_line() == "entered");
  CHECK(w.killed_by(SIGTERM, 10s));
}

TEST_CASE("the watchdog's default signal applies to scopes that name none") {
  hosted h({.signal = SIGUSR1});
  auto w = h.worker("hang", {"100"});
  REQUIRE(w.read_line() == "entered");
  CHECK(w.killed_by(SIGUSR1, 10s));
}

TEST_CASE("a process that survives a softer signal gets SIGKILL after the grace") {
  hosted h({.escalate_after = 300ms});
  auto w = h.worker("ignore-abrt", {"100"});
  REQUIRE(w.read_line() == "entered");
  CHECK(w.read_line(10s) == "got SIGABRT");
  CHECK(w.killed_by(SIGKILL, 10s));
  const auto esc = elastic::test::wait_for_events(h.events, "watchdog_escalate", 1, 5s);
  REQUIRE(esc.size() == 1);
  CHECK(esc[0].find("\"after_signal\":\"SIGABRT\"") != std::string::npos);
  CHECK(h.wd.stats().escalations == 1);
}

TEST_CASE("an outer scope that expires is enforced while inner scopes churn") {
  hosted h;
  auto w = h.worker("outer-expires", {"200"});
  REQUIRE(w.read_line() == "entered");
  CHECK(w.killed_by(SIGKILL, 10s));
  const auto kills = elastic::test::wait_for_events(h.events, "watchdog_kill", 1, 5s);
  REQUIRE(kills.size() == 1);
  CHECK(kills[0].find("\"scope\":\"epoch\"") != std::string::npos);
}

TEST_CASE("a deadline before the watchdog's next look wakes it through the doorbell") {
  // A poll of a minute: without the doorbell this kill would come a minute late.
  hosted h({.poll = 60s, .reclaim_interval = 60s});
  std::this_thread::sleep_for(50ms);  // let the watchdog go to sleep
  auto w = h.worker("hang", {"100"});
  REQUIRE(w.read_line() == "entered");
  CHECK(w.killed_by(SIGKILL, 10s));
}

TEST_CASE("a fork child leaving its copy of a scope does not unwatch the parent") {
  hosted h;
  auto w = h.worker("fork-child-leaves", {"300"});
  CHECK(w.read_line() == "child-ok");
  CHECK(w.killed_by(SIGKILL, 10s));
}

TEST_CASE("the standalone elastic-watchdog kills, logs, and cleans up on SIGTERM") {
  const std::string tool = ELASTIC_WATCHDOG_TOOL;
  if (tool.empty()) {
    WARN("elastic-watchdog was not built (ELASTIC_BUILD_TOOLS=OFF)");
    return;
  }
  elastic::test::temp_dir dir;
  const std::string name = elastic::test::unique_name("tool");
  const std::string events = dir.file("events.jsonl");
  auto wd = child_process::spawn({tool, "--name", name, "--events", events, "--poll", "5"});
  const auto ready = wd.read_line();
  REQUIRE(ready);
  CHECK(ready->find("serving '" + name + "'") != std::string::npos);
  auto w = child_process::spawn({ELASTIC_TEST_WORKER, "hang", name, "150"});
  REQUIRE(w.read_line() == "entered");
  CHECK(w.killed_by(SIGKILL, 10s));
  CHECK(elastic::test::wait_for_events(events, "watchdog_kill", 1, 5s).size() == 1);
  wd.kill(SIGTERM);
  CHECK(wd.exit_code(10s) == 0);
  CHECK_FALSE(std::filesystem::exists("/dev/shm/elastic-timer." + name));
}

TEST_CASE("elastic-watchdog refuses bad arguments with usage and exit code 2") {
  const std::string tool = ELASTIC_WATCHDOG_TOOL;
  if (tool.empty()) return;
  CHECK(child_process::spawn({tool, "--name", "bad/name"}).exit_code(10s) == 1);
  CHECK(child_process::spawn({tool, "--poll", "soon", "--name", "x"}).exit_code(10s) == 2);
  CHECK(child_process::spawn({tool, "--bogus"}).exit_code(10s) == 2);
  CHECK(child_process::spawn({tool, "--name", "x", "--signal", "NOPE"}).exit_code(10s) == 2);
}
