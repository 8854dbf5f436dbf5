// The shm:// store with real processes: atomic counters across forked clients, waits, leases
// that vanish, a client SIGKILLed while it holds the lock, and store URLs.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <elastic/rendezvous/host_address.hpp>
#include <elastic/rendezvous/shm_store.hpp>
#include <elastic/rendezvous/store_url.hpp>

#include "support/catch.hpp"
#include "support/errors.hpp"
#include "support/planted_shm.hpp"
#include "support/process.hpp"
#include "support/shm_store_peer.hpp"
#include "support/store_contract.hpp"

using namespace std::chrono_literals;
using elastic::errc;
using elastic::test::error_of;
namespace rdzv = elastic::rendezvous;

namespace {

/// A store with a unique name, removed at the end of the test.
struct scratch_store {
  std::string name = elastic::test::unique_name("store");
  rdzv::shm_store s{name};
  ~scratch_store() { rdzv::shm_store::remove(name); }
};

/// Runs `f` in a forked child; returns its wait status.
template <class F>
int in_child(F&& f) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    try {
      f();
    } catch (...) {
      std::_Exit(99);
    }
    std::_Exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
}

}  // namespace

TEST_CASE("set, get, erase, list and compare_set behave like a map") {
  scratch_store t;
  elastic::test::check_map_behaviour(t.s);
}

TEST_CASE("a batch of writes does what each write would, and one on an ended lease fails alone") {
  scratch_store t;
  elastic::test::check_batch_behaviour(t.s);
}

TEST_CASE("a watch reports the range's keys, then each put and erasure in it, a lapsed lease's too") {
  scratch_store t;
  elastic::test::check_feed_behaviour(t.s);
}

TEST_CASE("bad keys, values and counters get clear errors") {
  scratch_store t;
  CHECK(error_of([&] { t.s.set("", "v"); }).code() == errc::invalid_argument);
  CHECK(error_of([&] { t.s.set(std::string(256, 'k'), "v"); }).code() == errc::invalid_argument);
  CHECK(error_of([&] { t.s.set("k", std::string(16 * 1024 + 1, 'v')); }).code() == errc::invalid_argument);
  t.s.set("word", "hello");
  const auto e = error_of([&] { t.s.add("word", 1); });
  CHECK(e.code() == errc::invalid_argument);
  CHECK(std::string(e.what()).find("not an integer") != std::string::npos);
  CHECK(error_of([&] { rdzv::shm_store bad("../etc"); }).code() == errc::bad_name);
}

TEST_CASE("a store name taken by a planted FIFO, socket or device is refused, naming what is there") {
  for (const auto kind : elastic::test::plantable_kinds()) {
    const std::string what = elastic::test::planted_words(kind);
    INFO(what);
    const std::string name = elastic::test::unique_name("planted");
    const elastic::test::planted_shm planted("elastic-store." + name, kind);
    const auto e = error_of([&] { rdzv::shm_store s(name); });
    INFO(e.what());
    CHECK(e.code() == errc::unsafe_path);
    CHECK(std::string(e.what()).find(planted.path() + " is " + what) != std::string::npos);
    CHECK(planted.intact());
  }
}

TEST_CASE("add is atomic across processes") {
  scratch_store t;
  std::vector<pid_t> kids;
  for (int p = 0; p < 4; ++p) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      rdzv::shm_store s(t.name);
      for (int i = 0; i < 500; ++i) s.add("count", 1);
      std::_Exit(0);
    }
    kids.push_back(pid);
  }
  for (pid_t pid : kids) {
    int st = 0;
    ::waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st));
  }
  CHECK(t.s.add("count", 0) == 2000);
  CHECK(t.s.add("count", -2000) == 0);
}

TEST_CASE("wait returns when another process sets the keys, and times out naming the missing ones") {
  scratch_store t;
  const pid_t pid = ::fork();
  if (pid == 0) {
    rdzv::shm_store s(t.name);
    std::this_thread::sleep_for(50ms);
    s.set("k1", "a");
    std::this_thread::sleep_for(50ms);
    s.set("k2", "b");
    std::_Exit(0);
  }
  const std::vector<std::string> keys{"k1", "k2"};
  const auto t0 = std::chrono::steady_clock::now();
  t.s.wait(keys, 10s);
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  CHECK(t.s.get("k2", 1s) == "b");
  int st = 0;
  ::waitpid(pid, &st, 0);
  const std::vector<std::string> absent{"k1", "nope"};
  const auto e = error_of([&] { t.s.wait(absent, 50ms); });
  CHECK(e.code() == errc::timeout);
  CHECK(std::string(e.what()).find("'nope'") != std::string::npos);
  CHECK(std::string(e.what()).find("'k1'") == std::string::npos);
}

TEST_CASE("leased keys vanish when their owner stops heartbeating") {
  scratch_store t;
  const auto lease = t.s.grant(200ms);
  t.s.set("alive/0", "x", lease);
  for (int i = 0; i < 5; ++i) {
    std::this_thread::sleep_for(100ms);
    t.s.keep_alive(lease);
    CHECK(t.s.get("alive/0"));
  }
  std::this_thread::sleep_for(300ms);
  CHECK_FALSE(t.s.get("alive/0"));
  CHECK(error_of([&] { t.s.keep_alive(lease); }).code() == errc::not_found);
  CHECK(error_of([&] { t.s.set("late", "x", lease); }).code() == errc::not_found);
  const auto l2 = t.s.grant(10s);
  t.s.set("alive/1", "y", l2);
  t.s.revoke(l2);
  CHECK_FALSE(t.s.get("alive/1"));
}

TEST_CASE("a lease of a process that was SIGKILLed expires and its keys go") {
  scratch_store t;
  const int st = in_child([&] {
    rdzv::shm_store s(t.name);
    const auto l = s.grant(150ms);
    s.set("member/7", "here", l);
    ::raise(SIGKILL);
  });
  CHECK(WIFSIGNALED(st));
  std::this_thread::sleep_for(300ms);
  CHECK_FALSE(t.s.get("member/7"));
}

TEST_CASE("a lease dies with its process, long before its time to live") {
  scratch_store t;
  const auto mine = t.s.grant(60s);
  t.s.set("member/self", "here", mine);
  // The child takes a 60 s lease and is SIGKILLed; as a zombie (not reaped yet) it counts as gone.
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    rdzv::shm_store s(t.name);
    s.set("member/7", "here", s.grant(60s));
    (void)!::write(ready[1], "r", 1);
    for (;;) ::pause();
  }
  char c = 0;
  REQUIRE(::read(ready[0], &c, 1) == 1);
  ::close(ready[0]);
  ::close(ready[1]);
  REQUIRE(t.s.get("member/7") == "here");
  ::kill(pid, SIGKILL);
  const auto t0 = std::chrono::steady_clock::now();
  while (t.s.get("member/7") && std::chrono::steady_clock::now() - t0 < 5s) std::this_thread::sleep_for(1ms);
  CHECK_FALSE(t.s.get("member/7"));
  CHECK(std::chrono::steady_clock::now() - t0 < 2s);  // generous: the point is "not 60 s"
  int st = 0;
  ::waitpid(pid, &st, 0);
  // Our own lease, held by a live process, stays.
  CHECK(t.s.get("member/self") == "here");
  t.s.keep_alive(mine);
}

TEST_CASE("a client SIGKILLed while holding the lock does not wedge the store") {
  scratch_store t;
  t.s.set("kept", "1");
  const int st = in_child([&] {
    rdzv::shm_store s(t.name);
    rdzv::shm_store_test_peer::lock_and_start_writing(s, "torn");
    ::raise(SIGKILL);
  });
  REQUIRE(WIFSIGNALED(st));
  // The robust lock hands over; the half-written entry is dropped; the rest is intact.
  CHECK(t.s.get("kept") == "1");
  CHECK_FALSE(t.s.get("torn"));
  t.s.set("after", "2");
  CHECK(t.s.get("after") == "2");
}

TEST_CASE("a store of another layout or another user is refused and left alone") {
  const std::string name = elastic::test::unique_name("store");
  const std::string path = "/dev/shm/elastic-store." + name;
  {
    rdzv::shm_store s(name);
    s.set("k", "v");
  }
  {
    // Another layout version: bytes 8..11 of the header.
    FILE* f = std::fopen(path.c_str(), "r+b");
    REQUIRE(f);
    std::fseek(f, 8, SEEK_SET);
    const std::uint32_t v = 99;
    std::fwrite(&v, sizeof v, 1, f);
    std::fclose(f);
  }
  const auto e = error_of([&] { rdzv::shm_store s(name); });
  CHECK(e.code() == errc::version_mismatch);
  CHECK(std::string(e.what()).find("remove /dev/shm/") != std::string::npos);
  if (::getuid() == 0) {
    REQUIRE(::chown(path.c_str(), 12345, 12345) == 0);
    CHECK(error_of([&] { rdzv::shm_store s(name); }).code() == errc::owner_mismatch);
  }
  rdzv::shm_store::remove(name);
}

TEST_CASE("store URLs parse, and bad ones say what to write") {
  const auto shm = rdzv::parse_store_url("shm://job-7");
  CHECK(shm.scheme == rdzv::store_url::kind::shm);
  CHECK(shm.name == "job-7");
  const auto etcd = rdzv::parse_store_url("etcd://10.0.0.1:2379,etcd-b.svc:2380,[::1]:2381");
  CHECK(etcd.scheme == rdzv::store_url::kind::etcd);
  CHECK_FALSE(etcd.tls);
  CHECK(etcd.endpoints == std::vector<rdzv::endpoint>{{"10.0.0.1", 2379}, {"etcd-b.svc", 2380}, {"::1", 2381}});
  CHECK(rdzv::parse_store_url("etcds://h:1").tls);
  for (const char* bad : {"", "job", "http://x:1", "etcd://", "etcd://host", "etcd://host:0", "etcd://host:70000",
                          "etcd://host:12a", "etcd://:2379", "etcd://a:1,", "etcd://[::1:2379", "etcd://ho st:1"}) {
    INFO(bad);
    const auto e = error_of([&] { rdzv::parse_store_url(bad); });
    CHECK(e.code() == errc::invalid_argument);
    CHECK(std::string(e.what()).find("use shm://NAME or etcd://HOST:PORT") != std::string::npos);
  }
  CHECK(error_of([&] { rdzv::parse_store_url("shm://a/b"); }).code() == errc::bad_name);
}

TEST_CASE("the address peers reach this host at: loopback for shm://, the route's source for etcd") {
  CHECK(rdzv::host_address_for(rdzv::parse_store_url("shm://job-7")) == "127.0.0.1");
  CHECK(rdzv::host_address_towards({"127.0.0.1", 2379}) == "127.0.0.1");
  CHECK(rdzv::host_address_towards({"127.0.0.5", 2379}) == "127.0.0.1");  // all of 127/8 is lo, source .1
  // An endpoint this host cannot send to (connect() to the broadcast address is refused without
  // SO_BROADCAST) is passed over for the next one; with none left the error says what to do.
  CHECK(rdzv::host_address_for(rdzv::parse_store_url("etcd://255.255.255.255:2379,127.0.0.1:2379")) == "127.0.0.1");
  const auto e = error_of([] { (void)rdzv::host_address_for(rdzv::parse_store_url("etcd://255.255.255.255:2379")); });
  CHECK(e.code() == errc::not_found);
  CHECK(std::string(e.what()).find("255.255.255.255:2379") != std::string::npos);
  CHECK(std::string(e.what()).find("--host-addr or ELASTIC_HOST_ADDR") != std::string::npos);
}
