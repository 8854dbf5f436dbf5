// Elastic groups with real processes: 4 workers (tests/support/group_worker.cpp) train over Gloo
// on loopback, bootstrapped through a real store; the tests SIGKILL, SIGSTOP and restart them,
// stop the store, and check that the survivors rebuild and end with the very weights of an
// undisturbed run (the workers sum gradients exactly, so any world size gives the same bits).
//
// Timings (kill to resumed, rejoin) are printed, never asserted: benchmarks/recovery_bench.cpp
// measures them.
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <elastic/checkpoint/preemption.hpp>
#include <elastic/checkpoint/storage.hpp>
#include <elastic/comm/gloo.hpp>
#include <elastic/internal/clock.hpp>
#include <elastic/internal/tcp.hpp>
#include <elastic/rendezvous/shm_store.hpp>

#include "support/catch.hpp"
#include "support/fleet.hpp"
#include "support/hosted_watchdog.hpp"
#include "support/process.hpp"
#if defined(ELASTIC_ETCD_SERVER)
#include "support/etcd_server.hpp"
#endif

namespace {

using namespace std::chrono_literals;
using elastic::test::exit_code_of;
using elastic::test::field;
using elastic::test::fleet;
using elastic::test::num;
using elastic::test::starts_with;
using elastic::test::temp_dir;
using elastic::test::unique_name;

struct scratch : elastic::test::group_scratch {
  scratch() : group_scratch("grp") {}
};

/// The weights' crc after `steps` steps of an undisturbed run (one worker: exact sums make any
/// world size give the same result).
std::string reference_crc(const std::vector<std::string>& common, std::uint64_t steps) {
  scratch s;
  fleet f(ELASTIC_GROUP_WORKER, s.url, "ref", common, s.events);
  const auto i = f.start("ref", {"--dir", s.ckpt, "--steps", std::to_string(steps), "--min", "1", "--max", "1"});
  REQUIRE(f.wait_until([&] { return f.all_ended({i}); }, 120s));
  const auto fin = f.find(i, "final ");
  REQUIRE(fin);
  return field(*fin, "crc");
}

/// Worker i ended well after `steps` steps with the weights `want`, rebuilt into a group of
/// `world` on the way (world 0: never rebuilt).
void check_finished(fleet& f, std::size_t i, std::uint64_t steps, const std::string& want, const char* world) {
  CHECK(exit_code_of(f[i].status) == 0);
  const auto fin = f.find(i, "final ");
  REQUIRE(fin);
  CHECK(field(*fin, "step") == std::to_string(steps));
  CHECK(field(*fin, "crc") == want);  // identical across ranks, and to the undisturbed run
  if (std::string(world) == "0") {
    CHECK_FALSE(f.find(i, "rebuilt "));
  } else {
    CHECK(f.find(i, "rebuilt ", [&](auto& l) { return field(l, "world") == world; }));
  }
}

/// The worker's options with its moments partitioned across the group (--shard 2).
std::vector<std::string> with_shards(std::vector<std::string> common) {
  common.insert(common.end(), {"--shard", "2"});
  return common;
}

/// The weights and the whole moments buffer of an undisturbed run, alone.
struct sharded_final {
  std::string crc, moments;
};
sharded_final sharded_reference(const std::vector<std::string>& common, std::uint64_t steps) {
  scratch r;
  fleet ref(ELASTIC_GROUP_WORKER, r.url, "ref", common, r.events);
  const auto i = ref.start("ref", {"--dir", r.ckpt, "--steps", std::to_string(steps), "--min", "1", "--max", "1"});
  REQUIRE(ref.wait_until([&] { return ref.all_ended({i}); }, 120s));
  const auto fin = ref.find(i, "final ");
  REQUIRE(fin);
  return {field(*fin, "crc"), field(*fin, "moments")};
}

/// Worker i finished all `steps` with the undisturbed weights and moments.
void check_sharded_finish(fleet& f, std::size_t i, std::uint64_t steps, const sharded_final& want) {
  INFO(f.transcript(i));
  CHECK(exit_code_of(f[i].status) == 0);
  const auto fin = f.find(i, "final ");
  REQUIRE(fin);
  CHECK(field(*fin, "step") == std::to_string(steps));
  CHECK(field(*fin, "crc") == want.crc);
  CHECK(field(*fin, "moments") == want.moments);
}

// Workers of 4 that detect a death quickly: 100 ms heartbeats, 500 ms to be declared dead. A
// last call of 3 s: every round holds every live member. With 300 ms, under TSan at -j2, a
// worker slow to start missed the first round, or a survivor slow to reach its safe point the
// next, and came back a round later as a newcomer under another rank (a case then saw rounds
// it did not expect). A round closes as soon as all max_ranks, or every live member of the
// round before and every waiting newcomer, are in: the long call costs nothing when all goes well.
const std::vector<std::string> fast{"--every", "10", "--dim", "65536", "--timeout-ms", "2000",
                                    "--hb-interval-ms", "100", "--hb-timeout-ms", "500", "--last-call-ms", "3000",
                                    "--join-timeout-ms", "30000", "--poll-ms", "20"};

// Workers whose Gloo timeout (60 s) dwarfs their heartbeat timeout (2 s): a test that waits less
// than 60 s for them sees a frozen rank dropped at its heartbeat, never at Gloo's timeout.
const std::vector<std::string> slow_gloo{"--every", "10", "--dim", "65536", "--timeout-ms", "60000",
                                         "--hb-interval-ms", "100", "--hb-timeout-ms", "2000", "--last-call-ms", "300",
                                         "--join-timeout-ms", "30000", "--poll-ms", "20"};

// slow_gloo with a last call of 3 s, for the cases whose next round must hold every survivor: a
// loaded machine (TSan, -j2) made one miss a 300 ms one, and it came back later as a newcomer.
// A round still closes as soon as every survivor is in.
const std::vector<std::string> slow_gloo_all_survivors = [] {
  auto v = slow_gloo;
  v.insert(v.end(), {"--last-call-ms", "3000"});
  return v;
}();

/// Starts workers w0 .. w<n-1> with `args`, worker i with `faults[i]` too.
void start_workers(fleet& f, int n, const std::vector<std::string>& args,
                   const std::map<int, std::vector<std::string>>& faults) {
  for (int i = 0; i < n; ++i) {
    auto a = args;
    if (auto it = faults.find(i); it != faults.end()) a.insert(a.end(), it->second.begin(), it->second.end());
    f.start("w" + std::to_string(i), a);
  }
}

}  // namespace

TEST_CASE("4 ranks lose one mid-allreduce: the 3 survivors rebuild and finish with the undisturbed weights") {
  const std::uint64_t steps = 60;
  const std::string want = reference_crc(fast, steps);
  scratch s;
  fleet f(ELASTIC_GROUP_WORKER, s.url, "kill4", fast, s.events);
  const std::vector<std::string> args{"--dir", s.ckpt, "--steps", std::to_string(steps), "--min", "2", "--max", "4"};
  for (int i = 0; i < 4; ++i) {
    auto a = args;
    if (i == 2) a.insert(a.end(), {"--kill-self-at", "20"});
    f.start("w" + std::to_string(i), a);
  }
  const std::vector<std::size_t> survivors{0, 1, 3};
  const bool ended = f.wait_until([&] { return f.all_ended({0, 1, 2, 3}); }, 120s);
  INFO(f.transcript(0) << f.transcript(1) << f.transcript(2) << f.transcript(3));
  REQUIRE(ended);

  // The victim died by SIGKILL inside the allreduce of step 20; nobody else restarted.
  REQUIRE(f[2].status);
  CHECK(WIFSIGNALED(*f[2].status));
  const auto killed = f.find(2, "killing ");
  REQUIRE(killed);
  const std::int64_t t_kill = num(*killed, "t");
  std::int64_t resumed = 0;
  for (auto i : survivors) {
    check_finished(f, i, steps, want, "3");
    CHECK(std::count_if(f[i].lines.begin(), f[i].lines.end(), [](auto& l) { return starts_with(l, "joined "); }) == 1);
    const auto rebuilt = f.find(i, "rebuilt ", [](auto& l) { return field(l, "world") == "3"; });
    const auto first3 = f.find(i, "step=", [](auto& l) { return field(l, "world") == "3"; });
    REQUIRE(first3);
    resumed = std::max(resumed, num(*first3, "t"));
    if (rebuilt) {
      std::printf("rank %s: noticed %.1f ms, rendezvous %.1f ms, connect %.1f ms, resync %.1f ms after the kill\n",
                  f[i].id.c_str(), (num(*rebuilt, "noticed") - t_kill) / 1e6, (num(*rebuilt, "met") - t_kill) / 1e6,
                  (num(*rebuilt, "connected") - t_kill) / 1e6, (num(*rebuilt, "resynced") - t_kill) / 1e6);
    }
  }
  std::printf("kill -> first step of the 3 survivors: %.1f ms\n", (resumed - t_kill) / 1e6);
}

TEST_CASE("a killed rank restarted under its id rejoins: the group is back to 4 at the next round") {
  const std::uint64_t steps = 150;
  const std::string want = reference_crc(fast, steps);
  scratch s;
  fleet f(ELASTIC_GROUP_WORKER, s.url, "rejoin", fast, s.events);
  const std::vector<std::string> args{"--dir", s.ckpt, "--steps", std::to_string(steps), "--min", "2", "--max", "4",
                                      "--step-sleep-ms", "10"};
  for (int i = 0; i < 4; ++i) {
    auto a = args;
    if (i == 2) a.insert(a.end(), {"--kill-self-at", "20"});
    f.start("w" + std::to_string(i), a);
  }
  REQUIRE(f.wait_until([&] { return f[2].status.has_value(); }, 60s));
  REQUIRE(WIFSIGNALED(*f[2].status));
  // The survivors go on as 3; then the rank comes back, restores the newest checkpoint and
  // waits as a newcomer until the group takes it in.
  REQUIRE(f.wait_until([&] { return f.find(0, "step=", [](auto& l) { return field(l, "world") == "3"; }).has_value(); },
                       30s));
  const std::int64_t t_restart = elastic::internal::monotonic_ns();
  const auto back = f.start("w2", args);
  const bool ended = f.wait_until([&] { return f.all_ended({0, 1, 3, back}); }, 120s);
  INFO(f.transcript(0) << f.transcript(1) << f.transcript(3) << f.transcript(back));
  REQUIRE(ended);
  const auto joined = f.find(back, "joined ");
  REQUIRE(joined);
  CHECK(field(*joined, "world") == "4");
  for (auto i : {std::size_t{0}, std::size_t{1}, std::size_t{3}}) check_finished(f, i, steps, want, "4");
  check_finished(f, back, steps, want, "0");
  std::printf("restart -> rejoined the group of 4: %.1f ms\n", (num(*joined, "t") - t_restart) / 1e6);
}

namespace {

/// The group_resynced events of round `round` in the events file `path`, one per rank.
std::vector<std::string> resyncs_of_round(const std::string& path, const std::string& round) {
  auto all = elastic::test::events_named(path, "group_resynced");
  std::erase_if(all, [&](const std::string& e) { return e.find("\"round\":" + round + ",") == std::string::npos; });
  return all;
}

/// Runs 4 workers of which the group's rank 2 dies before the allreduce of step 20 (every
/// worker given `perturb` too, so that rank 0 stays rank 0 whoever it is); checks that the 3
/// survivors finish with the undisturbed weights and returns the group_resynced events of the
/// round they rebuilt into, and the survivors' "perturbed" lines.
std::vector<std::string> lose_one_before_allreduce(const std::string& run, const std::vector<std::string>& perturb,
                                                   std::string& transcript, std::vector<std::string>& perturbed) {
  const std::uint64_t steps = 40;
  const std::string want = reference_crc(fast, steps);
  scratch s;
  fleet f(ELASTIC_GROUP_WORKER, s.url, run, fast, s.events);
  std::vector<std::string> args{"--dir", s.ckpt, "--steps", std::to_string(steps), "--min", "2", "--max", "4",
                                "--die-at", "20", "--die-rank", "2"};
  args.insert(args.end(), perturb.begin(), perturb.end());
  start_workers(f, 4, args, {});
  const bool ended = f.wait_until([&] { return f.all_ended({0, 1, 2, 3}); }, 120s);
  transcript = f.transcript(0, 80) + f.transcript(1, 80) + f.transcript(2, 80) + f.transcript(3, 80);
  INFO(transcript);
  REQUIRE(ended);
  for (std::size_t i = 0; i < 4; ++i) {
    const auto joined = f.find(i, "joined ");
    REQUIRE(joined);
    REQUIRE(field(*joined, "world") == "4");  // the premise: one group of four from the start
  }
  std::vector<std::size_t> survivors;
  for (std::size_t i = 0; i < 4; ++i) {
    if (f[i].status && WIFSIGNALED(*f[i].status)) {
      CHECK(f.find(i, "killing "));
    } else {
      survivors.push_back(i);
    }
  }
  REQUIRE(survivors.size() == 3);
  for (auto i : survivors) {
    check_finished(f, i, steps, want, "3");
    if (auto p = f.find(i, "perturbed ")) perturbed.push_back(*p);
  }
  const auto rebuilt = f.find(survivors.front(), "rebuilt ", [](auto& l) { return field(l, "world") == "3"; });
  REQUIRE(rebuilt);
  return resyncs_of_round(s.events, field(*rebuilt, "round"));
}

}  // namespace

TEST_CASE("survivors that hold the same state after a kill compare hashes and skip the bulk resync") {
  std::string transcript;
  std::vector<std::string> perturbed;
  const auto resyncs = lose_one_before_allreduce("same", {}, transcript, perturbed);
  INFO(transcript);
  // Every survivor was at step 20 with the same weights: one small allreduce proved it, and
  // nothing of the replicated state moved; the weights still end as the undisturbed run's.
  REQUIRE(resyncs.size() == 3);
  std::printf("resync of equal survivors: %s\n", resyncs.front().c_str());
  for (const auto& e : resyncs) {
    INFO(e);
    CHECK(e.find("\"compared\":true") != std::string::npos);
    CHECK(e.find("\"skipped\":true") != std::string::npos);
    CHECK(e.find("\"differing\":0,") != std::string::npos);
    CHECK(e.find("\"bytes\":0,") != std::string::npos);
    CHECK(e.find("\"hash_ms\":") != std::string::npos);
  }
}

TEST_CASE("a survivor whose replicated state differs from rank 0's makes the resync broadcast, and every rank ends "
          "with rank 0's state") {
  std::string transcript;
  std::vector<std::string> perturbed;
  const auto resyncs = lose_one_before_allreduce("diverged", {"--perturb-after", "19"}, transcript, perturbed);
  INFO(transcript);
  // Every survivor but rank 0 flipped a bit of one weight after step 19, the last one of 4: they
  // differed, the state moved, and (checked above) every survivor ended with the undisturbed
  // weights.
  REQUIRE(perturbed.size() == 2);
  REQUIRE(resyncs.size() == 3);
  std::printf("resync after a divergence: %s\n", resyncs.front().c_str());
  for (const auto& e : resyncs) {
    INFO(e);
    CHECK(e.find("\"compared\":true") != std::string::npos);
    CHECK(e.find("\"skipped\":false") != std::string::npos);
    CHECK(e.find("\"differing\":" + std::to_string(perturbed.size()) + ",") != std::string::npos);
    CHECK(e.find("\"bytes\":0,") == std::string::npos);
  }
}

TEST_CASE("with resync_mode::broadcast the state moves after a kill even when the survivors hold the same") {
  std::string transcript;
  std::vector<std::string> perturbed;
  const auto resyncs = lose_one_before_allreduce("always", {"--resync-mode", "1"}, transcript, perturbed);
  INFO(transcript);
  REQUIRE(resyncs.size() == 3);
  for (const auto& e : resyncs) {
    INFO(e);
    CHECK(e.find("\"compared\":false") != std::string::npos);
    CHECK(e.find("\"skipped\":false") != std::string::npos);
    CHECK(e.find("\"bytes\":0,") == std::string::npos);
  }
}

TEST_CASE("a group refuses a resync mode it does not know, with a clear error") {
  scratch s;
  fleet f(ELASTIC_GROUP_WORKER, s.url, "badmode", fast, s.events);
  const auto i = f.start("w0", {"--dir", s.ckpt, "--steps", "5", "--min", "1", "--max", "1", "--resync-mode", "7"});
  REQUIRE(f.wait_until([&] { return f.all_ended({i}); }, 60s));
  INFO(f.transcript(i));
  CHECK(exit_code_of(f[i].status) == 3);
  const auto err = f.find(i, "error ");
  REQUIRE(err);
  CHECK(field(*err, "code") == "invalid_argument");
  CHECK(err->find("resync 7 must be resync_mode::compare or resync_mode::broadcast") != std::string::npos);
}

TEST_CASE("a rank that hangs (SIGSTOP) is dropped by its peers and killed by the watchdog") {
  const std::uint64_t steps = 60;
  const std::string want = reference_crc(fast, steps);
  scratch s;
  elastic::test::hosted wd;  // the watchdog elastic-run would host
  fleet f(ELASTIC_GROUP_WORKER, s.url, "hang", fast, s.events);
  const std::vector<std::string> args{"--dir", s.ckpt, "--steps", std::to_string(steps), "--min", "2", "--max", "4",
                                      "--timeout-ms", "1000", "--step-timeout-ms", "3000"};
  const std::vector<std::pair<std::string, std::string>> env{{"ELASTIC_WATCHDOG", wd.name}};
  for (int i = 0; i < 4; ++i) {
    auto a = args;
    if (i == 1) a.insert(a.end(), {"--stop-self-at", "15"});
    f.start("w" + std::to_string(i), a, env);
  }
  const bool ended = f.wait_until([&] { return f.all_ended({0, 1, 2, 3}); }, 120s);
  INFO(f.transcript(0) << f.transcript(1) << f.transcript(2) << f.transcript(3));
  REQUIRE(ended);
  // The hung rank never resumed: the watchdog's SIGKILL ended it (a stopped process takes it).
  REQUIRE(f[1].status);
  CHECK(WIFSIGNALED(*f[1].status));
  CHECK(WTERMSIG(*f[1].status) == SIGKILL);
  CHECK_FALSE(f.find(1, "step=", [](auto& l) { return num(l, "step") > 15; }));
  const auto kills = elastic::test::events_named(wd.events, "watchdog_kill");
  CHECK(std::any_of(kills.begin(), kills.end(), [&](const std::string& e) {
    return e.find("\"pid\":" + std::to_string(f[1].proc.pid())) != std::string::npos ||
           e.find("\"target_pid\":" + std::to_string(f[1].proc.pid())) != std::string::npos;
  }));
  for (std::size_t i : {0, 2, 3}) check_finished(f, i, steps, want, "3");
}

TEST_CASE("a rank frozen inside an allreduce (SIGSTOP) is dropped when its heartbeat lapses and not at Gloo's timeout") {
  // The survivors must be done (60 steps, rebuilt into 3) within 40 s of the start, which only
  // the departure seen by the watcher can give (slow_gloo).
  const std::uint64_t steps = 60;
  const std::string want = reference_crc(slow_gloo, steps);
  scratch s;
  // Round 2 holds the three survivors: one that missed it would come back as a newcomer, and
  // round 3's rebuild would name the newcomer instead of w1's departure.
  fleet f(ELASTIC_GROUP_WORKER, s.url, "frozen", slow_gloo_all_survivors, s.events);
  const std::vector<std::string> args{"--dir", s.ckpt, "--steps", std::to_string(steps), "--min", "2", "--max", "4"};
  start_workers(f, 4, args, {{1, {"--stop-self-at", "15"}}});  // its peers are in step 15's allreduce
  const std::vector<std::size_t> survivors{0, 2, 3};
  const bool ended = f.wait_until([&] { return f.all_ended(survivors); }, 40s);
  INFO(f.transcript(0) << f.transcript(1) << f.transcript(2) << f.transcript(3));
  // Frozen with its sockets open, it never ends by itself: reap it.
  f[1].proc.kill(SIGKILL);
  REQUIRE(f.wait_until([&] { return f.all_ended({1}); }, 10s));
  REQUIRE(ended);
  REQUIRE(f.find(1, "stopping "));
  for (auto i : survivors) {
    check_finished(f, i, steps, want, "3");
    const auto rebuilt = f.find(i, "rebuilt ", [](auto& l) { return field(l, "world") == "3"; });
    REQUIRE(rebuilt);
    INFO(*rebuilt);
    // The allreduce ended because w1 departed, not because it timed out.
    CHECK(rebuilt->find("departure of w1") != std::string::npos);
    CHECK(rebuilt->find("did not answer in time") == std::string::npos);
    const auto stopped = f.find(1, "stopping ");
    std::printf("rank %s: noticed %.1f ms after the SIGSTOP (heartbeat timeout 2000 ms), trained again %.1f ms after\n",
                f[i].id.c_str(), (num(*rebuilt, "noticed") - num(*stopped, "t")) / 1e6,
                (num(*rebuilt, "resynced") - num(*stopped, "t")) / 1e6);
  }
  const auto failures = elastic::test::events_named(s.events, "group_failure");
  CHECK_FALSE(failures.empty());
  for (const auto& e : failures) {
    INFO(e);
    CHECK(e.find("\"code\":\"peer_lost\"") != std::string::npos);
    // Its own watcher's revoke, or a peer's that closed their connection first: w1 either way.
    CHECK(e.find("departure of w1") != std::string::npos);
  }
}

TEST_CASE("a rank frozen while the next round's communicator connects is dropped when its heartbeat lapses") {
  // w3 dies at step 10; in the connect of round 2 w1 freezes before publishing its address. Only
  // the round's check (the departure seen in the store) ends the connect of w0 and w2 in time for
  // them to finish within 40 s, as a group of 2 (slow_gloo).
  const std::uint64_t steps = 40;
  const std::string want = reference_crc(slow_gloo, steps);
  scratch s;
  // Round 2 must hold w1: formed without it, w1 would never reach its connect.
  fleet f(ELASTIC_GROUP_WORKER, s.url, "frozen_connect", slow_gloo_all_survivors, s.events);
  const std::vector<std::string> args{"--dir", s.ckpt, "--steps", std::to_string(steps), "--min", "2", "--max", "4"};
  start_workers(f, 4, args, {{1, {"--stop-in-connect-round", "2"}}, {3, {"--kill-self-at", "10"}}});
  const std::vector<std::size_t> survivors{0, 2};
  const bool ended = f.wait_until([&] { return f.all_ended(survivors); }, 40s);
  INFO(f.transcript(0) << f.transcript(1) << f.transcript(2) << f.transcript(3));
  f[1].proc.kill(SIGKILL);  // frozen: reap it
  REQUIRE(f.wait_until([&] { return f.all_ended({1, 3}); }, 10s));
  REQUIRE(ended);
  REQUIRE(f.find(1, "stopping round=2"));
  for (auto i : survivors) check_finished(f, i, steps, want, "2");
  // The connect of round 2 ended because w1 departed, not at a timeout.
  const auto failed = elastic::test::events_named(s.events, "group_connect_failed");
  CHECK(std::any_of(failed.begin(), failed.end(), [](const std::string& e) {
    return e.find("w1 left round 2 while its communicator was being built") != std::string::npos;
  }));
}

TEST_CASE("a participant of another run shares the store without disturbing the group, and names it when alone") {
  const std::uint64_t steps = 80;
  const std::string want = reference_crc(fast, steps);
  scratch s;
  fleet f(ELASTIC_GROUP_WORKER, s.url, "ours", fast, s.events);
  // 80 steps of 50 ms: the run lives well past the intruder's 1.5 s wait.
  const std::vector<std::string> args{"--dir", s.ckpt, "--steps", std::to_string(steps), "--min", "2", "--max", "2",
                                      "--step-sleep-ms", "50"};
  f.start("w0", args);
  f.start("w1", args);
  REQUIRE(f.wait_until([&] { return f.find(0, "joined ") && f.find(1, "joined "); }, 30s));
  // Same store, another run id, and nobody else of its run: it waits alone, then says who is here.
  fleet intruder(ELASTIC_GROUP_WORKER, s.url, "theirs", fast, s.events);
  const auto x = intruder.start("x0", {"--dir", s.dir.file("other"), "--steps", "5", "--min", "2", "--max", "2",
                                       "--join-timeout-ms", "1500"});
  REQUIRE(intruder.wait_until([&] { return intruder.all_ended({x}); }, 30s));
  CHECK(exit_code_of(intruder[x].status) == 3);
  const auto err = intruder.find(x, "error ");
  REQUIRE(err);
  INFO(*err);
  CHECK(field(*err, "code") == "timeout");
  CHECK(err->find("run 'ours' is live in this store") != std::string::npos);
  REQUIRE(f.wait_until([&] { return f.all_ended({0, 1}); }, 60s));
  for (std::size_t i : {0, 1}) check_finished(f, i, steps, want, "0");
}

TEST_CASE("partitioned moments without replicas: 4 ranks lose one and reload from disk, take it back from memory, and "
          "end bit-identical") {
  const std::uint64_t steps = 150;
  const auto common = with_shards(fast);
  const auto want = sharded_reference(common, steps);
  scratch s;
  fleet f(ELASTIC_GROUP_WORKER, s.url, "zero1", common, s.events);
  const std::vector<std::string> args{"--dir", s.ckpt, "--steps", std::to_string(steps), "--min", "2", "--max", "4",
                                      "--step-sleep-ms", "10", "--replicas", "0"};
  for (int i = 0; i < 4; ++i) {
    auto a = args;
    if (i == 2) a.insert(a.end(), {"--kill-self-at", "25"});
    f.start("w" + std::to_string(i), a);
  }
  REQUIRE(f.wait_until([&] { return f[2].status.has_value(); }, 60s));
  REQUIRE(WIFSIGNALED(*f[2].status));
  REQUIRE(f.wait_until([&] { return f.find(0, "step=", [](auto& l) { return field(l, "world") == "3"; }).has_value(); },
                       30s));
  const auto back = f.start("w2", args);
  const bool ended = f.wait_until([&] { return f.all_ended({0, 1, 3, back}); }, 120s);
  INFO(f.transcript(0) << f.transcript(1) << f.transcript(3) << f.transcript(back));
  REQUIRE(ended);
  for (auto i : {std::size_t{0}, std::size_t{1}, std::size_t{3}, back}) check_sharded_finish(f, i, steps, want);
  // The lost slice came from the checkpoint, the 3 -> 4 move from the survivors' memory.
  const auto moves = elastic::test::events_named(s.events, "group_resharded");
  INFO(moves.size() << " group_resharded events");
  CHECK(std::any_of(moves.begin(), moves.end(),
                    [](const std::string& e) { return e.find("\"from\":\"disk\"") != std::string::npos; }));
  CHECK(std::any_of(moves.begin(), moves.end(), [](const std::string& e) {
    return e.find("\"from\":\"memory\"") != std::string::npos && e.find("\"world_after\":4") != std::string::npos &&
           e.find("\"round\":1,") == std::string::npos;  // the grow back, not the first join
  }));
}

namespace {

/// Whether one group_resharded event among `events` (the lines of an events file) holds every
/// fragment of `has`.
bool resharded(const std::string& events, std::initializer_list<std::string_view> has) {
  std::istringstream in(events);
  for (std::string e; std::getline(in, e);) {
    if (e.find("\"event\":\"group_resharded\"") == std::string::npos) continue;
    if (std::all_of(has.begin(), has.end(), [&](std::string_view h) { return e.find(h) != std::string::npos; })) {
      return true;
    }
  }
  return false;
}

/// `per_listener` TCP connections that say nothing to each of the 4 replica listeners whose
/// `replica_listening` events are in `events` (waiting for them), held until destroyed.
std::vector<elastic::internal::unique_fd> idle_connections(const std::string& events, int per_listener) {
  const auto listening = elastic::test::wait_for_events(events, "replica_listening", 4, 30s);
  REQUIRE(listening.size() >= 4);
  std::vector<elastic::internal::unique_fd> idle;
  for (const auto& e : listening) {
    const auto h = e.find("\"host\":\""), p = e.find("\"port\":");
    REQUIRE(h != std::string::npos);
    REQUIRE(p != std::string::npos);
    const auto host = e.substr(h + 8, e.find('"', h + 8) - h - 8);
    const auto port = static_cast<std::uint16_t>(std::stoul(e.substr(p + 7)));
    for (int i = 0; i < per_listener; ++i) {
      idle.push_back(elastic::internal::tcp::connect_to(host, port, elastic::internal::tcp::clock::now() + 5s));
    }
  }
  return idle;
}

/// 4 ranks with `replicas` successors holding each one's slices; `die` kill themselves
/// together in step 25 (snapshots every 10 steps); the survivors finish, then as many ranks
/// join again; every one ends with the weights and moments of an undisturbed run. With `idle`,
/// that many idle connections are held to every rank's replica listener from its start.
void lose_ranks(const std::string& run, int replicas, std::vector<int> die, std::string& events, int idle = 0) {
  const std::uint64_t steps = 150;
  const auto common = with_shards(fast);
  const auto want = sharded_reference(common, steps);
  scratch s;
  fleet f(ELASTIC_GROUP_WORKER, s.url, run, common, s.events);
  // Slower steps with idle connections: they are open before the first replica is sent.
  const std::vector<std::string> args{"--dir", s.ckpt, "--steps", std::to_string(steps), "--min", "2", "--max", "4",
                                      "--step-sleep-ms", idle > 0 ? "40" : "10", "--replicas", std::to_string(replicas)};
  for (int i = 0; i < 4; ++i) {
    auto a = args;
    if (std::find(die.begin(), die.end(), i) != die.end()) a.insert(a.end(), {"--kill-self-at", "25"});
    f.start("w" + std::to_string(i), a);
  }
  std::vector<elastic::internal::unique_fd> held;
  if (idle > 0) held = idle_connections(s.events, idle);
  std::vector<std::size_t> alive;
  for (std::size_t i = 0; i < 4; ++i) {
    if (std::find(die.begin(), die.end(), static_cast<int>(i)) == die.end()) alive.push_back(i);
  }
  REQUIRE(f.wait_until([&] { return std::all_of(die.begin(), die.end(), [&](int d) { return f[static_cast<std::size_t>(d)].status.has_value(); }); }, 60s));
  for (int d : die) REQUIRE(WIFSIGNALED(*f[static_cast<std::size_t>(d)].status));
  const std::string smaller = std::to_string(4 - die.size());
  REQUIRE(f.wait_until(
      [&] { return f.find(alive[0], "step=", [&](auto& l) { return field(l, "world") == smaller; }).has_value(); },
      30s));
  for (int d : die) alive.push_back(f.start("w" + std::to_string(d), args));
  const bool ended = f.wait_until([&] { return f.all_ended(alive); }, 120s);
  std::string all;
  for (auto i : alive) all += f.transcript(i);
  INFO(all);
  REQUIRE(ended);
  for (auto i : alive) check_sharded_finish(f, i, steps, want);
  std::ifstream in(s.events);
  events.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace

TEST_CASE("partitioned moments with peer replicas: 4 ranks lose one, take its slice from its successor's memory (no "
          "disk), grow back, and end bit-identical") {
  std::string events;
  lose_ranks("zero1-replica", 1, {2}, events);
  INFO(events);
  // Rank 2's slice came from rank 3's replica, the others' from their own images, at a snapshot
  // step (20, or 10 when the newest replica was still on the wire; on a loaded machine another
  // rank may lapse at the same time, so the world after is not checked).
  CHECK(resharded(events, {"\"from\":\"memory\"", "replica@", "\"rolled_back\":true"}));
  CHECK_FALSE(resharded(events, {"\"from\":\"disk\""}));
  CHECK(resharded(events, {"\"world_after\":4", "\"from\":\"memory\"", "live@", "\"rolled_back\":false"}));
  CHECK(events.find("\"event\":\"replica_sent\"") != std::string::npos);
}

TEST_CASE("partitioned moments with peer replicas: idle connections held on every replica listener do not push a lost "
          "slice to disk") {
  std::string events;
  lose_ranks("zero1-idle", 1, {2}, events, 16);
  INFO(events);
  CHECK(resharded(events, {"\"from\":\"memory\"", "replica@", "\"rolled_back\":true"}));
  CHECK_FALSE(resharded(events, {"\"from\":\"disk\""}));
}

TEST_CASE("partitioned moments with one replica: a rank and its successor lost together reload from disk, and end "
          "bit-identical") {
  std::string events;
  lose_ranks("zero1-buddy", 1, {1, 2}, events);
  INFO(events);
  CHECK(resharded(events, {"\"from\":\"disk\""}));
}

TEST_CASE("partitioned moments with two replicas: a rank and its successor lost together come back from memory") {
  std::string events;
  lose_ranks("zero1-two", 2, {1, 2}, events);
  INFO(events);
  CHECK(resharded(events, {"\"from\":\"memory\"", "replica@", "\"rolled_back\":true"}));
  CHECK_FALSE(resharded(events, {"\"from\":\"disk\""}));
}

TEST_CASE("partitioned moments: a notice stops 4 ranks at one agreed step with every part saved, and 3 resume it") {
  const std::uint64_t steps = 120;
  const auto common = with_shards(fast);
  const auto want = sharded_reference(common, steps);
  scratch s;
  fleet f(ELASTIC_GROUP_WORKER, s.url, "zero1-stop", common, s.events);
  const std::vector<std::string> args{"--dir", s.ckpt, "--steps", std::to_string(steps), "--min", "2", "--max", "4",
                                      "--step-sleep-ms", "20"};
  for (int i = 0; i < 4; ++i) f.start("w" + std::to_string(i), args);
  REQUIRE(f.wait_until([&] { return f.find(0, "step=", [](auto& l) { return num(l, "step") >= 33; }).has_value(); },
                       60s));
  for (std::size_t i = 0; i < 4; ++i) f[i].proc.kill(SIGTERM);
  REQUIRE(f.wait_until([&] { return f.all_ended({0, 1, 2, 3}); }, 60s));
  std::string stopped_at;
  for (std::size_t i = 0; i < 4; ++i) {
    INFO(f.transcript(i));
    CHECK(exit_code_of(f[i].status) == 75);
    const auto fin = f.find(i, "final ");
    REQUIRE(fin);
    CHECK(field(*fin, "reason") == "preempted");
    if (i == 0) stopped_at = field(*fin, "step");
    CHECK(field(*fin, "step") == stopped_at);  // one agreed step
  }
  const std::string step_dir = "step-" + std::string(12 - stopped_at.size(), '0') + stopped_at;
  REQUIRE(std::filesystem::exists(std::filesystem::path(s.ckpt) / step_dir));  // committed: every part was there
  // Three ranks resume the 4 ranks' checkpoint and finish.
  std::vector<std::size_t> again;
  for (int i = 0; i < 3; ++i) again.push_back(f.start("v" + std::to_string(i), args));
  REQUIRE(f.wait_until([&] { return f.all_ended(again); }, 120s));
  for (auto i : again) check_sharded_finish(f, i, steps, want);
}

TEST_CASE("a group refuses a fixed slice (add_shard), which cannot follow it, with a clear error") {
  scratch s;
  fleet f(ELASTIC_GROUP_WORKER, s.url, "sharded", fast, s.events);
  const std::vector<std::string> args{"--dir", s.ckpt, "--steps", "20", "--min", "2", "--max", "2", "--shard", "1"};
  f.start("w0", args);
  f.start("w1", args);
  REQUIRE(f.wait_until([&] { return f.all_ended({0, 1}); }, 60s));
  for (std::size_t i : {0, 1}) {
    CHECK(exit_code_of(f[i].status) == 3);
    const auto err = f.find(i, "error ");
    REQUIRE(err);
    CHECK(field(*err, "code") == "not_supported");
    CHECK(err->find("'moments' is a fixed slice (add_shard)") != std::string::npos);
  }
}

TEST_CASE("a rank that comes to a run that already finished ends as finished with its final weights at once") {
  const std::uint64_t steps = 30;
  const std::string want = reference_crc(fast, steps);
  scratch s;
  fleet f(ELASTIC_GROUP_WORKER, s.url, "over", fast, s.events);
  // A join timeout far past what this test waits: only the run's end can stop the late rank.
  const std::vector<std::string> args{"--dir", s.ckpt, "--steps", std::to_string(steps), "--min", "2", "--max", "3",
                                      "--join-timeout-ms", "120000"};
  f.start("w0", args);
  f.start("w1", args);
  REQUIRE(f.wait_until([&] { return f.all_ended({0, 1}); }, 60s));
  for (std::size_t i : {0u, 1u}) check_finished(f, i, steps, want, "0");

  // A restarted rank no round admitted before the end (or one started again under the id):
  // it does not wait for the members that left, it loads the final checkpoint and is done.
  const auto t0 = std::chrono::steady_clock::now();
  const auto late = f.start("w2", args);
  const bool ended = f.wait_until([&] { return f.all_ended({late}); }, 30s);
  INFO(f.transcript(late));
  REQUIRE(ended);
  CHECK(std::chrono::steady_clock::now() - t0 < 20s);
  check_finished(f, late, steps, want, "0");
  CHECK_FALSE(f.find(late, "joined "));

  // A launch that asks for other steps under the finished run's id is refused, saying why.
  auto more = args;
  more[3] = std::to_string(steps + 10);
  const auto other = f.start("w3", more);
  REQUIRE(f.wait_until([&] { return f.all_ended({other}); }, 30s));
  INFO(f.transcript(other));
  CHECK(exit_code_of(f[other].status) == 3);
  const auto err = f.find(other, "error ");
  REQUIRE(err);
  CHECK(field(*err, "code") == "mismatch");
  CHECK(err->find("already finished, its step 30 of 30 durable") != std::string::npos);
  CHECK(err->find("asked for 30 steps, this loop for 40") != std::string::npos);
}

TEST_CASE("a group that falls below min_ranks stops with a clear error and keeps its checkpoint") {
  scratch s;
  fleet f(ELASTIC_GROUP_WORKER, s.url, "shrink", fast, s.events);
  const std::vector<std::string> args{"--dir", s.ckpt, "--steps", "1000", "--min", "3", "--max", "3",
                                      "--join-timeout-ms", "2000", "--step-sleep-ms", "5"};
  for (int i = 0; i < 3; ++i) f.start("w" + std::to_string(i), args);
  REQUIRE(f.wait_until([&] { return f.find(0, "step=", [](auto& l) { return num(l, "step") >= 25; }).has_value(); },
                       60s));
  f[2].proc.kill(SIGKILL);
  const bool ended = f.wait_until([&] { return f.all_ended({0, 1, 2}); }, 60s);
  INFO(f.transcript(0) << f.transcript(1));
  REQUIRE(ended);
  for (auto i : {0, 1}) {
    CHECK(exit_code_of(f[i].status) == 3);
    const auto err = f.find(i, "error ");
    REQUIRE(err);
    CHECK(field(*err, "code") == "timeout");
    CHECK(err->find("below min_ranks 3") != std::string::npos);
  }
  // What was committed stays, and loads.
  const auto committed = elastic::checkpoint::storage::list_steps(s.ckpt);
  REQUIRE_FALSE(committed.empty());
  CHECK(committed.front() >= 20);
}

TEST_CASE("a survivor waiting for the group to re-form exits 75 on SIGTERM, its newest committed step standing") {
  scratch s;
  fleet f(ELASTIC_GROUP_WORKER, s.url, "regroup", fast, s.events);
  // The join timeout is far past what this test waits: only the notice can end the wait.
  const std::vector<std::string> args{"--dir", s.ckpt, "--steps", "100000", "--min", "3", "--max", "3",
                                      "--join-timeout-ms", "120000", "--step-sleep-ms", "5"};
  for (int i = 0; i < 3; ++i) f.start("w" + std::to_string(i), args);
  REQUIRE(f.wait_until([&] { return f.find(0, "step=", [](auto& l) { return num(l, "step") >= 25; }).has_value(); },
                       60s));
  f[2].proc.kill(SIGKILL);
  // Both survivors are back in the rendezvous, waiting for a third member that never comes.
  auto rejoined = [&](std::size_t i) {
    const auto joins = elastic::test::events_named(s.events, "rendezvous_join");
    const std::string pid = "\"pid\":" + std::to_string(f[i].proc.pid()) + ",";
    return std::any_of(joins.begin(), joins.end(), [&](const std::string& e) {
      return e.find(pid) != std::string::npos && e.find("\"previous_round\":0") == std::string::npos;
    });
  };
  REQUIRE(f.wait_until([&] { return rejoined(0) && rejoined(1); }, 60s));
  const auto committed = elastic::checkpoint::storage::list_steps(s.ckpt);
  REQUIRE_FALSE(committed.empty());
  for (std::size_t i : {1, 0}) {
    f[i].proc.kill(SIGTERM);
    const bool ended = f.wait_until([&] { return f.all_ended({i}); }, 20s);
    INFO(f.transcript(i));
    REQUIRE(ended);
    CHECK(exit_code_of(f[i].status) == elastic::exit_preempted);
    const auto fin = f.find(i, "final ");
    REQUIRE(fin);
    CHECK(field(*fin, "reason") == "preempted");
  }
  // No new checkpoint: the newest committed step stands, and the loops said why.
  CHECK(elastic::checkpoint::storage::list_steps(s.ckpt).front() == committed.front());
  const auto ends = elastic::test::events_named(s.events, "loop_preempted");
  CHECK(std::count_if(ends.begin(), ends.end(), [](const std::string& e) {
          return e.find("\"interrupted\":\"regroup\"") != std::string::npos &&
                 e.find("\"final_checkpoint\":false") != std::string::npos;
        }) == 2);
}

TEST_CASE("a gloo connect waiting for a peer that never comes stops at a preemption notice") {
  scratch s;
  elastic::rendezvous::shm_store store(s.store_name);
  const elastic::preemption_handler notices;
  std::jthread notify([] {
    std::this_thread::sleep_for(300ms);
    ::kill(::getpid(), SIGTERM);  // a real signal, to this process's handler
  });
  std::optional<elastic::error> got;
  try {
    elastic::comm::gloo_communicator c(store, "lonely", 0, 2, 60s);  // rank 1 never comes
  } catch (const elastic::error& e) {
    got = e;
  }
  notify.join();
  elastic::preemption_handler::clear();
  REQUIRE(got);
  INFO(got->what());
  CHECK(got->code() == elastic::errc::interrupted);
}

#if defined(ELASTIC_ETCD_SERVER)
TEST_CASE("etcd away for 3 seconds: training goes on, and the group still recovers once it is back") {
  const std::uint64_t steps = 400;
  const std::string want = reference_crc(fast, steps);
  elastic::test::etcd_server etcd;
  scratch s;
  // etcd: no agent retires a dead rank's key, its lease does (2 s).
  std::vector<std::string> common = fast;
  common.insert(common.end(), {"--hb-interval-ms", "250", "--hb-timeout-ms", "2000", "--unavailable-ms", "20000"});
  fleet f(ELASTIC_GROUP_WORKER, etcd.url(), "outage", common, s.events);
  const std::vector<std::string> args{"--dir", s.ckpt, "--steps", std::to_string(steps), "--min", "2", "--max", "3",
                                      "--step-sleep-ms", "10"};
  for (int i = 0; i < 3; ++i) f.start("w" + std::to_string(i), args);
  auto last_step = [&](std::size_t i) {
    std::int64_t n = 0;
    for (const auto& l : f[i].lines)
      if (starts_with(l, "step=")) n = std::max(n, num(l, "step"));
    return n;
  };
  REQUIRE(f.wait_until([&] { return last_step(0) >= 30 && last_step(1) >= 30 && last_step(2) >= 30; }, 60s));
  etcd.kill();
  const std::int64_t before = last_step(0);
  f.wait_until([] { return false; }, 3s);
  const std::int64_t during = last_step(0);
  etcd.restart();
  INFO(f.transcript(0) << f.transcript(1) << f.transcript(2));
  CHECK(during - before >= 20);  // steps need no store: ~100 of them fit in 3 s
  // Once etcd answers again, a death is handled as usual.
  REQUIRE(f.wait_until([&] { return last_step(0) >= during + 20; }, 30s));
  f[2].proc.kill(SIGKILL);
  const bool ended = f.wait_until([&] { return f.all_ended({0, 1, 2}); }, 120s);
  INFO(f.transcript(0) << f.transcript(1));
  REQUIRE(ended);
  for (std::size_t i : {0, 1}) check_finished(f, i, steps, want, "2");
}

TEST_CASE("etcd gone for good: a rebuild fails with a clear error after the store's timeout") {
  elastic::test::etcd_server etcd;
  scratch s;
  std::vector<std::string> common = fast;
  common.insert(common.end(), {"--hb-interval-ms", "250", "--hb-timeout-ms", "2000", "--unavailable-ms", "2000"});
  fleet f(ELASTIC_GROUP_WORKER, etcd.url(), "gone", common, s.events);
  const std::vector<std::string> args{"--dir", s.ckpt, "--steps", "100000", "--min", "2", "--max", "3",
                                      "--step-sleep-ms", "5"};
  for (int i = 0; i < 3; ++i) f.start("w" + std::to_string(i), args);
  REQUIRE(f.wait_until([&] { return f.find(0, "step=", [](auto& l) { return num(l, "step") >= 20; }).has_value(); },
                       60s));
  etcd.kill();
  f[2].proc.kill(SIGKILL);
  const bool ended = f.wait_until([&] { return f.all_ended({0, 1, 2}); }, 60s);
  INFO(f.transcript(0) << f.transcript(1));
  REQUIRE(ended);
  for (auto i : {0, 1}) {
    CHECK(exit_code_of(f[i].status) == 3);
    const auto err = f.find(i, "error ");
    REQUIRE(err);
    CHECK(field(*err, "code") == "unavailable");
    CHECK(err->find(etcd.endpoint()) != std::string::npos);  // says which store did not answer
  }
  CHECK_FALSE(elastic::checkpoint::storage::list_steps(s.ckpt).empty());
}
#endif
