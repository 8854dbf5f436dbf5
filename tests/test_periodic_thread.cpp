// periodic_thread: ticks at its interval, wakes early on request, ends when its tick says so,
// and is stopped and joined by its destructor.
#include <atomic>
#include <chrono>
#include <thread>

#include <elastic/internal/periodic_thread.hpp>

#include "support/catch.hpp"
#include "support/eventually.hpp"

using namespace std::chrono_literals;
using elastic::internal::periodic_thread;
using elastic::test::eventually;

TEST_CASE("periodic_thread ticks repeatedly and stops with its owner") {
  std::atomic<int> ticks{0};
  {
    periodic_thread t(1ms, [&] {
      ++ticks;
      return true;
    });
    CHECK(t.started());
    CHECK(eventually([&] { return ticks.load() >= 3; }, 10s, 1ms));  // ticks are a millisecond apart
  }
  const int after = ticks.load();
  std::this_thread::sleep_for(20ms);
  CHECK(ticks.load() == after);
}

TEST_CASE("periodic_thread wakes early when asked, long before its interval") {
  std::atomic<int> ticks{0};
  periodic_thread t(1h, [&] {
    ++ticks;
    return true;
  });
  t.wake();
  CHECK(eventually([&] { return ticks.load() == 1; }, 10s, 1ms));  // ticks are a millisecond apart
  t.wake();
  CHECK(eventually([&] { return ticks.load() == 2; }, 10s, 1ms));  // ticks are a millisecond apart
  t.stop();  // an hour-long interval still stops at once
  CHECK_FALSE(t.started());
}

TEST_CASE("periodic_thread ends when its tick returns false, and survives a move") {
  std::atomic<int> ticks{0};
  periodic_thread t(1ms, [&] { return ++ticks < 2; });
  periodic_thread moved = std::move(t);
  CHECK_FALSE(t.started());
  CHECK(eventually([&] { return ticks.load() == 2; }, 10s, 1ms));  // ticks are a millisecond apart
  std::this_thread::sleep_for(20ms);
  CHECK(ticks.load() == 2);
  moved.wake();  // waking an ended thread is harmless
  periodic_thread empty;
  empty.wake();
  empty.stop();
}
