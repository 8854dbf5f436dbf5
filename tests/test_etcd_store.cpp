// The etcd:// store against a real etcd (tests/support/etcd_server.hpp starts one per test):
// the store operations, races between processes, leases that expire, etcd killed and brought
// back, dead endpoints, replies that are not etcd's, authentication and TLS.
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <elastic/rendezvous/etcd_store.hpp>
#include <elastic/rendezvous/store_url.hpp>

#include "support/catch.hpp"
#include "support/errors.hpp"
#include "support/eventually.hpp"
#include "support/etcd_server.hpp"
#include "support/process.hpp"
#include "support/store_contract.hpp"

#ifndef ELASTIC_OPENSSL_TOOL
#define ELASTIC_OPENSSL_TOOL ""
#endif

using namespace std::chrono_literals;
using elastic::errc;
using elastic::test::error_of;
using elastic::test::eventually;
using elastic::test::etcd_server;
using elastic::test::fork_child;
namespace rdzv = elastic::rendezvous;
using clock_type = std::chrono::steady_clock;

namespace {

/// Options for tests: every wait bounded well inside the test's own timeout.
rdzv::etcd_options test_options(std::chrono::milliseconds unavailable = 10s) {
  rdzv::etcd_options o;
  o.prefix = "/test/";
  o.request_timeout = 3s;
  o.connect_timeout = 1s;
  o.unavailable_timeout = unavailable;
  return o;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

/// The exit code of `pid`, or -1 if it did not exit normally.
int exit_code_of(pid_t pid) {
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}


/// An HTTP server on 127.0.0.1 that answers every request with `reply`: a stand-in for a port
/// where something other than etcd listens.
class fake_http_server {
 public:
  explicit fake_http_server(std::string reply) : reply_(std::move(reply)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(fd_, 16) == 0);
    REQUIRE(::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    port_ = ntohs(a.sin_port);
    thread_ = std::jthread([this](std::stop_token stop) { serve(stop); });
  }
  ~fake_http_server() {
    thread_.request_stop();
    thread_.join();
    ::close(fd_);
  }
  [[nodiscard]] std::string endpoint() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  void serve(const std::stop_token& stop) {
    while (!stop.stop_requested()) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      // Read the request (headers, then Content-Length bytes of body), answer, hang up.
      std::string req;
      char buf[4096];
      for (;;) {
        pollfd q{c, POLLIN, 0};
        if (::poll(&q, 1, 2000) <= 0) break;
        const ssize_t n = ::read(c, buf, sizeof buf);
        if (n <= 0) break;
        req.append(buf, static_cast<std::size_t>(n));
        const auto end = req.find("\r\n\r\n");
        if (end == std::string::npos) continue;
        std::size_t length = 0;
        if (const auto cl = req.find("Content-Length: "); cl != std::string::npos) {
          length = std::stoul(req.substr(cl + 16));
        }
        if (req.size() >= end + 4 + length) break;
      }
      std::size_t off = 0;
      while (off < reply_.size()) {
        const ssize_t n = ::write(c, reply_.data() + off, reply_.size() - off);
        if (n <= 0) break;
        off += static_cast<std::size_t>(n);
      }
      ::close(c);
    }
  }

  std::string reply_;
  int fd_ = -1;
  std::uint16_t port_ = 0;
  std::jthread thread_;
};

std::string http_reply(int status, const std::string& reason, const std::string& body) {
  return "HTTP/1.1 " + std::to_string(status) + " " + reason + "\r\nContent-Type: text/plain\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
}

}  // namespace

TEST_CASE("prefix ends are what etcd expects") {
  CHECK(rdzv::detail::prefix_end("run/") == "run0");
  CHECK(rdzv::detail::prefix_end("a\xff\xff") == "b");
  CHECK(rdzv::detail::prefix_end("\xff") == std::string(1, '\0'));
  CHECK(rdzv::detail::prefix_end("") == std::string(1, '\0'));
}

TEST_CASE("bad URLs and options are refused before any request") {
  CHECK(error_of([] { rdzv::etcd_store s("shm://job"); }).code() == errc::invalid_argument);
  CHECK(error_of([] { rdzv::etcd_store s("etcd://host"); }).code() == errc::invalid_argument);
  auto o = test_options();
  o.ca_file = "/etc/hostname";
  const auto plain = error_of([&] { rdzv::etcd_store s("etcd://127.0.0.1:1", o); });
  CHECK(plain.code() == errc::invalid_argument);
  CHECK(contains(plain.what(), "etcds://"));
  o.ca_file = "/nonexistent/ca.pem";
  const auto missing = error_of([&] { rdzv::etcd_store s("etcds://127.0.0.1:1", o); });
  CHECK(missing.code() == errc::not_found);
  CHECK(contains(missing.what(), "/nonexistent/ca.pem"));
  o = test_options();
  o.cert_file = "/etc/hostname";
  CHECK(error_of([&] { rdzv::etcd_store s("etcds://127.0.0.1:1", o); }).code() == errc::invalid_argument);
  o = test_options();
  o.request_timeout = 0ms;
  CHECK(error_of([&] { rdzv::etcd_store s("etcd://127.0.0.1:1", o); }).code() == errc::invalid_argument);
  o = test_options();
  o.password = "secret";
  CHECK(error_of([&] { rdzv::etcd_store s("etcd://127.0.0.1:1", o); }).code() == errc::invalid_argument);
}

TEST_CASE("a watch reports the range's keys, then each put and erasure in it, a lapsed lease's too") {
  etcd_server etcd;
  rdzv::etcd_store s(etcd.url(), test_options());
  elastic::test::check_feed_behaviour(s);
}

TEST_CASE("a watch asks etcd nothing while its range is quiet and loses nothing when etcd restarts") {
  etcd_server etcd;
  rdzv::etcd_store s(etcd.url(), test_options(30s));
  rdzv::etcd_store other(etcd.url(), test_options(30s));
  using mirror = elastic::test::feed_copy;
  other.set("w/a", "1");
  auto feed = s.watch("w/", "w0");
  auto m = elastic::test::follow_feed(*feed, {}, [](const mirror& x) { return x.contains("w/a"); }, 5s);
  REQUIRE(m.contains("w/a"));
  // A key that arrives through the stream: it is open. From here, quiet: a second of waiting,
  // with writes outside the range, costs this client no request.
  other.set("w/a", "1.");
  m = elastic::test::follow_feed(*feed, m, [](const mirror& x) { return x.at("w/a") == "1."; }, 5s);
  other.set("w/a", "1");
  m = elastic::test::follow_feed(*feed, m, [](const mirror& x) { return x.at("w/a") == "1"; }, 5s);
  const auto before = s.requests();
  other.set("x/elsewhere", "1");
  CHECK_FALSE(feed->wait(1s));
  CHECK(s.requests() == before);
  // etcd dies and comes back: what changed after is delivered, and the stream is back.
  etcd.kill();
  etcd.restart();
  other.set("w/b", "2");
  m = elastic::test::follow_feed(*feed, m, [](const mirror& x) { return x.contains("w/b"); }, 20s);
  CHECK(m == mirror{{"w/a", "1"}, {"w/b", "2"}});
  other.erase("w/a");
  m = elastic::test::follow_feed(*feed, m, [](const mirror& x) { return !x.contains("w/a"); }, 10s);
  CHECK(m == mirror{{"w/b", "2"}});
  // Destroying a feed whose stream is idle ends its thread (the test's timeout bounds it).
  feed.reset();
}

TEST_CASE("a watch opened while its range is written misses nothing and replays nothing") {
  // The feed watches from "now" and reads the range at the revision etcd says the watch began
  // after: a write between the two must come exactly once, by one way or the other.
  etcd_server etcd;
  rdzv::etcd_store s(etcd.url(), test_options(30s));
  rdzv::etcd_store writer_store(etcd.url(), test_options(30s));
  constexpr int writes = 300;
  std::atomic<bool> done{false};
  std::jthread writer([&] {
    for (int i = 1; i <= writes; ++i) {
      writer_store.set("w/count", std::to_string(i));
      writer_store.set("w/k" + std::to_string(i), "v");
      if (i > 5) writer_store.erase("w/k" + std::to_string(i - 5));
    }
    done = true;
  });
  // Feeds opened at moments spread over the writes (each stays open), then each followed to
  // the end.
  std::vector<std::unique_ptr<rdzv::key_feed>> feeds;
  while (!done && feeds.size() < 40) {
    feeds.push_back(s.watch("w/", "w0"));
    std::this_thread::sleep_for(5ms);
  }
  writer.join();
  feeds.push_back(s.watch("w/", "w0"));  // and one after the last write
  elastic::test::feed_copy now;
  for (auto& [k, v] : s.list("w/")) now.insert_or_assign(k, v);
  for (std::size_t i = 0; i < feeds.size(); ++i) {
    elastic::test::feed_copy m;
    long last = 0;  // the counter as this feed reported it: it only ever goes up
    const auto until = clock_type::now() + 20s;
    while (last != writes) {
      bool reset = false;
      for (auto& e : feeds[i]->take(reset)) {
        REQUIRE_FALSE(reset);
        if (!e.value) {
          m.erase(e.key);
          continue;
        }
        if (e.key == "w/count") {
          const long at = std::stol(*e.value);
          INFO("feed " << i << " of " << feeds.size() << ": w/count went from " << last << " to " << at);
          CHECK(at > last);
          last = at;
        }
        m.insert_or_assign(e.key, *e.value);
      }
      REQUIRE(clock_type::now() < until);
      if (last != writes) feeds[i]->wait(50ms);
    }
    INFO("feed " << i << " of " << feeds.size());
    CHECK(m == now);  // every change in, none twice: the copy is what the store holds
  }
  CHECK(feeds.size() >= 3);
}

TEST_CASE("a watch on an etcd that is down fails as a read does, naming the endpoint") {
  etcd_server etcd;
  rdzv::etcd_store s(etcd.url(), test_options(1s));
  etcd.kill();
  const auto t0 = clock_type::now();
  const auto e = error_of([&] { auto feed = s.watch("w/", "w0"); });
  CHECK(clock_type::now() - t0 < 10s);
  CHECK(e.code() == errc::unavailable);
  INFO(e.what());
  CHECK(contains(e.what(), etcd.endpoint()));
}

TEST_CASE("set, get, erase, list and compare_set behave like a map") {
  etcd_server etcd;
  rdzv::etcd_store s(etcd.url(), test_options());
  elastic::test::check_map_behaviour(s);

  SECTION("an empty expected value matches an empty value, not an absent key") {
    std::optional<std::string> actual = "stale";
    CHECK_FALSE(s.compare_set("empty", std::string_view(""), "x", 0, &actual));
    CHECK_FALSE(actual);
    s.set("empty", "");
    CHECK(s.compare_set("empty", std::string_view(""), "x"));
    CHECK(s.get("empty") == "x");
  }
  SECTION("keys and values are bytes, any bytes") {
    std::string all;
    for (int c = 0; c < 256; ++c) all += static_cast<char>(c);
    const std::string key = std::string("bin/\0\xff", 6);
    s.set(key, all);
    CHECK(s.get(key) == all);
    CHECK(s.list("bin/") == std::vector<std::pair<std::string, std::string>>{{key, all}});
    s.set(std::string(1, '\xff'), "top");
    CHECK(s.list("\xff") == std::vector<std::pair<std::string, std::string>>{{std::string(1, '\xff'), "top"}});
  }
  SECTION("the prefix keeps stores apart, and list('') lists this prefix only") {
    auto o = test_options();
    o.prefix = "/other-job/";
    rdzv::etcd_store t(etcd.url(), o);
    CHECK_FALSE(t.get("leader"));
    t.set("leader", "them");
    CHECK(s.get("leader") == "rank-1");
    CHECK(t.list("") == std::vector<std::pair<std::string, std::string>>{{"leader", "them"}});
    CHECK(s.list("") == std::vector<std::pair<std::string, std::string>>{
                            {"leader", "rank-1"}, {"other", ""}, {"run/b", std::string(1000, 'x')}});
    o.prefix = "";  // no namespace: the whole keyspace
    rdzv::etcd_store all(etcd.url(), o);
    CHECK(all.list("").size() == 4);
    CHECK(all.get("/test/leader") == "rank-1");
    CHECK(all.list("/other-job/") == std::vector<std::pair<std::string, std::string>>{{"/other-job/leader", "them"}});
  }
  SECTION("add counts, and refuses a value that is not an integer") {
    CHECK(s.add("count", 5) == 5);
    CHECK(s.add("count", -7) == -2);
    CHECK(s.get("count") == "-2");
    s.set("word", "hello");
    const auto e = error_of([&] { s.add("word", 1); });
    CHECK(e.code() == errc::invalid_argument);
    CHECK(contains(e.what(), "not an integer"));
    CHECK(error_of([&] { s.set("", "v"); }).code() == errc::invalid_argument);
  }
}

TEST_CASE("a batch of writes is one transaction that does what each write would, and one on an ended lease fails alone") {
  etcd_server etcd;
  rdzv::etcd_store s(etcd.url(), test_options());
  const auto before = s.requests();
  std::vector<rdzv::write_request> batch;
  for (int i = 0; i < 40; ++i) {
    batch.push_back({rdzv::write_request::kind::compare_set, "one/" + std::to_string(i), std::nullopt, "v", 0});
  }
  const auto r = s.apply(batch);
  CHECK(s.requests() - before == 1);
  CHECK(std::all_of(r.begin(), r.end(), [](const auto& x) { return x.done; }));
  elastic::test::check_batch_behaviour(s);
}

TEST_CASE("add is atomic across processes") {
  etcd_server etcd;
  rdzv::etcd_store s(etcd.url(), test_options());
  std::vector<pid_t> kids;
  for (int p = 0; p < 4; ++p) {
    kids.push_back(fork_child([&] {
      rdzv::etcd_store c(etcd.url(), test_options());
      for (int i = 0; i < 50; ++i) c.add("count", 1);
      return 0;
    }));
  }
  for (pid_t pid : kids) CHECK(exit_code_of(pid) == 0);
  CHECK(s.add("count", 0) == 200);
}

TEST_CASE("compare_set races between processes elect exactly one winner") {
  etcd_server etcd;
  rdzv::etcd_store s(etcd.url(), test_options());
  for (int round = 0; round < 3; ++round) {
    const std::string key = "leader/" + std::to_string(round), go = "go/" + std::to_string(round);
    std::vector<pid_t> kids;
    for (int p = 0; p < 6; ++p) {
      kids.push_back(fork_child([&, p] {
        rdzv::etcd_store c(etcd.url(), test_options());
        const std::vector<std::string> start{go};
        c.wait(start, 20s);  // all race from the same moment
        std::optional<std::string> actual;
        if (c.compare_set(key, std::nullopt, "rank-" + std::to_string(p), 0, &actual)) return 0;
        return actual && actual->starts_with("rank-") ? 1 : 2;  // lost, and saw the winner
      }));
    }
    std::this_thread::sleep_for(200ms);
    s.set(go, "1");
    int winners = 0, losers = 0;
    std::string winner;
    for (std::size_t p = 0; p < kids.size(); ++p) {
      const int code = exit_code_of(kids[p]);
      if (code == 0) {
        ++winners;
        winner = "rank-" + std::to_string(p);
      }
      if (code == 1) ++losers;
    }
    CHECK(winners == 1);
    CHECK(losers == 5);
    CHECK(s.get(key) == winner);
  }
}

TEST_CASE("wait returns when another process sets the keys, and times out naming the missing ones") {
  etcd_server etcd;
  rdzv::etcd_store s(etcd.url(), test_options());
  const pid_t pid = fork_child([&] {
    rdzv::etcd_store c(etcd.url(), test_options());
    std::this_thread::sleep_for(200ms);
    c.set("k1", "a");
    std::this_thread::sleep_for(200ms);
    c.set("k2", "b");
    return 0;
  });
  const std::vector<std::string> keys{"k1", "k2"};
  const auto t0 = clock_type::now();
  s.wait(keys, 10s);
  CHECK(clock_type::now() - t0 < 5s);
  CHECK(s.get("k2", 1s) == "b");
  CHECK(exit_code_of(pid) == 0);
  const std::vector<std::string> absent{"k1", "nope"};
  const auto t1 = clock_type::now();
  const auto e = error_of([&] { s.wait(absent, 300ms); });
  CHECK(clock_type::now() - t1 < 2s);
  CHECK(e.code() == errc::timeout);
  CHECK(contains(e.what(), "'nope'"));
  CHECK_FALSE(contains(e.what(), "'k1'"));
}

TEST_CASE("a long wait in one thread does not hold up calls in another") {
  etcd_server etcd;
  rdzv::etcd_store s(etcd.url(), test_options());
  const auto lease = s.grant(1s);
  std::string failure;
  {
    std::jthread waiter([&] {
      try {
        const std::vector<std::string> keys{"never"};
        s.wait(keys, 2s);
      } catch (const elastic::error& e) {
        if (e.code() != errc::timeout) failure = e.what();
      }
    });
    std::this_thread::sleep_for(100ms);
    const auto t0 = clock_type::now();
    for (int i = 0; i < 10; ++i) {
      s.keep_alive(lease);  // the heartbeat a member sends while it waits for the others
      s.set("beat", std::to_string(i));
    }
    CHECK(clock_type::now() - t0 < 1s);
  }
  INFO(failure);
  CHECK(failure.empty());
}

TEST_CASE("leased keys vanish when their owner stops heartbeating") {
  etcd_server etcd;
  rdzv::etcd_store s(etcd.url(), test_options());
  CHECK(error_of([&] { s.grant(0ms); }).code() == errc::invalid_argument);
  // 300 ms rounds up to 1 s, the shortest lease this etcd grants (see etcd_server).
  const auto lease = s.grant(300ms);
  s.set("alive/0", "x", lease);
  for (int i = 0; i < 6; ++i) {  // 1.8 s: longer than the lease, kept alive
    std::this_thread::sleep_for(300ms);
    s.keep_alive(lease);
    CHECK(s.get("alive/0"));
  }
  const auto stopped = clock_type::now();
  CHECK(eventually([&] { return !s.get("alive/0"); }, 5s, 50ms));
  CHECK(clock_type::now() - stopped >= 500ms);
  const auto e = error_of([&] { s.keep_alive(lease); });
  CHECK(e.code() == errc::not_found);
  CHECK(contains(e.what(), "expired"));
  CHECK(error_of([&] { s.set("late", "x", lease); }).code() == errc::not_found);
  CHECK(error_of([&] { s.compare_set("late", std::nullopt, "x", lease); }).code() == errc::not_found);
  CHECK_FALSE(s.get("late"));
  const auto l2 = s.grant(10s);
  s.set("alive/1", "y", l2);
  CHECK(s.compare_set("alive/2", std::nullopt, "z", l2));
  s.revoke(l2);
  CHECK_FALSE(s.get("alive/1"));
  CHECK_FALSE(s.get("alive/2"));
  s.revoke(l2);  // already gone: nothing to do
}

TEST_CASE("a lease of a process that was SIGKILLed expires and its keys go") {
  etcd_server etcd;
  rdzv::etcd_store s(etcd.url(), test_options());
  const pid_t pid = ::fork();
  if (pid == 0) {
    try {
      rdzv::etcd_store c(etcd.url(), test_options());
      c.set("member/7", "here", c.grant(1s));
    } catch (...) {
      std::_Exit(99);
    }
    ::raise(SIGKILL);
  }
  int st = 0;
  ::waitpid(pid, &st, 0);
  REQUIRE(WIFSIGNALED(st));
  CHECK(s.get("member/7") == "here");
  CHECK(eventually([&] { return !s.get("member/7"); }, 5s, 50ms));
}

TEST_CASE("a call made while etcd is down succeeds once etcd is back within unavailable_timeout") {
  etcd_server etcd;
  rdzv::etcd_store s(etcd.url(), test_options(20s));
  s.set("before", "1");
  const auto lease = s.grant(10s);
  s.set("member/0", "alive", lease);
  etcd.kill();
  std::atomic<bool> done{false};
  std::string failure;
  auto t0 = clock_type::now();
  std::chrono::milliseconds took{};
  {
    // etcd is restarted from this thread: its death signal is tied to the thread that forked it.
    std::jthread during([&] {
      try {
        s.set("during", "2");
      } catch (const std::exception& e) {
        failure = e.what();
      }
      took = std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - t0);
      done = true;
    });
    std::this_thread::sleep_for(1500ms);
    CHECK_FALSE(done);
    etcd.restart();
  }
  INFO(failure);
  CHECK(failure.empty());
  CHECK(took >= 1400ms);
  CHECK(took < 15s);
  CHECK(s.get("before") == "1");
  CHECK(s.get("during") == "2");
  s.keep_alive(lease);  // etcd renews leases when it comes back
  CHECK(s.get("member/0") == "alive");
}

TEST_CASE("a wait spanning an etcd outage returns when the keys appear after it") {
  etcd_server etcd;
  rdzv::etcd_store s(etcd.url(), test_options(20s));
  std::string failure;
  std::atomic<bool> done{false};
  {
    std::jthread waiter([&] {
      try {
        const std::vector<std::string> keys{"round/1/ready"};
        s.wait(keys, 30s);
      } catch (const std::exception& e) {
        failure = e.what();
      }
      done = true;
    });
    std::this_thread::sleep_for(300ms);  // the waiter is watching now
    etcd.kill();
    std::this_thread::sleep_for(1s);
    etcd.restart();
    rdzv::etcd_store other(etcd.url(), test_options());
    other.set("round/1/ready", "yes");
    CHECK(eventually([&] { return done.load(); }, 10s, 50ms));
  }
  INFO(failure);
  CHECK(failure.empty());
}

TEST_CASE("with etcd down longer than unavailable_timeout a call fails naming the endpoint") {
  etcd_server etcd;
  rdzv::etcd_store s(etcd.url(), test_options(1s));
  s.set("k", "v");
  etcd.kill();
  const auto t0 = clock_type::now();
  const auto e = error_of([&] { s.set("k", "w"); });
  const auto took = clock_type::now() - t0;
  CHECK(took >= 1s);
  CHECK(took < 4s);
  CHECK(e.code() == errc::unavailable);
  INFO(e.what());
  CHECK(contains(e.what(), etcd.endpoint()));
  CHECK(contains(e.what(), "unavailable_timeout"));
  CHECK(contains(e.what(), "onnect"));  // curl's words: "Couldn't connect", "Connection refused"

  // A batch of 150 writes (three transactions) waits the timeout once, not once per transaction,
  // and every write carries the reason.
  std::vector<rdzv::write_request> batch;
  for (int i = 0; i < 150; ++i) batch.push_back(rdzv::write_request::setting("b/" + std::to_string(i), "v"));
  const auto t1 = clock_type::now();
  const auto r = s.apply(batch);
  CHECK(clock_type::now() - t1 < 4s);
  REQUIRE(r.size() == batch.size());
  for (const auto& w : r) {
    REQUIRE(w.failure);
    try {
      std::rethrow_exception(w.failure);
    } catch (const elastic::error& f) {
      CHECK(f.code() == errc::unavailable);
    }
  }
}

TEST_CASE("a wait with etcd down gives up at its own timeout") {
  etcd_server etcd;
  rdzv::etcd_store s(etcd.url(), test_options(10s));
  etcd.kill();
  const std::vector<std::string> keys{"k"};
  const auto t0 = clock_type::now();
  const auto e = error_of([&] { s.wait(keys, 500ms); });
  CHECK(clock_type::now() - t0 < 3s);
  CHECK(e.code() == errc::timeout);
  CHECK(contains(e.what(), etcd.endpoint()));
}

TEST_CASE("a dead endpoint in the URL is skipped") {
  etcd_server etcd;
  const std::string dead = "127.0.0.1:" + std::to_string(elastic::test::free_port());
  for (const auto& url : {"etcd://" + dead + "," + etcd.endpoint(), "etcd://" + etcd.endpoint() + "," + dead}) {
    INFO(url);
    rdzv::etcd_store s(url, test_options());
    const auto t0 = clock_type::now();
    for (int i = 0; i < 10; ++i) s.set("k" + std::to_string(i), "v");
    CHECK(s.list("k").size() == 10);
    const std::vector<std::string> keys{"k9"};
    s.wait(keys, 2s);
    CHECK(clock_type::now() - t0 < 3s);
  }
}

TEST_CASE("a server that is not etcd gets a clear error") {
  SECTION("a reply that is not JSON") {
    fake_http_server fake(http_reply(200, "OK", "hello"));
    rdzv::etcd_store s("etcd://" + fake.endpoint(), test_options());
    const auto e = error_of([&] { (void)s.get("k"); });
    CHECK(e.code() == errc::corrupt);
    CHECK(contains(e.what(), "not JSON"));
    CHECK(contains(e.what(), fake.endpoint()));
    CHECK(contains(e.what(), "hello"));
  }
  SECTION("no gateway at /v3") {
    fake_http_server fake(http_reply(404, "Not Found", "404 page not found"));
    rdzv::etcd_store s("etcd://" + fake.endpoint(), test_options());
    const auto e = error_of([&] { s.set("k", "v"); });
    CHECK(e.code() == errc::version_mismatch);
    CHECK(contains(e.what(), "3.4"));
  }
  SECTION("JSON that is not what etcd sends") {
    fake_http_server fake(http_reply(200, "OK", R"({"kvs":[{"key":"aw==","value":"not base64!"}]})"));
    rdzv::etcd_store s("etcd://" + fake.endpoint(), test_options());
    const auto e = error_of([&] { (void)s.get("k"); });
    CHECK(e.code() == errc::corrupt);
    CHECK(contains(e.what(), "cannot read"));
  }
  SECTION("a server error is retried until unavailable_timeout") {
    fake_http_server fake(http_reply(503, "Service Unavailable", "busy"));
    rdzv::etcd_store s("etcd://" + fake.endpoint(), test_options(500ms));
    const auto e = error_of([&] { (void)s.get("k"); });
    CHECK(e.code() == errc::unavailable);
    CHECK(contains(e.what(), "HTTP 503"));
  }
}

TEST_CASE("with authentication on, the right password works and a wrong one is refused") {
  etcd_server etcd;
  REQUIRE(contains(etcd.post("/v3/auth/user/add", R"({"name":"root","password":"sesame"})"), "header"));
  REQUIRE(contains(etcd.post("/v3/auth/user/grant", R"({"user":"root","role":"root"})"), "header"));
  REQUIRE(contains(etcd.post("/v3/auth/enable", "{}"), "header"));
  auto o = test_options();
  o.user = "root";
  o.password = "sesame";
  rdzv::etcd_store s(etcd.url(), o);
  s.set("k", "v");
  CHECK(s.get("k") == "v");
  CHECK(s.add("n", 2) == 2);
  CHECK(s.compare_set("c", std::nullopt, "1"));
  s.keep_alive(s.grant(5s));
  const std::vector<std::string> keys{"w"};
  std::jthread setter([&] {
    std::this_thread::sleep_for(200ms);
    rdzv::etcd_store t(etcd.url(), o);
    t.set("w", "x");
  });
  s.wait(keys, 5s);  // the watch carries the token too

  o.password = "wrong";
  const auto wrong = error_of([&] { rdzv::etcd_store bad(etcd.url(), o); });
  CHECK(wrong.code() == errc::invalid_argument);
  CHECK(contains(wrong.what(), "'root'"));
  CHECK(contains(wrong.what(), "authentication failed"));
  rdzv::etcd_store anonymous(etcd.url(), test_options());
  const auto none = error_of([&] { (void)anonymous.get("k"); });
  CHECK(none.code() == errc::invalid_argument);
  CHECK(contains(none.what(), "etcd_options::user"));

  // A restart forgets every token: the store signs in again by itself.
  etcd.stop();
  etcd.restart();
  CHECK(s.get("k") == "v");
}

TEST_CASE("etcds:// checks the server against the CA and presents a client certificate") {
  if (std::string(ELASTIC_OPENSSL_TOOL).empty()) {
    WARN("no openssl tool: cannot make certificates, TLS untested");
    return;
  }
  elastic::test::temp_dir dir;
  const std::string cert = dir.file("cert.pem"), key = dir.file("key.pem");
  // One self-signed certificate for 127.0.0.1 serves as CA, server and client certificate.
  const std::string cmd = std::string(ELASTIC_OPENSSL_TOOL) +
                          " req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=127.0.0.1"
                          " -addext subjectAltName=IP:127.0.0.1 -keyout " +
                          key + " -out " + cert + " >/dev/null 2>&1";
  REQUIRE(std::system(cmd.c_str()) == 0);
  etcd_server etcd({.cert_file = cert, .key_file = key, .trusted_ca_file = cert});
  CHECK(etcd.url().starts_with("etcds://"));
  auto o = test_options();
  o.ca_file = cert;
  o.cert_file = cert;
  o.key_file = key;
  rdzv::etcd_store s(etcd.url(), o);
  s.set("k", "v");
  CHECK(s.get("k") == "v");
  const std::vector<std::string> keys{"k"};
  s.wait(keys, 2s);

  SECTION("a server the CA did not sign is refused at once") {
    auto no_ca = test_options();
    rdzv::etcd_store t(etcd.url(), no_ca);
    const auto t0 = clock_type::now();
    const auto e = error_of([&] { (void)t.get("k"); });
    CHECK(clock_type::now() - t0 < 2s);
    CHECK(e.code() == errc::invalid_argument);
    CHECK(contains(e.what(), "ca_file"));
  }
  SECTION("without a client certificate the server does not serve us") {
    auto no_cert = test_options(500ms);
    no_cert.ca_file = cert;
    rdzv::etcd_store t(etcd.url(), no_cert);
    const auto e = error_of([&] { (void)t.get("k"); });
    CHECK(e.code() == errc::unavailable);
    CHECK(contains(e.what(), etcd.endpoint()));
  }
}

TEST_CASE("no etcd outlives its etcd_server, killed and restarted or not") {
  pid_t first = 0, second = 0;
  {
    etcd_server etcd;
    first = etcd.pid();
    etcd.kill();
    etcd.restart();
    second = etcd.pid();
    CHECK(::kill(second, 0) == 0);
  }
  for (pid_t pid : {first, second}) {
    errno = 0;
    CHECK(::kill(pid, 0) == -1);
    CHECK(errno == ESRCH);
  }
}
