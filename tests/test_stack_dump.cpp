// The stack dump before a watchdog kill, with real processes: elastic-run and the standalone
// elastic-watchdog against workers (tests/support/hung_worker.cpp) hung in a known function,
// deadlocked inside malloc, already traced by another process; the bound, the switch, a
// watchdog that may not trace; the library's own order of events; and the dump's two formats.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <elastic/config.hpp>
#include <elastic/internal/json.hpp>
#include <elastic/timer/stack_dump.hpp>
#include <elastic/timer/watchdog.hpp>

#include "agent/options.hpp"  // tools/agent: elastic-run's parser, for its new flags
#include "support/catch.hpp"
#include "support/hosted_watchdog.hpp"
#include "support/launched_run.hpp"
#include "support/other_user.hpp"
#include "support/process.hpp"

namespace {

using namespace std::chrono_literals;
using elastic::internal::json;
using elastic::test::child_process;
using elastic::test::launched_run;

const std::string hung_worker = ELASTIC_HUNG_WORKER;

bool contains(std::string_view text, std::string_view what) { return text.find(what) != std::string_view::npos; }

/// The JSON lines of `events` (a whole events file) whose event is `name`, parsed.
std::vector<json> events_named(const std::string& events, const std::string& name) {
  std::vector<json> out;
  std::size_t start = 0;
  while (start < events.size()) {
    const std::size_t nl = std::min(events.find('\n', start), events.size());
    const std::string_view line(events.data() + start, nl - start);
    if (contains(line, "\"event\":\"" + name + "\"")) out.push_back(json::parse(line));
    start = nl + 1;
  }
  return out;
}

/// Where in `events` the first `name` event is (npos when none).
std::size_t first_event(const std::string& events, const std::string& name) {
  return events.find("\"event\":\"" + name + "\"");
}

/// Every function name in a watchdog_stack's "stacks", for the thread named `thread`, or the
/// scope's thread when `thread` is empty.
[[maybe_unused]] std::vector<std::string> functions(const json& stack_event, const std::string& thread = "") {
  std::vector<std::string> out;
  for (const json& t : stack_event.at("stacks").elements()) {
    if (thread.empty() ? !t.at("scope_thread").as_bool() : t.at("name").as_string() != thread) continue;
    for (const json& f : t.at("frames").elements()) {
      if (f.at("function").is_string()) out.push_back(f.at("function").as_string());
    }
  }
  return out;
}

[[maybe_unused]] bool any_contains(const std::vector<std::string>& names, std::string_view what) {
  for (const auto& n : names)
    if (contains(n, what)) return true;
  return false;
}

/// elastic-run with one worker, no restarts, `options`, running `hung_worker MODE`.
launched_run run_hung(const std::string& run_id, const std::string& mode, std::vector<std::string> options = {}) {
  std::vector<std::string> all{"--nproc-per-node", "1", "--max-restarts", "0", "--step-timeout", "0.3"};
  all.insert(all.end(), options.begin(), options.end());
  return launched_run(ELASTIC_RUN_TOOL, run_id, all, {hung_worker, mode});
}

/// Waits (bounded) until child `pid` has exited, taking notices of its ptrace stops off the
/// queue on the way, as a host of a watchdog with stack dumps must: its capture thread traces
/// from this process, so waitpid() here would report those stops. Leaves the exit to be reaped.
bool exited_skipping_stops(pid_t pid, std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < until) {
    siginfo_t si{};
    if (::waitid(P_PID, static_cast<id_t>(pid), &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid == pid) {
      if (si.si_code == CLD_EXITED || si.si_code == CLD_KILLED || si.si_code == CLD_DUMPED) return true;
      siginfo_t notice{};
      ::waitid(P_PID, static_cast<id_t>(pid), &notice, WSTOPPED | WCONTINUED | WNOHANG | __WALL);
      continue;
    }
    std::this_thread::sleep_for(1ms);
  }
  return false;
}

/// Where the forge tests hand a worker the pid it forges a scope for (one per test process).
std::string run_target_file() {
  static elastic::test::temp_dir dir;
  return dir.file("target");
}

}  // namespace

TEST_CASE("a worker hung in a known function is killed and its rank log holds that function in a stack dump") {
  auto run = run_hung("stack-spin", "spin");
  CHECK(run.finish() == 1);
  const std::string log = run.log(0);
  const std::string events = run.events();
  INFO(log);
  REQUIRE(contains(log, "elastic watchdog: scope 'hung-step' of pid "));
  CHECK(contains(log, "'hw-sleeper'"));
  CHECK(contains(log, "), the scope's thread:"));
  // The dump comes before the worker's end, in its log and in the events.
  CHECK(log.find("elastic watchdog: scope") < log.find("killed by SIGKILL (the watchdog"));
  REQUIRE(first_event(events, "watchdog_stack") != std::string::npos);
  CHECK(first_event(events, "watchdog_stack") < first_event(events, "watchdog_kill"));
  const auto stacks = events_named(events, "watchdog_stack");
  REQUIRE(stacks.size() == 1);
  const json& e = stacks[0];
  CHECK(e.at("scope").as_string() == "hung-step");
  CHECK(e.at("target_rank").as_int64() == 0);
  CHECK(e.at("threads").as_int64() == 2);
  CHECK(e.at("late_ms").as_double() >= 0);
  CHECK(e.at("capture_ms").as_double() >= 0);
  CHECK(contains(e.at("text").as_string(), "elastic watchdog: scope 'hung-step'"));
  // And on the console, as the rank's own lines are.
  bool on_console = false;
  for (const auto& l : run.console) on_console = on_console || contains(l, "[rank 0] elastic watchdog: scope 'hung-step'");
  CHECK(on_console);
#if ELASTIC_WITH_LIBDW
  CHECK(e.at("complete").as_bool());
  CHECK(e.at("symbols").as_bool());
  CHECK(e.at("reason").is_null());
  CHECK(contains(log, " in elastic_test::stuck_in_known_function(int) at "));
  CHECK(contains(log, "hung_worker.cpp:"));
  CHECK(any_contains(functions(e), "elastic_test::stuck_in_known_function(int)"));
  CHECK(any_contains(functions(e, "hw-sleeper"), "pthread_cond_wait"));
#else
  CHECK_FALSE(e.at("symbols").as_bool());
  CHECK(contains(log, "no symbols: this watchdog was built without libdw"));
  CHECK(contains(log, "elastic_hung_worker+0x"));
#endif
}

TEST_CASE("the dump of a worker of 1600 threads folds threads by stack, stays bounded and says what it leaves out") {
  launched_run run(ELASTIC_RUN_TOOL, "stack-crowd",
                   {"--nproc-per-node", "1", "--max-restarts", "0", "--step-timeout", "0.5", "--stack-dump-limit", "20"},
                   {hung_worker, "crowd", "1600"});
  CHECK(run.finish(120s) == 1);
  const std::string events = run.events();
  const std::string log = run.log(0);
  CHECK(contains(log, "killed by SIGKILL (the watchdog"));
  std::string line;  // the watchdog_stack event as written
  for (std::size_t at = first_event(events, "watchdog_stack"); at != std::string::npos;) {
    const std::size_t begin = events.rfind('\n', at);
    line = events.substr(begin == std::string::npos ? 0 : begin + 1, events.find('\n', at) - (begin == std::string::npos ? 0 : begin + 1));
    break;
  }
  REQUIRE_FALSE(line.empty());
  CHECK(line.size() < 256 * 1024);  // unbounded, it was megabytes
  CHECK(log.size() < 256 * 1024);
  const json e = json::parse(line);
  CHECK(e.at("threads").as_int64() == 1602);  // main, hw-sleeper, the crowd (40 stacks of 40 threads)
  const std::string text = e.at("text").as_string();
  INFO(text.substr(text.size() > 3000 ? text.size() - 3000 : 0));
  CHECK(text.size() <= 66 * 1024);
  CHECK(contains(text, "), the scope's thread:"));
  CHECK(contains(text, " threads with this stack: tids "));
  CHECK(contains(text, " more; the first 'crowd' (state S"));
  CHECK(contains(text, " threads not shown ("));
  CHECK(contains(log, " threads not shown ("));
  CHECK(e.at("threads_not_shown").as_int64() > 0);
  // Folded: one entry per stack, each with its count, the scope's thread first and alone.
  const auto& entries = e.at("stacks").elements();
  REQUIRE_FALSE(entries.empty());
  CHECK(entries.front().at("scope_thread").as_bool());
  CHECK(entries.front().at("count").as_int64() == 1);
  std::int64_t shown = 0;
  for (const json& t : entries) shown += t.at("count").as_int64();
  CHECK(shown + e.at("threads_not_shown").as_int64() == 1602);
  CHECK(entries.size() < 42);
  CHECK(entries.at(1).at("count").as_int64() > 1);
}

TEST_CASE("a worker in its own mount namespace, run from a path that names another program outside it, gets its own functions named or marked unverified") {
  // The decoy: another program, at a path that the worker's namespace binds the hung worker over.
  elastic::test::temp_dir dir;
  const std::string decoy = dir.file("trainer");
  REQUIRE(std::system(("cp '" + std::string(ELASTIC_NO_PTRACE) + "' '" + decoy + "'").c_str()) == 0);
  launched_run run(ELASTIC_RUN_TOOL, "stack-mntns", {"--nproc-per-node", "1", "--max-restarts", "0", "--step-timeout", "0.3"},
                   {hung_worker, "nsexec", decoy, "spin"});
  const int code = run.finish();
  const std::string log = run.log(0);
  INFO(log);
  if (contains(log, "no mount namespace") || contains(log, "cannot bind over the decoy")) {
    elastic::test::skip_test("this process may not make a mount namespace (unshare(CLONE_NEWNS) needs root)");
  }
  CHECK(code == 1);
  const auto stacks = events_named(run.events(), "watchdog_stack");
  REQUIRE(stacks.size() == 1);
  const json& e = stacks[0];
  const std::string text = e.at("text").as_string();
#if ELASTIC_WITH_LIBDW
  // Named from the file the process maps, not from the decoy at the same path out here; what
  // cannot be checked says so, and then the dump is not complete.
  const bool named = any_contains(functions(e), "elastic_test::stuck_in_known_function(int)");
  const bool unverified = contains(text, "[unverified]");
  CHECK((named || unverified));
  if (unverified) CHECK_FALSE(e.at("complete").as_bool());
  CHECK(named);  // as root, /proc/PID/map_files or /proc/PID/root reach the mapped file
  CHECK(e.at("complete").as_bool() != unverified);
#else
  CHECK_FALSE(e.at("symbols").as_bool());  // frame #0 as MODULE+OFFSET: nothing read from the decoy
#endif
}

TEST_CASE("a watchdog that can reach a worker's executable only by its path, where another build now lies, names nothing from it and says the dump is incomplete") {
  // Without CAP_SYS_ADMIN (and CAP_CHECKPOINT_RESTORE) the watchdog cannot open
  // /proc/PID/map_files: it reads /proc/PID/root/PATH, and the worker's namespace has bound
  // another program over that path since it was mapped.
  if (::geteuid() != 0) elastic::test::skip_test("needs root: a mount namespace, and a watchdog that may trace what it did not start");
  elastic::test::temp_dir dir;
  const std::string name = elastic::test::unique_name("wd-nsbind");
  const std::string events = dir.file("events.jsonl");
  auto wd = child_process::spawn({"/usr/bin/setpriv", "--bounding-set", "-sys_admin,-checkpoint_restore", ELASTIC_WATCHDOG_TOOL,
                                  "--name", name, "--events", events});
  const auto serving = wd.read_line();
  if (!serving || serving->rfind("elastic-watchdog: serving", 0) != 0) {
    elastic::test::skip_test("cannot start a watchdog without CAP_SYS_ADMIN (setpriv --bounding-set)");
  }
  auto w = child_process::spawn({hung_worker, "nsbind", ELASTIC_NO_PTRACE, "spin", "300"}, {{"ELASTIC_WATCHDOG", name}});
  const auto first = w.read_line();
  if (first && contains(*first, "mount namespace")) elastic::test::skip_test("this process may not make a mount namespace");
  REQUIRE(first == "entered");
  CHECK(w.killed_by(SIGKILL, 20s));
  const auto stacks = elastic::test::wait_for_events(events, "watchdog_stack", 1, 10s);
  REQUIRE(stacks.size() == 1);
  const json e = json::parse(stacks[0]);
  const std::string text = e.at("text").as_string();
  INFO(text);
#if ELASTIC_WITH_LIBDW
  CHECK_FALSE(e.at("complete").as_bool());
  CHECK(contains(e.at("reason").as_string(), "is another build (build id "));
  CHECK(contains(text, "[unverified]"));
  // The spinning frame is not named from the other program: unnamed, and marked.
  bool marked = false;
  for (const json& t : e.at("stacks").elements()) {
    if (!t.at("scope_thread").as_bool()) continue;
    const json& f0 = t.at("frames").at(0);
    CHECK(f0.at("function").is_null());
    marked = f0.at("unverified").as_bool();
  }
  CHECK(marked);
#endif
  wd.kill(SIGTERM);
  CHECK(wd.exit_code(10s) == 0);
}

TEST_CASE("four workers hung at once each get their own dump in their own rank log") {
  launched_run run(ELASTIC_RUN_TOOL, "stack-four",
                   {"--nproc-per-node", "4", "--max-restarts", "0", "--step-timeout", "0.3"}, {hung_worker, "spin"});
  CHECK(run.finish() == 1);
  const std::string events = run.events();
  const auto stacks = events_named(events, "watchdog_stack");
  CHECK(stacks.size() >= 1);
  for (const json& e : stacks) {
    // Every dump taken goes into the log of the rank it was taken of, none to elastic-run's stderr.
    const auto rank = static_cast<int>(e.at("target_rank").as_int64());
    REQUIRE(rank >= 0);
    REQUIRE(rank < 4);
    const std::string header = "elastic watchdog: scope 'hung-step' of pid " + std::to_string(e.at("target_pid").as_int64()) +
                               " (rank " + std::to_string(rank) + ")";
    INFO(header);
    CHECK(contains(run.log(rank), header));
    CHECK_FALSE(contains(run.err(), header));
  }
  CHECK_FALSE(contains(run.err(), "elastic watchdog: scope"));
  // Each rank the watchdog killed has its dump, and its own only.
  for (const json& k : events_named(events, "watchdog_kill")) {
    const auto rank = static_cast<int>(k.at("target_rank").as_int64());
    const std::string log = run.log(rank);
    INFO("rank " << rank << ":\n" << log);
    CHECK(contains(log, "of pid " + std::to_string(k.at("target_pid").as_int64()) + " (rank " + std::to_string(rank) + ")"));
    for (int other = 0; other < 4; ++other) {
      if (other != rank) CHECK_FALSE(contains(log, "(rank " + std::to_string(other) + ") expired"));
    }
  }
}

TEST_CASE("a worker that forges a scope in elastic-run's name gets elastic-run no signal, and the refusal is logged") {
  launched_run run(ELASTIC_RUN_TOOL, "stack-forge-host", {"--nproc-per-node", "1", "--max-restarts", "0"},
                   {hung_worker, "forge", "parent"});
  CHECK(run.finish() == 0);  // the forger saw its slot freed and exited 0; elastic-run lived to report it
  const std::string events = run.events();
  const std::string log = run.log(0);
  INFO(log);
  CHECK(contains(log, "forged " + std::to_string(run.proc.pid())));
  CHECK(contains(log, "freed"));
  const auto refused = events_named(events, "watchdog_refused");
  REQUIRE(refused.size() == 1);
  CHECK(refused[0].at("target_pid").as_int64() == run.proc.pid());
  CHECK(contains(refused[0].at("reason").as_string(), "the watchdog's own process"));
  CHECK(events_named(events, "watchdog_kill").empty());
  CHECK(events_named(events, "watchdog_stack").empty());
}

TEST_CASE("a worker that forges a scope in the name of a process elastic-run did not start gets that process no signal") {
  launched_run run(ELASTIC_RUN_TOOL, "stack-forge-other", {"--nproc-per-node", "1", "--max-restarts", "0"},
                   {hung_worker, "forge", run_target_file()});
  // The innocent maps elastic-run's segment too (any process of the user can), but elastic-run
  // did not start it.
  bool forger_attached = false;
  for (int i = 0; i < 100 && !forger_attached; ++i) {
    if (auto l = run.proc.read_line(100ms)) {
      run.console.push_back(*l);
      forger_attached = contains(*l, "attached");
    }
  }
  REQUIRE(forger_attached);
  auto innocent = child_process::spawn({hung_worker, "attach"},
                                       {{"ELASTIC_WATCHDOG", "elastic-" + run.run + "-" + std::to_string(run.proc.pid())}});
  const auto said = innocent.read_line();
  REQUIRE(said == "attached " + std::to_string(innocent.pid()));
  {
    std::ofstream out(run_target_file());
    out << innocent.pid() << "\n";
  }
  CHECK(run.finish() == 0);
  const std::string events = run.events();
  INFO(run.log(0));
  CHECK(contains(run.log(0), "forged " + std::to_string(innocent.pid())));
  CHECK_FALSE(innocent.wait_for(0ms).has_value());  // alive
  const auto refused = events_named(events, "watchdog_refused");
  REQUIRE(refused.size() == 1);
  CHECK(refused[0].at("target_pid").as_int64() == innocent.pid());
  CHECK(contains(refused[0].at("reason").as_string(), "not a process elastic-run started"));
  CHECK(events_named(events, "watchdog_kill").empty());
  innocent.kill(SIGKILL);
}

TEST_CASE("a standalone watchdog refuses a scope forged in its own name or its parent's") {
  elastic::test::temp_dir dir;
  const std::string name = elastic::test::unique_name("wd-forge-self");
  const std::string events = dir.file("events.jsonl");
  auto wd = child_process::spawn({ELASTIC_WATCHDOG_TOOL, "--name", name, "--events", events});
  REQUIRE(wd.read_line().value_or("").rfind("elastic-watchdog: serving", 0) == 0);
  const std::string target = dir.file("target");
  auto forger = child_process::spawn({hung_worker, "forge", target}, {{"ELASTIC_WATCHDOG", name}});
  REQUIRE(forger.read_line() == "attached");
  {
    std::ofstream out(target);
    out << wd.pid() << "\n";
  }
  CHECK(forger.read_line(40s) == "forged " + std::to_string(wd.pid()));
  CHECK(forger.read_line(40s) == "freed");
  CHECK(forger.exit_code(10s) == 0);
  const auto refused = elastic::test::wait_for_events(events, "watchdog_refused", 1, 5s);
  REQUIRE(refused.size() == 1);
  CHECK(contains(refused[0], "the watchdog's own process"));
  wd.kill(SIGTERM);
  CHECK(wd.exit_code(10s) == 0);  // alive until then, and stopped by our SIGTERM
}

TEST_CASE("a worker deadlocked inside malloc, where nothing in it could print, gets its stacks dumped and is killed") {
  auto run = run_hung("stack-malloc", "malloc");
  CHECK(run.finish() == 1);
  const std::string log = run.log(0);
  INFO(log);
  CHECK(contains(log, "entered"));
  CHECK_FALSE(contains(log, "not deadlocked"));
  CHECK(contains(log, "killed by SIGKILL (the watchdog"));
  REQUIRE(contains(log, "elastic watchdog: scope 'hung-step' of pid "));
  CHECK(contains(log, "'malloc-stats'"));
  const auto stacks = events_named(run.events(), "watchdog_stack");
  REQUIRE(stacks.size() == 1);
#if ELASTIC_WITH_LIBDW
  CHECK(stacks[0].at("complete").as_bool());
  // The thread inside malloc_stats, holding the arena lock, waits for the step's lock in the
  // print it makes; the main thread waits for the arena lock in malloc.
  const auto stats = functions(stacks[0], "malloc-stats");
  CHECK(any_contains(stats, "malloc_stats"));
  CHECK(any_contains(stats, "cookie_write"));
  CHECK(any_contains(functions(stacks[0]), "blocked_on_the_arena_lock"));
  CHECK(contains(log, "blocked_on_the_arena_lock() at "));
#endif
}

TEST_CASE("a worker that another tracer holds is still killed, and its dump says why it has no stacks") {
  auto run = run_hung("stack-traced", "traced");
  CHECK(run.finish() == 1);
  const std::string log = run.log(0);
  INFO(log);
  CHECK(contains(log, "traced"));
  CHECK(contains(log, "killed by SIGKILL (the watchdog"));
  CHECK(contains(log, "dump incomplete: pid "));
  CHECK(contains(log, " is already traced by pid "));
  CHECK(contains(log, "'hw-sleeper'"));  // what /proc says without ptrace
  const auto stacks = events_named(run.events(), "watchdog_stack");
  REQUIRE(stacks.size() == 1);
  CHECK_FALSE(stacks[0].at("complete").as_bool());
  CHECK(contains(stacks[0].at("reason").as_string(), "already traced by pid"));
  CHECK(stacks[0].at("threads").as_int64() == 2);
}

TEST_CASE("a stack dump cut short by its limit still ends in the kill, and says it is incomplete") {
  auto run = run_hung("stack-bound", "spin", {"--stack-dump-limit", "0.001"});
  CHECK(run.finish() == 1);
  const std::string log = run.log(0);
  const std::string events = run.events();
  INFO(log);
  CHECK(contains(log, "killed by SIGKILL (the watchdog"));
  CHECK(contains(log, "dump incomplete: "));
  const auto stacks = events_named(events, "watchdog_stack");
  REQUIRE(stacks.size() == 1);
  CHECK_FALSE(stacks[0].at("complete").as_bool());
  CHECK(stacks[0].at("reason").is_string());
  CHECK(first_event(events, "watchdog_stack") < first_event(events, "watchdog_kill"));
}

TEST_CASE("elastic-run --no-stack-dump kills a hung worker without a dump") {
  auto run = run_hung("stack-off", "spin", {"--no-stack-dump"});
  CHECK(run.finish() == 1);
  const std::string log = run.log(0);
  const std::string events = run.events();
  INFO(log);
  CHECK(contains(log, "killed by SIGKILL (the watchdog"));
  CHECK_FALSE(contains(log, "elastic watchdog: scope"));
  CHECK(first_event(events, "watchdog_stack") == std::string::npos);
  CHECK(first_event(events, "watchdog_kill") != std::string::npos);
}

TEST_CASE("a standalone watchdog that may not trace still kills, and its dump says why it has no stacks") {
  elastic::test::temp_dir dir;
  const std::string name = elastic::test::unique_name("wd-noptrace");
  const std::string events = dir.file("events.jsonl");
  // Under ASan, LeakSanitizer's check at exit stops the process's threads with ptrace, which the
  // filter refuses ("LeakSanitizer has encountered a fatal error", exit 1): off for this one
  // process, whose leaks the other tests of the watchdog still check.
  const char* asan = std::getenv("ASAN_OPTIONS");
  const std::string no_leak_check = std::string(asan != nullptr ? asan : "") + (asan != nullptr ? ":" : "") + "detect_leaks=0";
  auto wd = child_process::spawn({ELASTIC_NO_PTRACE, ELASTIC_WATCHDOG_TOOL, "--name", name, "--events", events},
                                 {{"ASAN_OPTIONS", no_leak_check}});
  REQUIRE(wd.read_line().value_or("").rfind("elastic-watchdog: serving", 0) == 0);
  auto w = child_process::spawn({hung_worker, "spin", "300"}, {{"ELASTIC_WATCHDOG", name}, {"ELASTIC_RANK", "5"}});
  REQUIRE(w.read_line() == "entered");
  CHECK(w.killed_by(SIGKILL, 20s));
  const auto text = wd.read_line(10s);  // the dump's first line, on the watchdog's stdout
  REQUIRE(text);
  CHECK(contains(*text, "elastic watchdog: scope 'hung-step' of pid " + std::to_string(w.pid()) + " (rank 5)"));
  const auto second = wd.read_line(5s);
  REQUIRE(second);
  CHECK(contains(*second, "dump incomplete: not permitted to trace pid " + std::to_string(w.pid()) + " (EPERM)"));
  CHECK(contains(*second, "seccomp"));
  const auto stacks = elastic::test::wait_for_events(events, "watchdog_stack", 1, 5s);
  REQUIRE(stacks.size() == 1);
  const json e = json::parse(stacks[0]);
  CHECK_FALSE(e.at("complete").as_bool());
  CHECK(contains(e.at("reason").as_string(), "not permitted to trace"));
  CHECK(contains(e.at("text").as_string(), "'hw-sleeper'"));
  CHECK(elastic::test::wait_for_events(events, "watchdog_kill", 1, 5s).size() == 1);
  wd.kill(SIGTERM);
  CHECK(wd.exit_code(10s) == 0);
}

TEST_CASE("a standalone watchdog allowed to trace prints the hung worker's stacks on its stdout") {
  if (::geteuid() != 0 && elastic::timer::detail::read_proc_text("/proc/sys/kernel/yama/ptrace_scope") >= "1") {
    elastic::test::skip_test("kernel.yama.ptrace_scope lets only a privileged watchdog trace what it did not start");
  }
  elastic::test::temp_dir dir;
  const std::string name = elastic::test::unique_name("wd-stack");
  const std::string events = dir.file("events.jsonl");
  auto wd = child_process::spawn({ELASTIC_WATCHDOG_TOOL, "--name", name, "--events", events});
  REQUIRE(wd.read_line().value_or("").rfind("elastic-watchdog: serving", 0) == 0);
  auto w = child_process::spawn({hung_worker, "spin", "300"}, {{"ELASTIC_WATCHDOG", name}});
  REQUIRE(w.read_line() == "entered");
  CHECK(w.killed_by(SIGKILL, 20s));
  std::string printed;
  while (auto line = wd.read_line(2s)) printed += *line + "\n";
  INFO(printed);
  CHECK(contains(printed, "elastic watchdog: scope 'hung-step' of pid " + std::to_string(w.pid()) + " (no rank)"));
  CHECK(contains(printed, "'hw-sleeper'"));
#if ELASTIC_WITH_LIBDW
  CHECK(contains(printed, "elastic_test::stuck_in_known_function(int)"));
#endif
  wd.kill(SIGTERM);
  CHECK(wd.exit_code(10s) == 0);
}

TEST_CASE("a host told of stack dumps gets each before the kill of its process") {
  std::mutex mu;
  std::vector<std::string> told;  // "stack" / "kill", in order
  elastic::timer::stack_dump seen;
  elastic::timer::watchdog_options o;
  o.stack_dump = true;
  o.on_stack = [&](const elastic::timer::stack_dump& d) {
    std::lock_guard lk(mu);
    told.emplace_back("stack");
    seen = d;
  };
  o.on_kill = [&](const elastic::timer::watchdog_kill_report&) {
    std::lock_guard lk(mu);
    told.emplace_back("kill");
  };
  elastic::test::hosted h(o);
  auto w = child_process::spawn({hung_worker, "spin", "200"}, {{"ELASTIC_WATCHDOG", h.name}, {"ELASTIC_RANK", "2"}});
  REQUIRE(w.read_line() == "entered");
  // The capture traces from this process: wait as a host must, skipping the stops it reports.
  REQUIRE(exited_skipping_stops(w.pid(), 20s));
  CHECK(w.killed_by(SIGKILL, 1s));
  std::lock_guard lk(mu);
  REQUIRE(told == std::vector<std::string>{"stack", "kill"});
  CHECK(seen.pid == w.pid());
  CHECK(seen.rank == 2);
  CHECK(seen.scope == "hung-step");
  CHECK(seen.threads.size() == 2);
#if ELASTIC_WITH_LIBDW
  CHECK(seen.complete);
  CHECK(contains(elastic::timer::to_text(seen), "stuck_in_known_function"));
#endif
}

TEST_CASE("a process that leaves its expired scope while its stacks are captured is not signalled, and its dump is logged") {
  elastic::timer::watchdog_options o;
  o.start_thread = false;  // the test scans: before the scope is left, and after
  o.stack_dump = true;
  o.stack_dump_limit = 1s;
  elastic::test::hosted h(o);
  auto w = child_process::spawn({hung_worker, "leave", "50"}, {{"ELASTIC_WATCHDOG", h.name}});
  REQUIRE(w.read_line() == "entered");
  std::this_thread::sleep_for(100ms);
  CHECK(h.wd.scan_once().signals_sent == 0);  // expired: the capture starts, the signal waits
  // Its signal may reach it while it is stopped: the capture gives it back when it lets it go.
  w.kill(SIGUSR1);
  REQUIRE(w.read_line() == "left");
  std::this_thread::sleep_for(1200ms);  // past the bound, whatever the capture did
  CHECK(h.wd.scan_once().signals_sent == 0);
  const auto stacks = elastic::test::wait_for_events(h.events, "watchdog_stack", 1, 5s);
  REQUIRE(stacks.size() == 1);
  CHECK(contains(stacks[0], "\"scope\":\"hung-step\""));
  CHECK(h.wd.stats().signals == 0);
  CHECK(elastic::test::events_named(h.events, "watchdog_kill").empty());
  CHECK_FALSE(w.wait_for(0ms).has_value());  // alive
}

TEST_CASE("a watchdog refuses a stack dump limit outside 1 ms to 60 s") {
  for (auto limit : {0ms, 60001ms}) {
    elastic::timer::watchdog_options o;
    o.name = elastic::test::unique_name("wd-limit");
    o.stack_dump_limit = limit;
    CHECK_THROWS_AS(elastic::timer::watchdog(o), elastic::error);
  }
}

TEST_CASE("elastic-run's --no-stack-dump and --stack-dump-limit reach its options, and a bad limit is refused") {
  using elastic::agent::parse_command_line;
  const std::vector<std::string_view> plain{"--", "true"};
  CHECK(parse_command_line(plain).options.stack_dump);
  CHECK(parse_command_line(plain).options.stack_dump_limit == 2000ms);
  const std::vector<std::string_view> off{"--no-stack-dump", "--stack-dump-limit", "0.5", "--", "true"};
  CHECK_FALSE(parse_command_line(off).options.stack_dump);
  CHECK(parse_command_line(off).options.stack_dump_limit == 500ms);
  for (std::string_view bad : {"0", "61", "soon"}) {
    const std::vector<std::string_view> args{"--stack-dump-limit", bad, "--", "true"};
    CHECK_THROWS_AS(parse_command_line(args), elastic::error);
  }
}

TEST_CASE("a stack dump reads as gdb-like text and as JSON") {
  elastic::timer::stack_dump d;
  d.pid = 1234;
  d.rank = 2;
  d.scope = "step";
  d.late = 3100us;
  d.capture_time = 41ms;
  d.complete = false;
  d.symbols = true;
  d.reason = "1 of 2 threads did not stop within 1000 ms";
  elastic::timer::thread_stack main_thread;
  main_thread.tid = 1234;
  main_thread.name = "train";
  main_thread.state = 'R';
  main_thread.scope_thread = true;
  elastic::timer::stack_frame f0;
  f0.pc = 0x55d0c0de1234;
  f0.function = "hang_here(int)";
  f0.file = "/src/train.cpp";
  f0.line = 42;
  f0.module = "/src/build/train";
  f0.offset = 0x1234;
  elastic::timer::stack_frame f1;
  f1.pc = 0x7f1200029d90;
  f1.module = "/usr/lib/libc.so.6";
  f1.offset = 0x29d90;
  main_thread.frames = {f0, f1};
  elastic::timer::thread_stack stuck;
  stuck.tid = 1236;
  stuck.name = "loader \"io\"";
  stuck.state = 'D';
  stuck.wchan = "nfs_wait";
  stuck.note = "it did not stop within 1000 ms";
  d.threads = {main_thread, stuck};

  const std::string text = elastic::timer::to_text(d);
  CHECK(text ==
        "elastic watchdog: scope 'step' of pid 1234 (rank 2) expired 3.1 ms ago; 2 threads, captured in 41 ms\n"
        "dump incomplete: 1 of 2 threads did not stop within 1000 ms\n"
        "thread 1234 'train' (state R), the scope's thread:\n"
        "  #0  0x000055d0c0de1234 in hang_here(int) at /src/train.cpp:42\n"
        "  #1  0x00007f1200029d90 in ?? from /usr/lib/libc.so.6+0x29d90\n"
        "thread 1236 'loader \"io\"' (state D, in nfs_wait):\n"
        "  (it did not stop within 1000 ms)\n");

  const json j = json::parse(elastic::timer::to_json(d));
  REQUIRE(j.size() == 2);
  CHECK(j.at(0).at("tid").as_int64() == 1234);
  CHECK(j.at(0).at("scope_thread").as_bool());
  CHECK(j.at(0).at("frames").at(0).at("pc").as_string() == "0x55d0c0de1234");
  CHECK(j.at(0).at("frames").at(0).at("function").as_string() == "hang_here(int)");
  CHECK(j.at(0).at("frames").at(0).at("line").as_int64() == 42);
  CHECK(j.at(0).at("frames").at(1).at("function").is_null());
  CHECK(j.at(0).at("frames").at(1).at("offset").as_string() == "0x29d90");
  CHECK(j.at(1).at("name").as_string() == "loader \"io\"");
  CHECK(j.at(1).at("wchan").as_string() == "nfs_wait");
  CHECK(j.at(1).at("frames").size() == 0);

  // In an event, "stacks" is that JSON as it is, not a string.
  const elastic::event_log log(std::make_shared<elastic::events::fd_sink>(-1));
  const std::string stacks = elastic::timer::to_json(d);
  const json line = json::parse(log.format("watchdog_stack", {{"text", text}, {"stacks", elastic::event_value::json(stacks)}}));
  CHECK(line.at("text").as_string() == text);
  CHECK(line.at("stacks") == j);
}
