// elastic-run with real worker processes (tests/support/agent_worker.cpp): restarts, used-up
// restarts, preemptions, the SIGTERM grace, logs, orphans, the hosted watchdog, the worker
// environment, bad command lines, and two launchers meeting through one etcd. Then the launcher
// under hostile conditions: planted links and unusable log directories, a closed or undrained
// console, a frozen or dead etcd, a second launcher of the same run, workers that exit 75 on
// their own, every signal a platform may send, wrapped and escaped workers, and /dev/shm after
// a SIGKILLed launcher.
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <elastic/comm/detail/flight_recorder.hpp>
#include <elastic/internal/process.hpp>
#include <elastic/rendezvous/run_keys.hpp>
#include <elastic/rendezvous/shm_store.hpp>

#include "agent/options.hpp"  // tools/agent: the parser, tested as a function too
#include "agent/worker_environment.hpp"
#include "support/catch.hpp"
#include "support/eventually.hpp"
#include "support/other_user.hpp"
#include "support/planted_shm.hpp"
#include "support/process.hpp"
#if defined(ELASTIC_ETCD_SERVER) && defined(ELASTIC_GROUP_WORKER)
#include <elastic/rendezvous/etcd_store.hpp>

#include "support/etcd_server.hpp"
#include "support/fleet.hpp"
#endif

namespace {

using namespace std::chrono_literals;
using elastic::test::child_process;
using elastic::test::eventually;
using elastic::test::temp_dir;

using elastic::test::slurp;

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

bool contains(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

/// A run id no other test process uses at the same time (the default store is named after it,
/// and a second launcher of a live run is refused).
std::string unique_run(const std::string& base) { return base + "-" + std::to_string(::getpid()); }

/// Runs elastic-run through `sh -c 'exec elastic-run ... 2>>FILE'`: the same process (exec), its
/// stderr in FILE for the test to read.
child_process spawn_tool(const std::vector<std::string>& args, const std::string& err_file, uid_t uid = -1,
                         gid_t gid = -1) {
  std::vector<std::string> argv{"/bin/sh", "-c", "exec \"$0\" \"$@\" 2>>\"$ELASTIC_TEST_ERR\"", ELASTIC_RUN_TOOL};
  argv.insert(argv.end(), args.begin(), args.end());
  return child_process::spawn_as(uid, gid, argv, {{"ELASTIC_TEST_ERR", err_file}});
}

/// A run id used as it is, not made unique (the name is what a test is about).
struct exact_id {
  std::string name;
};

/// elastic-run with its logs under `dir`, run id `run` (made unique), then `args` (options,
/// "--", program). Its stderr goes to err(), and to the test's stderr when it has ended.
/// `wrapper` (e.g. unshare and its options) runs elastic-run when given.
struct launch {
  temp_dir dir;
  std::string run;
  child_process proc;
  std::vector<std::string> console;

  launch(const std::string& run_id, std::vector<std::string> options, std::vector<std::string> program,
         const std::vector<std::string>& wrapper = {})
      : run(unique_run(run_id)) {
    start(options, program, wrapper);
  }
  launch(exact_id id, std::vector<std::string> options, std::vector<std::string> program) : run(std::move(id.name)) {
    start(options, program, {});
  }
  void start(const std::vector<std::string>& options, const std::vector<std::string>& program,
             const std::vector<std::string>& wrapper) {
    std::vector<std::string> argv{"--run-id", run, "--log-dir", dir.path()};
    argv.insert(argv.end(), options.begin(), options.end());
    argv.push_back("--");
    argv.insert(argv.end(), program.begin(), program.end());
    if (wrapper.empty()) {
      proc = spawn_tool(argv, dir.file("launcher.err"));
    } else {
      std::vector<std::string> wrapped{"/bin/sh", "-c", "exec \"$0\" \"$@\" 2>>\"$ELASTIC_TEST_ERR\""};
      wrapped.insert(wrapped.end(), wrapper.begin(), wrapper.end());
      wrapped.push_back(ELASTIC_RUN_TOOL);
      wrapped.insert(wrapped.end(), argv.begin(), argv.end());
      proc = child_process::spawn(wrapped, {{"ELASTIC_TEST_ERR", dir.file("launcher.err")}});
    }
  }
  std::string log(int slot) const { return slurp(dir.path() + "/" + run + "/rank-" + std::to_string(slot) + ".log"); }
  std::string events() const { return slurp(dir.path() + "/" + run + "/events.jsonl"); }
  std::string err() const { return slurp(dir.file("launcher.err")); }
  /// The exit code once elastic-run ended (reading its console meanwhile), or -1.
  int finish(std::chrono::milliseconds timeout = 60s) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < until) {
      while (auto l = proc.read_line(0ms)) console.push_back(*l);
      if (auto st = proc.wait_for(10ms)) {
        while (auto l = proc.read_line(0ms)) console.push_back(*l);
        std::cerr << err();
        return WIFEXITED(*st) ? WEXITSTATUS(*st) : -1;
      }
    }
    std::cerr << err();
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

bool gone(pid_t pid) { return !elastic::internal::process_alive(pid, 0); }

/// The names under /dev/shm that contain `part`.
std::vector<std::string> shm_names(const std::string& part) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    const std::string name = e.path().filename().string();
    if (contains(name, part)) out.push_back(name);
  }
  return out;
}

/// elastic-run with stdout and stderr on pipes the test holds: to close them, or never read them.
struct piped_launch {
  temp_dir dir;
  std::string run;
  pid_t pid = -1;
  int out = -1, err = -1;
  std::optional<int> status;

  piped_launch(const std::string& run_id, std::vector<std::string> options, std::vector<std::string> program)
      : run(unique_run(run_id)) {
    std::vector<std::string> argv{ELASTIC_RUN_TOOL, "--run-id", run, "--log-dir", dir.path()};
    argv.insert(argv.end(), options.begin(), options.end());
    argv.push_back("--");
    argv.insert(argv.end(), program.begin(), program.end());
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    int o[2], e[2];
    REQUIRE(::pipe2(o, O_CLOEXEC) == 0);
    REQUIRE(::pipe2(e, O_CLOEXEC) == 0);
    pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::dup2(o[1], STDOUT_FILENO);
      ::dup2(e[1], STDERR_FILENO);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
    ::close(o[1]);
    ::close(e[1]);
    out = o[0];
    err = e[0];
  }
  piped_launch(const piped_launch&) = delete;
  piped_launch& operator=(const piped_launch&) = delete;
  ~piped_launch() {
    close_pipes();
    if (!status) {
      ::kill(pid, SIGKILL);
      int st = 0;
      ::waitpid(pid, &st, 0);
    }
  }
  void close_pipes() {
    if (out >= 0) ::close(out);
    if (err >= 0) ::close(err);
    out = err = -1;
  }
  std::string log(int slot) const { return slurp(dir.path() + "/" + run + "/rank-" + std::to_string(slot) + ".log"); }
  bool running() {
    if (status) return false;
    int st = 0;
    if (::waitpid(pid, &st, WNOHANG) == pid) status = st;
    return !status;
  }
  /// The exit code if it exited within `timeout`; -1 if it still runs or died of a signal.
  int finish(std::chrono::milliseconds timeout) {
    eventually([&] { return !running(); }, timeout);
    return status && WIFEXITED(*status) ? WEXITSTATUS(*status) : -1;
  }
};

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

TEST_CASE("a worker that exits 75 after a preemption notice of its own is restarted at once without counting a failure") {
  launch l("preempt", {"--nproc-per-node", "2", "--max-restarts", "0"}, {worker, "notice-once"});
  REQUIRE(l.finish() == 0);
  CHECK(count(l.log(0), "started: pid") == 2);
  CHECK(l.log(0).find("exited with code 75 (preempted, state saved)") != std::string::npos);
  CHECK(contains(l.events(), "\"delay_ms\":0"));
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
  for (int s = 0; s < 3; ++s) CHECK_FALSE(elastic::internal::process_alive(read_pid(pids.file("pid." + std::to_string(s))), 0));
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
    for (int s = 0; s < 3; ++s) gone = gone && !elastic::internal::process_alive(read_pid(pids.file("pid." + std::to_string(s))), 0);
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
  launch l("envrun", {"--nproc-per-node", "2", "--min-ranks", "1", "--step-timeout", "2.5", "--grace", "7"},
           {worker, "env", out.file("env")});
  REQUIRE(l.finish() == 0);
  const std::string e1 = slurp(out.file("env.1"));
  for (const std::string& want : {"ELASTIC_RUN_ID=" + l.run + "\n", std::string("ELASTIC_RANK=1\n"), std::string("ELASTIC_LOCAL_RANK=1\n"),
                                 std::string("ELASTIC_WORLD_SIZE=2\n"), std::string("ELASTIC_LOCAL_WORLD_SIZE=2\n"),
                                 std::string("ELASTIC_RESTART_COUNT=0\n"), "ELASTIC_RDZV=shm://elastic-" + l.run + "\n",
                                 std::string("ELASTIC_MIN_RANKS=1\n"), std::string("ELASTIC_MAX_RANKS=2\n"),
                                 // the older names, for workers built before the rename
                                 std::string("ELASTIC_MIN_NODES=1\n"), std::string("ELASTIC_MAX_NODES=2\n"),
                                 std::string("ELASTIC_STEP_TIMEOUT=2.500\n"), std::string("ELASTIC_GRACE=7.000\n"),
                                 std::string("RANK=1\n"), std::string("WORLD_SIZE=2\n"), std::string("LOCAL_RANK=1\n"),
                                 std::string("ELASTIC_HOST_ADDR=127.0.0.1\n"),
                                 // elastic-run ignores SIGPIPE and blocks signals; its workers must not.
                                 std::string("SIGPIPE=default\n"), std::string("SIGMASK=empty\n")}) {
    CHECK(e1.find(want) != std::string::npos);
  }
  CHECK(e1.find("ELASTIC_EVENTS=" + l.dir.path() + "/" + l.run + "/events.jsonl\n") != std::string::npos);
  CHECK(e1.find("ELASTIC_PARTICIPANT_ID=") != std::string::npos);
  CHECK(e1.find("ELASTIC_WATCHDOG=elastic-" + l.run + "-") != std::string::npos);
  CHECK(slurp(out.file("env.0")).find("ELASTIC_RANK=0\n") != std::string::npos);
  // The launcher's own events, and its watchdog's, carry the run id it was given on the command
  // line (not through its environment) and no rank.
  const std::string ev = l.events();
  for (const char* e : {"launcher_start", "watchdog_start", "launcher_end"}) {
    INFO(e);
    const auto at = ev.find(std::string("\"event\":\"") + e + "\",\"run_id\":\"" + l.run + "\"");
    REQUIRE(at != std::string::npos);
    const std::string line = ev.substr(at, ev.find('\n', at) - at);
    CHECK(line.find("\"rank\":") == std::string::npos);
  }
}

TEST_CASE("a dead worker's alive key is retired at once, so the group need not wait for its lease") {
  const std::string store = elastic::test::unique_name("agentstore");
  {
    launch l("retire", {"--nproc-per-node", "1", "--max-restarts", "1", "--rdzv", "shm://" + store}, {worker, "retire"});
    REQUIRE(l.finish() == 0);
    CHECK(l.log(0).find("\nkey-present=0\n") != std::string::npos);
    CHECK(l.log(0).find("own-key-present=1") != std::string::npos);  // retired before, not after, the restart
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
                                                                {"--preempt-signal", "KILL", "--", worker},
                                                                {"--preempt-signal", "SIGBOGUS", "--", worker},
                                                                {"--quiet=yes", "--", worker},
                                                                {"--nnodes", "2", "--", worker},
                                                                {"--nnodes", "1:2", "--rdzv", "shm://x", "--", worker},
                                                                {"--rdzv-backend", "zookeeper", "--", worker},
                                                                {"--rdzv-backend", "etcd", "--", worker},
                                                                {"--rdzv", "etcd://h:1", "--rdzv-backend", "c10d", "--", worker},
                                                                {"--standalone", "--rdzv", "etcd://h:1", "--", worker},
                                                                {"--monitor-interval", "soon", "--", worker},
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

// ---- The command line: CLI11, torchrun's spellings, the program after "--" ----

namespace {

elastic::agent::command_line parse(std::vector<std::string_view> args) { return elastic::agent::parse_command_line(args); }

/// The message parse() refuses `args` with, or "" when it takes them.
std::string refusal(std::vector<std::string_view> args) {
  try {
    (void)parse(std::move(args));
    return {};
  } catch (const elastic::error& e) {
    return e.message();
  }
}

}  // namespace

TEST_CASE("a Python program runs through its interpreter, and every worker restarts together by default") {
  using elastic::agent::restart_mode;
  const auto script = parse({"--nproc-per-node", "2", "--python", "/usr/bin/python3", "train.py", "--lr", "1"}).options;
  CHECK(script.command == std::vector<std::string>{"/usr/bin/python3", "-u", "train.py", "--lr", "1"});
  CHECK(script.python_program);
  CHECK(script.restarts == restart_mode::whole_round);
  const auto module = parse({"--nproc-per-node", "2", "--python", "py3", "-m", "pkg.train", "--lr", "1"}).options;
  CHECK(module.command == std::vector<std::string>{"py3", "-u", "-m", "pkg.train", "--lr", "1"});
  CHECK(module.restarts == restart_mode::whole_round);
  // --no-python runs the script itself; an interpreter named as PROGRAM is still Python.
  const auto itself = parse({"--nproc-per-node", "2", "--no-python", "./train.py"}).options;
  CHECK(itself.command == std::vector<std::string>{"./train.py"});
  CHECK(itself.restarts == restart_mode::in_place);
  CHECK(parse({"--nproc-per-node", "2", "/usr/bin/python3.11", "train.py"}).options.restarts == restart_mode::whole_round);
  // A C++ trainer keeps the in-place path unless told otherwise, and a Python one can be told.
  CHECK(parse({"--nproc-per-node", "2", "./digits_train"}).options.restarts == restart_mode::in_place);
  CHECK(parse({"--nproc-per-node", "2", "--restart-mode", "all", "./digits_train"}).options.restarts == restart_mode::whole_round);
  CHECK(parse({"--nproc-per-node", "2", "--restart-mode", "in-place", "--python", "p", "t.py"}).options.restarts ==
        restart_mode::in_place);
  CHECK_THAT(refusal({"-m", "--no-python", "pkg.train"}), Catch::Matchers::Contains("cannot be used together"));
  CHECK_THAT(refusal({"--nproc-per-node", "2", "-m"}), Catch::Matchers::Contains("-m needs the module to run"));
  CHECK_THAT(refusal({"--restart-mode", "sometimes", "t.py"}), Catch::Matchers::Contains("auto, in-place or all"));
  CHECK_THAT(refusal({"--python", "p", "./digits_train"}), Catch::Matchers::Contains("neither a .py script nor a module"));
  CHECK_THAT(refusal({"--min-ranks", "1", "--nproc-per-node", "2", "--python", "p", "t.py"}),
             Catch::Matchers::Contains("--min-ranks is for --restart-mode in-place"));
}

TEST_CASE("with every worker restarted together, workers get torchrun's variables with torchrun's meaning") {
  auto o = parse({"--nproc-per-node", "3", "--nnodes", "2:4", "--rdzv", "etcd://127.0.0.1:1", "--run-id", "job7",
                  "--max-restarts", "5", "--python", "py", "t.py"})
               .options;
  const elastic::agent::round_placement round{.group_rank = 2, .group_world = 3, .master_addr = "10.0.0.9",
                                              .master_port = 29511, .restart_count = 4, .error_file = "/l/error-1.json"};
  ::setenv("OMP_NUM_THREADS", "7", 1);  // the user's own value stands
  ::unsetenv("NCCL_ASYNC_ERROR_HANDLING");
  ::unsetenv("GLOO_SOCKET_IFNAME");
  o.host_interface = "veth7";  // the interface holding --host-addr, where other hosts reach this one
  const auto env = elastic::agent::worker_environment(o, {.index = 1, .participant = "h.1:1", .watchdog = "w", .round = &round});
  ::unsetenv("OMP_NUM_THREADS");
  auto value = [&](std::string_view k) -> std::string {
    std::string found = "<unset>";
    int n = 0;
    for (const auto& kv : env) {
      if (kv.size() > k.size() && kv.compare(0, k.size(), k) == 0 && kv[k.size()] == '=') found = kv.substr(k.size() + 1), ++n;
    }
    return n > 1 ? "<set twice>" : found;
  };
  CHECK(value("RANK") == "7");  // host 2 of hosts with 3 workers each, local rank 1
  CHECK(value("ELASTIC_RANK") == "7");
  CHECK(value("WORLD_SIZE") == "9");
  CHECK(value("ELASTIC_WORLD_SIZE") == "9");
  CHECK(value("LOCAL_RANK") == "1");
  CHECK(value("LOCAL_WORLD_SIZE") == "3");
  CHECK(value("GROUP_RANK") == "2");
  CHECK(value("GROUP_WORLD_SIZE") == "3");
  CHECK(value("ROLE_RANK") == "7");
  CHECK(value("ROLE_WORLD_SIZE") == "9");
  CHECK(value("ROLE_NAME") == "default");
  CHECK(value("MASTER_ADDR") == "10.0.0.9");
  CHECK(value("MASTER_PORT") == "29511");
  CHECK(value("TORCHELASTIC_RESTART_COUNT") == "4");
  CHECK(value("TORCHELASTIC_MAX_RESTARTS") == "5");
  CHECK(value("TORCHELASTIC_RUN_ID") == "job7");
  CHECK(value("TORCHELASTIC_USE_AGENT_STORE") == "False");
  CHECK(value("TORCHELASTIC_ERROR_FILE") == "/l/error-1.json");
  CHECK(value("NCCL_ASYNC_ERROR_HANDLING") == "1");
  CHECK(value("OMP_NUM_THREADS") == "7");
  CHECK(value("GLOO_SOCKET_IFNAME") == "veth7");
  // In place, the ranks are first guesses and the group finds its own address: none given.
  const auto in_place = elastic::agent::worker_environment(o, {.index = 1, .participant = "h.1:1", .watchdog = "w"});
  CHECK(std::none_of(in_place.begin(), in_place.end(), [](const std::string& kv) {
    return kv.starts_with("MASTER_ADDR=") || kv.starts_with("GROUP_RANK=") || kv.starts_with("TORCHELASTIC_");
  }));
}

TEST_CASE("torchrun's spellings parse to the same options as elastic-run's") {
  const auto ours = parse({"--nproc-per-node", "3", "--nnodes", "2:4", "--rdzv", "etcd://10.0.0.1:2379", "--run-id", "job7",
                           "--max-restarts", "5", "--log-dir", "/tmp/logs", "--quiet", "--", "train", "--lr", "1"});
  const auto theirs = parse({"--nproc_per_node=3", "--nnodes=2:4", "--rdzv_backend=etcd", "--rdzv_endpoint=10.0.0.1:2379",
                             "--rdzv_id=job7", "--max_restarts=5", "--log_dir=/tmp/logs", "--redirects", "3",
                             "--monitor_interval=5", "--no_python", "train", "--lr", "1"});
  const auto dashed = parse({"--nproc-per-node=3", "--nnodes", "2:4", "--rdzv-backend", "etcd-v2", "--rdzv-endpoint",
                             "10.0.0.1:2379", "--rdzv-id", "job7", "--max-restarts", "5", "--log-dir", "/tmp/logs",
                             "--quiet", "--no-python", "--tee", "3", "--", "train", "--lr", "1"});
  for (const auto* cl : {&theirs, &dashed}) {
    const auto& o = cl->options;
    CHECK(cl->asks == elastic::agent::command_line::request::run);
    CHECK(o.nproc_per_node == ours.options.nproc_per_node);
    CHECK(o.min_nodes == 2);
    CHECK(o.max_nodes == 4);
    CHECK(o.min_ranks == ours.options.min_ranks);
    CHECK(o.rdzv == ours.options.rdzv);
    CHECK(o.run_id == ours.options.run_id);
    CHECK(o.max_restarts == ours.options.max_restarts);
    CHECK(o.log_dir == ours.options.log_dir);
    CHECK(o.quiet == ours.options.quiet);
    CHECK(o.command == ours.options.command);
  }
  CHECK(ours.notes.empty());
  REQUIRE(theirs.notes.size() == 1);  // --monitor-interval: accepted, said to change nothing
  CHECK(contains(theirs.notes[0], "--monitor-interval 5 is not used"));
  CHECK(contains(dashed.notes.at(0), "--tee 3 is not needed"));

  // --standalone and the one-host backends are this launcher's own store.
  for (const auto& args : std::vector<std::vector<std::string_view>>{
           {"--standalone", "x"}, {"--rdzv-backend", "c10d", "x"}, {"--rdzv_backend=static", "x"}}) {
    CHECK(parse(args).options.rdzv.empty());
  }
  const auto c10d = parse({"--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:29400", "x"});
  CHECK(c10d.options.rdzv.empty());
  CHECK(contains(c10d.notes.at(0), "--rdzv-endpoint localhost:29400 is not used"));

  // --nproc-per-node: a number, cpu, or auto/gpu from the GPUs this process may see.
  CHECK(parse({"--nproc-per-node", "cpu", "x"}).options.nproc_per_node >= 1);
  CHECK(parse({"--nproc-per-node", "auto", "x"}).options.nproc_per_node == parse({"x"}).options.nproc_per_node);
  if (elastic::agent::detail::visible_gpu_count() > 0) {
    CHECK(parse({"--nproc-per-node", "gpu", "x"}).options.nproc_per_node == elastic::agent::detail::visible_gpu_count());
  } else {
    CHECK(contains(refusal({"--nproc-per-node", "gpu", "x"}), "no GPU is visible"));
  }
}

TEST_CASE("the program starts at '--' or at the first argument that is not an option, and is never parsed") {
  CHECK(parse({"--", "--help", "-x"}).options.command == std::vector<std::string>{"--help", "-x"});
  CHECK(parse({"--run-id", "a", "prog", "--run-id", "..", "--", "z"}).options.command ==
        std::vector<std::string>{"prog", "--run-id", "..", "--", "z"});
  CHECK(parse({"--", "--"}).options.command == std::vector<std::string>{"--"});
  CHECK(parse({"--help"}).asks == elastic::agent::command_line::request::help);
  CHECK(parse({"-h", "--bogus"}).asks == elastic::agent::command_line::request::help);  // asked first, answered first
  CHECK(parse({"--version"}).asks == elastic::agent::command_line::request::version);
  // Refusals name the flag and the reason.
  CHECK(refusal({"--run-id=", "--log-dir", "/tmp/x", "--", "p"}) == "--run-id needs a value, got an empty one");
  CHECK(contains(refusal({"--run-id", "..", "p"}), "'..' is not a run id"));
  CHECK(contains(refusal({"--run-id", "a/b", "p"}), "is not a run id"));
  CHECK(contains(refusal({"--run-id", ".", "p"}), "is not a run id"));
  CHECK(refusal({"--bogus", "p"}) == "unknown option '--bogus'");
  CHECK(refusal({"--quiet=yes", "p"}) == "--quiet takes no value");
  CHECK(contains(refusal({"--nnodes", "2", "p"}), "more than one host cannot meet in this launcher's own shm:// store"));
  CHECK(contains(refusal({"--nproc-per-node", "0", "p"}), "wants a whole number from 1 to 4096"));
  CHECK(contains(refusal({"--preempt-signal", "USR1,", "p"}), "needs a value, got an empty one"));
  CHECK(contains(refusal({"--grace", "p"}), "--grace: wants a number of seconds (e.g. 30 or 2.5), got 'p'"));
  CHECK(contains(refusal({"--grace", "2"}), "no program to run"));
  CHECK(contains(refusal({"--max-restarts"}), "--max-restarts needs a value"));
}

TEST_CASE("an empty --run-id= is refused with exit 2 and does not swallow the next flag") {
  temp_dir d;
  // Were --log-dir taken as the run id, the refusal would say "'--log-dir' is not a run id".
  auto p = spawn_tool({"--run-id=", "--log-dir", d.file("logs"), "--", worker, "env", d.file("env")}, d.file("err"));
  CHECK(p.exit_code(10s) == 2);
  const std::string err = slurp(d.file("err"));
  INFO(err);
  CHECK(contains(err, "--run-id needs a value, got an empty one"));
  CHECK_FALSE(contains(err, "is not a run id"));
  CHECK_FALSE(std::filesystem::exists(d.file("logs")));
  CHECK_FALSE(std::filesystem::exists(d.file("env.0")));
}

TEST_CASE("a run id of .. is refused with exit 2 and nothing is written outside --log-dir") {
  temp_dir d;
  std::filesystem::create_directories(d.file("out/logs"));
  for (const std::string id : {"..", ".", "../escape", "a/b", "/abs"}) {
    INFO(id);
    auto p = spawn_tool({"--run-id", id, "--log-dir", d.file("out/logs"), "--", worker, "env", d.file("env")}, d.file("err"));
    CHECK(p.exit_code(10s) == 2);
  }
  CHECK(contains(slurp(d.file("err")), "is not a run id"));
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::recursive_directory_iterator(d.path())) names.push_back(e.path().string());
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{d.file("err"), d.file("out"), d.file("out/logs")});
}

TEST_CASE("elastic-run -- --help runs a program named --help") {
  temp_dir bin, out;
  const std::string script = bin.file("--help");
  std::ofstream(script) << "#!/bin/sh\necho \"ran $*\" > \"$ELASTIC_TEST_OUT.$ELASTIC_RANK\"\n";
  ::chmod(script.c_str(), 0755);
  const std::string run = unique_run("dashhelp");
  auto p = child_process::spawn({"/bin/sh", "-c", "PATH=\"$ELASTIC_TEST_BIN:$PATH\" exec \"$0\" \"$@\"", ELASTIC_RUN_TOOL,
                                 "--nproc-per-node", "1", "--run-id", run, "--log-dir", out.file("logs"), "--", "--help",
                                 "--version"},
                                {{"ELASTIC_TEST_BIN", bin.path()}, {"ELASTIC_TEST_OUT", out.file("ran")}});
  std::string console;
  while (auto l = p.read_line(20s)) console += *l + "\n";
  CHECK(p.exit_code(20s) == 0);
  INFO(console);
  CHECK(slurp(out.file("ran.0")) == "ran --version\n");
  CHECK_FALSE(contains(console, "usage: elastic-run"));
}

TEST_CASE("elastic-run --help lists every flag, torchrun's spellings and the exit codes") {
  auto p = child_process::spawn({ELASTIC_RUN_TOOL, "--help"});
  std::string text;
  while (auto l = p.read_line(10s)) text += *l + "\n";
  CHECK(p.exit_code(10s) == 0);
  for (const char* flag : {"usage: elastic-run [options] [--] PROGRAM [ARGS...]", "--nproc-per-node", "--nproc_per_node",
                           "--nnodes", "--min-ranks", "--rdzv ", "--rdzv-backend", "--rdzv_endpoint", "--standalone",
                           "--host-addr", "--run-id", "--rdzv-id", "--max-restarts", "--max_restarts", "--step-timeout",
                           "--grace", "--preempt-signal", "--log-dir", "--events", "--quiet", "--monitor-interval",
                           "--no-python", "--redirects", "--tee", "--version", "Exit: 0"}) {
    INFO(flag);
    CHECK(contains(text, flag));
  }
}

TEST_CASE("a run given in torchrun's spellings runs, and says which flags change nothing") {
  temp_dir out;
  launch l("torchrun", {"--nproc_per_node=2", "--rdzv_backend=c10d", "--max_restarts=1", "--monitor_interval=1",
                        "--no_python", "--tee", "3"},
           {worker, "env", out.file("env")});
  REQUIRE(l.finish() == 0);
  const std::string e1 = slurp(out.file("env.1"));
  CHECK(contains(e1, "WORLD_SIZE=2\n"));
  CHECK(contains(e1, "ELASTIC_RDZV=shm://elastic-" + l.run + "\n"));
  CHECK(contains(l.err(), "note: --monitor-interval 1 is not used"));
  CHECK(contains(l.err(), "note: --tee 3 is not needed"));
  CHECK(contains(l.err(), "--max-restarts 1"));  // the summary names the limit it ran with
}

#if defined(ELASTIC_ETCD_SERVER) && defined(ELASTIC_GROUP_WORKER)
TEST_CASE("two launchers meet through one etcd and train as one group") {
  elastic::test::etcd_server etcd;
  temp_dir ckpt;
  // The workers take the store elastic-run gives them (ELASTIC_RDZV): its relay, unless told not.
  const std::vector<std::string> program{ELASTIC_GROUP_WORKER, "--run-id", "twohosts", "--min", "2", "--max", "2",
                                         "--steps", "30", "--dir", ckpt.path(), "--dim", "4096"};
  std::vector<std::string> options{"--nproc-per-node", "1", "--nnodes", "2:2", "--rdzv", etcd.url()};
  std::string scheme = "relay";
  SECTION("each worker through its launcher's store relay (the default)") {}
  SECTION("each worker its own etcd client (--no-store-relay)") {
    options.push_back("--no-store-relay");
    scheme = "etcd";
  }
  launch a("twohosts", options, program);
  launch b("twohosts", options, program);
  REQUIRE(a.finish(120s) == 0);
  REQUIRE(b.finish(120s) == 0);
  std::vector<std::string> joined, finals;
  for (auto* l : {&a, &b}) {
    const std::string log = l->log(0);
    CHECK(log.find("store scheme=" + scheme + "\n") != std::string::npos);
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

TEST_CASE("two runs share one etcd at once, and each leaves none of its keys when it finishes") {
  elastic::test::etcd_server etcd;
  temp_dir ckpt;
  auto program = [&](const std::string& run) {
    return std::vector<std::string>{ELASTIC_GROUP_WORKER, "--store", etcd.url(), "--run-id", unique_run(run), "--min",
                                    "2", "--max", "2", "--steps", "40", "--dir", ckpt.file(run), "--dim", "4096",
                                    "--step-sleep-ms", "20"};
  };
  const std::vector<std::string> options{"--nproc-per-node", "2", "--rdzv", etcd.url()};
  launch a("shared-a", options, program("shared-a"));
  launch b("shared-b", options, program("shared-b"));
  REQUIRE(a.finish(120s) == 0);
  REQUIRE(b.finish(120s) == 0);
  for (auto* l : {&a, &b}) {
    CHECK(l->log(0).find("final ") != std::string::npos);
    CHECK(l->events().find("\"event\":\"run_keys_removed\"") != std::string::npos);
  }
  elastic::rendezvous::etcd_store store(etcd.url());
  const auto left = store.list("");
  for (const auto& [k, v] : left) UNSCOPED_INFO("left behind: " << k);
  CHECK(left.empty());
}
#endif

// ---- Exit 75 with no notice: backoff and the crash-loop bound (exit 3) ----

TEST_CASE("a worker that keeps exiting 75 with no notice and no progress is backed off and ends the run with exit 3") {
  launch l("tempfail", {"--nproc-per-node", "2", "--max-restarts", "3", "--grace", "5"}, {worker, "tempfail"});
  REQUIRE(l.finish(60s) == 3);
  CHECK(count(l.log(0), "started: pid") == 4);  // the first life and 3 restarts, then the bound
  CHECK(count(l.log(0), "exited with code 75 (retry me, but no preemption notice came)") == 4);
  // Exponential backoff, in the events (the delays are what the launcher chose, not timings).
  const std::string ev = l.events();
  CHECK(contains(ev, "\"event\":\"worker_restart\",") );
  CHECK(contains(ev, "\"delay_ms\":100"));
  CHECK(contains(ev, "\"delay_ms\":200"));
  CHECK(contains(ev, "\"delay_ms\":400"));
  CHECK(contains(ev, "\"event\":\"launcher_crash_loop\""));
  CHECK(contains(l.log(1), "terminating: exit 75"));  // the others were stopped in order
  CHECK(contains(l.err(), "crash loop"));
  CHECK(contains(l.err(), "exit code        3 (crash loop: no progress; do not requeue)"));
}

TEST_CASE("exits 75 with a checkpoint committed in between are progress: the run goes on") {
  launch l("progress", {"--nproc-per-node", "1", "--max-restarts", "1"}, {worker, "tempfail-progress", "4"});
  REQUIRE(l.finish(60s) == 0);
  CHECK(count(l.log(0), "started: pid") == 5);
  // Progress starts a new row and resets the backoff: every restart is the first of its row.
  CHECK(count(l.events(), "\"delay_ms\":100,\"exits_in_a_row\":1}") == 4);
}

// ---- Notices: every signal that would end the launcher, platforms that signal everyone ----

TEST_CASE("SIGUSR1, SIGQUIT and every other signal that would end elastic-run are a preemption notice") {
  for (int sig : {SIGUSR1, SIGQUIT, SIGUSR2, SIGHUP, SIGALRM, SIGXCPU, SIGPWR, SIGVTALRM, SIGRTMIN + 3}) {
    INFO("signal " << sig);
    temp_dir pids;
    launch l("notice", {"--nproc-per-node", "1", "--grace", "10"}, {worker, "term", "0", pids.file("pid"), "none"});
    REQUIRE(wait_for_file(pids.file("pid.0"), 20s));
    l.proc.kill(sig);
    REQUIRE(l.finish(20s) == 75);
    CHECK(contains(l.log(0), "terminating after 1 notices"));  // forwarded as SIGTERM
    CHECK(contains(l.err(), "a preemption notice"));
    CHECK(contains(l.err(), "exit code        75"));
    CHECK(shm_names(l.run).empty());
  }
}

TEST_CASE("a signal that ends nothing is a preemption notice too when named with --preempt-signal") {
  temp_dir pids;
  launch l("winch", {"--nproc-per-node", "1", "--preempt-signal", "WINCH,usr2"}, {worker, "term", "0", pids.file("pid"), "none"});
  REQUIRE(wait_for_file(pids.file("pid.0"), 20s));
  l.proc.kill(SIGWINCH);
  REQUIRE(l.finish(20s) == 75);
  CHECK(contains(l.log(0), "terminating after 1 notices"));
  CHECK(contains(l.err(), "SIGWINCH: a preemption notice"));
}

TEST_CASE("signals within 2 s of a notice are the same notice: the workers keep their grace") {
  temp_dir pids;
  // The workers take 1.5 s to "checkpoint"; the platform signals the launcher three times and
  // the workers themselves, as Slurm and systemd do.
  launch l("window", {"--nproc-per-node", "2", "--grace", "20"}, {worker, "term", "1500", pids.file("pid"), "none"});
  for (int s = 0; s < 2; ++s) REQUIRE(wait_for_file(pids.file("pid." + std::to_string(s)), 20s));
  l.proc.kill(SIGTERM);
  std::this_thread::sleep_for(200ms);
  l.proc.kill(SIGINT);
  ::kill(read_pid(pids.file("pid.0")), SIGTERM);
  std::this_thread::sleep_for(200ms);
  l.proc.kill(SIGTERM);
  REQUIRE(l.finish(30s) == 75);
  for (int s = 0; s < 2; ++s) {
    CHECK(contains(l.log(s), "exited with code 75"));
    CHECK_FALSE(contains(l.log(s), "SIGKILL"));
  }
  CHECK(contains(l.err(), "the same notice"));
  CHECK_FALSE(contains(l.err(), "killed at grace"));
}

TEST_CASE("a signal more than 2 s after the notice kills the workers at once") {
  temp_dir pids;
  launch l("again", {"--nproc-per-node", "2", "--grace", "60"}, {worker, "wait", pids.file("pid")});
  for (int s = 0; s < 2; ++s) REQUIRE(wait_for_file(pids.file("pid." + std::to_string(s)), 20s));
  l.proc.kill(SIGTERM);
  // The window runs from when the launcher took the notice.
  REQUIRE(eventually([&] { return contains(l.events(), "\"event\":\"launcher_signal\""); }, 10s));
  std::this_thread::sleep_for(2500ms);
  l.proc.kill(SIGTERM);
  REQUIRE(l.finish(30s) == 75);  // long before the 60 s grace
  CHECK(contains(l.log(1), "did not exit within the grace: SIGKILL"));  // slot 1 ignores SIGTERM
  CHECK(contains(l.err(), "again: killing the workers now"));
}

TEST_CASE("'state saved' is said only when a worker committed the final checkpoint") {
  temp_dir pids;
  SECTION("committed") {
    launch l("saved", {"--nproc-per-node", "2"}, {worker, "term", "0", pids.file("pid"), "saved"});
    for (int s = 0; s < 2; ++s) REQUIRE(wait_for_file(pids.file("pid." + std::to_string(s)), 20s));
    l.proc.kill(SIGTERM);
    REQUIRE(l.finish(20s) == 75);
    CHECK(contains(l.err(), "exit code        75 (preempted: state saved, run the same command again)"));
    CHECK(contains(l.log(0), "exited with code 75 (preempted, state saved)"));
    CHECK(contains(l.log(1), "exited with code 75 (preempted)"));  // it did not commit the step
  }
  SECTION("not committed") {
    launch l("unsaved", {"--nproc-per-node", "2"}, {worker, "term", "0", pids.file("pid"), "unsaved"});
    for (int s = 0; s < 2; ++s) REQUIRE(wait_for_file(pids.file("pid." + std::to_string(s)), 20s));
    l.proc.kill(SIGTERM);
    REQUIRE(l.finish(20s) == 75);
    CHECK_FALSE(contains(l.err(), "state saved"));
    CHECK(contains(l.err(), "the final checkpoint was not confirmed; the newest committed step is 3"));
    CHECK_FALSE(contains(l.log(0), "state saved"));
  }
  SECTION("nothing committed at all") {
    launch l("nothing", {"--nproc-per-node", "1"}, {worker, "term", "0", pids.file("pid"), "none"});
    REQUIRE(wait_for_file(pids.file("pid.0"), 20s));
    l.proc.kill(SIGTERM);
    REQUIRE(l.finish(20s) == 75);
    CHECK_FALSE(contains(l.err(), "state saved"));
    CHECK(contains(l.err(), "no checkpoint was committed in this run"));
  }
}

// ---- Run ids, empty values, unusable and hostile log directories ----

TEST_CASE("a run id is a plain name and an empty value is a command-line error: exit 2, nothing written") {
  temp_dir d;
  const std::string logs = d.file("logs");
  for (const auto& args : std::vector<std::vector<std::string>>{{"--run-id", ".."},
                                                                {"--run-id", "."},
                                                                {"--run-id", "a/b"},
                                                                {"--run-id", "../escape"},
                                                                {"--run-id=", "--log-dir", logs},
                                                                {"--run-id", ""},
                                                                {"--log-dir="},
                                                                {"--events="},
                                                                {"--rdzv="},
                                                                {"--grace="},
                                                                {"--preempt-signal="},
                                                                {"--preempt-signal", "USR1,"}}) {
    std::vector<std::string> argv{"--log-dir", logs};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.insert(argv.end(), {"--", worker, "env", d.file("env")});
    INFO(args.front() << " " << (args.size() > 1 ? args[1] : ""));
    auto p = spawn_tool(argv, d.file("err"));
    CHECK(p.exit_code(10s) == 2);
  }
  // From the environment too.
  auto p = child_process::spawn({"/bin/sh", "-c", "ELASTIC_RUN_ID=.. exec \"$0\" \"$@\" 2>/dev/null", ELASTIC_RUN_TOOL, "--log-dir",
                            logs, "--", worker, "env", d.file("env")});
  CHECK(p.exit_code(10s) == 2);
  CHECK_FALSE(std::filesystem::exists(d.file("rank-0.log")));  // nothing outside --log-dir
  CHECK_FALSE(std::filesystem::exists(d.file("env.0")));       // and nothing started
  CHECK(contains(slurp(d.file("err")), "is not a run id"));
  CHECK(contains(slurp(d.file("err")), "needs a value, got an empty one"));
}

TEST_CASE("a --log-dir that is a regular file is refused with exit 2 and the reason") {
  temp_dir d;
  std::ofstream(d.file("file")) << "not a directory\n";
  auto p = spawn_tool({"--log-dir", d.file("file"), "--run-id", unique_run("file"), "--", worker, "env", d.file("env")},
                      d.file("err"));
  CHECK(p.exit_code(10s) == 2);
  const std::string err = slurp(d.file("err"));
  CHECK(contains(err, "--log-dir " + d.file("file")));
  CHECK(contains(err, "not a directory"));
  CHECK_FALSE(contains(err, "terminate"));
}

TEST_CASE("a --log-dir the user cannot write to is refused with exit 2 and the reason") {
  const auto other = elastic::test::require_other_user();
  temp_dir d, errs;
  ::chmod(d.path().c_str(), 0755);
  ::chmod(errs.path().c_str(), 0777);
  REQUIRE(::mkdir(d.file("ro").c_str(), 0755) == 0);  // root's: the other user cannot write here
  auto p = spawn_tool({"--log-dir", d.file("ro"), "--run-id", unique_run("ro"), "--", "/bin/true"}, errs.file("err"),
                      other.uid, other.gid);
  CHECK(p.exit_code(10s) == 2);
  const std::string err = slurp(errs.file("err"));
  INFO(err);
  CHECK(contains(err, "--log-dir " + d.file("ro")));
  CHECK(contains(err, "Permission denied"));
}

TEST_CASE("planted symbolic links in the run's log directory are refused, never written through") {
  const auto other = elastic::test::require_other_user();
  temp_dir d;
  ::chmod(d.path().c_str(), 0755);
  const std::string run = unique_run("planted");
  const std::string dir = d.file(run);
  const std::string victim = d.file("victim");
  std::ofstream(victim) << "precious\n";
  std::string planted, expected_reason;
  SECTION("in a run directory another user made") {
    REQUIRE(::mkdir(dir.c_str(), 0755) == 0);
    REQUIRE(::chown(dir.c_str(), other.uid, other.gid) == 0);
    planted = dir + "/rank-0.log";
    expected_reason = "belongs to uid " + std::to_string(other.uid);
  }
  SECTION("in a shared (sticky) run directory, by another user") {
    REQUIRE(::mkdir(dir.c_str(), 01777) == 0);
    ::chmod(dir.c_str(), 01777);
    planted = dir + "/events.jsonl";
    // O_NOFOLLOW refuses it, unless the kernel's protected_symlinks already did (EACCES).
    expected_reason = "";
  }
  REQUIRE(::symlink(victim.c_str(), planted.c_str()) == 0);
  REQUIRE(::lchown(planted.c_str(), other.uid, other.gid) == 0);
  auto p = spawn_tool({"--log-dir", d.path(), "--run-id", run, "--", worker, "env", d.file("env")}, d.file("err"));
  CHECK(p.exit_code(10s) == 2);
  CHECK(slurp(victim) == "precious\n");
  CHECK_FALSE(std::filesystem::exists(d.file("env.0")));  // nothing started
  const std::string err = slurp(d.file("err"));
  INFO(err);
  CHECK(contains(err, expected_reason.empty() ? planted : dir));
  CHECK(contains(err, expected_reason));
}

// ---- Names a local user plants in /dev/shm ----

TEST_CASE("a FIFO, socket or device planted in /dev/shm under the library's prefixes does not stop elastic-run") {
  using elastic::test::planted_kind;
  for (const planted_kind kind : elastic::test::plantable_kinds()) {
    const std::string what = elastic::test::planted_words(kind);
    INFO(what);
    const std::string tag = std::to_string(::getpid()) + "-" + std::to_string(static_cast<int>(kind));
    const std::string base = "planted-shm-" + std::to_string(static_cast<int>(kind)), run = unique_run(base);
    // Under every prefix the launcher sweeps at its start, and one under its own run's records.
    std::vector<std::unique_ptr<elastic::test::planted_shm>> planted;
    for (const std::string& name : {"elastic-store.elastic-planted-" + tag, "elastic-timer.elastic-planted-" + tag,
                                   "elastic.flight.planted-" + tag + ".1", elastic::comm::detail::flight_name(run, 4194303)}) {
      planted.push_back(std::make_unique<elastic::test::planted_shm>(name, kind));
    }
    temp_dir pids;
    launch l(base, {"--nproc-per-node", "2"}, {worker, "term", "0", pids.file("pid"), "none"});
    // Today's launcher would wait forever in its start-up sweep, before any worker starts: a
    // bounded wait, then elastic-run is killed by the test's destructor.
    CHECK(wait_for_file(pids.file("pid.0"), 20s));
    CHECK(wait_for_file(pids.file("pid.1"), 20s));
    l.proc.kill(SIGTERM);
    CHECK(l.finish(30s) == 75);
    const std::string err = l.err();
    INFO(err);
    for (const auto& p : planted) {
      CHECK(p->intact());  // another user's: never removed
      if (p.get() != planted.back().get()) CHECK(contains(err, p->path() + " is " + what));  // said once, by the sweep
    }
  }
}

TEST_CASE("a FIFO, socket or device planted under a live worker's flight record does not stop elastic-run at a bad death") {
  using elastic::test::planted_kind;
  for (const planted_kind kind : elastic::test::plantable_kinds()) {
    const std::string what = elastic::test::planted_words(kind);
    INFO(what);
    temp_dir pids;
    launch l("planted-flight-" + std::to_string(static_cast<int>(kind)), {"--nproc-per-node", "2", "--max-restarts", "5"},
             {worker, "term", "0", pids.file("pid"), "none"});
    REQUIRE(wait_for_file(pids.file("pid.0"), 20s));
    REQUIRE(wait_for_file(pids.file("pid.1"), 20s));
    const pid_t first = read_pid(pids.file("pid.0")), survivor = read_pid(pids.file("pid.1"));
    // Planted where the launcher looks for its workers' records when one of them dies badly.
    elastic::test::planted_shm at_survivor(elastic::comm::detail::flight_name(l.run, survivor), kind);
    elastic::test::planted_shm at_dead(elastic::comm::detail::flight_name(l.run, first), kind);
    REQUIRE(::kill(first, SIGKILL) == 0);
    // The launcher reads the records, restarts slot 0 and still acts on SIGTERM; today it waits
    // forever in the open of the FIFO.
    CHECK(eventually([&] { return read_pid(pids.file("pid.0")) != first; }, 20s));
    l.proc.kill(SIGTERM);
    CHECK(l.finish(30s) == 75);
    const std::string err = l.err();
    INFO(err);
    CHECK(contains(err, at_survivor.path() + " is " + what));
    CHECK(at_survivor.intact());
  }
}

// ---- The console: closed, or never read ----

TEST_CASE("a closed console does not kill elastic-run: the logs go on and SIGTERM still ends the run with 75") {
  piped_launch l("closed", {"--nproc-per-node", "2"}, {worker, "chatter", "100"});
  pollfd p{l.out, POLLIN, 0};
  REQUIRE(::poll(&p, 1, 20'000) == 1);  // the workers talk
  l.close_pipes();                      // `| head` has read enough
  std::this_thread::sleep_for(500ms);
  REQUIRE(l.running());  // not killed by SIGPIPE
  const std::size_t before = l.log(0).size();
  REQUIRE(eventually([&] { return l.log(0).size() > before; }, 10s));  // the log still grows
  ::kill(l.pid, SIGTERM);
  REQUIRE(l.finish(30s) == 75);
  for (int s = 0; s < 2; ++s) CHECK(contains(l.log(s), "exited with code 75"));
  CHECK(shm_names(l.run).empty());
}

TEST_CASE("an undrained console does not delay a notice: the workers get SIGTERM within 5 s") {
  piped_launch l("undrained", {"--nproc-per-node", "2", "--grace", "10"}, {worker, "chatter", "4000"});
  // Nothing reads stdout or stderr: the pipes fill within a fraction of a second.
  REQUIRE(eventually([&] { return l.log(0).size() > (4u << 20); }, 30s));
  ::kill(l.pid, SIGTERM);
  CHECK(eventually([&] { return contains(l.log(0), "terminating: exit 75") && contains(l.log(1), "terminating: exit 75"); },
                   5s));
  CHECK(l.finish(20s) == 75);  // its last words do not wait for a reader that never comes
}

TEST_CASE("a console reader the shell started before elastic-run (`> >(tee log)`) is left alone and gets the summary") {
  // `elastic-run ... > >(tee log) &` in a script: the shell forks tee, then execs elastic-run,
  // so tee is elastic-run's child from its first instruction. It is not a worker's leftover.
  temp_dir dir;
  const std::string run = unique_run("procsubst");
  const std::string seen = dir.file("console.txt");
  const std::string pids = dir.file("pid"), tool = ELASTIC_RUN_TOOL, log_dir = dir.path();
  const pid_t launcher = ::fork();
  REQUIRE(launcher >= 0);
  if (launcher == 0) {
    int p[2];
    if (::pipe(p) != 0) ::_exit(127);
    const pid_t reader = ::fork();
    if (reader == 0) {
      const int file = ::open(seen.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      ::dup2(p[0], STDIN_FILENO);
      ::dup2(file, STDOUT_FILENO);
      ::close(p[1]);
      ::execl("/bin/cat", "cat", static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::dup2(p[1], STDOUT_FILENO);
    ::dup2(p[1], STDERR_FILENO);
    ::close(p[0]);
    ::close(p[1]);
    ::execl(tool.c_str(), tool.c_str(), "--run-id", run.c_str(), "--log-dir", log_dir.c_str(), "--nproc-per-node",
            "1", "--", worker.c_str(), "wait", pids.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  int st = 0;
  bool reaped = false;
  const auto reap = [&] { return reaped = reaped || ::waitpid(launcher, &st, WNOHANG) == launcher; };
  struct end_it {
    std::function<void()> f;
    ~end_it() { f(); }
  } guard{[&] {
    if (reaped) return;
    ::kill(launcher, SIGKILL);
    ::waitpid(launcher, &st, 0);
  }};
  REQUIRE(wait_for_file(dir.file("pid.0"), 20s));
  std::this_thread::sleep_for(100ms);
  ::kill(launcher, SIGTERM);
  REQUIRE(eventually(reap, 30s));
  CHECK(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 75);
  // cat ends when the last writer (elastic-run) is gone; what it wrote is the whole console.
  CHECK(eventually([&] { return contains(slurp(seen), "exit code        75"); }, 10s));
  const std::string text = slurp(seen);
  CHECK(contains(text, "exited with code 75"));
  CHECK(contains(text, "elastic-run: run '" + run + "' preempted"));
}

// ---- The store: a frozen or dead etcd never holds the supervision loop ----

#if defined(ELASTIC_ETCD_SERVER) && defined(ELASTIC_GROUP_WORKER)
TEST_CASE("an etcd that stops answering does not delay a notice: the workers get SIGTERM within 5 s") {
  elastic::test::etcd_server etcd;
  temp_dir pids;
  launch l("frozen", {"--nproc-per-node", "2", "--rdzv", etcd.url(), "--grace", "5"},
           {worker, "term", "0", pids.file("pid"), "none"});
  for (int s = 0; s < 2; ++s) REQUIRE(wait_for_file(pids.file("pid." + std::to_string(s)), 20s));
  const pid_t etcd_pid = etcd.pid();
  SECTION("frozen (SIGSTOP)") { REQUIRE(::kill(etcd_pid, SIGSTOP) == 0); }
  SECTION("dead (SIGKILL)") { etcd.kill(); }
  // A worker dies: the launcher retires its alive key in the store that does not answer.
  const pid_t first = read_pid(pids.file("pid.0"));
  ::kill(first, SIGKILL);
  REQUIRE(eventually([&] { return count(l.log(0), "started: pid") == 2; }, 10s));  // restarted meanwhile
  std::this_thread::sleep_for(300ms);
  l.proc.kill(SIGTERM);
  CHECK(eventually([&] { return contains(l.log(1), "terminating after"); }, 5s));
  CHECK(l.finish(20s) == 75);
  if (etcd.pid() > 0) ::kill(etcd.pid(), SIGCONT);
}
#endif

// ---- One launcher per run (its own store), and what it owns in /dev/shm ----

TEST_CASE("a second launcher of a live run is refused, names the first one's pid, and leaves its store alone") {
  temp_dir pids;
  launch a("twice", {"--nproc-per-node", "1", "--max-restarts", "2"}, {worker, "term", "0", pids.file("pid"), "none"});
  REQUIRE(wait_for_file(pids.file("pid.0"), 20s));
  const std::string store = "elastic-store.elastic-" + a.run;
  REQUIRE(std::filesystem::exists("/dev/shm/" + store));
  {
    temp_dir d;
    auto b = spawn_tool({"--run-id", a.run, "--log-dir", d.path(), "--", worker, "env", d.file("env")}, d.file("err"));
    const pid_t b_pid = b.pid();
    CHECK(b.exit_code(20s) == 1);
    const std::string err = slurp(d.file("err"));
    INFO(err);
    CHECK(contains(err, "already running"));
    CHECK(contains(err, "elastic-run pid " + std::to_string(a.proc.pid())));
    CHECK_FALSE(std::filesystem::exists(d.file("env.0")));  // it started nothing
    CHECK(shm_names("elastic-timer.elastic-" + a.run + "-" + std::to_string(b_pid)).empty());
  }
  CHECK(std::filesystem::exists("/dev/shm/" + store));  // the first run's store is untouched
  // The first run goes on: a worker death is handled as always.
  const pid_t first = read_pid(pids.file("pid.0"));
  ::kill(first, SIGKILL);
  REQUIRE(eventually([&] { return read_pid(pids.file("pid.0")) != first; }, 10s));  // restarted
  std::this_thread::sleep_for(200ms);
  a.proc.kill(SIGTERM);
  REQUIRE(a.finish(20s) == 75);
  CHECK_FALSE(std::filesystem::exists("/dev/shm/" + store));  // removed by its owner at the end
}

TEST_CASE("launchers of one run may share a store given with --rdzv on one host") {
  const std::string store = elastic::test::unique_name("agentshared");
  const std::vector<std::string> options{"--nproc-per-node", "1", "--rdzv", "shm://" + store};
  launch a("shared", options, {worker, "crash-once"});
  launch b("shared", options, {worker, "crash-once"});
  CHECK(a.finish() == 0);
  CHECK(b.finish() == 0);
  elastic::rendezvous::shm_store::remove(store);
}

namespace {

/// Runs named like the store's own keys share the store at `url` (opened by the test as `s`):
/// "runs", the parent of the registrations until they moved, and "config" and "round", whose
/// registrations were then keys of the run named "runs". Each forms its group, the store lists
/// exactly them as live, and each finishes, removing its keys.
void runs_named_like_store_keys_share_it(const std::string& url, elastic::rendezvous::store& s) {
  const std::vector<std::string> options{"--nproc-per-node", "1", "--max-restarts", "0", "--rdzv", url};
  auto program = [&](const std::string& run, const char* life_ms) {
    return std::vector<std::string>{ELASTIC_RDZV_WORKER, url, run, "1", "1", "-", "stay", "--life", life_ms};
  };
  launch config(exact_id{"config"}, options, program("config", "5000"));
  launch round(exact_id{"round"}, options, program("round", "5000"));
  REQUIRE(eventually([&] { return contains(config.log(0), "round 1 ") && contains(round.log(0), "round 1 "); }, 30s));
  launch runs(exact_id{"runs"}, options, program("runs", "1000"));
  REQUIRE(eventually([&] { return contains(runs.log(0), "round 1 ") || contains(runs.log(0), "error "); }, 30s));
  const auto live = elastic::rendezvous::live_runs(s, "/elastic");
  const int code_runs = runs.finish(60s), code_config = config.finish(60s), code_round = round.finish(60s);
  INFO(runs.log(0) << config.log(0) << round.log(0));
  CHECK(contains(runs.log(0), "round 1 rank 0 world 1"));
  CHECK(live == std::vector<std::string>{"config", "round", "runs"});
  CHECK(code_runs == 0);
  CHECK(code_config == 0);
  CHECK(code_round == 0);
  for (auto* l : {&runs, &config, &round}) CHECK(contains(l->events(), "\"event\":\"run_keys_removed\""));
  for (const char* run : {"config", "round", "runs"}) CHECK(s.list(std::string("/elastic/") + run + "/").empty());
}

}  // namespace

TEST_CASE("runs named runs, config and round share an shm store: each forms its group and finishes") {
  const std::string store = elastic::test::unique_name("agentnames");
  {
    elastic::rendezvous::shm_store s(store);
    runs_named_like_store_keys_share_it("shm://" + store, s);
  }
  elastic::rendezvous::shm_store::remove(store);
}

#if defined(ELASTIC_ETCD_SERVER) && defined(ELASTIC_GROUP_WORKER)
TEST_CASE("runs named runs, config and round share an etcd: each forms its group and finishes") {
  elastic::test::etcd_server etcd;
  elastic::rendezvous::etcd_store s(etcd.url());
  runs_named_like_store_keys_share_it(etcd.url(), s);
}
#endif

namespace {

/// unshare(1) running its command as pid 1 of a new pid namespace (with its own /proc), killed
/// with unshare; the test ends as skipped where that is not permitted (not root, no unshare).
std::vector<std::string> own_pid_namespace() {
  if (::geteuid() != 0) elastic::test::skip_test("needs root to make pid namespaces");
  std::string tool;
  for (const char* p : {"/usr/bin/unshare", "/bin/unshare", "/usr/sbin/unshare"})
    if (tool.empty() && ::access(p, X_OK) == 0) tool = p;
  if (tool.empty()) elastic::test::skip_test("no unshare(1) (util-linux)");
  const std::vector<std::string> unshare{tool, "--pid", "--fork", "--mount-proc", "--kill-child"};
  std::vector<std::string> probe = unshare;
  probe.push_back("/bin/true");
  auto p = child_process::spawn(probe);
  if (p.exit_code(20s) != 0) elastic::test::skip_test("unshare --pid --fork --mount-proc is not permitted here");
  return unshare;
}

}  // namespace

TEST_CASE("two launchers of one run in separate pid namespaces of one host get distinct participant ids and form one group") {
  // Containers that share the host's name and /dev/shm but not its pids: both launchers are pid
  // 1 in their own namespace.
  const auto wrapper = own_pid_namespace();
  const std::string store = elastic::test::unique_name("agentpidns");
  const std::string run = unique_run("pidns");
  const std::vector<std::string> options{"--nproc-per-node", "1", "--max-restarts", "0", "--rdzv", "shm://" + store};
  const std::vector<std::string> program{ELASTIC_RDZV_WORKER, store, run, "2", "2", "-", "once"};
  launch a("pidns", options, program, wrapper);
  launch b("pidns", options, program, wrapper);
  const int code_a = a.finish(60s), code_b = b.finish(60s);
  elastic::rendezvous::shm_store::remove(store);
  INFO(a.log(0) << b.log(0));
  CHECK(code_a == 0);
  CHECK(code_b == 0);
  // One round of two, both in it, each under an id of its own: "round 1 rank R world W members A,B ...".
  struct seen {
    std::string rank, world, members;
  };
  std::vector<seen> rounds;
  for (auto* l : {&a, &b}) {
    const std::string log = l->log(0);
    const auto at = log.find("round 1 ");
    REQUIRE(at != std::string::npos);
    std::istringstream in(log.substr(at, log.find('\n', at) - at));
    std::string word, round;
    seen r;
    in >> word >> round >> word >> r.rank >> word >> r.world >> word >> r.members;
    rounds.push_back(r);
  }
  CHECK(rounds[0].world == "2");
  CHECK(rounds[0].members == rounds[1].members);
  CHECK(rounds[0].rank != rounds[1].rank);
  const std::string members = rounds[0].members;
  const auto comma = members.find(',');
  REQUIRE(comma != std::string::npos);
  CHECK(members.substr(0, comma) != members.substr(comma + 1));
}

TEST_CASE("a SIGKILLed launcher leaves no worker and nothing in /dev/shm, wrapped and escaped workers included") {
  temp_dir pids;
  launch l("sigkill", {"--nproc-per-node", "2"}, {worker, "wrap", "escape", pids.file("pid"), "wait"});
  std::vector<pid_t> workers;
  for (const char* kind : {"pid.", "pid.escaped."}) {
    for (int s = 0; s < 2; ++s) {
      REQUIRE(wait_for_file(pids.file(kind + std::to_string(s)), 20s));
      workers.push_back(read_pid(pids.file(kind + std::to_string(s))));
    }
  }
  REQUIRE(shm_names(l.run).size() == 2);  // its store and its watchdog segment
  l.proc.kill(SIGKILL);
  l.finish(10s);
  CHECK(eventually([&] { return std::all_of(workers.begin(), workers.end(), gone); }, 5s));
  CHECK(eventually([&] { return shm_names(l.run).empty(); }, 5s));
  for (pid_t p : workers) ::kill(p, SIGKILL);  // whatever the outcome, nothing lingers
}

TEST_CASE("a wrapped trainer keeps its grace after a notice even when its wrapper exits at once") {
  temp_dir pids;
  // The wrapper dies of the SIGTERM at once (a shell script that does not exec); the trainer
  // under it takes 1 s to checkpoint and must neither be killed for it nor lose its output.
  launch l("wrapgrace", {"--nproc-per-node", "1", "--grace", "20"}, {worker, "wrap", "term", "1000", pids.file("pid"), "none"});
  REQUIRE(wait_for_file(pids.file("pid.0"), 20s));
  const pid_t trainer = read_pid(pids.file("pid.0"));
  l.proc.kill(SIGTERM);
  REQUIRE(l.finish(30s) == 75);
  CHECK(contains(l.log(0), "terminating after 1 notices"));
  CHECK_FALSE(contains(l.log(0), "SIGKILL"));
  CHECK(gone(trainer));
}

TEST_CASE("a worker's leftovers die with it: a restarted worker never meets its previous life's children") {
  temp_dir pids;
  launch l("leftovers", {"--nproc-per-node", "1", "--max-restarts", "1"}, {worker, "orphan", pids.file("pid")});
  REQUIRE(l.finish() == 0);
  REQUIRE(wait_for_file(pids.file("pid.child.0"), 1s));
  const pid_t child = read_pid(pids.file("pid.child.0"));
  CHECK(eventually([&] { return gone(child); }, 5s));
  ::kill(child, SIGKILL);
}

TEST_CASE("what escaped a worker with setsid is killed when the run ends") {
  temp_dir pids;
  launch l("escaped", {"--nproc-per-node", "2"}, {worker, "escape", pids.file("pid"), "exit"});
  REQUIRE(l.finish() == 0);
  for (int s = 0; s < 2; ++s) {
    REQUIRE(wait_for_file(pids.file("pid.escaped." + std::to_string(s)), 1s));
    const pid_t escaped = read_pid(pids.file("pid.escaped." + std::to_string(s)));
    CHECK(eventually([&] { return gone(escaped); }, 5s));
    ::kill(escaped, SIGKILL);
  }
}

TEST_CASE("a launcher that fails at start removes what it made in /dev/shm") {
  temp_dir d;
  const std::string run = unique_run("failstart");
  SECTION("its watchdog segment cannot be made") {
    // A stranger's object where the launcher's watchdog segment goes (the name holds the
    // launcher's pid, which the shell keeps across exec): the watchdog refuses it.
    auto p = child_process::spawn({"/bin/sh", "-c",
                                   "printf junk > /dev/shm/elastic-timer.elastic-$1-$$; exec \"$0\" --run-id \"$1\" "
                                   "--log-dir \"$2\" -- \"$3\" env x 2>\"$2/err\"",
                                   ELASTIC_RUN_TOOL, run, d.path(), worker});
    CHECK(p.exit_code(20s) == 1);
    INFO(slurp(d.file("err")));
  }
  SECTION("its program cannot be started") {
    auto p = spawn_tool({"--run-id", run, "--log-dir", d.path(), "--", "/nonexistent/trainer"}, d.file("err"));
    CHECK(p.exit_code(20s) == 1);
  }
  CHECK(eventually([&] { return shm_names(run).empty(); }, 5s));
  for (const auto& n : shm_names(run)) ::unlink(("/dev/shm/" + n).c_str());
}

TEST_CASE("objects of dead launchers that nobody removed are swept by the next launcher") {
  const std::string stale = "elastic-timer.elastic-" + unique_run("stale") + "-4194305";
  {
    const int fd = ::open(("/dev/shm/" + stale).c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
    REQUIRE(fd >= 0);
    REQUIRE(::write(fd, "stale", 5) == 5);
    ::close(fd);
  }
  std::this_thread::sleep_for(2200ms);  // older than a creator that is about to map it could be
  launch l("sweeper", {"--nproc-per-node", "1"}, {worker, "crash-once"});
  REQUIRE(l.finish() == 0);
  CHECK_FALSE(std::filesystem::exists("/dev/shm/" + stale));
  ::unlink(("/dev/shm/" + stale).c_str());
}
