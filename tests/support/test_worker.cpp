// A worker process for the multi-process tests. Each mode is one behaviour a real trainer can
// have; it reports progress on stdout, one line at a time, so the test can synchronize.
//
//   test_worker hang SEGMENT TIMEOUT_MS [SIGNAL]    enter a scope, print "entered", hang
//   test_worker ignore-abrt SEGMENT TIMEOUT_MS      like hang with SIGABRT, but survive SIGABRT
//   test_worker churn SEGMENT THREADS ITERATIONS    threads enter/leave nested scopes (never expire)
//   test_worker crowd SEGMENT THREADS               threads hold a scope at once; print how many
//                                                   of them were watched
//   test_worker churn-and-hang SEGMENT THREADS MS   threads churn while one hangs in a scope of MS
//   test_worker outer-expires SEGMENT MS            an outer scope expires while inner ones churn
//   test_worker fork-child-leaves SEGMENT MS        a forked child leaves its copy of the scope;
//                                                   the parent must still be killed at MS
//   test_worker threads-exit SEGMENT THREADS        threads take slots and exit; print "done"
//   test_worker stack-overflow SEGMENT              nest 40 scopes; print how many are watched
//   test_worker env-churn                           attach from ELASTIC_WATCHDOG; say if watched
//   test_worker forge SEGMENT PID START COUNT       write an expired scope into a free slot in the
//                                                   name of process (PID, START), as a buggy or
//                                                   hostile client could; wait for the watchdog to
//                                                   free it; COUNT times; print "freed COUNT"
//   test_worker abrt-then-exec SEGMENT MS           like ignore-abrt, but on SIGABRT print "got
//                                                   SIGABRT" and exec a shell that prints "execed"
//                                                   and sleeps: the same process, no longer mapping
//                                                   the segment
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <latch>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <elastic/internal/clock.hpp>
#include <elastic/timer/client.hpp>
#include <elastic/internal/futex.hpp>
#include <elastic/timer/expires.hpp>

#include "forged_scope.hpp"

using namespace std::chrono_literals;

namespace {

void say(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

[[noreturn]] void hang() {
  for (;;) ::pause();
}

void churn(int iterations) {
  for (int i = 0; i < iterations; ++i) {
    auto outer = elastic::expires(5s, "outer");
    for (int j = 0; j < 4; ++j) {
      auto inner = elastic::expires(3s + std::chrono::milliseconds(j), "inner");
      auto innermost = elastic::expires(2s, "innermost");
    }
    if (i % 64 == 0) outer.extend(6s);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: test_worker MODE SEGMENT ...\n");
    return 2;
  }
  const std::string_view mode = argv[1];
  if (mode == "env-churn") {
    // Attach the way a trainer does: from ELASTIC_WATCHDOG, on the first scope.
    bool watched = false;
    std::vector<std::thread> ts;
    for (int t = 0; t < 2; ++t) ts.emplace_back([] { churn(100); });
    for (auto& t : ts) t.join();
    { watched = elastic::expires(1s, "probe").watched(); }
    say(watched ? "watched done" : "unwatched done");
    return 0;
  }
  if (argc < 3) {
    std::fprintf(stderr, "usage: test_worker MODE SEGMENT ...\n");
    return 2;
  }
  auto& client = elastic::timer::client::attach(argv[2]);
  auto arg = [&](int i) { return i < argc ? std::atoi(argv[i]) : 0; };

  if (mode == "forge") {
    namespace td = elastic::timer::detail;
    if (argc < 6) return 2;
    const std::uint64_t pid = std::strtoull(argv[3], nullptr, 10);
    const std::uint64_t start = std::strtoull(argv[4], nullptr, 10);
    const int count = arg(5);
    for (int n = 0; n < count; ++n) {
      const td::slot* s = elastic::test::forge_expired_scope(client.table(), pid, start);
      if (s == nullptr) {
        say("table full");
        hang();
      }
      // The watchdog frees the slot (whatever it decided).
      if (!elastic::test::forged_slot_freed(*s, pid, start)) {
        say("not freed");
        hang();
      }
    }
    say("freed " + std::to_string(count));
    hang();
  }
  if (mode == "abrt-then-exec") {
    std::signal(SIGABRT, [](int) {
      static const char m[] = "got SIGABRT\n";
      (void)!::write(1, m, sizeof m - 1);
      // Only async-signal-safe calls here: execv replaces the image, so the process (same pid,
      // same start time) no longer maps the segment.
      char sh[] = "/bin/sh", c[] = "-c", script[] = "echo execed; exec sleep 60";
      char* args[] = {sh, c, script, nullptr};
      ::execv(sh, args);
      ::_exit(127);
    });
    auto g = elastic::expires(std::chrono::milliseconds(arg(3)), "abort-then-exec", SIGABRT);
    say(g.watched() ? "entered" : "unwatched");
    hang();
  }

  if (mode == "hang") {
    auto g = elastic::expires(std::chrono::milliseconds(arg(3)), "hung-step", arg(4));
    say(g.watched() ? "entered" : "unwatched");
    hang();
  }
  if (mode == "warned") {  // WARN_MS KILL_MS [EXTEND_AFTER_MS EXTEND_BY_MS]: a scope with two expiries
    auto g = elastic::expires_after_warning(std::chrono::milliseconds(arg(3)), std::chrono::milliseconds(arg(4)),
                                            "warned-step");
    say(g.watched() ? "entered" : "unwatched");
    if (argc > 6) {
      std::this_thread::sleep_for(std::chrono::milliseconds(arg(5)));
      g.extend(std::chrono::milliseconds(arg(6)));
      say("extended");
    }
    hang();
  }
  if (mode == "ignore-abrt") {
    std::signal(SIGABRT, [](int) { static const char m[] = "got SIGABRT\n"; (void)!::write(1, m, sizeof m - 1); });
    auto g = elastic::expires(std::chrono::milliseconds(arg(3)), "stubborn", SIGABRT);
    say("entered");
    hang();
  }
  if (mode == "churn") {
    std::vector<std::thread> ts;
    for (int t = 0; t < arg(3); ++t) ts.emplace_back([&] { churn(arg(4)); });
    for (auto& t : ts) t.join();
    say("done");
    return 0;
  }
  if (mode == "crowd") {
    // All threads hold a scope at once, so a small table really runs out of slots.
    const int n = arg(3);
    std::latch all_in(n);
    std::atomic<int> watched{0};
    std::vector<std::thread> ts;
    for (int t = 0; t < n; ++t) {
      ts.emplace_back([&] {
        {
          auto g = elastic::expires(5s, "crowd");
          if (g.watched()) watched.fetch_add(1);
          all_in.arrive_and_wait();
        }
        churn(50);
      });
    }
    for (auto& t : ts) t.join();
    say("watched " + std::to_string(watched.load()) + " of " + std::to_string(n));
    return 0;
  }
  if (mode == "churn-and-hang") {
    std::atomic<bool> stop{false};
    std::vector<std::thread> ts;
    for (int t = 0; t < arg(3); ++t) {
      ts.emplace_back([&] {
        while (!stop.load(std::memory_order_relaxed)) churn(16);
      });
    }
    auto g = elastic::expires(std::chrono::milliseconds(arg(4)), "hung-among-busy");
    say("entered");
    std::this_thread::sleep_for(60s);  // the watchdog kills us long before
    stop = true;
    for (auto& t : ts) t.join();
    return 0;
  }
  if (mode == "outer-expires") {
    auto outer = elastic::expires(std::chrono::milliseconds(arg(3)), "epoch");
    say("entered");
    for (;;) {
      auto inner = elastic::expires(10s, "fast-step");
    }
  }
  if (mode == "fork-child-leaves") {
    auto g = elastic::expires(std::chrono::milliseconds(arg(3)), "parent-scope");
    const pid_t child = ::fork();
    if (child == 0) {
      // The child's copy of `g` is destroyed here; it must not clear the parent's entry.
      { auto moved = std::move(g); }
      auto mine = elastic::expires(10s, "child-scope");
      std::_Exit(mine.watched() ? 0 : 1);
    }
    int st = 0;
    ::waitpid(child, &st, 0);
    say(WIFEXITED(st) && WEXITSTATUS(st) == 0 ? "child-ok" : "child-failed");
    hang();
  }
  if (mode == "threads-exit") {
    std::vector<std::thread> ts;
    for (int t = 0; t < arg(3); ++t) ts.emplace_back([] { auto g = elastic::expires(10s, "short-lived-thread"); });
    for (auto& t : ts) t.join();
    say("done");
    hang();
  }
  if (mode == "stack-overflow") {
    std::vector<elastic::timer::scope> scopes;
    int watched = 0;
    for (int i = 0; i < 40; ++i) {
      scopes.push_back(elastic::expires(10s, "deep"));
      watched += scopes.back().watched() ? 1 : 0;
    }
    say("watched " + std::to_string(watched));
    hang();
  }
  std::fprintf(stderr, "test_worker: unknown mode '%s'\n", argv[1]);
  return 2;
}
