// The rule that orders a round's joiners into ranks, the same on every participant (each
// would-be closer computes it, and the store keeps the first list written): survivors of the
// previous round first, in their previous rank order, then newcomers by id.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include <elastic/rendezvous/detail/round_records.hpp>

namespace elastic::inline v1::rendezvous::detail {

/// The rank order of round `round`: survivors of round-1 by their previous rank, then
/// newcomers by id; at most `max` of them.
inline std::vector<member> rank_order(std::vector<join_entry> joins, std::int64_t round, std::size_t max) {
  auto survivor = [&](const join_entry& e) { return e.prev_round == round - 1 && e.prev_round > 0; };
  std::sort(joins.begin(), joins.end(), [&](const join_entry& a, const join_entry& b) {
    const bool sa = survivor(a), sb = survivor(b);
    if (sa != sb) return sa;
    if (sa && a.prev_rank != b.prev_rank) return a.prev_rank < b.prev_rank;
    return a.who.id < b.who.id;
  });
  std::vector<member> out;
  for (auto& e : joins) {
    if (out.size() == max) break;
    out.push_back(std::move(e.who));
  }
  return out;
}

}  // namespace elastic::inline v1::rendezvous::detail
