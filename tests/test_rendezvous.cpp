// Rendezvous rounds over the shm:// store: real participant processes (rdzv_worker) forming
// rounds, dying and coming back; refusals and damaged keys; would-be leaders racing.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <latch>
#include <mutex>
#include <optional>
#include <sstream>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <vector>

#include <elastic/checkpoint/preemption.hpp>
#include <elastic/rendezvous/rendezvous.hpp>
#include <elastic/rendezvous/shm_store.hpp>

#include "support/catch.hpp"
#include "support/forwarding_store.hpp"
#include "support/env_var.hpp"
#include "support/errors.hpp"
#include "support/process.hpp"
#include "support/threads.hpp"

using namespace std::chrono_literals;
using elastic::errc;
using elastic::test::child_process;
using elastic::test::on_threads;
using elastic::test::error_of;
namespace rdzv = elastic::rendezvous;

namespace {

using clock_type = std::chrono::steady_clock;

constexpr auto heartbeat_timeout = 500ms;

/// A store with a unique name, removed at the end of the test.
struct scratch_store {
  std::string name = elastic::test::unique_name("rdzv");
  rdzv::shm_store s{name};
  ~scratch_store() { rdzv::shm_store::remove(name); }
};

/// Short timings, events dropped: what the in-process tests use.
rdzv::rendezvous_options options(const std::string& run, int min, int max, const std::string& id) {
  rdzv::rendezvous_options o;
  o.run_id = run;
  o.min_ranks = min;
  o.max_ranks = max;
  o.participant_id = id;
  // In-process participants share this process's cores with the test; where detection time is
  // not what is tested, a longer lease keeps a loaded (sanitized, parallel) run from starving one.
  o.heartbeat_interval = 100ms;
  o.heartbeat_timeout = 3s;
  o.last_call_timeout = 200ms;
  o.join_timeout = 5s;
  o.events = elastic::event_log();
  return o;
}

child_process participant(const std::string& store, const std::string& run, int min, int max, const std::string& id,
                          const std::string& mode, std::vector<std::string> extra = {}) {
  std::vector<std::string> argv{ELASTIC_RDZV_WORKER, store, run, std::to_string(min), std::to_string(max), id, mode};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return child_process::spawn(argv);
}

/// A "round N rank R world W members A,B bootstrap X" line.
struct round_line {
  long round = 0, rank = -1, world = 0;
  std::vector<std::string> members;
  std::string bootstrap;
};

std::optional<round_line> parse_round(const std::string& line) {
  std::istringstream in(line);
  std::string w1, w2, w3, w4, w5, members;
  round_line r;
  if (!(in >> w1 >> r.round >> w2 >> r.rank >> w3 >> r.world >> w4 >> members >> w5 >> r.bootstrap) ||
      w1 != "round") {
    return std::nullopt;
  }
  std::stringstream ms(members);
  for (std::string m; std::getline(ms, m, ',');) r.members.push_back(m);
  return r;
}

/// The next line of `p` starting with `prefix`, skipping others; fails the test on timeout.
std::string next_line(child_process& p, const std::string& prefix, std::chrono::milliseconds timeout = 15s) {
  const auto until = clock_type::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - clock_type::now());
    auto line = p.read_line(std::max(left, 1ms));
    if (!line) FAIL("no line starting with '" << prefix << "' from pid " << p.pid());
    INFO(*line);
    if (line->starts_with("error")) FAIL("participant failed: " << *line);
    if (line->starts_with(prefix)) return *line;
  }
}

round_line next_round(child_process& p, long round) {
  for (;;) {
    auto r = parse_round(next_line(p, "round "));
    REQUIRE(r);
    if (r->round >= round) return *r;
  }
}

}  // namespace

TEST_CASE("four participants form a round: distinct ranks, one world size, the leader's bootstrap") {
  scratch_store t;
  std::vector<child_process> ps;
  for (int i = 0; i < 4; ++i) ps.push_back(participant(t.name, "job", 4, 4, "p" + std::to_string(i), "once"));
  std::vector<round_line> rs;
  for (auto& p : ps) rs.push_back(next_round(p, 1));
  std::vector<long> ranks;
  for (const auto& r : rs) {
    CHECK(r.round == 1);
    CHECK(r.world == 4);
    CHECK(r.members == rs[0].members);
    CHECK(r.bootstrap == "boot:" + rs[0].members[0] + ":1");
    ranks.push_back(r.rank);
  }
  std::sort(ranks.begin(), ranks.end());
  CHECK(ranks == std::vector<long>{0, 1, 2, 3});
  // Newcomers are ranked by id.
  CHECK(rs[0].members == std::vector<std::string>{"p0", "p1", "p2", "p3"});
  for (auto& p : ps) CHECK(p.exit_code(10s) == 0);
}

TEST_CASE("a round closes at once when max_ranks have joined") {
  scratch_store t;
  const auto start = clock_type::now();
  std::vector<child_process> ps;
  for (int i = 0; i < 3; ++i) {
    ps.push_back(participant(t.name, "job", 2, 3, "p" + std::to_string(i), "once", {"--last-call", "20000"}));
  }
  for (auto& p : ps) CHECK(next_round(p, 1).world == 3);
  const auto took = clock_type::now() - start;
  INFO("formed in " << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms");
  CHECK(took < 10s);  // far below the 20 s last call
}

TEST_CASE("a round with min_ranks but not max_ranks closes when the last call runs out") {
  scratch_store t;
  std::vector<rdzv::round_info> got(2);
  std::vector<std::chrono::milliseconds> took(2);
  auto errors = on_threads(2, [&](int i) {
    auto o = options("job", 2, 4, "p" + std::to_string(i));
    o.last_call_timeout = 400ms;
    rdzv::rendezvous rv(t.s, o);
    const auto start = clock_type::now();
    got[i] = rv.join();
    took[i] = std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - start);
  });
  REQUIRE(errors.empty());
  for (int i = 0; i < 2; ++i) {
    INFO("participant " << i << " took " << took[i].count() << " ms");
    CHECK(got[i].world_size == 2);
    CHECK(took[i] >= 400ms);
    CHECK(took[i] < 4s);
  }
  CHECK(got[0].bootstrap == got[1].bootstrap);
  CHECK(got[0].bootstrap == "/elastic/job/round/1/gloo/");  // the default: Gloo's store prefix
}

namespace {

/// Holds every publication of a round's bootstrap for `hold`: the members that need it wait.
class slow_bootstrap final : public elastic::test::forwarding_store {
 public:
  slow_bootstrap(rdzv::store& s, std::chrono::milliseconds hold) : forwarding_store(s), hold_(hold) {}
  bool compare_set(std::string_view k, std::optional<std::string_view> expected, std::string_view desired,
                   rdzv::lease_id l, std::optional<std::string>* actual) override {
    if (k.find("/bootstrap/") != std::string_view::npos) std::this_thread::sleep_for(hold_);
    return s_.compare_set(k, expected, desired, l, actual);
  }

 private:
  std::chrono::milliseconds hold_;
};

}  // namespace

TEST_CASE("with the default bootstrap the members take it from the round's outcome, not from the leader") {
  // The leader's join says it makes the default (the Gloo store prefix), the closer writes so in
  // the outcome, and every member knows the blob at once: one wake per round, not two. A leader
  // with a bootstrap of its own is waited for, whatever the members would make.
  scratch_store t;
  slow_bootstrap slow(t.s, 1500ms);
  struct joined {
    rdzv::round_info info;
    std::chrono::milliseconds took{0};
  };
  auto run = [&](const std::string& run_id, auto bootstrap_of) {
    std::vector<joined> got(3);
    auto errors = on_threads(3, [&](int i) {
      auto o = options(run_id, 3, 3, "p" + std::to_string(i));  // p0 leads: newcomers rank by id
      rdzv::rendezvous rv(slow, o);
      const auto start = clock_type::now();
      got[i].info = rv.join(bootstrap_of(i));
      got[i].took = std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - start);
    });
    REQUIRE(errors.empty());
    return got;
  };
  SECTION("everyone the default: the members do not wait for its publication") {
    const auto got = run("dflt", [](int) { return rdzv::bootstrap_fn{}; });
    for (const auto& g : got) {
      INFO("rank " << g.info.rank << " took " << g.took.count() << " ms");
      CHECK(g.info.bootstrap == "/elastic/dflt/round/1/gloo/");
      if (g.info.rank == 0) CHECK(g.took >= 1500ms);  // it published
      else CHECK(g.took < 1500ms);
    }
    const auto closed = t.s.get("/elastic/dflt/closed/1");
    REQUIRE(closed);
    CHECK(closed->starts_with("members gloo\n"));
    CHECK(t.s.get("/elastic/dflt/bootstrap/1") == "/elastic/dflt/round/1/gloo/");  // published all the same
  }
  SECTION("a leader with its own bootstrap: the members wait for its blob, though theirs would be the default") {
    const auto got = run("own", [](int i) {
      return i == 0 ? rdzv::bootstrap_fn([](const rdzv::round_info& r) { return "own:" + std::to_string(r.round); })
                    : rdzv::bootstrap_fn{};
    });
    for (const auto& g : got) {
      INFO("rank " << g.info.rank << " took " << g.took.count() << " ms");
      CHECK(g.info.bootstrap == "own:1");
      CHECK(g.took >= 1500ms);
    }
    const auto closed = t.s.get("/elastic/own/closed/1");
    REQUIRE(closed);
    CHECK(closed->starts_with("members\n"));
  }
}

TEST_CASE("a SIGKILLed participant is declared dead within the heartbeat timeout and survivors keep their order") {
  scratch_store t;
  std::vector<child_process> ps;
  for (int i = 0; i < 4; ++i) {
    ps.push_back(participant(t.name, "job", 2, 4, "p" + std::to_string(i), "stay", {"--last-call", "5000"}));
  }
  std::vector<round_line> first;
  for (auto& p : ps) first.push_back(next_round(p, 1));
  const std::size_t victim = static_cast<std::size_t>(std::find_if(first.begin(), first.end(), [](auto& r) {
                                                        return r.rank == 1;
                                                      }) - first.begin());
  const std::string victim_id = first[victim].members[1];
  const auto killed_at = clock_type::now();
  ps[victim].kill(SIGKILL);
  REQUIRE(ps[victim].killed_by(SIGKILL, 5s));

  std::vector<std::string> expected = first[0].members;
  expected.erase(expected.begin() + 1);
  for (std::size_t i = 0; i < ps.size(); ++i) {
    if (i == victim) continue;
    const std::string change = next_line(ps[i], "change ");
    const auto seen = std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - killed_at);
    INFO(change << " after " << seen.count() << " ms");
    CHECK((change.find("departed=" + victim_id) != std::string::npos || change.find("advanced=1") != std::string::npos));
    // Lease expiry (heartbeat timeout) plus one poll; the slack is for loaded or sanitized runs.
    CHECK(seen < heartbeat_timeout + 1500ms);
    const auto r = next_round(ps[i], 2);
    CHECK(r.world == 3);
    CHECK(r.members == expected);  // survivors in their old order, ranks compacted
    const auto old_pos = std::find(expected.begin(), expected.end(), first[i].members[first[i].rank]) - expected.begin();
    CHECK(r.rank == old_pos);
    CHECK(r.bootstrap == "boot:" + expected[0] + ":" + std::to_string(r.round));
  }
}

TEST_CASE("a restarted participant waits and is admitted in the next round") {
  scratch_store t;
  std::vector<child_process> ps;
  for (int i = 0; i < 4; ++i) {
    ps.push_back(participant(t.name, "job", 2, 4, "p" + std::to_string(i), "stay", {"--last-call", "5000"}));
  }
  for (auto& p : ps) REQUIRE(next_round(p, 1).world == 4);
  ps[2].kill(SIGKILL);  // p2: rank 2
  REQUIRE(ps[2].killed_by(SIGKILL, 5s));
  for (std::size_t i : {0u, 1u, 3u}) REQUIRE(next_round(ps[i], 2).world == 3);

  // The same id comes back as a new incarnation: round 2 is closed and not full, so it waits.
  ps[2] = participant(t.name, "job", 2, 4, "p2", "stay", {"--last-call", "5000"});
  const auto back = next_round(ps[2], 3);
  CHECK(back.world == 4);
  CHECK(back.members == std::vector<std::string>{"p0", "p1", "p3", "p2"});  // survivors first, then the newcomer
  CHECK(back.rank == 3);
  for (std::size_t i : {0u, 1u, 3u}) {
    const auto r = next_round(ps[i], back.round);
    CHECK(r.round == back.round);
    CHECK(r.members == back.members);
    CHECK(r.bootstrap == back.bootstrap);
  }
}

TEST_CASE("a late joiner waits and is admitted in the next round (scale-up)") {
  scratch_store t;
  std::vector<child_process> ps;
  for (int i = 0; i < 3; ++i) {
    ps.push_back(participant(t.name, "job", 2, 4, "p" + std::to_string(i), "stay", {"--last-call", "300"}));
  }
  for (auto& p : ps) REQUIRE(next_round(p, 1).world == 3);
  ps.push_back(participant(t.name, "job", 2, 4, "late", "stay"));
  const auto r = next_round(ps[3], 2);
  CHECK(r.world == 4);
  CHECK(r.members == std::vector<std::string>{"p0", "p1", "p2", "late"});
  CHECK(r.rank == 3);
  for (std::size_t i = 0; i < 3; ++i) {
    CHECK(next_line(ps[i], "change ").find("joining=late") != std::string::npos);
    const auto s = next_round(ps[i], r.round);
    CHECK(s.members == r.members);
    CHECK(s.rank == static_cast<long>(i));
  }
}

TEST_CASE("a participant that leaves done is a departure on purpose, one that leaves otherwise a death") {
  scratch_store t;
  std::optional<rdzv::rendezvous> a, b, c;
  a.emplace(t.s, options("job", 3, 3, "a"));
  b.emplace(t.s, options("job", 3, 3, "b"));
  c.emplace(t.s, options("job", 3, 3, "c"));
  REQUIRE(on_threads(3, [&](int i) { (i == 0 ? a : i == 1 ? b : c)->join(); }).empty());
  b->leave(true);  // finished: it owes the others no collective
  c->leave();      // gone without a word: as if it had died
  const auto ch = a->poll();
  CHECK(ch.departed == std::vector<std::string>{"b", "c"});
  CHECK(ch.left == std::vector<std::string>{"b"});
}

TEST_CASE("poll() looks again whenever the view changed: each departure shows at the next poll after idle ones") {
  // poll() derives departures and joiners from its copy of the keys only when the copy changed;
  // here every change must still show at the very next poll, and nothing twice as an event.
  elastic::test::temp_dir dir;
  const auto events = elastic::event_log::to_file(dir.file("events.jsonl"));
  scratch_store t;
  std::optional<rdzv::rendezvous> a, b, c, d;
  auto opts = [&](const std::string& id) {
    auto o = options("job", 2, 4, id);
    o.events = events;
    return o;
  };
  a.emplace(t.s, opts("a"));
  b.emplace(t.s, opts("b"));
  c.emplace(t.s, opts("c"));
  d.emplace(t.s, opts("d"));
  REQUIRE(on_threads(4, [&](int i) { (i == 0 ? a : i == 1 ? b : i == 2 ? c : d)->join(); }).empty());
  for (int i = 0; i < 5; ++i) CHECK_FALSE(a->poll().any());
  c->leave(true);
  auto ch = a->poll();
  CHECK(ch.departed == std::vector<std::string>{"c"});
  CHECK(ch.left == std::vector<std::string>{"c"});
  for (int i = 0; i < 3; ++i) CHECK(a->poll().departed == std::vector<std::string>{"c"});
  d->leave();  // its lease revoked: its heartbeat key goes, a death
  ch = a->poll();
  CHECK(ch.departed == std::vector<std::string>{"c", "d"});
  CHECK(ch.left == std::vector<std::string>{"c"});
  b.reset();
  ch = a->poll();
  CHECK(ch.departed == std::vector<std::string>{"b", "c", "d"});
  CHECK(ch.left == std::vector<std::string>{"c"});
  CHECK_FALSE(ch.round_advanced);
  CHECK(a->poll().departed == ch.departed);
  const auto departures = elastic::test::events_named(dir.file("events.jsonl"), "rendezvous_departure");
  CHECK(departures.size() == 3);
}

TEST_CASE("a participant that leaves is a departure at the others' next poll, with an event") {
  elastic::test::temp_dir dir;
  const auto events = elastic::event_log::to_file(dir.file("events.jsonl"));
  scratch_store t;
  std::optional<rdzv::rendezvous> a, b;
  auto oa = options("job", 2, 2, "a"), ob = options("job", 2, 2, "b");
  oa.events = ob.events = events;
  oa.join_timeout = 1s;  // for the last round, which cannot form
  a.emplace(t.s, oa);
  b.emplace(t.s, ob);
  REQUIRE(on_threads(2, [&](int i) { (i == 0 ? a : b)->join(); }).empty());
  CHECK_FALSE(a->poll().any());
  b.reset();
  const auto ch = a->poll();
  CHECK(ch.departed == std::vector<std::string>{"b"});
  CHECK_FALSE(ch.round_advanced);
  CHECK(elastic::test::events_named(dir.file("events.jsonl"), "rendezvous_join").size() == 2);
  const auto closed = elastic::test::events_named(dir.file("events.jsonl"), "rendezvous_round_closed");
  REQUIRE(closed.size() == 2);
  CHECK(closed[0].find("\"world_size\":2") != std::string::npos);
  CHECK(closed[0].find("\"members\":\"a,b\"") != std::string::npos);
  const auto departures = elastic::test::events_named(dir.file("events.jsonl"), "rendezvous_departure");
  REQUIRE(departures.size() == 1);
  CHECK(departures[0].find("\"participant\":\"b\"") != std::string::npos);
  // Below min_ranks now: the next round stops with a clear error and an event.
  const auto e = error_of([&] { a->next_round(); });
  CHECK(e.code() == errc::timeout);
  CHECK(elastic::test::events_named(dir.file("events.jsonl"), "rendezvous_timeout").size() == 1);
}

TEST_CASE("a group that falls below min_ranks after a departure stops with a clear timeout") {
  scratch_store t;
  std::vector<child_process> ps;
  for (int i = 0; i < 3; ++i) {
    ps.push_back(participant(t.name, "job", 3, 3, "p" + std::to_string(i), "stay", {"--join-timeout", "1500"}));
  }
  for (auto& p : ps) REQUIRE(next_round(p, 1).world == 3);
  ps[0].kill(SIGKILL);
  REQUIRE(ps[0].killed_by(SIGKILL, 5s));
  for (std::size_t i : {1u, 2u}) {
    std::string line;
    for (auto l = ps[i].read_line(15s); l; l = ps[i].read_line(15s)) {
      if (l->starts_with("error")) {
        line = *l;
        break;
      }
    }
    INFO(line);
    CHECK(line.starts_with("error timeout"));
    CHECK(line.find("fell to 2 participants, below min_ranks 3") != std::string::npos);
    CHECK(ps[i].exit_code(10s) == 3);
  }
}

TEST_CASE("a participant waiting for the group to re-form stops at a preemption notice") {
  scratch_store t;
  std::vector<child_process> ps;
  // The join timeout is far longer than this test waits: only the notice can end the wait.
  for (int i = 0; i < 3; ++i) {
    ps.push_back(participant(t.name, "job", 3, 3, "p" + std::to_string(i), "stay", {"--join-timeout", "120000"}));
  }
  for (auto& p : ps) REQUIRE(next_round(p, 1).world == 3);
  ps[0].kill(SIGKILL);
  REQUIRE(ps[0].killed_by(SIGKILL, 5s));
  // The survivors see the departure and wait in round 2 for a third participant.
  for (std::size_t i : {1u, 2u}) CHECK(next_line(ps[i], "change ").find("departed=p0") != std::string::npos);
  std::this_thread::sleep_for(200ms);
  ps[1].kill(SIGTERM);
  std::string line;
  for (auto l = ps[1].read_line(20s); l; l = ps[1].read_line(20s)) {
    if (l->starts_with("error")) {
      line = *l;
      break;
    }
  }
  INFO(line);
  CHECK(line.starts_with("error interrupted"));
  CHECK(line.find("preemption notice") != std::string::npos);
  CHECK(ps[1].exit_code(10s) == elastic::exit_preempted);
  // The other survivor is still waiting; it honours its own notice the same way.
  ps[2].kill(SIGTERM);
  CHECK(ps[2].exit_code(20s) == elastic::exit_preempted);
}

TEST_CASE("a group that never reaches min_ranks stops with a clear timeout") {
  scratch_store t;
  std::vector<std::optional<elastic::error>> got(2);
  auto errors = on_threads(2, [&](int i) {
    auto o = options("job", 3, 4, "p" + std::to_string(i));
    o.join_timeout = 600ms;
    rdzv::rendezvous rv(t.s, o);
    try {
      rv.join();
    } catch (const elastic::error& e) {
      got[i] = e;  // checked below: Catch's assertions are for the main thread only
    }
  });
  CHECK(errors.empty());
  for (const auto& e : got) {
    REQUIRE(e);
    INFO(e->what());
    CHECK(e->code() == errc::timeout);
    CHECK(std::string(e->what()).find("of min_ranks 3 participants joined within 600 ms") != std::string::npos);
  }
}

TEST_CASE("the group's bounds come from ELASTIC_MIN_RANKS and ELASTIC_MAX_RANKS (or their older names) unless the code sets them") {
  scratch_store st;
  using elastic::test::env_var;  // set before any participant exists and unset after
  auto bounds = [&](int min, int max) {
    auto o = options("bounds", 1, 1, "p1");
    o.min_ranks = min;
    o.max_ranks = max;
    rdzv::rendezvous r(st.s, o);
    return std::pair{r.options().min_ranks, r.options().max_ranks};
  };
  CHECK(bounds(0, 0) == std::pair{1, 1});  // alone, as before
  {
    env_var lo("ELASTIC_MIN_NODES", "2"), hi("ELASTIC_MAX_NODES", "8");
    CHECK(bounds(0, 0) == std::pair{2, 8});
    CHECK(bounds(3, 0) == std::pair{3, 8});
    CHECK(bounds(1, 4) == std::pair{1, 4});  // the code wins
  }
  {
    env_var lo("ELASTIC_MIN_NODES", "3");
    CHECK(bounds(0, 0) == std::pair{3, 3});
  }
  {
    env_var lo("ELASTIC_MIN_NODES", "4"), hi("ELASTIC_MAX_NODES", "2");
    const auto e = error_of([&] { (void)bounds(0, 0); });
    CHECK(e.code() == errc::invalid_argument);
    CHECK(std::string(e.what()).find("ELASTIC_MIN_NODES") != std::string::npos);
  }
  {
    env_var lo("ELASTIC_MIN_RANKS", "2"), hi("ELASTIC_MAX_RANKS", "6"), old_lo("ELASTIC_MIN_NODES", "3");
    CHECK(bounds(0, 0) == std::pair{2, 6});  // the current names first, the older ones after
  }
  {
    env_var lo("ELASTIC_MIN_RANKS", "5"), hi("ELASTIC_MAX_RANKS", "4");
    const auto e = error_of([&] { (void)bounds(0, 0); });
    CHECK(e.code() == errc::invalid_argument);
    CHECK(std::string(e.what()).find("min_ranks 5 (ELASTIC_MIN_RANKS, or the default 1) and max_ranks 4 "
                                     "(ELASTIC_MAX_RANKS)") != std::string::npos);
  }
  {
    env_var lo("ELASTIC_MIN_NODES", "two");
    const auto e = error_of([&] { (void)bounds(0, 0); });
    CHECK(e.code() == errc::invalid_argument);
    CHECK(std::string(e.what()).find("ELASTIC_MIN_NODES") != std::string::npos);
  }
}

TEST_CASE("alive_key names the key a participant's heartbeat lives in: erasing it retires the participant") {
  scratch_store st;
  rdzv::rendezvous r(st.s, options("alivekey", 1, 1, "host.42:0"));
  r.join();
  CHECK(rdzv::alive_key("/elastic", "alivekey", "host.42:0") == "/elastic/alivekey/alive/host.42:0");
  CHECK(st.s.get(rdzv::alive_key("/elastic", "alivekey", "host.42:0")) == r.incarnation());
  CHECK(st.s.erase(rdzv::alive_key("/elastic", "alivekey", "host.42:0")));
  CHECK(r.poll().departed == std::vector<std::string>{"host.42:0"});  // what the others see
}

TEST_CASE("a run id is a plain name, by the same rule elastic-run applies") {
  scratch_store st;
  for (const char* bad : {".", "..", ".hidden", "-x", "a/b", "a b"}) {
    INFO(bad);
    const auto e = error_of([&] { rdzv::rendezvous r(st.s, options(bad, 1, 1, "p1")); });
    CHECK(e.code() == errc::invalid_argument);
    CHECK(std::string(e.what()).find("not starting with '.' or '-'") != std::string::npos);
  }
  for (const char* good : {"job7", "a.b", "x_y-z", "run.1"}) {
    INFO(good);
    rdzv::rendezvous r(st.s, options(good, 1, 1, "p1"));
    CHECK(r.options().run_id == good);
  }
}

TEST_CASE("runs share a store, each under its own keys, and one alone names the live runs when it times out") {
  scratch_store t;
  std::optional<rdzv::rendezvous> a(std::in_place, t.s, options("job", 1, 1, "a0"));
  rdzv::rendezvous b(t.s, options("job-b", 1, 1, "b0"));
  CHECK(a->join().world_size == 1);
  CHECK(b.join().world_size == 1);  // another run in the same store is not refused
  CHECK(rdzv::live_runs(t.s, "/elastic") == std::vector<std::string>{"job", "job-b"});
  for (auto& [k, v] : t.s.list("")) {
    INFO(k);
    CHECK((k.starts_with("/elastic/job/") || k.starts_with("/elastic/job-b/") || k.starts_with("/elastic/.runs/")));
  }

  // A participant whose run id nobody else uses waits alone; its timeout says who is here.
  auto o = options("job-c", 2, 2, "c0");
  o.join_timeout = 300ms;
  rdzv::rendezvous c(t.s, o);
  const auto e = error_of([&] { c.join(); });
  CHECK(e.code() == errc::timeout);
  CHECK(std::string(e.what()).find("runs 'job', 'job-b' are live in this store") != std::string::npos);
  c.leave();  // it gave up: its registration goes with its lease

  // A finished run's keys go once its last participant has left, and only its own.
  CHECK_FALSE(rdzv::remove_finished_run(t.s, "/elastic", "job"));  // a0 still lives
  a.reset();
  const auto removed = rdzv::remove_finished_run(t.s, "/elastic", "job");
  REQUIRE(removed);
  CHECK(*removed > 0);
  CHECK(t.s.list("/elastic/job/").empty());
  CHECK_FALSE(t.s.list("/elastic/job-b/").empty());
  CHECK(rdzv::live_runs(t.s, "/elastic") == std::vector<std::string>{"job-b"});
}

TEST_CASE("a participant declaring other bounds is refused") {
  scratch_store t;
  rdzv::rendezvous a(t.s, options("job", 1, 2, "a0"));
  a.join();
  rdzv::rendezvous b(t.s, options("job", 1, 3, "b0"));
  const auto e = error_of([&] { b.join(); });
  CHECK(e.code() == errc::mismatch);
  CHECK(std::string(e.what()).find("min_ranks=1 max_ranks=2") != std::string::npos);
}

TEST_CASE("a participant joining a closed round that is full is refused") {
  scratch_store t;
  rdzv::rendezvous a(t.s, options("job", 1, 2, "a0"));
  rdzv::rendezvous b(t.s, options("job", 1, 2, "b0"));
  auto errors = on_threads(2, [&](int i) { (i == 0 ? a : b).join(); });
  REQUIRE(errors.empty());
  REQUIRE(a.current().world_size == 2);
  rdzv::rendezvous c(t.s, options("job", 1, 2, "c0"));
  const auto e = error_of([&] { c.join(); });
  CHECK(e.code() == errc::capacity_exhausted);
  CHECK(std::string(e.what()).find("is full") != std::string::npos);
}

TEST_CASE("a participant id in use by a live participant is refused") {
  scratch_store t;
  auto o = options("job", 1, 2, "same");
  o.heartbeat_timeout = heartbeat_timeout;  // how long b waits for a predecessor to lapse
  rdzv::rendezvous a(t.s, o);
  a.join();
  rdzv::rendezvous b(t.s, o);
  CHECK(error_of([&] { b.join(); }).code() == errc::already_running);
}

TEST_CASE("a participant declared gone whose old lease cannot be revoked takes its own old heartbeat key over") {
  // A store too loaded to revoke, whose leases outlive their time to live (expiry comes late
  // on a loaded etcd): the old life's alive key stays after the participant was declared gone
  // (its peers wrote P/gone/<id>, as their heartbeats do when it stalls). Waiting the old life
  // out, as for another process's, would end in errc::already_running after a heartbeat timeout.
  struct no_revoke final : elastic::test::forwarding_store {
    using forwarding_store::forwarding_store;
    void revoke(lease_id) override { throw elastic::error(errc::unavailable, "revoke refused (the test's store)"); }
    lease_id grant(std::chrono::milliseconds ttl) override { return s_.grant(ttl * 60); }
  };
  scratch_store t;
  no_revoke s(t.s);
  const auto o = options("takeover", 1, 1, "a");
  rdzv::rendezvous a(s, o);
  const auto first = a.join();
  const std::string old = a.incarnation();
  t.s.set(rdzv::run_prefix("/elastic", "takeover") + "/gone/a", old);
  CHECK(a.poll().self_lost);
  const auto again = a.next_round();
  CHECK(again.round > first.round);
  CHECK(a.incarnation() != old);
  CHECK(t.s.get(rdzv::alive_key("/elastic", "takeover", "a")) == a.incarnation());
  // Another process with the same id is still refused: only our own old life is taken over.
  auto same = options("takeover", 1, 1, "a");
  same.heartbeat_timeout = heartbeat_timeout;
  rdzv::rendezvous b(t.s, same);
  CHECK(error_of([&] { b.join(); }).code() == errc::already_running);
}

TEST_CASE("a participant waiting for the next round stops with errc::run_finished when the run finishes") {
  scratch_store t;
  auto a = options("job", 2, 3, "p0"), b = options("job", 2, 3, "p1");
  rdzv::rendezvous ra(t.s, a), rb(t.s, b);
  REQUIRE(on_threads(2, [&](int i) { (i == 0 ? ra : rb).join(); }).empty());
  REQUIRE(ra.current().world_size == 2);
  // The round closed without it: it waits as a newcomer, far longer than this test runs.
  auto o = options("job", 2, 3, "late");
  o.join_timeout = 120s;
  rdzv::rendezvous late(t.s, o);
  std::optional<elastic::error> failure;
  clock_type::time_point ended;
  std::thread waiter([&] {
    try {
      late.join();
    } catch (const elastic::error& e) {
      failure = e;
    }
    ended = clock_type::now();
  });
  // Its pending key is up once it waits.
  const auto until = clock_type::now() + 10s;
  while (!t.s.get("/elastic/job/pending/late") && clock_type::now() < until) std::this_thread::sleep_for(10ms);
  CHECK(t.s.get("/elastic/job/pending/late"));
  CHECK_FALSE(late.finished());
  // Rank 0 records the end, then both members leave.
  const auto t_end = clock_type::now();
  ra.mark_finished(500, 500);
  ra.leave(true);
  rb.leave(true);
  waiter.join();
  REQUIRE(failure);
  INFO(failure->what());
  CHECK(failure->code() == errc::run_finished);
  CHECK(ended - t_end < 2s);
  CHECK(std::string(failure->what()).find("its step 500 of 500 durable (recorded by 'p0' in round 1)") !=
        std::string::npos);
  REQUIRE(late.finished());
  CHECK(late.finished()->step == 500);
  CHECK(late.finished()->steps == 500);
  CHECK(late.finished()->by == "p0");
  CHECK(late.finished()->round == 1);
  CHECK_FALSE(t.s.get("/elastic/job/pending/late"));  // no member will look for it

  // One that starts after the end stops before it waits at all.
  rdzv::rendezvous again(t.s, options("job", 2, 3, "again"));
  CHECK(error_of([&] { again.join(); }).code() == errc::run_finished);
  // Removing the finished run's keys frees its id for a new run.
  late.leave();
  again.leave();
  CHECK(rdzv::remove_finished_run(t.s, "/elastic", "job"));
  CHECK_FALSE(t.s.get("/elastic/job/finished"));
}

TEST_CASE("garbage under the run's keys is errc::corrupt naming the key") {
  scratch_store t;
  auto o = options("job", 1, 1, "p0");
  std::string key;
  SECTION("the round number") {
    key = "/elastic/job/round";
    t.s.set(key, "banana");
  }
  SECTION("a round's outcome") {
    key = "/elastic/job/closed/1";
    t.s.set(key, "members\nno incarnation here");
  }
  SECTION("a join record") {
    key = "/elastic/job/round/1/join/ghost";
    t.s.set(key, "\x01\x02");
  }
  SECTION("the run's bounds") {
    key = "/elastic/job/config";
    t.s.set(key, "min=1;max=1");
  }
  SECTION("the run's end") {
    key = "/elastic/job/finished";
    t.s.set(key, "step=10 steps=ten by=p0 round=1");
  }
  rdzv::rendezvous rv(t.s, o);
  const auto e = error_of([&] { rv.join(); });
  INFO(e.what());
  CHECK(e.code() == errc::corrupt);
  CHECK(std::string(e.what()).find("'" + key + "'") != std::string::npos);
}

namespace {

/// Forwards to a store; holds every claim of a round's closer at a latch until `racers` would-be
/// closers have arrived, so that they all race at the store, and counts who wins the claim and
/// how often the round's outcome is written.
class racing_store final : public elastic::test::forwarding_store {
 public:
  racing_store(rdzv::store& s, std::ptrdiff_t racers) : forwarding_store(s), racers_(racers), gate_(racers) {}
  std::atomic<int> attempts{0}, wins{0}, closings{0};

  bool compare_set(std::string_view k, std::optional<std::string_view> expected, std::string_view desired,
                   rdzv::lease_id l, std::optional<std::string>* actual) override {
    const bool claim = k.find("/closer/") != std::string_view::npos;
    if (claim && arrived_++ < racers_) gate_.arrive_and_wait();
    const bool won = s_.compare_set(k, expected, desired, l, actual);
    if (claim) {
      ++attempts;
      wins += won ? 1 : 0;
    }
    if (won && k.find("/closed/") != std::string_view::npos) ++closings;
    return won;
  }

 private:
  const std::ptrdiff_t racers_;
  std::atomic<std::ptrdiff_t> arrived_{0};
  std::latch gate_;
};

}  // namespace

TEST_CASE("would-be closers racing close a round exactly once and everyone agrees") {
  // Every participant sees a round without a closer and claims it; the gate makes them all reach
  // the store before any of them writes. One wins, follows the joins and closes the round.
  for (const auto& [min, max, last_call] : {std::tuple{4u, 4u, 200}, std::tuple{3u, 8u, 0}}) {
    for (int iteration = 0; iteration < 25; ++iteration) {
      scratch_store t;
      const int n = static_cast<int>(min);
      racing_store racing(t.s, n);
      std::vector<rdzv::round_info> got(n);
      // Copies: Clang before 16 cannot capture a structured binding (the ASan build is Clang).
      auto errors = on_threads(n, [&, min = min, max = max, last_call = last_call](int i) {
        auto o = options("race", min, max, "p" + std::to_string(i));
        o.last_call_timeout = std::chrono::milliseconds(last_call);
        rdzv::rendezvous rv(racing, o);
        got[i] = rv.join([](const rdzv::round_info& r) { return "leader " + r.leader + " of " + std::to_string(r.rank); });
      });
      INFO("min " << min << " max " << max << " iteration " << iteration);
      std::string all;
      for (const auto& e : errors) all += e + "\n";
      INFO(all);
      REQUIRE(errors.empty());
      CHECK(racing.attempts == n);
      // A claim held at the gate may land after the winner closed the round and left (its
      // claim lapsing with its lease): it wins a closed round and does nothing there.
      CHECK(racing.wins >= 1);
      CHECK(racing.closings == 1);
      std::vector<std::size_t> ranks;
      for (const auto& g : got) {
        CHECK(g.members == got[0].members);
        CHECK(g.bootstrap == got[0].bootstrap);
        CHECK(g.world_size == static_cast<int>(min));
        ranks.push_back(g.rank);
      }
      CHECK(got[0].bootstrap == "leader " + got[0].members[0] + " of 0");
      std::sort(ranks.begin(), ranks.end());
      for (std::size_t k = 0; k < ranks.size(); ++k) CHECK(ranks[k] == k);
      const auto closed = t.s.get("/elastic/race/closed/1");
      REQUIRE(closed);
      CHECK(closed->starts_with("members\n"));
      CHECK(std::count(closed->begin(), closed->end(), '\n') == n);
    }
  }
}

namespace {

/// Forwards to a store; the first `lapses` leases it grants are gone before their first use, as
/// when a process starved for longer than the heartbeat timeout comes back to a fresh lease.
class lapsing_store final : public elastic::test::forwarding_store {
 public:
  lapsing_store(rdzv::store& s, int lapses) : forwarding_store(s), lapses_(lapses) {}
  std::atomic<int> grants{0};

  lease_id grant(std::chrono::milliseconds ttl) override {
    const lease_id l = s_.grant(ttl);
    if (grants++ < lapses_) s_.revoke(l);
    return l;
  }

 private:
  const int lapses_;
};

}  // namespace

TEST_CASE("a lease that lapses before its first use is granted again: join() still joins") {
  for (const int lapses : {1, 3}) {
    scratch_store t;
    lapsing_store lapsing(t.s, lapses);
    const elastic::test::temp_dir tmp;
    const auto events = tmp.file("events.jsonl");
    auto o = options("lapse", 1, 1, "p0");
    o.events = elastic::event_log::to_file(events);
    rdzv::rendezvous rv(lapsing, o);
    INFO(lapses << " lapses");
    const auto r = rv.join();
    CHECK(r.world_size == 1);
    CHECK(lapsing.grants == lapses + 1);
    CHECK(elastic::test::events_named(events, "rendezvous_lease_lost").size() ==
          static_cast<std::size_t>(lapses));
  }
}

TEST_CASE("a lease that lapses every time ends join() at its timeout with the store's word, not a spin") {
  scratch_store t;
  lapsing_store lapsing(t.s, 1'000'000);
  auto o = options("lapse", 1, 1, "p0");
  o.join_timeout = 1s;
  rdzv::rendezvous rv(lapsing, o);
  const auto e = error_of([&] { rv.join(); });
  INFO(e.what());
  CHECK(e.code() == errc::not_found);
  CHECK(std::string(e.what()).find("lease") != std::string::npos);
  CHECK(lapsing.grants < 1000);  // a pause between tries: at most one per 4 ms
}

TEST_CASE("peer heartbeats: a member heard and then silent is reported, one never heard is only reported unheard") {
  using rdzv::detail::beacon_peer;
  using rdzv::detail::peer_beacon;
  peer_beacon a("127.0.0.1", "run", 50ms, 600ms), b("127.0.0.1", "run", 50ms, 600ms), c("127.0.0.1", "run", 50ms, 600ms);
  a.identify("a", "1");
  b.identify("b", "1");
  c.identify("c", "1");
  const std::vector<beacon_peer> members{{"a", "1", a.address()}, {"b", "1", b.address()}, {"c", "1", c.address()}};
  a.follow(members, 0);  // with three members each watches the other two
  b.follow(members, 1);  // c never follows: it sends nothing, as if its beats could not pass
  std::vector<beacon_peer> quiet, silent, unheard;
  const auto until = clock_type::now() + 1s;
  while (clock_type::now() < until) {
    a.take(quiet, silent, unheard);
    std::this_thread::sleep_for(20ms);
  }
  CHECK(silent.empty());  // b beats; c was never heard, so it is never judged
  b.pause();              // b stops beating: heard once, now silent
  const auto until2 = clock_type::now() + 10s;
  while (clock_type::now() < until2 && silent.empty()) {
    a.take(quiet, silent, unheard);
    std::this_thread::sleep_for(20ms);
  }
  REQUIRE(silent.size() == 1);
  CHECK(silent[0].id == "b");
  CHECK(std::any_of(quiet.begin(), quiet.end(), [](const beacon_peer& p) { return p.id == "b"; }));
  REQUIRE(unheard.size() == 1);
  CHECK(unheard[0].id == "c");
}
