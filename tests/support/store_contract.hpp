// What every store must do, checked the same way for each backend.
#pragma once

#include <algorithm>
#include <chrono>
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
}

}  // namespace elastic::test
