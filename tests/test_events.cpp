#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <elastic/events.hpp>

#include "support/catch.hpp"
#include "support/process.hpp"

namespace {

std::vector<std::string> lines_of(const std::string& path) {
  std::vector<std::string> out;
  std::ifstream in(path);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
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

TEST_CASE("a disabled log drops events without failing") {
  const elastic::event_log log;
  CHECK_FALSE(log.enabled());
  log.emit("nothing");
}

TEST_CASE("an events file that cannot be opened is a clear error") {
  CHECK_THROWS_AS(elastic::event_log::to_file("/nonexistent-dir/x/events.jsonl"), elastic::error);
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
