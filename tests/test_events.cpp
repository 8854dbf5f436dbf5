#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include <elastic/events.hpp>

#include "support/catch.hpp"
#include "support/errors.hpp"
#include "support/other_user.hpp"
#include "support/process.hpp"

namespace {

std::vector<std::string> lines_of(const std::string& path) {
  std::vector<std::string> out;
  std::ifstream in(path);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

std::string contents_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

/// Expects to_file(path) to throw elastic::error with `code` and a message naming `path` and
/// containing `text`.
void expect_refused(const std::string& path, elastic::errc code, const std::string& text) {
  const auto e = elastic::test::error_of([&] { (void)elastic::event_log::to_file(path); });
  INFO(e.what());
  CHECK(e.code() == code);
  CHECK(std::string(e.what()).find(path) != std::string::npos);
  CHECK(std::string(e.what()).find(text) != std::string::npos);
}

elastic::event_identity test_identity() {
  elastic::event_identity id;
  id.run_id = "run-42";
  id.host = "host-a";
  id.rank = 3;
  return id;
}

}  // namespace

TEST_CASE("an event is one JSON line with the common fields first") {
  const elastic::event_log log(std::make_shared<elastic::events::fd_sink>(-1), test_identity());
  const std::string line = log.format("watchdog_kill", {{"target_pid", 77}, {"scope", "allreduce"}, {"late_ms", 0.5}});
  CHECK(line.rfind("{\"ts\":\"", 0) == 0);
  CHECK(line.find("\",\"event\":\"watchdog_kill\",\"run_id\":\"run-42\",\"host\":\"host-a\",\"pid\":") != std::string::npos);
  CHECK(line.find(",\"rank\":3,\"target_pid\":77,\"scope\":\"allreduce\",\"late_ms\":0.5}") != std::string::npos);
  CHECK(line.find('\n') == std::string::npos);
  // RFC 3339 UTC with microseconds: 2026-11-22T20:28:00.123456Z
  const std::string ts = line.substr(7, 27);
  CHECK(ts.size() == 27);
  CHECK(ts[4] == '-');
  CHECK(ts[10] == 'T');
  CHECK(ts[19] == '.');
  CHECK(ts[26] == 'Z');
}

TEST_CASE("strings are escaped so every line stays valid JSON") {
  const elastic::event_log log(std::make_shared<elastic::events::fd_sink>(-1), test_identity());
  const std::string line = log.format("x", {{"msg", "a \"quoted\"\\ line\nwith\ttabs\x01"}});
  CHECK(line.find(R"("msg":"a \"quoted\"\\ line\nwith\ttabs\u0001")") != std::string::npos);
}

TEST_CASE("values of every kind are written as JSON") {
  const elastic::event_log log(std::make_shared<elastic::events::fd_sink>(-1), test_identity());
  const std::string line = log.format(
      "x", {{"t", true}, {"f", false}, {"n", nullptr}, {"u", 18446744073709551615ull}, {"i", -5}, {"nan", 0.0 / 0.0}});
  CHECK(line.find(R"("t":true,"f":false,"n":null,"u":18446744073709551615,"i":-5,"nan":null)") != std::string::npos);
}

TEST_CASE("a value already encoded as JSON is written as it is, and an empty one as null") {
  const elastic::event_log log(std::make_shared<elastic::events::fd_sink>(-1), test_identity());
  const std::string stacks = R"([{"tid":7,"frames":[{"pc":"0x1","line":null}]}])";
  const std::string line = log.format("x", {{"stacks", elastic::event_value::json(stacks)},
                                            {"empty", elastic::event_value::json("")},
                                            {"text", stacks}});
  CHECK(line.find(R"("stacks":[{"tid":7,"frames":[{"pc":"0x1","line":null}]}],"empty":null,)") != std::string::npos);
  CHECK(line.find(R"("text":"[{\"tid\":7,)") != std::string::npos);  // a plain string stays a string
}

TEST_CASE("a disabled log drops events without failing") {
  const elastic::event_log log;
  CHECK_FALSE(log.enabled());
  log.emit("nothing");
}

TEST_CASE("an events file that cannot be opened is a clear error") {
  CHECK_THROWS_AS(elastic::event_log::to_file("/nonexistent-dir/x/events.jsonl"), elastic::error);
}

TEST_CASE("an events path that is a symbolic link is refused and its target is left untouched") {
  elastic::test::temp_dir dir;
  const std::string target = dir.file("precious"), link = dir.file("events.jsonl");
  write_file(target, "do not touch\n");
  REQUIRE(::symlink(target.c_str(), link.c_str()) == 0);
  expect_refused(link, elastic::errc::unsafe_path, "it is a symbolic link");
  CHECK(contents_of(target) == "do not touch\n");
  // A dangling link is refused too, and nothing is created where it points.
  const std::string dangling = dir.file("dangling.jsonl"), nowhere = dir.file("created-through-a-link");
  REQUIRE(::symlink(nowhere.c_str(), dangling.c_str()) == 0);
  expect_refused(dangling, elastic::errc::unsafe_path, "it is a symbolic link");
  CHECK_FALSE(std::filesystem::exists(nowhere));
}

TEST_CASE("an events file with a second hard link is refused and left untouched") {
  elastic::test::temp_dir dir;
  const std::string target = dir.file("precious"), link = dir.file("events.jsonl");
  write_file(target, "do not touch\n");
  REQUIRE(::link(target.c_str(), link.c_str()) == 0);
  expect_refused(link, elastic::errc::unsafe_path, "it has 2 names (a hard link to another file)");
  CHECK(contents_of(target) == "do not touch\n");
}

TEST_CASE("an events file of another user is refused and left untouched") {
  const auto other = elastic::test::require_other_user();
  elastic::test::temp_dir dir;
  const std::string path = dir.file("events.jsonl");
  write_file(path, "theirs\n");
  REQUIRE(::chown(path.c_str(), other.uid, other.gid) == 0);
  expect_refused(path, elastic::errc::unsafe_path, "belongs to uid " + std::to_string(other.uid));
  CHECK(contents_of(path) == "theirs\n");
}

TEST_CASE("a symbolic link of another user on the way to the events file is refused") {
  const auto other = elastic::test::require_other_user();
  elastic::test::temp_dir dir;
  const std::string real = dir.file("real"), planted = dir.file("planted");
  std::filesystem::create_directory(real);
  REQUIRE(::symlink(real.c_str(), planted.c_str()) == 0);
  REQUIRE(::lchown(planted.c_str(), other.uid, other.gid) == 0);
  expect_refused(planted + "/events.jsonl", elastic::errc::unsafe_path, "is a symbolic link of uid " + std::to_string(other.uid));
  CHECK_FALSE(std::filesystem::exists(real + "/events.jsonl"));
}

TEST_CASE("a FIFO in the events file's place is refused at once instead of blocking") {
  elastic::test::temp_dir dir;
  const std::string fifo = dir.file("events.jsonl");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  // In a child, so that an open that blocks (nobody reads the FIFO) cannot hang the test.
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    try {
      (void)elastic::event_log::to_file(fifo);
    } catch (const elastic::error& e) {
      const bool ok = e.code() == elastic::errc::unsafe_path && std::string(e.what()).find(fifo) != std::string::npos &&
                      std::string(e.what()).find("FIFO") != std::string::npos;
      std::_Exit(ok ? 0 : 2);
    }
    std::_Exit(1);
  }
  int st = 0;
  pid_t r = 0;
  for (int i = 0; i < 10000 && (r = ::waitpid(pid, &st, WNOHANG)) == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (r == 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &st, 0);
    FAIL("opening a FIFO as the events file blocked");
  }
  REQUIRE(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 0);
}

TEST_CASE("an events path that is a directory is refused with a hint, and ELASTIC_EVENTS is named") {
  elastic::test::temp_dir dir;
  expect_refused(dir.path(), elastic::errc::invalid_argument, "is a directory: name a file in it");
  ::setenv("ELASTIC_EVENTS", dir.path().c_str(), 1);
  const auto e = elastic::test::error_of([] { (void)elastic::event_log::from_env(); });
  ::unsetenv("ELASTIC_EVENTS");
  INFO(e.what());
  CHECK(e.code() == elastic::errc::invalid_argument);
  CHECK(std::string(e.what()).find("ELASTIC_EVENTS file " + dir.path() + " is a directory") != std::string::npos);
}

TEST_CASE("an events file of our own is appended to, not truncated") {
  elastic::test::temp_dir dir;
  const std::string path = dir.file("events.jsonl");
  write_file(path, "{\"earlier\":1}\n");
  elastic::event_log::to_file(path, test_identity()).emit("later");
  const auto lines = lines_of(path);
  REQUIRE(lines.size() == 2);
  CHECK(lines[0] == "{\"earlier\":1}");
  CHECK(lines[1].find("\"event\":\"later\"") != std::string::npos);
}

TEST_CASE("an events log writes to a descriptor it was handed and closes it with its last copy") {
  elastic::test::temp_dir dir;
  const std::string path = dir.file("events.jsonl");
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
  REQUIRE(fd >= 0);
  {
    const auto log = elastic::event_log::to_file(elastic::internal::unique_fd(fd), test_identity());
    const auto copy = log;
    log.emit("first");
    copy.emit("second");
  }
  CHECK(::fcntl(fd, F_GETFD) == -1);  // closed
  const auto lines = lines_of(path);
  REQUIRE(lines.size() == 2);
  CHECK(lines[1].find("\"event\":\"second\"") != std::string::npos);
  CHECK(elastic::test::error_of([] { (void)elastic::event_log::to_file(elastic::internal::unique_fd()); }).code() ==
        elastic::errc::invalid_argument);
}

TEST_CASE("lines from many processes and threads never interleave") {
  elastic::test::temp_dir dir;
  const std::string path = dir.file("events.jsonl");
  constexpr int processes = 4, threads = 4, per_thread = 200;
  std::vector<pid_t> kids;
  for (int p = 0; p < processes; ++p) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      // No threads exist yet in the test's child (Catch2 runs single-threaded), so starting
      // threads here is safe.
      const auto log = elastic::event_log::to_file(path, test_identity());
      std::vector<std::thread> ts;
      for (int t = 0; t < threads; ++t) {
        ts.emplace_back([&, t] {
          const std::string pad(300, static_cast<char>('a' + t));
          for (int i = 0; i < per_thread; ++i) log.emit("line", {{"thread", t}, {"i", i}, {"pad", pad}});
        });
      }
      for (auto& t : ts) t.join();
      std::_Exit(0);
    }
    kids.push_back(pid);
  }
  for (pid_t pid : kids) {
    int st = 0;
    ::waitpid(pid, &st, 0);
    REQUIRE(WIFEXITED(st));
  }
  const auto lines = lines_of(path);
  REQUIRE(lines.size() == processes * threads * per_thread);
  for (const auto& l : lines) {
    REQUIRE(l.front() == '{');
    REQUIRE(l.back() == '}');
    REQUIRE(l.find("{", 1) == std::string::npos);
  }
}

TEST_CASE("the identity comes from the worker environment") {
  ::setenv("ELASTIC_RUN_ID", "from-env", 1);
  ::setenv("ELASTIC_RANK", "5", 1);
  const auto id = elastic::event_identity::from_env();
  CHECK(id.run_id == "from-env");
  REQUIRE(id.rank.has_value());
  CHECK(*id.rank == 5);
  CHECK_FALSE(id.host.empty());
  ::setenv("ELASTIC_RANK", "five", 1);
  CHECK_FALSE(elastic::event_identity::from_env().rank.has_value());
  ::unsetenv("ELASTIC_RUN_ID");
  ::unsetenv("ELASTIC_RANK");
}

TEST_CASE("without ELASTIC_EVENTS only warnings reach stderr, and the standalone watchdog keeps every event") {
  using elastic::events::is_warning;
  for (const char* w : {"watchdog_kill", "watchdog_kill_failed", "checkpoint_failed", "checkpoint_skipped",
                        "checkpoint_quarantined", "rendezvous_timeout", "group_failure", "timer_unwatched",
                        "launcher_crash_loop", "worker_grace_exceeded", "rendezvous_departure"}) {
    INFO(w);
    CHECK(is_warning(w));
  }
  for (const char* p : {"loop_start", "loop_end", "checkpoint_commit", "checkpoint_policy", "group_rebuilt",
                        "rendezvous_join", "watchdog_start", "worker_start"}) {
    INFO(p);
    CHECK_FALSE(is_warning(p));
  }
  elastic::test::temp_dir dir;
  const std::string out = dir.file("stderr");
  ::unsetenv("ELASTIC_EVENTS");
  // stderr into a file while the two logs write, then back.
  const int saved = ::dup(STDERR_FILENO);
  REQUIRE(saved >= 0);
  const int file = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  REQUIRE(file >= 0);
  ::dup2(file, STDERR_FILENO);
  ::close(file);
  const auto standalone = elastic::event_log::from_env();
  standalone.emit("loop_start", {{"step", 0}});
  standalone.emit("checkpoint_failed", {{"step", 5}});
  const auto everything = elastic::event_log::from_env(true);
  everything.emit("watchdog_start", {{"segment", "w"}});
  ::dup2(saved, STDERR_FILENO);
  ::close(saved);
  std::ifstream in(out);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(text.find("\"event\":\"loop_start\"") == std::string::npos);
  CHECK(text.find("\"event\":\"checkpoint_failed\"") != std::string::npos);
  CHECK(text.find("\"event\":\"watchdog_start\"") != std::string::npos);
}
