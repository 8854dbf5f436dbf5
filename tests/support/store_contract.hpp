// What every store must do, checked the same way for each backend.
#pragma once

#include <poll.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <elastic/rendezvous/detail/run_view.hpp>
#include <elastic/rendezvous/store.hpp>

#include "support/catch.hpp"

namespace elastic::test {

/// set/get/erase/list/compare_set behave like a map.
inline void check_map_behaviour(elastic::rendezvous::store& s) {
  using namespace std::chrono_literals;
  CHECK_FALSE(s.get("a"));
  s.set("run/a", "1");
  s.set("run/b", std::string(1000, 'x'));
  s.set("other", "");
  CHECK(s.get("run/a") == "1");
  CHECK(s.get("other") == "");
  CHECK(s.list("run/") == std::vector<std::pair<std::string, std::string>>{{"run/a", "1"}, {"run/b", std::string(1000, 'x')}});
  CHECK(s.erase("run/a"));
  CHECK_FALSE(s.erase("run/a"));
  CHECK(s.compare_set("leader", std::nullopt, "rank-0"));
  std::optional<std::string> actual;
  CHECK_FALSE(s.compare_set("leader", std::nullopt, "rank-1", 0, &actual));
  CHECK(actual == "rank-0");
  CHECK_FALSE(s.compare_set("leader", std::string_view("rank-9"), "rank-1"));
  CHECK(s.compare_set("leader", std::string_view("rank-0"), "rank-1"));
  CHECK(s.get("leader") == "rank-1");
  CHECK(s.get("leader", 1s) == "rank-1");
  // erase_prefix takes exactly the keys under the prefix ("ns/" spares "ns-2/" and "ns").
  s.set("ns/a", "1");
  s.set("ns/b", "2");
  s.set("ns-2/a", "3");
  s.set("ns", "4");
  CHECK(s.erase_prefix("ns/") == 2);
  CHECK(s.list("ns/").empty());
  CHECK(s.get("ns-2/a") == "3");
  CHECK(s.get("ns") == "4");
  CHECK(s.erase_prefix("ns/") == 0);
  CHECK_THROWS_AS(s.erase_prefix(""), elastic::error);
  CHECK(s.get("run/b"));
  CHECK(s.erase("ns-2/a"));
  CHECK(s.erase("ns"));
}

/// apply(): a batch of sets, compare_sets and erases does what each call would; a write whose
/// lease is gone fails alone; a key named twice is refused before anything is written.
inline void check_batch_behaviour(elastic::rendezvous::store& s) {
  using namespace std::chrono_literals;
  using w = elastic::rendezvous::write_request;
  using k = w::kind;
  s.set("b/held", "old");
  s.set("b/gone", "x");
  const auto lease = s.grant(10s);
  std::vector<w> batch{{k::set, "b/new", std::nullopt, "1", lease},
                       {k::compare_set, "b/fresh", std::nullopt, "2", lease},
                       {k::compare_set, "b/held", std::nullopt, "3", 0},
                       {k::compare_set, "b/held2", std::string("nope"), "4", 0},
                       {k::erase, "b/gone", std::nullopt, {}, 0},
                       {k::erase, "b/never", std::nullopt, {}, 0}};
  auto r = s.apply(batch);
  REQUIRE(r.size() == batch.size());
  for (const auto& x : r) CHECK_FALSE(x.failure);
  CHECK(r[0].done);
  CHECK(r[1].done);
  CHECK_FALSE(r[2].done);
  CHECK(r[2].actual == "old");
  CHECK_FALSE(r[3].done);
  CHECK_FALSE(r[3].actual);
  CHECK(r[4].done);
  CHECK_FALSE(r[5].done);
  CHECK(s.list("b/") == std::vector<std::pair<std::string, std::string>>{{"b/fresh", "2"}, {"b/held", "old"}, {"b/new", "1"}});
  // Compared on the value the key holds: one condition holds, one does not.
  r = s.apply(std::vector<w>{{k::compare_set, "b/held", std::string("old"), "new", 0},
                             {k::compare_set, "b/new", std::string("9"), "x", 0}});
  CHECK(r[0].done);
  CHECK_FALSE(r[1].done);
  CHECK(r[1].actual == "1");
  // The leased ones go with their lease.
  s.revoke(lease);
  CHECK_FALSE(s.get("b/new"));
  CHECK_FALSE(s.get("b/fresh"));
  // A write on an ended lease fails alone, as its own call would.
  r = s.apply(std::vector<w>{{k::set, "b/a", std::nullopt, "a", 0},
                             {k::set, "b/late", std::nullopt, "l", lease},
                             {k::compare_set, "b/c", std::nullopt, "c", 0}});
  REQUIRE(r.size() == 3);
  CHECK_FALSE(r[0].failure);
  CHECK(r[1].failure);
  CHECK_FALSE(r[2].failure);
  CHECK(r[2].done);
  try {
    std::rethrow_exception(r[1].failure);
  } catch (const elastic::error& e) {
    CHECK(e.code() == elastic::errc::not_found);
  }
  CHECK(s.get("b/a") == "a");
  CHECK(s.get("b/c") == "c");
  CHECK_FALSE(s.get("b/late"));
  // A key twice: refused, nothing written.
  CHECK_THROWS_AS(s.apply(std::vector<w>{{k::set, "b/twice", std::nullopt, "1", 0}, {k::set, "b/twice", std::nullopt, "2", 0}}),
                  elastic::error);
  CHECK_FALSE(s.get("b/twice"));
  // More writes than one request takes (etcd: 64 a transaction).
  std::vector<w> many;
  for (int i = 0; i < 150; ++i) many.push_back({k::compare_set, "b/many/" + std::to_string(1000 + i), std::nullopt, "v", 0});
  r = s.apply(many);
  CHECK(std::count_if(r.begin(), r.end(), [](const auto& x) { return x.done && !x.failure; }) == 150);
  CHECK(s.list("b/many/").size() == 150);
  CHECK(s.erase_prefix("b/") == 153);
}

/// The copy a feed keeps (the rendezvous's own type for it).
using feed_copy = elastic::rendezvous::detail::key_copy;

/// Takes from `feed` into `mirror` until `done(mirror)` holds or `timeout` passes; returns it.
inline feed_copy follow_feed(elastic::rendezvous::key_feed& feed, feed_copy mirror,
                             const std::function<bool(const feed_copy&)>& done, std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    elastic::rendezvous::detail::take_into(feed, mirror);
    if (done(mirror) || std::chrono::steady_clock::now() >= until) return mirror;
    feed.wait(std::chrono::milliseconds(100));
  }
}

/// watch(): a copy of the range first, then its puts and erasures (a lease's expiry among
/// them), and nothing from outside the range.
inline void check_feed_behaviour(elastic::rendezvous::store& s) {
  using namespace std::chrono_literals;
  using mirror = feed_copy;
  s.set("feed/a", "1");
  s.set("feed/b", "2");
  s.set("feee", "outside");
  auto feed = s.watch("feed/", "feed0");
  REQUIRE(feed);
  auto m = follow_feed(*feed, {}, [](const mirror& x) { return x.size() >= 2; }, 5s);
  CHECK(m == mirror{{"feed/a", "1"}, {"feed/b", "2"}});

  s.set("feed/c", "3");
  s.set("feed/a", "one");
  CHECK(s.erase("feed/b"));
  s.set("fee", "outside");
  s.set("feed0", "outside");
  m = follow_feed(*feed, m, [](const mirror& x) { return x.size() == 2 && x.contains("feed/c") && x.at("feed/a") == "one"; }, 5s);
  CHECK(m == mirror{{"feed/a", "one"}, {"feed/c", "3"}});

  // A key whose lease lapses is reported erased.
  const auto lease = s.grant(1s);
  s.set("feed/leased", "x", lease);
  m = follow_feed(*feed, m, [](const mirror& x) { return x.contains("feed/leased"); }, 5s);
  CHECK(m.contains("feed/leased"));
  m = follow_feed(*feed, m, [](const mirror& x) { return !x.contains("feed/leased"); }, 10s);
  CHECK_FALSE(m.contains("feed/leased"));
  CHECK(m == mirror{{"feed/a", "one"}, {"feed/c", "3"}});

  // Erasures only, from now on, each with the value the key held.
  s.set("feed/d", "4");
  auto gone = s.watch("feed/", "feed0", elastic::rendezvous::feed_options{false, false, true});
  s.set("feed/a", "uno");
  CHECK(s.erase("feed/c"));
  CHECK(s.erase("feed/d"));
  std::vector<elastic::rendezvous::key_event> got;
  const auto until = std::chrono::steady_clock::now() + 5s;
  while (got.size() < 2 && std::chrono::steady_clock::now() < until) {
    bool reset = false;
    for (auto& e : gone->take(reset)) got.push_back(std::move(e));
    if (got.size() < 2) gone->wait(100ms);
  }
  REQUIRE(got.size() == 2);
  std::sort(got.begin(), got.end(), [](const auto& x, const auto& y) { return x.key < y.key; });
  CHECK(got[0].key == "feed/c");
  CHECK_FALSE(got[0].value);
  CHECK(got[0].previous == "3");
  CHECK(got[1].key == "feed/d");
  CHECK(got[1].previous == "4");

  // A feed that can be waited on beside others (key_feed::readable_fd) polls readable while
  // events wait for take(), and not once they are taken.
  m = follow_feed(*feed, m, [](const mirror& x) { return x == mirror{{"feed/a", "uno"}}; }, 5s);
  REQUIRE(m == mirror{{"feed/a", "uno"}});
  if (const int fd = feed->readable_fd(); fd >= 0) {
    auto readable = [fd](std::chrono::milliseconds within) {
      pollfd p{fd, POLLIN, 0};
      return ::poll(&p, 1, static_cast<int>(within.count())) == 1;
    };
    CHECK_FALSE(readable(0ms));
    s.set("feed/e", "5");
    CHECK(readable(5s));
    m = follow_feed(*feed, m, [](const mirror& x) { return x.contains("feed/e"); }, 5s);
    CHECK(m.contains("feed/e"));
    CHECK_FALSE(readable(0ms));
  }
}

}  // namespace elastic::test
