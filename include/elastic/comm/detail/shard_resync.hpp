// How an elastic group's partitioned state (state::add_partitioned) follows a rebuild: every
// rank says whose slices it holds (rank r of a world of w) and at which step; when the ranks that
// hold the agreed step's slices of one world cover the whole buffer, each of those slices is
// broadcast from its holder and every rank keeps what falls in its new slice (from memory, no
// disk); otherwise a slice was lost with its rank, and every rank loads the newest committed
// checkpoint as its new rank (restore_fn), so that all of them go on from that step together.
//
// The slices travel as host words through broadcasts (any communicator has them; a device
// slice is copied to the host first): the whole buffer is sent once, from the ranks that hold
// it. A collective that fails on the way makes this rank's slices unknown (they may be half
// moved): the next attempt after the rebuild finds them so, and reloads from the checkpoint.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <elastic/checkpoint/group_hook.hpp>
#include <elastic/checkpoint/state.hpp>
#include <elastic/comm/communicator.hpp>
#include <elastic/error.hpp>
#include <elastic/internal/cuda.hpp>

namespace elastic::inline v1::comm::detail {

/// Host words from rank `root` to every rank, through `run(what, f(Comm&))` (false: a
/// collective failed).
template <class Comm, class Run>
bool broadcast_words(Run& run, std::span<std::int64_t> words, int root = 0) {
  return run("broadcast", [&](Comm& c) {
    if constexpr (device_communicator<Comm>) {
      c.broadcast_host(words, root);
    } else {
      c.broadcast(words, root);
    }
  });
}

/// Whose slices a rank holds, and as of which step (-1: none it can vouch for).
struct shard_layout {
  std::int64_t rank = -1;
  std::int64_t world = 0;
  std::int64_t step = -1;
};

/// The layout of `st`'s partitioned entries (a fixed slice is refused, naming it).
inline shard_layout layout_of(const checkpoint::state& st, std::int64_t step) {
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
  return l;
}

/// Every rank's layout, in rank order: each rank broadcasts its own three words (the others'
/// are overwritten by the broadcast).
template <class Comm, class Run>
std::optional<std::vector<shard_layout>> exchange_layouts(Run& run, int world, const shard_layout& mine) {
  std::vector<shard_layout> all(static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r) {
    std::int64_t w[3] = {mine.rank, mine.world, mine.step};
    if (!broadcast_words<Comm>(run, std::span<std::int64_t>(w), r)) return std::nullopt;
    all[static_cast<std::size_t>(r)] = {w[0], w[1], w[2]};
  }
  return all;
}

/// The old world whose slices at `step` are all held, and the rank that sends each (the lowest
/// that holds it); nothing when no world is complete. Worlds are tried in the order their
/// holders appear, rank 0's first.
inline std::optional<std::pair<int, std::vector<int>>> choose_holders(const std::vector<shard_layout>& all,
                                                                       std::int64_t step) {
  std::vector<std::int64_t> tried;
  for (const auto& l : all) {
    if (l.step != step || l.world < 1 || std::find(tried.begin(), tried.end(), l.world) != tried.end()) continue;
    tried.push_back(l.world);
    std::vector<int> holders(static_cast<std::size_t>(l.world), -1);
    for (std::size_t n = 0; n < all.size(); ++n) {
      const auto& h = all[n];
      if (h.step != step || h.world != l.world || h.rank < 0 || h.rank >= h.world) continue;
      auto& slot = holders[static_cast<std::size_t>(h.rank)];
      if (slot < 0) slot = static_cast<int>(n);
    }
    if (std::find(holders.begin(), holders.end(), -1) == holders.end()) {
      return std::pair{static_cast<int>(l.world), std::move(holders)};
    }
  }
  return std::nullopt;
}

/// Copies `n` bytes of entry `e`'s memory at byte `at` to or from the host.
inline void read_entry(const checkpoint::entry& e, std::size_t at, std::byte* out, std::size_t n) {
  if (n == 0) return;
  const auto* src = static_cast<const std::byte*>(e.data) + at;
  if (e.where == checkpoint::location::device) {
    internal::cuda::copy_to_host(out, src, n);
  } else {
    std::memcpy(out, src, n);
  }
}
inline void write_entry(const checkpoint::entry& e, std::size_t at, const std::byte* in, std::size_t n) {
  if (n == 0) return;
  auto* dst = static_cast<std::byte*>(e.data) + at;
  if (e.where == checkpoint::location::device) {
    internal::cuda::copy_to_device(dst, in, n);
  } else {
    std::memcpy(dst, in, n);
  }
}

/// Gives every partitioned entry of `st` rank `rank` of `world`'s slice, filled from the slices
/// of world `old_world` that `holders` send. Adds the bytes moved to `bytes`; false when a
/// collective failed (the slices are then half moved).
template <class Comm, class Run>
bool move_slices(Run& run, checkpoint::state& st, int rank, int world, int old_world, const std::vector<int>& holders,
                 std::size_t& bytes) {
  // What this rank sends (it holds one slice of the old world: its layout's), kept while the
  // storage takes its new size. A rank that sends nothing keeps no copy.
  const bool sends = std::find(holders.begin(), holders.end(), rank) != holders.end();
  const std::vector<checkpoint::entry>& entries = st.entries();
  std::vector<std::vector<std::byte>> mine(entries.size());
  for (std::size_t i = 0; sends && i < entries.size(); ++i) {
    if (!entries[i].partition) continue;
    mine[i].resize(entries[i].bytes);
    read_entry(entries[i], 0, mine[i].data(), entries[i].bytes);
  }
  st.repartition(rank, world);
  std::vector<std::int64_t> words;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const auto& e = entries[i];
    if (!e.partition) continue;
    const std::uint64_t eb = e.element_bytes, global = e.shard->global_count;
    const std::uint64_t lo = e.shard->offset, hi = lo + e.bytes / eb;
    const auto old = checkpoint::partition_slices(e.partition, e.name, global, old_world);
    for (int o = 0; o < old_world; ++o) {
      const auto s = old[static_cast<std::size_t>(o)];
      const int root = holders[static_cast<std::size_t>(o)];
      // Sized, not cleared: the broadcast overwrites it everywhere but at the root, which fills it.
      words.resize(static_cast<std::size_t>((s.count * eb + 7) / 8));
      if (words.empty()) continue;
      if (rank == root) {
        if (mine[i].size() != s.count * eb) {
          throw error(errc::invalid_argument,
                      fmt::format("elastic_group: entry '{}': this rank was to send slice {} of {} ({} bytes) but "
                                  "holds {} bytes: is its partition function the same on every rank?",
                                  e.name, o, old_world, s.count * eb, mine[i].size()));
        }
        words.back() = 0;  // the padding after the last element
        std::memcpy(words.data(), mine[i].data(), mine[i].size());
      }
      if (!broadcast_words<Comm>(run, std::span<std::int64_t>(words), root)) return false;
      bytes += static_cast<std::size_t>(s.count * eb);
      const std::uint64_t a = std::max(lo, s.offset), b = std::min(hi, s.offset + s.count);
      if (a >= b) continue;
      write_entry(e, static_cast<std::size_t>((a - lo) * eb),
                  reinterpret_cast<const std::byte*>(words.data()) + (a - s.offset) * eb,
                  static_cast<std::size_t>((b - a) * eb));
    }
  }
  return true;
}

/// What a shard resync agreed on.
struct sharded {
  std::int64_t step = 0;     ///< the step every rank's slices (and, from disk, all state) are at
  bool from_disk = false;    ///< a slice was lost: the state was reloaded from this checkpoint step
  std::size_t bytes = 0;     ///< bytes moved between ranks
  int world_before = 0;      ///< the world whose slices were moved (0: none, from disk)
};

/// Makes every rank hold its slice of the partitioned state at `step` (rank 0's), from memory,
/// or all of the state at the newest committed step from disk. This rank's slices are as of
/// `own_step` when `valid` (not after a move that failed half way). Nothing when a collective
/// failed.
template <class Comm, class Run>
std::optional<sharded> resync_shards(Run& run, int rank, int world, std::int64_t own_step, std::int64_t step,
                                     bool valid, checkpoint::state& st, const checkpoint::restore_fn& restore) {
  const shard_layout mine = layout_of(st, valid ? own_step : -1);
  const auto all = exchange_layouts<Comm>(run, world, mine);
  if (!all) return std::nullopt;
  sharded out{step};
  if (const auto chosen = choose_holders(*all, step)) {
    out.world_before = chosen->first;
    if (!move_slices<Comm>(run, st, rank, world, chosen->first, chosen->second, out.bytes)) return std::nullopt;
    return out;
  }
  // A slice is lost: everyone goes back to the newest committed step rank 0 can read.
  if (!restore) {
    throw error(errc::not_supported,
                "elastic_group: a slice of the partitioned state was lost with its rank, and nothing can reload it "
                "(use the group through training_loop, which gives it the checkpoints)");
  }
  st.repartition(rank, world);
  std::int64_t chosen_step = -1;
  if (rank == 0) {
    const auto s = restore(std::nullopt, 0);
    chosen_step = s ? static_cast<std::int64_t>(*s) : -1;
  }
  if (!broadcast_words<Comm>(run, std::span<std::int64_t>(&chosen_step, 1), 0)) return std::nullopt;
  if (chosen_step < 0) {
    throw error(errc::not_found,
                fmt::format("elastic_group: a slice of the partitioned state at step {} was lost with its rank and no "
                            "committed checkpoint holds the state: the run cannot go on; restart it",
                            step));
  }
  if (rank != 0) (void)restore(static_cast<std::uint64_t>(chosen_step), rank);
  out.step = chosen_step;
  out.from_disk = true;
  return out;
}

}  // namespace elastic::inline v1::comm::detail
