// Faults the watchdog must survive: workers and watchdogs that die, pids that come back, full
// tables, and many processes with many threads racing the scanner.
#include <signal.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <elastic/internal/process.hpp>
#include <elastic/timer.hpp>

#include "support/catch.hpp"
#include "support/hosted_watchdog.hpp"
#include "support/process.hpp"

using namespace std::chrono_literals;
using elastic::test::child_process;
using elastic::test::hosted;
namespace td = elastic::timer::detail;

namespace {

int slots_owned_by(const td::table_view& t, pid_t pid) {
  int n = 0;
  for (std::uint32_t i = 0; i < t.slot_count(); ++i)
    n += t.at(i).head.owner.load() == static_cast<std::uint64_t>(pid) ? 1 : 0;
  return n;
}

}  // namespace

TEST_CASE("a process that dies inside a scope is never killed later and its slot is freed") {
  hosted h({.reclaim_interval = 100ms});
  auto w = h.worker("hang", {"400"});
  REQUIRE(w.read_line() == "entered");
  const pid_t pid = w.pid();
  w.kill(SIGKILL);  // dies inside its scope, before the deadline
  REQUIRE(w.killed_by(SIGKILL, 10s));
  const auto reclaims = elastic::test::wait_for_events(h.events, "watchdog_reclaim", 1, 10s);
  REQUIRE(reclaims.size() == 1);
  CHECK(reclaims[0].find("\"target_pid\":" + std::to_string(pid)) != std::string::npos);
  std::this_thread::sleep_for(500ms);  // well past the dead scope's deadline
  CHECK(elastic::test::events_named(h.events, "watchdog_kill").empty());
  CHECK(slots_owned_by(h.wd.table(), pid) == 0);
}

TEST_CASE("a process that reuses a dead owner's pid is not killed for the old deadline") {
  // Forcing the kernel to hand out a given pid again is not practical in a test, so build the
  // state pid reuse produces: a slot whose owner pid names a live process that started at
  // another time, holding an expired scope.
  hosted h({.poll = 5ms});
  auto innocent = h.worker("hang", {"60000"});
  REQUIRE(innocent.read_line() == "entered");
  const pid_t pid = innocent.pid();
  const std::uint64_t real_start = elastic::internal::process_start_time(pid);
  REQUIRE(real_start > 1);

  const auto t = h.wd.table();
  td::slot& s = t.at(t.slot_count() - 1);  // a slot no live thread uses
  s.head.tid.store(pid);
  s.head.depth.store(1);
  auto& e = s.scopes[0];
  e.deadline_ns.store(elastic::internal::monotonic_ns() - 1'000'000);
  e.entered_ns.store(elastic::internal::monotonic_ns() - 2'000'000);
  e.signal.store(SIGKILL);
  td::store_name(e, "old-owner-scope");
  e.generation.store(1);
  std::uint64_t expected = 0;
  REQUIRE(s.head.owner.compare_exchange_strong(expected, static_cast<std::uint64_t>(pid)));
  s.head.start_time.store(real_start - 1);  // the previous process with this pid
  t.header().slots_high_water.store(t.slot_count());

  const auto reclaims = elastic::test::wait_for_events(h.events, "watchdog_reclaim", 1, 10s);
  REQUIRE(reclaims.size() == 1);
  CHECK(reclaims[0].find("\"target_pid\":" + std::to_string(pid)) != std::string::npos);
  CHECK_FALSE(innocent.wait_for(200ms).has_value());  // still alive
  CHECK(elastic::test::events_named(h.events, "watchdog_kill").empty());
  CHECK(s.head.owner.load() == 0);
}

TEST_CASE("a watchdog that dies is replaced by a new one that enforces the old deadlines") {
  const std::string tool = ELASTIC_WATCHDOG_TOOL;
  if (tool.empty()) {
    WARN("elastic-watchdog was not built (ELASTIC_BUILD_TOOLS=OFF)");
    return;
  }
  elastic::test::temp_dir dir;
  const std::string name = elastic::test::unique_name("phoenix");
  const std::string events = dir.file("events.jsonl");
  auto first = child_process::spawn({tool, "--name", name, "--events", events});
  REQUIRE(first.read_line());
  auto w = child_process::spawn({ELASTIC_TEST_WORKER, "hang", name, "1500"});
  REQUIRE(w.read_line() == "entered");
  first.kill(SIGKILL);
  REQUIRE(first.killed_by(SIGKILL, 10s));
  CHECK_FALSE(w.wait_for(100ms).has_value());  // nobody enforces the scope right now

  elastic::timer::watchdog second({.name = name, .events = elastic::event_log::to_file(events)});
  CHECK(second.adopted());
  CHECK(w.killed_by(SIGKILL, 10s));  // the deadline written under the first watchdog
  CHECK(elastic::test::wait_for_events(events, "watchdog_kill", 1, 5s).size() == 1);
  const auto adopt = elastic::test::events_named(events, "watchdog_adopt");
  REQUIRE(adopt.size() == 1);
  CHECK(adopt[0].find("\"live_slots\":1") != std::string::npos);
}

TEST_CASE("many processes with many threads race the scanner: no false kill, no missed kill") {
  hosted h({.poll = 1ms, .reclaim_interval = 50ms});  // scan as often as possible
  std::vector<child_process> busy, hung;
  for (int p = 0; p < 4; ++p) busy.push_back(h.worker("churn", {"4", "3000"}));
  for (int p = 0; p < 2; ++p) hung.push_back(h.worker("churn-and-hang", {"2", "300"}));
  for (auto& w : hung) REQUIRE(w.read_line(30s) == "entered");
  for (auto& w : hung) CHECK(w.killed_by(SIGKILL, 20s));
  for (auto& w : busy) {
    CHECK(w.read_line(120s) == "done");
    CHECK(w.exit_code(30s) == 0);
  }
  const auto kills = elastic::test::wait_for_events(h.events, "watchdog_kill", 2, 5s);
  CHECK(kills.size() == 2);
  for (const auto& k : kills) CHECK(k.find("\"scope\":\"hung-among-busy\"") != std::string::npos);
}

TEST_CASE("threads that exit give their slots back") {
  hosted h;
  auto w = h.worker("threads-exit", {"50"});
  REQUIRE(w.read_line(30s) == "done");
  CHECK(slots_owned_by(h.wd.table(), w.pid()) == 0);
}

TEST_CASE("scopes nested deeper than a slot's stack are logged once") {
  hosted h;
  auto w = h.worker("stack-overflow", {});
  CHECK(w.read_line() == "watched " + std::to_string(td::scopes_per_slot));
  const auto ev = elastic::test::wait_for_events(h.events, "timer_stack_full", 1, 5s);
  CHECK(ev.size() == 1);
}

TEST_CASE("a full table leaves new threads unwatched, logs it, and training goes on") {
  hosted h({.capacity = 2});
  auto w = h.worker("crowd", {"6"});
  CHECK(w.read_line(60s) == "watched 2 of 6");
  CHECK(w.exit_code(30s) == 0);
  CHECK(elastic::test::events_named(h.events, "timer_table_full").size() == 1);
  CHECK(h.wd.table().header().table_full.load() > 0);
}

TEST_CASE("a worker whose watchdog segment is missing runs unwatched and says so once") {
  elastic::test::temp_dir dir;
  const std::string events = dir.file("events.jsonl");
  // test_worker attaches explicitly and fails; the env path is what a trainer uses.
  auto w = child_process::spawn({ELASTIC_TEST_WORKER, "env-churn"},
                                {{"ELASTIC_WATCHDOG", elastic::test::unique_name("absent")}, {"ELASTIC_EVENTS", events}});
  CHECK(w.read_line(30s) == "unwatched done");
  CHECK(w.exit_code(30s) == 0);
  const auto ev = elastic::test::events_named(events, "timer_unwatched");
  REQUIRE(ev.size() == 1);
  CHECK(ev[0].find("no watchdog segment") != std::string::npos);
}

TEST_CASE("a slot forged in the name of a process that never attached gets that process no signal") {
  hosted h({.poll = 5ms});
  // An innocent process: it has exec'd (so it does not even share the test's mappings any
  // more) before anything names it; `exec` keeps its pid and start time.
  auto innocent = child_process::spawn({"/bin/sh", "-c", "echo ready; exec sleep 60"});
  REQUIRE(innocent.read_line() == "ready");
  const pid_t pid = innocent.pid();
  const std::uint64_t start = elastic::internal::process_start_time(pid);
  REQUIRE(start > 0);

  // A client writes an expired scope in the innocent's name (real pid, real start time), three
  // times over: each time the watchdog must refuse, free the slot, and log it only once.
  auto forger = h.worker("forge", {std::to_string(pid), std::to_string(start), "3"});
  CHECK(forger.read_line(60s) == "freed 3");
  const auto refused = elastic::test::wait_for_events(h.events, "watchdog_refused", 1, 10s);
  REQUIRE(refused.size() == 1);
  CHECK(refused[0].find("\"target_pid\":" + std::to_string(pid) + ",") != std::string::npos);
  CHECK(refused[0].find("pid " + std::to_string(pid) + " does not map segment " + h.name + ": it never attached") !=
        std::string::npos);
  CHECK(refused[0].find("\"scope\":\"forged-scope\"") != std::string::npos);
  CHECK_FALSE(innocent.wait_for(0ms).has_value());  // alive: nothing was sent to it
  CHECK(elastic::test::events_named(h.events, "watchdog_kill").empty());
  CHECK(slots_owned_by(h.wd.table(), pid) == 0);
  CHECK(h.wd.stats().refused == 3);
  CHECK(h.wd.stats().signals == 0);

  // The forger, a real client, is still the watchdog's to kill, and so is any hung client.
  auto hung = h.worker("hang", {"100"});
  REQUIRE(hung.read_line() == "entered");
  CHECK(hung.killed_by(SIGKILL, 10s));
  const auto kills = elastic::test::wait_for_events(h.events, "watchdog_kill", 1, 5s);
  REQUIRE(kills.size() == 1);
  CHECK(kills[0].find("\"target_pid\":" + std::to_string(hung.pid()) + ",") != std::string::npos);
  CHECK_FALSE(innocent.wait_for(0ms).has_value());
}

TEST_CASE("a process that no longer maps the segment gets no SIGKILL escalation") {
  // The test drives the scans itself, with times of its choosing: no race with the exec below.
  hosted h({.escalate_after = 1s, .start_thread = false});
  auto w = h.worker("abrt-then-exec", {"100"});
  REQUIRE(w.read_line() == "entered");
  const std::int64_t later = elastic::internal::monotonic_ns() + 2'000'000'000;  // past its 100 ms
  REQUIRE(h.wd.scan_once(later).signals_sent == 1);                             // SIGABRT to a client
  REQUIRE(w.read_line() == "got SIGABRT");
  REQUIRE(w.read_line() == "execed");  // same process, a new image that maps nothing of ours
  h.wd.scan_once(later + 10'000'000'000);  // well past escalate_after
  const auto refused = elastic::test::events_named(h.events, "watchdog_refused");
  REQUIRE(refused.size() == 1);
  CHECK(refused[0].find("\"target_pid\":" + std::to_string(w.pid()) + ",") != std::string::npos);
  CHECK(refused[0].find("\"stage\":\"escalate\"") != std::string::npos);
  CHECK(refused[0].find("it no longer maps it") != std::string::npos);
  CHECK_FALSE(w.wait_for(0ms).has_value());  // alive: no SIGKILL
  CHECK(elastic::test::events_named(h.events, "watchdog_escalate").empty());
  CHECK(h.wd.stats().escalations == 0);
}
