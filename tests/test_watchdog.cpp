// The watchdog against real worker processes: who gets which signal, when, and what is logged.
#include <signal.h>
#include <sys/stat.h>
#include <time.h>

#include <chrono>
#include <filesystem>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include <elastic/timer/watchdog.hpp>

#include "support/catch.hpp"
#include "support/hosted_watchdog.hpp"
#include "support/other_user.hpp"
#include "support/planted_shm.hpp"
#include "support/process.hpp"

using namespace std::chrono_literals;
using elastic::test::child_process;
using elastic::test::hosted;

namespace {

std::string shm_path(const std::string& name) { return "/dev/shm/" + elastic::timer::detail::shm_object_name(name); }

/// What a run of elastic-watchdog that is expected to end on its own left behind.
struct tool_run {
  std::optional<int> status;  ///< wait status; nullopt when it did not end in time (it is killed)
  std::string output;         ///< stdout and stderr together
  [[nodiscard]] std::optional<int> exit_code() const {
    if (!status || !WIFEXITED(*status)) return std::nullopt;
    return WEXITSTATUS(*status);
  }
};

/// Runs elastic-watchdog ARGS (as `uid`/`gid` unless -1) with `env` added, and waits a bounded
/// time for it to end.
tool_run run_tool(std::vector<std::string> args, std::vector<std::pair<std::string, std::string>> env = {},
                  uid_t uid = static_cast<uid_t>(-1), gid_t gid = static_cast<gid_t>(-1)) {
  std::vector<std::string> argv{"/bin/sh", "-c", "exec \"$0\" \"$@\" 2>&1", ELASTIC_WATCHDOG_TOOL};
  argv.insert(argv.end(), args.begin(), args.end());
  auto p = child_process::spawn_as(uid, gid, argv, env);
  tool_run r;
  while (auto line = p.read_line(10s)) r.output += *line + "\n";
  r.status = p.wait_for(10s);
  return r;
}

/// Checks that a run ended with exit code 2 and a message containing `text`, not through
/// std::terminate, and left no segment `name` behind.
void expect_usage_exit(const tool_run& r, const std::string& text, const std::string& name) {
  INFO(r.output);
  CHECK(r.exit_code() == 2);
  CHECK(r.output.find(text) != std::string::npos);
  CHECK(r.output.find("terminate") == std::string::npos);
  CHECK_FALSE(std::filesystem::exists(shm_path(name)));
}

/// Waits (bounded) until `path` is at least `age` old by its ctime, as sweep_stale_shm counts.
void wait_until_older(const std::string& path, std::chrono::seconds age) {
  for (int i = 0; i < 200; ++i) {
    struct stat st {};
    timespec now{};
    ::clock_gettime(CLOCK_REALTIME, &now);
    if (::stat(path.c_str(), &st) != 0 || now.tv_sec - st.st_ctim.tv_sec >= age.count()) return;
    std::this_thread::sleep_for(50ms);
  }
}

}  // namespace


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

TEST_CASE("whoever hosts the watchdog is told of each kill on the watchdog's thread") {
  std::mutex mu;
  std::vector<std::tuple<pid_t, int, std::string, int, double>> seen;  // pid, rank, scope, signal, limit ms
  elastic::timer::watchdog_options o;
  o.on_kill = [&](const elastic::timer::watchdog_kill_report& r) {
    std::lock_guard lk(mu);
    seen.emplace_back(r.pid, r.rank, std::string(r.scope), r.signal,
                      std::chrono::duration<double, std::milli>(r.limit).count());
    throw std::runtime_error("a callback that throws does not stop the watchdog");
  };
  hosted h(o);
  auto w = h.worker("hang", {"200"}, {{"ELASTIC_RANK", "3"}});
  REQUIRE(w.read_line() == "entered");
  REQUIRE(w.killed_by(SIGKILL, 10s));
  std::lock_guard lk(mu);
  REQUIRE(seen.size() == 1);
  CHECK(std::get<0>(seen[0]) == w.pid());
  CHECK(std::get<1>(seen[0]) == 3);
  CHECK(std::get<2>(seen[0]) == "hung-step");
  CHECK(std::get<3>(seen[0]) == SIGKILL);
  CHECK(std::get<4>(seen[0]) > 199.0);
  CHECK(std::get<4>(seen[0]) < 201.0);
  CHECK(h.wd.stats().signals == 1);
}

TEST_CASE("a scope with a warning is warned of once at its first expiry and killed only at its second") {
  std::mutex mu;
  std::vector<std::pair<pid_t, double>> warned;  // pid, held ms when told
  elastic::timer::watchdog_options o;
  o.on_warning = [&](const elastic::timer::watchdog_warning_report& r) {
    std::lock_guard lk(mu);
    warned.emplace_back(r.pid, std::chrono::duration<double, std::milli>(r.held).count());
  };
  hosted h(o);
  auto w = h.worker("warned", {"150", "1500"}, {{"ELASTIC_RANK", "2"}});
  REQUIRE(w.read_line() == "entered");
  const auto warnings = elastic::test::wait_for_events(h.events, "watchdog_warning", 1, 5s);
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0].find("\"target_pid\":" + std::to_string(w.pid())) != std::string::npos);
  CHECK(warnings[0].find("\"scope\":\"warned-step\"") != std::string::npos);
  CHECK(warnings[0].find("\"target_rank\":2") != std::string::npos);
  CHECK(warnings[0].find("\"limit_ms\":1500") != std::string::npos);
  CHECK(elastic::test::events_named(h.events, "watchdog_kill").empty());  // warned, not signalled
  CHECK(::kill(w.pid(), 0) == 0);
  REQUIRE(w.killed_by(SIGKILL, 10s));
  const auto kills = elastic::test::wait_for_events(h.events, "watchdog_kill", 1, 5s);
  REQUIRE(kills.size() == 1);
  CHECK(kills[0].find("\"limit_ms\":1500") != std::string::npos);
  CHECK(elastic::test::events_named(h.events, "watchdog_warning").size() == 1);  // once
  std::lock_guard lk(mu);
  REQUIRE(warned.size() == 1);
  CHECK(warned[0].first == w.pid());
  CHECK(warned[0].second >= 150.0);
  CHECK(h.wd.stats().warnings == 1);
}

TEST_CASE("extending a scope with a warning moves its warning as far as its deadline") {
  hosted h;
  // Warned at 300 ms, killed at 3 s; extended at 100 ms to 5 s from then: warned at ~2.4 s.
  auto w = h.worker("warned", {"300", "3000", "100", "5000"});
  REQUIRE(w.read_line() == "entered");
  REQUIRE(w.read_line() == "extended");
  std::this_thread::sleep_for(1s);
  CHECK(elastic::test::events_named(h.events, "watchdog_warning").empty());
  const auto warnings = elastic::test::wait_for_events(h.events, "watchdog_warning", 1, 10s);
  REQUIRE(warnings.size() == 1);
  CHECK(elastic::test::events_named(h.events, "watchdog_kill").empty());
  REQUIRE(w.killed_by(SIGKILL, 15s));
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

TEST_CASE("a FIFO, socket or device planted under the segments' prefix does not stop elastic-watchdog") {
  if (std::string(ELASTIC_WATCHDOG_TOOL).empty()) return;
  for (const auto kind : elastic::test::plantable_kinds()) {
    const std::string what = elastic::test::planted_words(kind);
    INFO(what);
    // Another segment's name, which the watchdog's start-up sweep looks at.
    const elastic::test::planted_shm planted("elastic-timer." + elastic::test::unique_name("planted"), kind);
    const std::string name = elastic::test::unique_name("beside-planted");
    auto wd = child_process::spawn({"/bin/sh", "-c", "exec \"$0\" \"$@\" 2>&1", ELASTIC_WATCHDOG_TOOL, "--name", name});
    std::string output;
    // Today's watchdog waits forever in the sweep's open of the FIFO: a bounded wait instead.
    while (auto line = wd.read_line(10s)) {
      output += *line + "\n";
      if (line->find("serving '" + name + "'") != std::string::npos) break;
    }
    INFO(output);
    CHECK(output.find("serving '" + name + "'") != std::string::npos);
    CHECK(output.find(planted.path() + " is " + what) != std::string::npos);
    wd.kill(SIGTERM);
    CHECK(wd.exit_code(10s) == 0);
    CHECK(planted.intact());
    CHECK_FALSE(std::filesystem::exists("/dev/shm/elastic-timer." + name));
  }
}

TEST_CASE("elastic-watchdog refuses bad arguments with usage and exit code 2") {
  const std::string tool = ELASTIC_WATCHDOG_TOOL;
  if (tool.empty()) return;
  CHECK(child_process::spawn({tool, "--name", "bad/name"}).exit_code(10s) == 2);
  CHECK(child_process::spawn({tool, "--poll", "soon", "--name", "x"}).exit_code(10s) == 2);
  CHECK(child_process::spawn({tool, "--bogus"}).exit_code(10s) == 2);
  CHECK(child_process::spawn({tool, "--name", "x", "--signal", "NOPE"}).exit_code(10s) == 2);
  CHECK(child_process::spawn({tool, "--name", "x", "stray"}).exit_code(10s) == 2);
  CHECK(child_process::spawn({tool, "--name", "x", "--keep=yes"}).exit_code(10s) == 2);
  // An empty --events= is refused, naming the flag: it does not take the next argument as the file.
  const std::string name = elastic::test::unique_name("emptyval");
  expect_usage_exit(run_tool({"--events=", "--name", name}), "--events needs a value, got an empty one", name);
  expect_usage_exit(run_tool({"--name", name, "--poll", "0"}), "--poll: wants a whole number from 1 to 60000, got '0'", name);
}

TEST_CASE("elastic-watchdog --help lists its flags and exit codes, and --version its version") {
  const std::string tool = ELASTIC_WATCHDOG_TOOL;
  if (tool.empty()) return;
  const auto help = run_tool({"--help"});
  CHECK(help.exit_code() == 0);
  for (const char* flag : {"--name", "--events", "--poll", "--capacity", "--signal", "--escalate-after", "--keep",
                           "--version", "Exit status: 0"}) {
    INFO(flag);
    CHECK(help.output.find(flag) != std::string::npos);
  }
  const auto version = run_tool({"--version"});
  CHECK(version.exit_code() == 0);
  CHECK(version.output.rfind("elastic-watchdog ", 0) == 0);
}

TEST_CASE("elastic-watchdog with ELASTIC_EVENTS naming a directory says so and exits 2") {
  if (std::string(ELASTIC_WATCHDOG_TOOL).empty()) return;
  elastic::test::temp_dir dir;
  const std::string name = elastic::test::unique_name("envdir");
  const auto r = run_tool({"--name", name}, {{"ELASTIC_EVENTS", dir.path()}});
  expect_usage_exit(r, "ELASTIC_EVENTS file " + dir.path() + " is a directory", name);
}

TEST_CASE("elastic-watchdog with --events naming a directory says so and exits 2") {
  if (std::string(ELASTIC_WATCHDOG_TOOL).empty()) return;
  elastic::test::temp_dir dir;
  const std::string name = elastic::test::unique_name("argdir");
  const auto r = run_tool({"--name", name, "--events", dir.path()});
  expect_usage_exit(r, "events file " + dir.path() + " is a directory: name a file in it", name);
}

TEST_CASE("elastic-watchdog refuses an events file that is a planted link or a FIFO, and exits 2") {
  if (std::string(ELASTIC_WATCHDOG_TOOL).empty()) return;
  elastic::test::temp_dir dir;
  const std::string name = elastic::test::unique_name("planted");
  const std::string target = dir.file("precious"), link = dir.file("link.jsonl"), fifo = dir.file("fifo.jsonl");
  REQUIRE(::symlink(target.c_str(), link.c_str()) == 0);
  expect_usage_exit(run_tool({"--name", name, "--events", link}), link + ": it is a symbolic link", name);
  CHECK_FALSE(std::filesystem::exists(target));
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  expect_usage_exit(run_tool({"--name", name, "--events", fifo}), fifo + ": it is a FIFO", name);
}

TEST_CASE("elastic-watchdog with an events file it cannot write says so and exits 2") {
  if (std::string(ELASTIC_WATCHDOG_TOOL).empty()) return;
  const auto other = elastic::test::require_other_user();
  elastic::test::temp_dir dir;  // mode 0700, root's: the other user cannot create a file in it
  const std::string name = elastic::test::unique_name("unwritable");
  const std::string events = dir.file("events.jsonl");
  const auto r = run_tool({"--name", name, "--events", events}, {}, other.uid, other.gid);
  expect_usage_exit(r, "cannot open events file " + events + " for appending", name);
}

TEST_CASE("elastic-watchdog with a bad ELASTIC_WATCHDOG name says so and exits 2") {
  if (std::string(ELASTIC_WATCHDOG_TOOL).empty()) return;
  const auto r = run_tool({}, {{"ELASTIC_WATCHDOG", "../etc/passwd"}});
  INFO(r.output);
  CHECK(r.exit_code() == 2);
  CHECK(r.output.find("ELASTIC_WATCHDOG: elastic: watchdog segment name '../etc/passwd'") != std::string::npos);
  CHECK(r.output.find("terminate") == std::string::npos);
}

TEST_CASE("elastic-watchdog removes its segment whichever catchable signal stops it") {
  const std::string tool = ELASTIC_WATCHDOG_TOOL;
  if (tool.empty()) return;
  elastic::test::temp_dir dir;
  const std::string events = dir.file("events.jsonl");
  // Every signal whose default action ends a process and that a process may catch; the fault
  // signals too, as another process sends them with kill().
  for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM, SIGVTALRM, SIGPROF, SIGIO, SIGPWR,
                  SIGSTKFLT, SIGXCPU, SIGXFSZ, SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS, SIGRTMIN,
                  SIGRTMIN + 3, SIGRTMAX}) {
    INFO("signal " << sig << " (" << (::sigabbrev_np(sig) ? ::sigabbrev_np(sig) : "RT") << ")");
    const std::string name = elastic::test::unique_name("sig");
    auto wd = child_process::spawn({tool, "--name", name, "--events", events});
    const auto ready = wd.read_line();
    REQUIRE(ready);
    REQUIRE(ready->find("serving '" + name + "'") != std::string::npos);
    REQUIRE(std::filesystem::exists(shm_path(name)));
    wd.kill(sig);
    CHECK(wd.exit_code(10s) == 0);
    CHECK_FALSE(std::filesystem::exists(shm_path(name)));
  }
}

TEST_CASE("elastic-watchdog is not stopped by SIGPIPE and goes on enforcing deadlines") {
  const std::string tool = ELASTIC_WATCHDOG_TOOL;
  if (tool.empty()) return;
  elastic::test::temp_dir dir;
  const std::string name = elastic::test::unique_name("pipe");
  const std::string events = dir.file("events.jsonl");
  auto wd = child_process::spawn({tool, "--name", name, "--events", events});
  REQUIRE(wd.read_line());
  wd.kill(SIGPIPE);
  auto w = child_process::spawn({ELASTIC_TEST_WORKER, "hang", name, "100"});
  REQUIRE(w.read_line() == "entered");
  CHECK(w.killed_by(SIGKILL, 10s));
  CHECK_FALSE(wd.wait_for(0ms).has_value());
  wd.kill(SIGTERM);
  CHECK(wd.exit_code(10s) == 0);
  CHECK_FALSE(std::filesystem::exists(shm_path(name)));
}

TEST_CASE("a segment whose watchdog and workers are all gone is removed by the next watchdog to start") {
  const std::string tool = ELASTIC_WATCHDOG_TOOL;
  if (tool.empty()) return;
  elastic::test::temp_dir dir;
  const std::string name = elastic::test::unique_name("orphan");
  auto first = child_process::spawn({tool, "--name", name, "--events", dir.file("first.jsonl")});
  REQUIRE(first.read_line());
  auto w = child_process::spawn({ELASTIC_TEST_WORKER, "hang", name, "60000"});
  REQUIRE(w.read_line() == "entered");
  first.kill(SIGKILL);  // no cleanup: the segment stays, adoptable while the worker runs
  REQUIRE(first.killed_by(SIGKILL, 10s));
  w.kill(SIGKILL);
  REQUIRE(w.killed_by(SIGKILL, 10s));
  REQUIRE(std::filesystem::exists(shm_path(name)));
  // The sweep leaves objects younger than 2 s alone: a creator may be about to map one.
  wait_until_older(shm_path(name), 3s);

  hosted h;  // any watchdog of this user, under any name
  // Gone once a watchdog has started. Which one swept it (and so logged watchdog_swept) is not
  // asserted: tests running in parallel start watchdogs and launchers too, and any of them may.
  CHECK_FALSE(std::filesystem::exists(shm_path(name)));
}

TEST_CASE("a segment that a running worker still maps is kept for a new watchdog to adopt") {
  const std::string tool = ELASTIC_WATCHDOG_TOOL;
  if (tool.empty()) return;
  elastic::test::temp_dir dir;
  const std::string name = elastic::test::unique_name("adoptable");
  auto first = child_process::spawn({tool, "--name", name, "--events", dir.file("first.jsonl")});
  REQUIRE(first.read_line());
  auto w = child_process::spawn({ELASTIC_TEST_WORKER, "hang", name, "60000"});
  REQUIRE(w.read_line() == "entered");
  first.kill(SIGKILL);
  REQUIRE(first.killed_by(SIGKILL, 10s));
  wait_until_older(shm_path(name), 3s);

  { hosted h; }  // another watchdog starts (and sweeps) while the worker runs
  REQUIRE(std::filesystem::exists(shm_path(name)));
  elastic::timer::watchdog second({.name = name, .events = elastic::event_log()});
  CHECK(second.adopted());
  CHECK(second.scan_once().live_scopes == 1);
}
