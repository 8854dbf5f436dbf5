// The culprit of a round that spans hosts, through the store: a rank that leaves a round (a
// collective failed, a member departed) first writes there where it was, its last collective
// #k of the round, and the next round's rank 0 compares them all (flight_culprit.hpp). A rank
// of the old round that wrote nothing while the others were in #k is named: it hung, or died,
// before it got there. On one host the launcher also reads the shared-memory flight recorders
// (elastic-run); this path needs neither, and sees every host.
//
// Key: <run prefix>/round/<round>/flight/<rank> = "<#k> <world> <outcome> <ns since entered>
// <ns since left> <op>" (times relative: hosts' clocks differ; the reader puts them on its own).
#pragma once

#include <charconv>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <elastic/comm/detail/flight_culprit.hpp>
#include <elastic/events.hpp>
#include <elastic/internal/clock.hpp>
#include <elastic/rendezvous/store.hpp>

namespace elastic::inline v1::comm::detail {

/// Where a rank was in its round: its newest collective.
struct last_collective {
  std::uint64_t index = 0;  ///< #k in the round (0: none yet)
  std::string_view op;      ///< a literal: the group's collectives are named by string literals
  flight_outcome outcome = flight_outcome::done;
  std::int64_t entered_ns = 0, left_ns = 0;
};

inline std::string flight_round_prefix(std::string_view run_prefix, std::int64_t round) {
  return fmt::format("{}/round/{}/flight/", run_prefix, round);
}

/// Writes `last` as rank `rank` of `world` in `round`; a store that fails is left alone (the
/// report is a courtesy, the rebuild is what matters).
inline void publish_last_collective(rendezvous::store& s, std::string_view run_prefix, std::int64_t round, int rank,
                                    int world, const last_collective& last) noexcept {
  try {
    const std::int64_t now = internal::monotonic_ns();
    s.set(flight_round_prefix(run_prefix, round) + std::to_string(rank),
          fmt::format("{} {} {} {} {} {}", last.index, world, static_cast<int>(last.outcome),
                      last.entered_ns ? now - last.entered_ns : 0, last.left_ns ? now - last.left_ns : 0, last.op));
  } catch (...) {
  }
}

/// What the ranks of `round` wrote, as flight logs on this process's clock (one entry each).
inline std::vector<flight_log> read_last_collectives(rendezvous::store& s, std::string_view run_prefix,
                                                     std::int64_t round) {
  std::vector<flight_log> out;
  const std::string prefix = flight_round_prefix(run_prefix, round);
  const std::int64_t now = internal::monotonic_ns();
  for (const auto& [key, value] : s.list(prefix)) {
    int rank = -1, world = 0, outcome = 0;
    unsigned long long index = 0;
    long long entered = 0, left = 0;
    int used = 0;
    if (std::sscanf(value.c_str(), "%llu %d %d %lld %lld %n", &index, &world, &outcome, &entered, &left, &used) < 5) continue;
    const std::string_view r = std::string_view(key).substr(prefix.size());
    if (std::from_chars(r.data(), r.data() + r.size(), rank).ec != std::errc{} || rank < 0 || rank >= world) continue;
    flight_log l;
    l.rank = rank;
    l.world = world;
    l.round = round;
    if (index > 0) {
      flight_entry e;
      e.round = round;
      e.rank = rank;
      e.world = world;
      e.index = index;
      e.op = value.substr(static_cast<std::size_t>(used));
      e.entered_ns = entered ? now - entered : 0;
      e.left_ns = left ? now - left : 0;
      e.outcome = static_cast<flight_outcome>(outcome);
      l.entries.push_back(std::move(e));
    }
    out.push_back(std::move(l));
  }
  return out;
}

/// Names the rank(s) of round `round` that never entered the collective the others were in
/// (`group_culprit`, source "group"); a store that does not answer costs the report only.
inline void report_culprit(rendezvous::store& s, std::string_view run_prefix, std::int64_t round,
                           const event_log& events) noexcept {
  try {
    const auto logs = read_last_collectives(s, run_prefix, round);
    const auto rep = find_culprit(logs, round, true);
    if (rep) emit_culprit(events, *rep, "group", internal::monotonic_ns());
  } catch (...) {
  }
}

}  // namespace elastic::inline v1::comm::detail
