// elastic-run's store relay (tools/agent/store_relay.hpp) and the relay_store its workers reach
// it with: calls forwarded as they are, one lease and one watch per host, a worker's keys gone
// the moment it dies (a real SIGKILL), a relay that is gone a clear error. The store behind the
// relay here is a real shm:// store; test_rendezvous_etcd runs it in front of a real etcd.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <elastic/rendezvous/open_store.hpp>
#include <elastic/rendezvous/relay_store.hpp>
#include <elastic/rendezvous/rendezvous.hpp>
#include <elastic/rendezvous/shm_store.hpp>

#include "agent/store_relay.hpp"
#include "support/catch.hpp"
#include "support/errors.hpp"
#include "support/eventually.hpp"
#include "support/forwarding_store.hpp"
#include "support/process.hpp"
#include "support/store_contract.hpp"
#include "support/threads.hpp"

using namespace std::chrono_literals;
using elastic::errc;
using elastic::test::error_of;
using elastic::test::eventually;
namespace rdzv = elastic::rendezvous;

namespace {

using clock_type = std::chrono::steady_clock;

/// A shm store (the real store behind the relay here) and a relay serving it in a temp dir.
struct relayed {
  std::string name = elastic::test::unique_name("relay");
  elastic::test::temp_dir dir;
  rdzv::shm_store* upstream = nullptr;
  std::optional<elastic::agent::store_relay> relay;
  relayed() {
    auto up = std::make_unique<rdzv::shm_store>(name);
    upstream = up.get();
    relay.emplace(std::move(up), dir.file("store.sock"));
  }
  ~relayed() {
    relay.reset();
    rdzv::shm_store::remove(name);
  }
  [[nodiscard]] std::unique_ptr<rdzv::store> client() const { return rdzv::open_store(relay->url()); }
};

}  // namespace

TEST_CASE("a relay forwards every call to its store, errors included") {
  relayed t;
  auto s = t.client();
  s->set("/k/a", "1");
  CHECK(t.upstream->get("/k/a") == "1");
  CHECK(s->get("/k/a") == "1");
  CHECK_FALSE(s->get("/k/none"));
  CHECK(s->add("/k/n", 5) == 5);
  CHECK(s->add("/k/n", -2) == 3);
  std::optional<std::string> held;
  CHECK_FALSE(s->compare_set("/k/a", std::string_view("2"), "3", 0, &held));
  CHECK(held == "1");
  CHECK(s->compare_set("/k/a", std::string_view("1"), "3"));
  CHECK(s->compare_set("/k/new", std::nullopt, "x"));
  CHECK(s->list("/k/") == std::vector<std::pair<std::string, std::string>>{{"/k/a", "3"}, {"/k/n", "3"}, {"/k/new", "x"}});
  CHECK(s->erase("/k/new"));
  CHECK_FALSE(s->erase("/k/new"));
  s->set("/k/w", "here");
  const std::vector<std::string> keys{"/k/w"};
  s->wait(keys, 1s);
  // The store's own errors come back as the same elastic::error.
  s->set("/k/text", "banana");
  CHECK(error_of([&] { s->add("/k/text", 1); }).code() == errc::invalid_argument);
  const std::vector<std::string> missing{"/k/never"};
  const auto e = error_of([&] { s->wait(missing, 100ms); });
  CHECK(e.code() == errc::timeout);
  CHECK(std::string(e.what()).find("/k/never") != std::string::npos);
  CHECK(error_of([&] { (void)s->erase_prefix(""); }).code() == errc::invalid_argument);
  CHECK(s->erase_prefix("/k/") == 4);
  CHECK(t.upstream->list("/k/").empty());
  CHECK(s->local());  // what the store behind it is
}

TEST_CASE("a relay keeps one lease of the store for all its workers, renewed without asking the store per worker") {
  relayed t;
  auto a = t.client(), b = t.client();
  const auto la = a->grant(2s), lb = b->grant(2s);
  CHECK(la != lb);
  a->set("/l/a", "a", la);
  b->set("/l/b", "b", lb);
  for (int i = 0; i < 3; ++i) {
    a->keep_alive(la);
    b->keep_alive(lb);
  }
  CHECK(t.relay->leases() == 2);
  // A revoke erases that worker's keys, not the other's.
  a->revoke(la);
  CHECK_FALSE(t.upstream->get("/l/a"));
  CHECK(t.upstream->get("/l/b") == "b");
  CHECK(t.relay->leases() == 1);
  const auto e = error_of([&] { a->keep_alive(la); });
  CHECK(e.code() == errc::not_found);
  CHECK(error_of([&] { a->set("/l/late", "x", la); }).code() == errc::not_found);
  // A key set again without a lease no longer goes with one.
  b->set("/l/b", "kept");
  b->revoke(lb);
  CHECK(t.upstream->get("/l/b") == "kept");
}

namespace {

/// Two workers of `relay` set /f/a and /f/b under leases of 400 ms; for 1.5 s b renews its lease
/// and a, frozen with its connections open, says nothing. Returns a's client and lease.
std::pair<std::unique_ptr<rdzv::store>, rdzv::lease_id> one_frozen_one_live(const elastic::agent::store_relay& relay,
                                                                             std::unique_ptr<rdzv::store>& b) {
  auto a = rdzv::open_store(relay.url());
  b = rdzv::open_store(relay.url());
  const auto la = a->grant(400ms), lb = b->grant(400ms);
  a->set("/f/a", "a", la);
  b->set("/f/b", "b", lb);
  const auto until = clock_type::now() + 1500ms;
  while (clock_type::now() < until) {
    b->keep_alive(lb);
    std::this_thread::sleep_for(50ms);
  }
  return {std::move(a), la};
}

}  // namespace

TEST_CASE("a worker that stops renewing its lease, its connections open (frozen), loses its keys at its time to live") {
  relayed t;
  std::unique_ptr<rdzv::store> b;
  // Not a structured binding: Clang before 16 cannot capture one (the ASan build is Clang).
  const auto frozen = one_frozen_one_live(*t.relay, b);
  CHECK_FALSE(t.upstream->get("/f/a"));
  CHECK(t.upstream->get("/f/b") == "b");
  CHECK(error_of([&] { frozen.first->keep_alive(frozen.second); }).code() == errc::not_found);
}

namespace {

/// A shm store that records the leases asked of it and counts their renewals.
class counting_leases final : public elastic::test::forwarding_store {
 public:
  using forwarding_store::forwarding_store;
  lease_id grant(std::chrono::milliseconds ttl) override {
    granted_ttl = ttl.count();
    return forwarding_store::grant(ttl);
  }
  void keep_alive(lease_id l) override {
    ++renewals;
    forwarding_store::keep_alive(l);
  }
  std::atomic<std::int64_t> granted_ttl{0};
  std::atomic<int> renewals{0};
};

/// A shm store's name, the store removed when the test ends however it ends.
struct shm_name {
  std::string name = elastic::test::unique_name("floor");
  ~shm_name() { rdzv::shm_store::remove(name); }
};

}  // namespace

TEST_CASE("a host's lease on the store lives at least 15 s whatever its workers' heartbeats, each worker's its own") {
  // Workers beating every 50 ms with a 400 ms time to live would have had the store renew the
  // host's lease every 66 ms (15 times a second per host); the peer heartbeats notice a host
  // that vanished, and the lease is their backstop.
  const shm_name n1, n2;
  rdzv::shm_store shm(n1.name);
  elastic::test::temp_dir dir;
  auto up = std::make_unique<counting_leases>(shm);
  auto& counts = *up;
  std::optional<elastic::agent::store_relay> relay;
  relay.emplace(std::move(up), dir.file("store.sock"));
  std::unique_ptr<rdzv::store> b;
  auto a = one_frozen_one_live(*relay, b).first;
  CHECK(counts.granted_ttl.load() == 15000);
  CHECK(counts.renewals.load() == 0);  // the first renewal is 2.5 s in
  // a's lease still ends at its own 400 ms, not the host's.
  CHECK_FALSE(shm.get("/f/a"));
  CHECK(shm.get("/f/b") == "b");
  // A worker asking for longer than the floor gets its own time to live on the store.
  a.reset();
  b.reset();
  relay.reset();
  rdzv::shm_store shm2(n2.name);
  auto up2 = std::make_unique<counting_leases>(shm2);
  auto& counts2 = *up2;
  relay.emplace(std::move(up2), dir.file("store2.sock"));
  auto c = rdzv::open_store(relay->url());
  (void)c->grant(30s);
  CHECK(counts2.granted_ttl.load() == 30000);
  c.reset();
  relay.reset();
}

TEST_CASE("a worker's keys go the moment its last connection closes: a client dropped, a process SIGKILLed") {
  relayed t;
  SECTION("a client object destroyed") {
    auto a = t.client();
    const auto l = a->grant(30s);
    a->set("/d/a", "alive", l);
    auto feed = a->watch("/d/", "/d0");  // a second connection of the same client
    a.reset();
    CHECK(t.upstream->get("/d/a") == "alive");  // the watch is still open
    feed.reset();
    CHECK(eventually([&] { return !t.upstream->get("/d/a"); }, 2s));
  }
  SECTION("a real participant SIGKILLed: the others see the departure at once, its 30 s lease notwithstanding") {
    std::vector<elastic::test::child_process> ps;
    for (int i = 0; i < 3; ++i) {
      ps.push_back(elastic::test::child_process::spawn({ELASTIC_RDZV_WORKER, t.relay->url(), "job", "3", "3",
                                                        "p" + std::to_string(i), "stay", "--hb", "5000", "--hb-timeout",
                                                        "30000"}));
    }
    for (auto& p : ps) {
      for (;;) {
        auto line = p.read_line(20s);
        REQUIRE(line);
        if (line->starts_with("round 1")) break;
      }
    }
    const auto t0 = clock_type::now();
    ps[2].kill(SIGKILL);
    REQUIRE(ps[2].killed_by(SIGKILL, 5s));
    for (std::size_t i : {0u, 1u}) {
      std::optional<std::string> line;
      for (line = ps[i].read_line(10s); line && !line->starts_with("change "); line = ps[i].read_line(10s)) {
      }
      REQUIRE(line);
      CHECK(line->find("departed=p2") != std::string::npos);
    }
    CHECK(clock_type::now() - t0 < 5s);  // not at the lease's 30 s
    for (std::size_t i : {0u, 1u}) ps[i].kill(SIGKILL);
  }
}

TEST_CASE("workers following the same range share one watch of the store, and a later one gets the range first") {
  relayed t;
  auto a = t.client(), b = t.client(), c = t.client();
  t.upstream->set("/w/x", "1");
  auto fa = a->watch("/w/", "/w0"), fb = b->watch("/w/", "/w0");
  CHECK(t.relay->watches() == 1);
  auto erasures = c->watch("/w/", "/w0", {.snapshot = false, .puts = false, .previous = true});
  CHECK(t.relay->watches() == 2);  // other options, another watch
  rdzv::detail::key_copy ma, mb;
  auto drain = [](rdzv::key_feed& f, rdzv::detail::key_copy& m) { rdzv::detail::take_into(f, m); };
  CHECK(eventually([&] {
    drain(*fa, ma);
    drain(*fb, mb);
    return ma.size() == 1 && mb.size() == 1;
  }, 2s));
  t.upstream->set("/w/y", "2");
  t.upstream->erase("/w/x");
  CHECK(eventually([&] {
    drain(*fa, ma);
    drain(*fb, mb);
    return ma == rdzv::detail::key_copy{{"/w/y", "2"}} && mb == ma;
  }, 2s));
  std::vector<rdzv::key_event> seen;
  CHECK(eventually([&] {
    bool reset = false;
    for (auto& e : erasures->take(reset)) seen.push_back(std::move(e));
    return !seen.empty();
  }, 2s));
  REQUIRE(seen.size() == 1);
  CHECK(seen[0].key == "/w/x");
  CHECK_FALSE(seen[0].value);
  CHECK(seen[0].previous == "1");
  // One that comes later is given the range as it is now.
  auto late = t.client();
  auto fl = late->watch("/w/", "/w0");
  rdzv::detail::key_copy ml;
  CHECK(eventually([&] {
    drain(*fl, ml);
    return ml == rdzv::detail::key_copy{{"/w/y", "2"}};
  }, 2s));
  CHECK(t.relay->watches() == 2);
  fa.reset();
  fb.reset();
  fl.reset();
  CHECK(eventually([&] { return t.relay->watches() == 1; }, 2s));
}

TEST_CASE("a relayed watch reports what the store's own does, and its socket polls readable while events wait") {
  relayed t;
  auto c = t.client();
  elastic::test::check_feed_behaviour(*c);
}

TEST_CASE("participants behind one relay form rounds and see a departure, as on the store itself") {
  relayed t;
  std::vector<std::unique_ptr<rdzv::store>> stores;
  std::vector<std::unique_ptr<rdzv::rendezvous>> rs;
  for (int i = 0; i < 3; ++i) {
    stores.push_back(t.client());
    rdzv::rendezvous_options o;
    o.run_id = "job";
    o.min_ranks = 2;
    o.max_ranks = 3;
    o.participant_id = "p" + std::to_string(i);
    o.last_call_timeout = 300ms;
    o.join_timeout = 20s;
    o.events = elastic::event_log();
    rs.push_back(std::make_unique<rdzv::rendezvous>(*stores.back(), o));
  }
  REQUIRE(elastic::test::on_threads(3, [&](int i) { rs[static_cast<std::size_t>(i)]->join(); }).empty());
  for (auto& r : rs) CHECK(r->current().world_size == 3);
  // The run's keys and its heartbeat erasures, for all three (the closer's watch of the joins
  // ends with the round).
  CHECK(eventually([&] { return t.relay->watches() == 2; }, 2s));
  rs[2].reset();
  stores[2].reset();
  CHECK(eventually([&] { return rs[0]->poll().departed == std::vector<std::string>{"p2"}; }, 5s));
}

TEST_CASE("a relay that is gone is errc::unavailable, and a relay URL is checked") {
  auto t = std::make_unique<relayed>();
  auto s = t->client();
  const std::string url = t->relay->url();
  t->relay->stop();
  CHECK(error_of([&] { (void)s->get("/x"); }).code() == errc::unavailable);
  CHECK(error_of([&] { (void)rdzv::open_store(url); }).code() == errc::unavailable);
  CHECK(error_of([] { (void)rdzv::parse_store_url("relay://relative/path"); }).code() == errc::invalid_argument);
  CHECK(rdzv::parse_store_url("relay:///run/x.sock").name == "/run/x.sock");
}

namespace {

/// A shm store whose apply() takes 5 ms and counts its calls: writes that come while one is in
/// flight must wait and go together.
class slow_batches final : public elastic::test::forwarding_store {
 public:
  using forwarding_store::forwarding_store;
  std::vector<rdzv::write_result> apply(std::span<const rdzv::write_request> writes) override {
    ++calls;
    largest = std::max(largest.load(), writes.size());
    std::this_thread::sleep_for(5ms);
    return rdzv::store::apply(writes);
  }
  std::atomic<int> calls{0};
  std::atomic<std::size_t> largest{0};
};

}  // namespace

TEST_CASE("writes made at the same moment go to the store together, each answered as its own call would be") {
  const std::string name = elastic::test::unique_name("batch");
  rdzv::shm_store shm(name);
  slow_batches store(shm);
  elastic::agent::write_batcher writes(store, 16);
  using w = rdzv::write_request;
  constexpr int n = 48;
  std::vector<int> all(n);
  for (int i = 0; i < n; ++i) all[i] = i;
  std::vector<rdzv::write_result> own(n), claim(n);
  std::vector<rdzv::write_result> bump(n);
  store.set("round", "1", 0);
  // Each thread: a key of its own, a claim of one key every thread wants, and a move of one
  // key from 1 to 2 that every thread makes.
  const auto errors = elastic::test::on_threads(all, [&](int i) {
    own[i] = writes.write({w::kind::set, "own/" + std::to_string(i), std::nullopt, std::to_string(i), 0});
    claim[i] = writes.write({w::kind::compare_set, "claim", std::nullopt, std::to_string(i), 0});
    bump[i] = writes.write({w::kind::compare_set, "round", std::string("1"), "2", 0});
  });
  REQUIRE(errors.empty());
  for (int i = 0; i < n; ++i) {
    CHECK(own[i].done);
    CHECK(store.get("own/" + std::to_string(i)) == std::to_string(i));
  }
  // Exactly one claim won; every other saw the winner's value.
  const auto winner = store.get("claim");
  REQUIRE(winner);
  int won = 0;
  for (int i = 0; i < n; ++i) {
    if (claim[i].done) {
      ++won;
      CHECK(std::to_string(i) == *winner);
    } else {
      CHECK(claim[i].actual == winner);
    }
  }
  CHECK(won == 1);
  CHECK(std::count_if(bump.begin(), bump.end(), [](const auto& r) { return r.done; }) == 1);
  CHECK(std::all_of(bump.begin(), bump.end(), [](const auto& r) { return r.done || r.actual == "2"; }));
  CHECK(store.get("round") == "2");
  INFO(store.calls.load() << " requests for " << 3 * n << " writes, at most " << store.largest.load() << " in one");
  CHECK(store.calls.load() < n);  // one per write would be 3n
  CHECK(store.largest.load() <= 16);
  writes.write({w::kind::erase, "claim", std::nullopt, {}, 0});
  CHECK_FALSE(store.get("claim"));
  // A rider whose condition holds after the write it rides on is sent after it: a set of 3
  // and a compare_set from 3 made at once end in the compare_set's value.
  store.set("seq", "0", 0);
  std::vector<rdzv::write_result> seq(2);
  REQUIRE(elastic::test::on_threads(std::vector<int>{0, 1}, [&](int i) {
            if (i == 0) seq[0] = writes.write({w::kind::set, "seq", std::nullopt, "3", 0});
            else seq[1] = writes.write({w::kind::compare_set, "seq", std::string("3"), "4", 0});
          }).empty());
  CHECK(seq[0].done);
  // Either the set came first and the compare_set moved 3 to 4, or the compare_set found 0.
  if (seq[1].done) {
    CHECK(store.get("seq") == "4");
  } else {
    CHECK(seq[1].actual == "0");
    CHECK(store.get("seq") == "3");
  }
  // What the store throws for one write reaches that writer alone.
  const auto lease = store.grant(10s);
  store.revoke(lease);
  CHECK(error_of([&] { writes.write({w::kind::set, "late", std::nullopt, "x", lease}); }).code() == errc::not_found);
  CHECK(writes.write({w::kind::set, "after", std::nullopt, "y", 0}).done);
  rdzv::shm_store::remove(name);
}
