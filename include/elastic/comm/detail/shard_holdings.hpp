// What one rank of an elastic group says of its partitioned state before the slices move
// (detail/shard_resync.hpp): whose slices it holds live and as of which step, which snapshot
// images it holds in memory, where its replica listener is; and how that travels as words.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <elastic/checkpoint/group_hook.hpp>
#include <elastic/checkpoint/state.hpp>
#include <elastic/comm/detail/memory_image.hpp>
#include <elastic/comm/detail/replica_wire.hpp>
#include <elastic/error.hpp>

namespace elastic::inline v1::comm::detail {

/// Whose slices a rank holds live, and as of which step (-1: none it can vouch for).
struct shard_layout {
  std::int64_t rank = -1;
  std::int64_t world = 0;
  std::int64_t step = -1;
  bool restored = false;  ///< read from a checkpoint by its loop, not trained on in this group yet
};

/// The layout of `st`'s partitioned entries (a fixed slice is refused, naming it).
inline shard_layout layout_of(const checkpoint::state& st, std::int64_t step, bool restored) {
  checkpoint::refuse_fixed_slices(st);
  shard_layout l;
  for (const auto& e : st.entries()) {
    if (!e.shard) continue;
    if (l.rank >= 0 && (l.rank != e.part_rank || l.world != e.part_world)) {
      throw error(errc::invalid_argument,
                  fmt::format("elastic_group: partitioned entries hold slices of different worlds ('{}' is rank {} "
                              "of {}, another rank {} of {}): register them all with the same rank and world",
                              e.name, e.part_rank, e.part_world, l.rank, l.world));
    }
    l.rank = e.part_rank;
    l.world = e.part_world;
  }
  l.step = step;
  l.restored = restored;
  return l;
}

/// What one rank says of its slices before they move.
struct shard_holdings {
  shard_layout live;
  std::vector<image_key> images;  // snapshot images in its memory
  peer_address address;           // its replica listener (port 0: none)
  wire::group_key key{};          // its group's replica key (peer_replicas::key; zero: none)
};

/// A rank's holdings as words: live rank, world, step, restored; port; image count; host
/// length; the replica key in four words; four words per image; the host name's bytes. (They
/// travel only through the group's communicator, which is why the key may.)
inline std::vector<std::int64_t> encode(const shard_holdings& h) {
  std::vector<std::int64_t> w{h.live.rank, h.live.world, h.live.step, h.live.restored ? 1 : 0, h.address.port,
                              static_cast<std::int64_t>(h.images.size()),
                              static_cast<std::int64_t>(h.address.host.size()), 0, 0, 0, 0};
  std::memcpy(w.data() + 7, h.key.data(), h.key.size());
  for (const auto& i : h.images) w.insert(w.end(), {i.rank, i.world, i.step, i.full ? 1 : 0});
  const std::size_t at = w.size();
  w.resize(at + (h.address.host.size() + 7) / 8);
  if (!h.address.host.empty()) std::memcpy(w.data() + at, h.address.host.data(), h.address.host.size());
  return w;
}

inline shard_holdings decode(std::span<const std::int64_t> w) {
  const auto bad = [] {
    return error(errc::corrupt, "elastic_group: a peer sent a malformed account of its slices (another version?)");
  };
  constexpr std::size_t head = 11;
  static_assert(sizeof(wire::group_key) == 4 * sizeof(std::int64_t));
  if (w.size() < head || w[5] < 0 || w[5] > 1024 || w[6] < 0 || w[6] > 1024 || w[4] < 0 || w[4] > 65535) throw bad();
  const auto n = static_cast<std::size_t>(w[5]), host = static_cast<std::size_t>(w[6]);
  if (w.size() != head + 4 * n + (host + 7) / 8) throw bad();
  shard_holdings h;
  h.live = {w[0], w[1], w[2], w[3] != 0};
  h.address.port = static_cast<std::uint16_t>(w[4]);
  std::memcpy(h.key.data(), w.data() + 7, h.key.size());
  for (std::size_t i = 0; i < n; ++i) {
    const auto* p = w.data() + head + 4 * i;
    h.images.push_back({p[0], p[1], p[2], p[3] != 0});
  }
  h.address.host.resize(host);
  if (host) std::memcpy(h.address.host.data(), w.data() + head + 4 * n, host);
  return h;
}

}  // namespace elastic::inline v1::comm::detail
