// How a global 1-D buffer is split among the ranks of a world, for sharded state whose slices
// follow the world size (state::add_partitioned): rank r of w holds the elements
// [offset, offset + count) that the entry's partition function gives it. ZeRO-1 style optimizer
// moments are the usual case: each data-parallel rank keeps 1/w of them.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include <elastic/error.hpp>

namespace elastic::inline v1::checkpoint {

/// Elements [offset, offset + count) of a global 1-D buffer.
struct slice {
  std::uint64_t offset = 0;
  std::uint64_t count = 0;
  friend bool operator==(const slice&, const slice&) = default;
};

/// Which slice of a buffer of `global_count` elements rank `rank` of `world` holds. The slices
/// of the ranks of one world must not overlap and must cover the buffer (check_partition).
using partition_fn = std::function<slice(std::uint64_t global_count, int rank, int world)>;

/// The default: contiguous slices in rank order, the first `global_count % world` ranks holding
/// one element more than the others.
inline slice even_partition(std::uint64_t global_count, int rank, int world) {
  const auto w = static_cast<std::uint64_t>(world), r = static_cast<std::uint64_t>(rank);
  const std::uint64_t base = global_count / w, extra = global_count % w;
  return {r * base + std::min(r, extra), base + (r < extra ? 1 : 0)};
}

/// Every rank's slice of entry `name` for a world of `world`, in rank order; throws
/// errc::invalid_argument when `partition` leaves a gap, overlaps or runs past the buffer.
inline std::vector<slice> partition_slices(const partition_fn& partition, std::string_view name,
                                           std::uint64_t global_count, int world) {
  if (world < 1) {
    throw error(errc::invalid_argument, fmt::format("sharded entry '{}': a world of {} ranks", name, world));
  }
  std::vector<slice> all;
  all.reserve(static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r) all.push_back(partition(global_count, r, world));
  std::vector<std::size_t> order(all.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return all[a].offset < all[b].offset; });
  std::uint64_t next = 0;
  for (const std::size_t i : order) {
    const slice& s = all[i];
    if (s.offset != next || s.count > global_count - std::min(global_count, s.offset)) {
      throw error(errc::invalid_argument,
                  fmt::format("sharded entry '{}': its partition gives rank {} of {} the elements [{}, {}), but the "
                              "slices must tile [0, {}) with neither gap nor overlap ({} expected next)",
                              name, i, world, s.offset, s.offset + s.count, global_count, next));
    }
    next += s.count;
  }
  if (next != global_count) {
    throw error(errc::invalid_argument,
                fmt::format("sharded entry '{}': the slices of {} ranks cover {} of its {} elements", name, world,
                            next, global_count));
  }
  return all;
}

}  // namespace elastic::inline v1::checkpoint
