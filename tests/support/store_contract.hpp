// What every store must do, checked the same way for each backend.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

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

}  // namespace elastic::test
