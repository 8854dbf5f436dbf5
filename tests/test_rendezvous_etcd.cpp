// Rendezvous rounds over a real etcd with a few dozen participants, each with its own client (as
// separate hosts would have): the store load of a formed, idle group must be its heartbeats
// alone, not a per-rank poll; a departure is still seen by every member and a round re-forms.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <elastic/rendezvous/etcd_store.hpp>
#include <elastic/rendezvous/open_store.hpp>
#include <elastic/rendezvous/rendezvous.hpp>

#include "agent/store_relay.hpp"
#include "support/catch.hpp"
#include "support/etcd_server.hpp"
#include "support/process.hpp"
#include "support/threads.hpp"

using namespace std::chrono_literals;
using elastic::test::child_process;
using elastic::test::on_threads;
using elastic::test::etcd_server;
namespace rdzv = elastic::rendezvous;
using clock_type = std::chrono::steady_clock;

namespace {

constexpr auto heartbeat_interval = 1s;

/// One participant: its own etcd client, as on a host of its own.
struct participant {
  std::unique_ptr<rdzv::etcd_store> store;
  std::unique_ptr<rdzv::rendezvous> rv;
  rdzv::round_info info;
};

rdzv::etcd_options client_options() {
  rdzv::etcd_options o;
  o.prefix = "/scale/";
  o.request_timeout = 10s;
  o.unavailable_timeout = 30s;
  return o;
}

rdzv::rendezvous_options options(int n, int i) {
  rdzv::rendezvous_options o;
  o.run_id = "scale";
  o.min_ranks = n - 1;
  o.max_ranks = n;
  o.participant_id = "p" + std::to_string(i);
  o.heartbeat_interval = heartbeat_interval;
  o.heartbeat_timeout = 10s;
  o.last_call_timeout = 1s;
  o.join_timeout = 60s;
  o.events = elastic::event_log();
  return o;
}

std::uint64_t requests(const std::vector<participant>& ps) {
  std::uint64_t n = 0;
  for (const auto& p : ps) n += p.store ? p.store->requests() : 0;
  return n;
}

}  // namespace

TEST_CASE("32 participants over etcd: an idle round asks etcd for heartbeats only, and a departure re-forms the "
          "round") {
  constexpr int n = 32;
  etcd_server etcd;
  std::vector<participant> ps(n);
  std::vector<int> all(n);
  for (int i = 0; i < n; ++i) {
    all[i] = i;
    ps[i].store = std::make_unique<rdzv::etcd_store>(etcd.url(), client_options());
    ps[i].rv = std::make_unique<rdzv::rendezvous>(*ps[i].store, options(n, i));
  }

  const auto t0 = clock_type::now();
  auto errors = on_threads(all, [&](int i) { ps[i].info = ps[i].rv->join(); });
  REQUIRE(errors.empty());
  const double first_round = std::chrono::duration<double>(clock_type::now() - t0).count();
  for (const auto& p : ps) {
    CHECK(p.info.round == 1);
    CHECK(p.info.world_size == n);
    CHECK(p.info.members == ps[0].info.members);
  }
  const std::uint64_t formation = requests(ps);
  auto expected = ps[0].info.members;
  expected.erase(std::find(expected.begin(), expected.end(), "p" + std::to_string(n - 1)));

  // Idle: every member's watcher polls every 50 ms, as elastic_group's does, for 3 s.
  const auto idle = 3s;
  const std::uint64_t before = requests(ps);
  const auto idle_from = clock_type::now();
  while (clock_type::now() - idle_from < idle) {
    for (auto& p : ps) CHECK_FALSE(p.rv->poll().any());
    std::this_thread::sleep_for(50ms);
  }
  const double idle_s = std::chrono::duration<double>(clock_type::now() - idle_from).count();
  const std::uint64_t idle_requests = requests(ps) - before;
  // A heartbeat is two requests (renew the lease, refresh the run's registration) per interval;
  // the bound allows one more beat each and a stream reopened here and there. Polling the
  // rendezvous (three reads per poll, 20 polls a second) would be ~60 times this.
  const auto beats = static_cast<std::uint64_t>(idle_s / std::chrono::duration<double>(heartbeat_interval).count()) + 1;
  const std::uint64_t bound = n * (2 * beats + 1);
  INFO("first round of " << n << ": " << first_round << " s, " << formation << " requests; idle " << idle_s
                         << " s: " << idle_requests << " requests (bound " << bound << ")");
  CHECK(idle_requests <= bound);

  // A member leaves without a word (its lease revoked: as a retired death): every other sees the
  // departure from its feed, and the rest form the next round.
  ps[n - 1].rv->leave();
  const auto gone_from = clock_type::now();
  std::vector<bool> seen(n - 1, false);
  while (std::count(seen.begin(), seen.end(), true) < n - 1 && clock_type::now() - gone_from < 30s) {
    for (int i = 0; i < n - 1; ++i) {
      if (seen[i]) continue;
      const auto ch = ps[i].rv->poll();
      seen[i] = ch.departed == std::vector<std::string>{"p" + std::to_string(n - 1)};
    }
    std::this_thread::sleep_for(10ms);
  }
  REQUIRE(std::count(seen.begin(), seen.end(), true) == n - 1);
  std::vector<int> survivors(all.begin(), all.end() - 1);
  errors = on_threads(survivors, [&](int i) { ps[i].info = ps[i].rv->next_round(); });
  REQUIRE(errors.empty());
  const double reround = std::chrono::duration<double>(clock_type::now() - gone_from).count();
  INFO("re-round after a departure: " << reround << " s");
  for (int i = 0; i < n - 1; ++i) {
    CHECK(ps[i].info.round == 2);
    CHECK(ps[i].info.world_size == n - 1);
    CHECK(ps[i].info.members == expected);  // survivors keep their order
  }
  // Seen in the test's log: the figures behind the bound.
  WARN("first round " << first_round << " s; idle " << idle_requests << " requests in " << idle_s << " s for " << n
                      << " participants; re-round " << reround << " s");
}

TEST_CASE("32 participants on 4 hosts' relays over etcd: one lease and one watch per host, an idle round asks "
          "etcd for the hosts' renewals alone") {
  constexpr int hosts = 4, per_host = 8, n = hosts * per_host;
  etcd_server etcd;
  elastic::test::temp_dir dir;
  std::vector<rdzv::etcd_store*> upstream;
  std::vector<std::unique_ptr<elastic::agent::store_relay>> relays;
  for (int h = 0; h < hosts; ++h) {
    auto up = std::make_unique<rdzv::etcd_store>(etcd.url(), client_options());
    upstream.push_back(up.get());
    relays.push_back(std::make_unique<elastic::agent::store_relay>(std::move(up), dir.file("h" + std::to_string(h))));
  }
  auto etcd_requests = [&] {
    std::uint64_t r = 0;
    for (auto* u : upstream) r += u->requests();
    return r;
  };
  std::vector<std::unique_ptr<rdzv::store>> stores;
  std::vector<std::unique_ptr<rdzv::rendezvous>> rs;
  std::vector<int> all(n);
  for (int i = 0; i < n; ++i) {
    all[i] = i;
    stores.push_back(rdzv::open_store(relays[static_cast<std::size_t>(i / per_host)]->url()));
    rs.push_back(std::make_unique<rdzv::rendezvous>(*stores.back(), options(n, i)));
  }
  const auto t0 = clock_type::now();
  REQUIRE(on_threads(all, [&](int i) { rs[i]->join(); }).empty());
  const double first_round = std::chrono::duration<double>(clock_type::now() - t0).count();
  for (const auto& r : rs) CHECK(r->current().world_size == n);
  const std::uint64_t formation = etcd_requests();
  // Per host: a lease, the run's registration, two watches (a read and a stream each), the round
  // and closer claims; the workers' heartbeat keys and join records go in shared transactions
  // (write_batcher.hpp). One request per write made it ~170-195 here; batched, 55-85.
  CHECK(formation <= 4 * n);
  for (const auto& relay : relays) {
    CHECK(relay->leases() == per_host);
    // The run's keys and the heartbeat erasures, for all its workers (a closer's watch of the
    // joins ends with the round).
    const auto until = clock_type::now() + 2s;
    while (relay->watches() > 2 && clock_type::now() < until) std::this_thread::sleep_for(10ms);
    CHECK(relay->watches() == 2);
  }

  // Idle, every member polling every 50 ms: the relays renew their own leases (every 10 s / 6),
  // and a registration set again by every worker at each beat goes to etcd once per host.
  const std::uint64_t before = etcd_requests();
  const auto idle_from = clock_type::now();
  while (clock_type::now() - idle_from < 3s) {
    for (auto& r : rs) CHECK_FALSE(r->poll().any());
    std::this_thread::sleep_for(50ms);
  }
  const double idle_s = std::chrono::duration<double>(clock_type::now() - idle_from).count();
  const std::uint64_t idle_requests = etcd_requests() - before;
  // Per host, every 1.67 s (a sixth of the 10 s lease): a renewal, and the run's registration
  // asked for once (not per worker); a third for a beat that straddles the window.
  const auto bound = static_cast<std::uint64_t>(hosts * 3 * (idle_s / 1.66 + 1));
  INFO("first round " << first_round << " s, " << formation << " etcd requests; idle " << idle_s << " s: "
                      << idle_requests << " etcd requests (bound " << bound << ")");
  CHECK(idle_requests <= bound);

  WARN("relayed: first round " << first_round << " s, " << formation << " etcd requests; idle " << idle_requests
                               << " etcd requests in " << idle_s << " s for " << n << " participants on " << hosts
                               << " hosts");
  rs.clear();  // before the stores they speak through
  stores.clear();
}

namespace {

/// The next line of `p` starting with `prefix` (others skipped); nothing on timeout.
std::optional<std::string> line_starting(child_process& p, const std::string& prefix, std::chrono::milliseconds timeout) {
  const auto until = clock_type::now() + timeout;
  while (clock_type::now() < until) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - clock_type::now());
    auto line = p.read_line(std::max(left, 1ms));
    if (!line) return std::nullopt;
    if (line->starts_with("error")) FAIL("participant failed: " << *line);
    if (line->starts_with(prefix)) return line;
  }
  return std::nullopt;
}

/// The world size of a "round N rank R world W ..." line.
long world_of(const std::string& line) {
  std::istringstream in(line);
  std::string w;
  long round = 0, rank = 0, world = 0;
  in >> w >> round >> w >> rank >> w >> world;
  return world;
}

}  // namespace

TEST_CASE("a participant frozen with its lease alive is declared gone by its peers' heartbeats, and rejoins when it "
          "thaws") {
  etcd_server etcd;
  // Leases of 60 s: only the peer heartbeats (1.5 s of silence) can notice the frozen one in time.
  const std::vector<std::string> opts{"--hb",     "1000", "--hb-timeout", "60000", "--last-call", "2000",
                                      "--join-timeout", "60000", "--peer-silence", "1500", "--poll", "50"};
  std::vector<child_process> ps;
  for (int i = 0; i < 4; ++i) {
    std::vector<std::string> argv{ELASTIC_RDZV_WORKER, etcd.url(), "frozen", "3", "4", "p" + std::to_string(i), "stay"};
    argv.insert(argv.end(), opts.begin(), opts.end());
    ps.push_back(child_process::spawn(argv));
  }
  for (auto& p : ps) REQUIRE(line_starting(p, "round 1 ", 30s));
  // Its peers must have heard it once (a member never heard is never judged: its beats may not
  // be able to pass at all); a beat is every 250 ms.
  std::this_thread::sleep_for(1s);
  ps[2].kill(SIGSTOP);
  const auto frozen_at = clock_type::now();
  for (int i : {0, 1, 3}) {
    // Well inside the 60 s lease: the lease cannot be what noticed.
    const auto change = line_starting(ps[i], "change ", 20s);
    REQUIRE(change);
    CHECK(change->find("departed=p2") != std::string::npos);
    const auto round = line_starting(ps[i], "round ", 20s);
    REQUIRE(round);
    CHECK(world_of(*round) == 3);
  }
  WARN("a frozen participant noticed and a round of 3 formed in "
       << std::chrono::duration<double>(clock_type::now() - frozen_at).count() << " s (lease: 60 s)");
  // Thawed, it finds itself declared gone, joins as a new life, and the group takes it back.
  ps[2].kill(SIGCONT);
  REQUIRE(line_starting(ps[2], "change ", 20s));
  for (auto& p : ps) {
    std::optional<std::string> round;
    while ((round = line_starting(p, "round ", 30s)) && world_of(*round) != 4) {
    }
    REQUIRE(round);
  }
  // Each child_process SIGKILLs and reaps its process when it goes.
}
