// Which rank held a round back: from the ranks' flight records (detail/flight_recorder.hpp,
// read from shared memory by the launcher or gathered through the store by the group), the
// newest collective #k that some rank of the round entered, and the ranks that never entered
// it. Those are the culprits: a rank hung in its own code (or dead before it got there) while
// the others waited in #k. A rank of the round with no record at all is one only where the
// caller says so (`blame_unrecorded`: through the store, a rank that did not report while all
// that did were in #k); the launcher, which sees every worker of its host, does not (a worker
// that ended normally removed its record).
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <elastic/comm/detail/flight_recorder.hpp>
#include <elastic/events.hpp>

namespace elastic::inline v1::comm::detail {

/// What one rank of the round did last in it.
struct rank_flight {
  int rank = 0;
  long pid = 0;                ///< 0: unknown (no record, or gathered from another host)
  bool recorded = false;       ///< false: no collective of this round is on record for it
  std::uint64_t index = 0;     ///< its newest collective's #k in the round (0: none)
  std::string op;
  std::int64_t entered_ns = 0, left_ns = 0;
  flight_outcome outcome = flight_outcome::inside;
};

/// The culprits of round `round` at collective #`index`.
struct culprit_report {
  std::int64_t round = 0;
  int world = 0;
  std::uint64_t index = 0;       ///< the collective the culprits never entered
  std::string op;
  std::uint64_t bytes = 0;
  std::vector<int> culprits;     ///< never entered #index (rank order)
  std::vector<int> inside;       ///< entered #index, still in it
  std::vector<int> failed;       ///< entered #index and left it failed
  std::vector<rank_flight> ranks;  ///< every rank of the round, in rank order

  /// The most ranks text() describes one by one (a group of thousands would make an event of
  /// megabytes); the culprits are always named.
  static constexpr std::size_t max_ranks_in_text = 64;

  /// One paragraph a person reads: who, where each rank was, for how long (`now_ns` on the
  /// records' clock).
  [[nodiscard]] std::string text(std::int64_t now_ns) const {
    const auto ago = [&](std::int64_t t) { return fmt::format("{:.3f} s", static_cast<double>(now_ns - t) / 1e9); };
    std::string out = fmt::format("round {}: rank{} {} never entered collective #{} ({}{})", round,
                                  culprits.size() > 1 ? "s" : "", fmt::join(culprits, ","), index, op,
                                  bytes ? fmt::format(", {} bytes", bytes) : std::string());
    std::vector<std::string> parts;
    for (const auto& r : ranks) {
      if (parts.size() == max_ranks_in_text) {
        parts.push_back(fmt::format("{} more ranks not shown", ranks.size() - max_ranks_in_text));
        break;
      }
      if (!r.recorded) {
        parts.push_back(fmt::format("rank {}: no collective of this round on record", r.rank));
      } else if (r.outcome == flight_outcome::inside) {
        parts.push_back(fmt::format("rank {}: inside #{} {} for {}", r.rank, r.index, r.op, ago(r.entered_ns)));
      } else {
        parts.push_back(fmt::format("rank {}: last #{} {}, left {} ago{}", r.rank, r.index, r.op, ago(r.left_ns),
                                    r.outcome == flight_outcome::failed ? " (failed)" : ""));
      }
    }
    return out + "; " + fmt::format("{}", fmt::join(parts, "; "));
  }
};

/// The most ranks a group has, for readers that know no better bound: what a record claims
/// beyond it is not believed (and never costs memory in proportion to the claim).
inline constexpr int max_flight_world = 1 << 20;

/// The report for round `round` from `logs` (any processes of the run, any rounds): nothing when
/// no rank of the round was behind the others (all entered the newest collective, or none
/// entered any). Collectives that claim a world of more than `max_world` ranks (the run's bound,
/// where the caller knows it) are not believed: records are read, not trusted.
inline std::optional<culprit_report> find_culprit(std::span<const flight_log> logs, std::int64_t round,
                                                  bool blame_unrecorded = false, int max_world = max_flight_world) {
  culprit_report rep;
  rep.round = round;
  max_world = std::clamp(max_world, 1, max_flight_world);
  for (const auto& l : logs)
    for (const auto& e : l.entries)
      if (e.round == round && e.world <= max_world) rep.world = std::max(rep.world, e.world);
  if (rep.world <= 0) return std::nullopt;
  rep.ranks.resize(static_cast<std::size_t>(rep.world));
  for (int r = 0; r < rep.world; ++r) rep.ranks[static_cast<std::size_t>(r)].rank = r;
  const flight_entry* newest = nullptr;
  for (const auto& l : logs) {
    for (const auto& e : l.entries) {
      if (e.round != round || e.world > max_world || e.rank < 0 || e.rank >= rep.world) continue;
      auto& r = rep.ranks[static_cast<std::size_t>(e.rank)];
      if (r.recorded && r.index >= e.index) continue;
      r.recorded = true;
      r.pid = l.pid;
      r.index = e.index;
      r.op = e.op;
      r.entered_ns = e.entered_ns;
      r.left_ns = e.left_ns;
      r.outcome = e.outcome;
      if (!newest || e.index > newest->index) newest = &e;
    }
  }
  if (!newest) return std::nullopt;
  rep.index = newest->index;
  rep.op = newest->op;
  rep.bytes = newest->bytes;
  for (const auto& r : rep.ranks) {
    if (r.recorded ? r.index < rep.index : blame_unrecorded) {
      rep.culprits.push_back(r.rank);
    } else if (r.outcome == flight_outcome::inside) {
      rep.inside.push_back(r.rank);
    } else if (r.outcome == flight_outcome::failed) {
      rep.failed.push_back(r.rank);
    }
  }
  if (rep.culprits.empty()) return std::nullopt;
  return rep;
}

/// Emits `rep` as a `group_culprit` event from `source` ("launcher", "group"), with `extra`
/// fields; returns its text (read at `now_ns` on the records' clock).
inline std::string emit_culprit(const event_log& events, const culprit_report& rep, std::string_view source,
                                std::int64_t now_ns, std::span<const event_field> extra = {}) {
  const std::string culprits = fmt::format("{}", fmt::join(rep.culprits, ",")),
                    inside = fmt::format("{}", fmt::join(rep.inside, ",")),
                    failed = fmt::format("{}", fmt::join(rep.failed, ",")), text = rep.text(now_ns);
  std::vector<event_field> f{{"source", source},       {"round", rep.round},      {"world_size", rep.world},
                             {"collective", rep.index}, {"op", rep.op},            {"culprit", rep.culprits.front()},
                             {"culprits", culprits},    {"inside", inside},        {"failed", failed},
                             {"text", text}};
  f.insert(f.end(), extra.begin(), extra.end());
  events.emit("group_culprit", std::span<const event_field>(f));
  return text;
}

}  // namespace elastic::inline v1::comm::detail
