// Timer scopes as the worker sees them: what a scope writes into its thread's slot, and when.
// A watchdog without its scanning thread owns the segment, so nothing here is ever killed.
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <new>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <elastic/internal/process.hpp>
#include <elastic/timer.hpp>

#include "support/catch.hpp"
#include "support/process.hpp"

using namespace std::chrono_literals;
namespace td = elastic::timer::detail;

// Counts allocations to check the hot path makes none. Every replaceable form that a library
// may pair with another is replaced, so new and delete always agree (ASan checks that).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
static std::atomic<long> g_allocations{0};
static void* counted_alloc(std::size_t n) noexcept {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(n == 0 ? 1 : n);
}
void* operator new(std::size_t n) {
  if (void* p = counted_alloc(n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return ::operator new(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return counted_alloc(n); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return counted_alloc(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

namespace {

struct quiet_watchdog {
  std::string name = elastic::test::unique_name("scope");
  elastic::timer::watchdog wd{{.name = name, .start_thread = false, .events = elastic::event_log()}};
  quiet_watchdog() { elastic::timer::client::attach(name); }
  ~quiet_watchdog() { elastic::timer::client::detach(); }

  /// The slot of the calling thread, or nullptr.
  [[nodiscard]] td::slot* my_slot() const {
    const auto t = wd.table();
    const auto tid = elastic::internal::current_tid();
    for (std::uint32_t i = 0; i < t.slot_count(); ++i) {
      auto& s = t.at(i);
      if (s.head.owner.load() == static_cast<std::uint64_t>(::getpid()) && s.head.tid.load() == tid) return &s;
    }
    return nullptr;
  }
  [[nodiscard]] int owned_by_me() const {
    const auto t = wd.table();
    int n = 0;
    for (std::uint32_t i = 0; i < t.slot_count(); ++i)
      n += t.at(i).head.owner.load() == static_cast<std::uint64_t>(::getpid()) ? 1 : 0;
    return n;
  }
};

}  // namespace

TEST_CASE("a scope records its deadline, name and signal in its thread's slot") {
  quiet_watchdog q;
  const auto before = elastic::internal::monotonic_ns();
  auto g = elastic::expires(30s, "allreduce", SIGABRT);
  REQUIRE(g.watched());
  td::slot* s = q.my_slot();
  REQUIRE(s != nullptr);
  CHECK(s->head.depth.load() == 1);
  td::entry_snapshot e;
  REQUIRE(td::read_entry(s->scopes[0], e));
  CHECK(std::string(e.name) == "allreduce");
  CHECK(e.signal == SIGABRT);
  CHECK(e.deadline_ns >= before + 30'000'000'000);
  CHECK(e.deadline_ns <= elastic::internal::monotonic_ns() + 30'000'000'000);
  CHECK(g.remaining() > 29s);
}

TEST_CASE("leaving a scope clears it") {
  quiet_watchdog q;
  { auto g = elastic::expires(1s, "step"); }
  td::slot* s = q.my_slot();
  REQUIRE(s != nullptr);
  CHECK(s->head.depth.load() == 0);
  CHECK(s->scopes[0].generation.load() == 0);
  CHECK(q.wd.scan_once().live_scopes == 0);
}

TEST_CASE("scopes nest and the earliest live deadline governs") {
  quiet_watchdog q;
  auto outer = elastic::expires(60s, "epoch");
  auto mid = elastic::expires(5s, "step");
  auto inner = elastic::expires(20s, "allreduce");
  const auto r = q.wd.scan_once();
  CHECK(r.live_scopes == 3);
  td::entry_snapshot e;
  REQUIRE(td::read_entry(q.my_slot()->scopes[1], e));
  CHECK(r.next_deadline_ns == e.deadline_ns);
}

TEST_CASE("extend pushes the deadline and never pulls it in") {
  quiet_watchdog q;
  auto g = elastic::expires(2s, "loop");
  const auto first = g.remaining();
  g.extend(10s);
  CHECK(g.remaining() > 9s);
  g.extend(1s);
  CHECK(g.remaining() > 9s);
  CHECK(first < 3s);
}

TEST_CASE("a moved scope keeps watching and the moved-from one watches nothing") {
  quiet_watchdog q;
  auto a = elastic::expires(30s, "a");
  elastic::timer::scope b = std::move(a);
  CHECK_FALSE(a.watched());  // NOLINT(bugprone-use-after-move): the moved-from state is specified
  CHECK(b.watched());
  CHECK(q.wd.scan_once().live_scopes == 1);
  b.leave();
  CHECK(q.wd.scan_once().live_scopes == 0);
  CHECK(q.my_slot()->head.depth.load() == 0);
}

TEST_CASE("scopes left out of order are all cleared") {
  quiet_watchdog q;
  auto a = elastic::expires(30s, "a");
  auto b = elastic::expires(30s, "b");
  auto c = elastic::expires(30s, "c");
  b.leave();
  CHECK(q.wd.scan_once().live_scopes == 2);
  CHECK(q.my_slot()->head.depth.load() == 3);
  c.leave();
  CHECK(q.my_slot()->head.depth.load() == 1);  // c and the hole b left are popped together
  a.leave();
  CHECK(q.my_slot()->head.depth.load() == 0);
}

TEST_CASE("a scope left on another thread is cleared") {
  quiet_watchdog q;
  auto g = elastic::expires(30s, "handed-over");
  std::thread([s = std::move(g)]() mutable { s.leave(); }).join();
  CHECK(q.wd.scan_once().live_scopes == 0);
  { auto next = elastic::expires(30s, "next"); }  // the owner pops the hole on its next leave
  CHECK(q.my_slot()->head.depth.load() == 0);
}

TEST_CASE("threads get slots of their own and give them back when they exit") {
  quiet_watchdog q;
  constexpr int n = 8;
  std::atomic<int> entered{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> ts;
  std::vector<int> tids(n);
  for (int i = 0; i < n; ++i) {
    ts.emplace_back([&, i] {
      auto g = elastic::expires(30s, "worker-thread");
      tids[i] = elastic::internal::current_tid();
      entered.fetch_add(1);
      while (!go.load()) std::this_thread::sleep_for(1ms);
    });
  }
  while (entered.load() < n) std::this_thread::sleep_for(1ms);
  CHECK(q.wd.scan_once().live_scopes == n);
  CHECK(q.owned_by_me() >= n);
  go = true;
  for (auto& t : ts) t.join();
  CHECK(q.wd.scan_once().live_scopes == 0);
  CHECK(q.owned_by_me() <= 1);  // at most the main thread's
}

TEST_CASE("without a watchdog, scopes are no-ops") {
  elastic::timer::client::detach();
  auto g = elastic::expires(1ms, "unwatched");
  CHECK_FALSE(g.watched());
  g.extend(1s);
  CHECK(g.remaining() == 0ns);
}

TEST_CASE("long names are truncated to 31 bytes") {
  quiet_watchdog q;
  auto g = elastic::expires(30s, std::string(100, 'x'));
  td::entry_snapshot e;
  REQUIRE(td::read_entry(q.my_slot()->scopes[0], e));
  CHECK(std::string(e.name) == std::string(31, 'x'));
}

TEST_CASE("any std::chrono duration works, and huge ones do not wrap into the past") {
  quiet_watchdog q;
  auto a = elastic::expires(std::chrono::duration<double>(0.25), "double-seconds");
  auto b = elastic::expires(std::chrono::minutes(2), "minutes");
  auto c = elastic::expires(std::chrono::hours(24 * 365 * 1000), "practically-never");
  CHECK(a.remaining() > 200ms);
  CHECK(a.remaining() <= 250ms);
  CHECK(b.remaining() > 119s);
  CHECK(c.remaining() > std::chrono::hours(24 * 365));
}

TEST_CASE("entering and leaving a scope does not allocate after the thread's first") {
  quiet_watchdog q;
  { auto warm = elastic::expires(1s, "warm-up"); }
  const long before = g_allocations.load();
  for (int i = 0; i < 1000; ++i) {
    auto g = elastic::expires(1s, "step");
    auto h = elastic::expires(500ms, "allreduce");
    h.extend(600ms);
  }
  CHECK(g_allocations.load() == before);
}

TEST_CASE("scopes nested deeper than a slot's stack are not watched, and outer ones still are") {
  quiet_watchdog q;
  std::vector<elastic::timer::scope> scopes;
  scopes.reserve(40);
  int watched = 0;
  for (int i = 0; i < 40; ++i) {
    scopes.push_back(elastic::expires(30s, "deep"));
    watched += scopes.back().watched() ? 1 : 0;
  }
  CHECK(watched == static_cast<int>(td::scopes_per_slot));
  CHECK(q.my_slot()->head.dropped.load() == 40 - td::scopes_per_slot);
  CHECK(q.wd.scan_once().live_scopes == td::scopes_per_slot);
  while (!scopes.empty()) scopes.pop_back();
  CHECK(q.my_slot()->head.depth.load() == 0);
}

TEST_CASE("attaching to a missing segment is a clear error") {
  try {
    elastic::timer::client::attach(elastic::test::unique_name("missing"));
    FAIL("attach should have thrown");
  } catch (const elastic::error& e) {
    CHECK(e.code() == elastic::errc::not_found);
    CHECK(std::string(e.what()).find("elastic-watchdog --name") != std::string::npos);
  }
}
