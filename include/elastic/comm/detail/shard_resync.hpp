// How an elastic group's partitioned state (state::add_partitioned) follows a rebuild. Every
// rank says whose slices it holds live (rank r of a world of w, at which step), which snapshot
// images it holds in memory (detail/peer_replicas.hpp: its own, and replicas of its
// predecessors' slices) and where its replica listener is. Then, in this order:
// 1. the live slices of one world at the agreed step cover the whole buffer: each is broadcast
//    from its holder and every rank keeps what falls in its new slice (nothing goes back);
// 2. a slice was lost with its rank, but the newest step S whose slices are all held in memory
//    (a rank's own image, or a successor's replica) and of which some rank has its own whole
//    image: that rank (the root) takes its replicated state back to S from its image, the
//    slices are broadcast from the images, and every rank goes on from S;
// 3. nothing in memory covers the buffer: every rank loads the newest committed checkpoint as its
//    new rank (restore_fn), so that all of them go on from that step together.
//
// The slices travel as host words through broadcasts (any communicator has them; a device
// slice is copied to the host first): each old slice another rank needs is sent once, from the
// rank that holds it, in place where the communicator allows (move_slices). A collective that fails on the way makes this rank's live slices unknown (they may be half
// moved): the next attempt after the rebuild finds them so; its images are untouched.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <elastic/checkpoint/group_hook.hpp>
#include <elastic/checkpoint/state.hpp>
#include <elastic/comm/communicator.hpp>
#include <elastic/comm/detail/peer_replicas.hpp>
#include <elastic/comm/detail/shard_holdings.hpp>
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

/// Every rank's holdings, in rank order: each rank broadcasts the length of its account, then it.
template <class Comm, class Run>
std::optional<std::vector<shard_holdings>> exchange_holdings(Run& run, int rank, int world, const shard_holdings& mine) {
  std::vector<shard_holdings> all(static_cast<std::size_t>(world));
  const std::vector<std::int64_t> own = encode(mine);
  for (int r = 0; r < world; ++r) {
    std::int64_t n = static_cast<std::int64_t>(own.size());
    if (!broadcast_words<Comm>(run, std::span<std::int64_t>(&n, 1), r)) return std::nullopt;
    if (n < 8 || n > 8192) throw error(errc::corrupt, "elastic_group: a peer's account of its slices has a bad length");
    std::vector<std::int64_t> w = r == rank ? own : std::vector<std::int64_t>(static_cast<std::size_t>(n));
    if (!broadcast_words<Comm>(run, std::span<std::int64_t>(w), r)) return std::nullopt;
    all[static_cast<std::size_t>(r)] = r == rank ? mine : decode(w);
  }
  return all;
}

/// Where an old slice comes from, on the rank that sends it: its live state (trained in the
/// group, or read from the checkpoint by a newcomer's loop: `restored`), or a memory image.
enum class slice_source : std::uint8_t { live, restored, own, replica };

inline const char* to_string(slice_source s) noexcept {
  switch (s) {
    case slice_source::live: return "live";
    case slice_source::restored: return "disk";
    case slice_source::own: return "own";
    case slice_source::replica: return "replica";
  }
  return "?";
}

/// How the slices will move: those of world `world` at `step`, old slice o sent by rank
/// `holders[o]` from `sources[o]`; `root` the rank whose own image gives the replicated state
/// (-1: the live state, rank 0's).
struct shard_plan {
  int world = 0;
  std::int64_t step = -1;
  std::vector<int> holders;
  std::vector<slice_source> sources;
  int root = -1;
};

/// Case 1: the old world whose live slices at `step` are all held, the lowest rank holding each
/// sending it; worlds are tried in the order their holders appear, rank 0's first.
inline std::optional<shard_plan> plan_live(const std::vector<shard_holdings>& all, std::int64_t step) {
  std::vector<std::int64_t> tried;
  for (const auto& a : all) {
    const auto& l = a.live;
    if (l.step != step || l.world < 1 || std::find(tried.begin(), tried.end(), l.world) != tried.end()) continue;
    tried.push_back(l.world);
    std::vector<int> holders(static_cast<std::size_t>(l.world), -1);
    for (std::size_t n = 0; n < all.size(); ++n) {
      const auto& h = all[n].live;
      if (h.step != step || h.world != l.world || h.rank < 0 || h.rank >= h.world) continue;
      auto& slot = holders[static_cast<std::size_t>(h.rank)];
      if (slot < 0) slot = static_cast<int>(n);
    }
    if (std::find(holders.begin(), holders.end(), -1) == holders.end()) {
      std::vector<slice_source> sources;
      for (const int n : holders) {
        sources.push_back(all[static_cast<std::size_t>(n)].live.restored ? slice_source::restored : slice_source::live);
      }
      return shard_plan{static_cast<int>(l.world), step, std::move(holders), std::move(sources), -1};
    }
  }
  return std::nullopt;
}

/// Case 2: the newest snapshot step whose slices are all in memory (own images first, the
/// lowest rank holding each) and of which a rank holds its own whole image (the lowest is the root).
inline std::optional<shard_plan> plan_memory(const std::vector<shard_holdings>& all) {
  std::set<std::pair<std::int64_t, std::int64_t>, std::greater<>> candidates;  // (step, world), newest first
  for (const auto& a : all)
    for (const auto& i : a.images)
      if (i.world >= 1 && i.world <= (1 << 20) && i.step >= 0) candidates.insert({i.step, i.world});
  for (const auto& [step, world] : candidates) {
    shard_plan p{static_cast<int>(world), step, std::vector<int>(static_cast<std::size_t>(world), -1),
                 std::vector<slice_source>(static_cast<std::size_t>(world), slice_source::replica), -1};
    for (const bool full : {true, false}) {
      for (std::size_t n = 0; n < all.size(); ++n) {
        for (const auto& i : all[n].images) {
          if (i.step != step || i.world != world || i.full != full || i.rank < 0 || i.rank >= world) continue;
          if (full && p.root < 0) p.root = static_cast<int>(n);
          auto& slot = p.holders[static_cast<std::size_t>(i.rank)];
          if (slot >= 0) continue;
          slot = static_cast<int>(n);
          p.sources[static_cast<std::size_t>(i.rank)] = full ? slice_source::own : slice_source::replica;
        }
      }
    }
    if (p.root >= 0 && std::find(p.holders.begin(), p.holders.end(), -1) == p.holders.end()) return p;
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

/// The image this rank holds for old slice `o` of plan `p` (own or replica), pinned.
inline std::shared_ptr<const memory_image> image_for(const std::vector<std::shared_ptr<const memory_image>>& images,
                                                     const shard_plan& p, int o) {
  const image_key want{o, p.world, p.step, p.sources[static_cast<std::size_t>(o)] == slice_source::own};
  for (const auto& i : images)
    if (i->key == want) return i;
  throw error(errc::invalid_argument,
              fmt::format("elastic_group: this rank was to send slice {} of {} at step {} from its memory, but holds "
                          "no such image",
                          o, p.world, p.step));
}

/// Gives every partitioned entry of `st` rank `rank` of `world`'s slice, filled from the old
/// slices plan `p` names, each broadcast by its holder from its live state or an image
/// (`images`: this rank's, pinned; `parts`: the partitioned entries' indices, what a replica
/// image holds). Adds the bytes moved to `bytes`; false when a collective failed (the live
/// slices are then half moved).
template <class Comm, class Run>
bool move_slices(Run& run, checkpoint::state& st, int rank, int world, const shard_plan& p,
                 const std::vector<std::shared_ptr<const memory_image>>& images, const std::vector<std::size_t>& parts,
                 std::size_t& bytes) {
  // What this rank sends from its live state (its layout's slice), kept while the storage takes
  // its new size; what it sends from images stays in them.
  const std::vector<checkpoint::entry>& entries = st.entries();
  std::vector<std::vector<std::byte>> live(entries.size());
  std::vector<std::shared_ptr<const memory_image>> from(static_cast<std::size_t>(p.world));
  for (int o = 0; o < p.world; ++o) {
    if (p.holders[static_cast<std::size_t>(o)] != rank) continue;
    const auto src = p.sources[static_cast<std::size_t>(o)];
    if (src == slice_source::own || src == slice_source::replica) {
      from[static_cast<std::size_t>(o)] = image_for(images, p, o);
      continue;
    }
    for (std::size_t i = 0; i < entries.size(); ++i) {
      if (!entries[i].partition) continue;
      live[i].resize(entries[i].bytes);
      read_entry(entries[i], 0, live[i].data(), entries[i].bytes);
    }
  }
  // The bytes of old slice o of entry i, on the rank that sends it (`expected` of them).
  const auto sent = [&](int o, std::size_t i, std::uint64_t expected) -> std::span<const std::byte> {
    const auto& img = from[static_cast<std::size_t>(o)];
    std::span<const std::byte> b = live[i];
    if (img && img->key.full) b = img->bytes(i);
    if (img && !img->key.full) b = img->bytes(static_cast<std::size_t>(std::find(parts.begin(), parts.end(), i) - parts.begin()));
    if (b.size() != expected) {
      throw error(errc::invalid_argument,
                  fmt::format("elastic_group: entry '{}': this rank was to send slice {} of {} ({} bytes) but holds "
                              "{} bytes: is its partition function the same on every rank?",
                              entries[i].name, o, p.world, expected, b.size()));
    }
    return b;
  };
  st.repartition(rank, world);
  std::vector<std::vector<checkpoint::slice>> olds(entries.size()), nows(entries.size());
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const auto& e = entries[i];
    if (!e.partition) continue;
    olds[i] = checkpoint::partition_slices(e.partition, e.name, e.shard->global_count, p.world);
    nows[i] = checkpoint::partition_slices(e.partition, e.name, e.shard->global_count, world);
  }
  // A host communicator (Gloo) reads a root's buffer and writes a receiver's and nothing else: the
  // root sends straight from its image or live copy, a receiver whose new slice holds the whole
  // old one receives straight into it. Otherwise (a device communicator stages through the device
  // and writes the root's buffer back; a slice split between new slices) the words go through one
  // buffer, never zero-filled: the broadcast overwrites it everywhere but at the root, which fills it.
  constexpr bool in_place = !device_communicator<Comm>;
  const auto words_at = [](const std::byte* b) { return reinterpret_cast<std::uintptr_t>(b) % alignof(std::int64_t) == 0; };
  std::unique_ptr<std::int64_t[]> buffer;
  std::size_t buffer_words = 0;
  // First the slices some other rank needs, then those only their holder keeps (a survivor's own
  // slice back from its image): receivers wait on no holder's copy of its own.
  for (const bool others : {true, false}) {
    for (std::size_t i = 0; i < entries.size(); ++i) {
      const auto& e = entries[i];
      if (!e.partition) continue;
      const std::uint64_t eb = e.element_bytes;
      const std::uint64_t lo = e.shard->offset, hi = lo + e.bytes / eb;
      const auto& now = nows[i];
      for (int o = 0; o < p.world; ++o) {
        const auto s = olds[i][static_cast<std::size_t>(o)];
        const int root = p.holders[static_cast<std::size_t>(o)];
        const std::uint64_t a = std::max(lo, s.offset), b = std::min(hi, s.offset + s.count);
        const auto at = static_cast<std::size_t>((a - lo) * eb), n = static_cast<std::size_t>(s.count * eb);
        const bool wanted = std::any_of(now.begin(), now.end(), [&](const checkpoint::slice& x) {
          const auto r = static_cast<int>(&x - now.data());
          return r != root && x.count > 0 && s.count > 0 && x.offset < s.offset + s.count && s.offset < x.offset + x.count;
        });
        if (wanted != others) continue;
        const std::span<const std::byte> mine = rank == root ? sent(o, i, n) : std::span<const std::byte>{};
        if (!wanted) {
          if (rank == root && a < b) write_entry(e, at, mine.data() + (a - s.offset) * eb, static_cast<std::size_t>((b - a) * eb));
          continue;
        }
        const std::size_t count = (n + 7) / 8;
        if (count == 0) continue;
        const bool from_mine = in_place && rank == root && n % 8 == 0 && words_at(mine.data());
        auto* into = a < b ? static_cast<std::byte*>(e.data) + at : nullptr;
        const bool into_slice = in_place && rank != root && e.where == checkpoint::location::host && a == s.offset &&
                                b == s.offset + s.count && n % 8 == 0 && words_at(into);
        std::span<std::int64_t> words;
        if (from_mine) {  // read only: see above
          words = {reinterpret_cast<std::int64_t*>(const_cast<std::byte*>(mine.data())), count};
        } else if (into_slice) {
          words = {reinterpret_cast<std::int64_t*>(into), count};
        } else {
          if (buffer_words < count) {
            buffer.reset();  // one at a time
            buffer = std::make_unique_for_overwrite<std::int64_t[]>(count);
            buffer_words = count;
          }
          words = {buffer.get(), count};
          if (rank == root) {
            words.back() = 0;  // the padding after the last element
            std::memcpy(words.data(), mine.data(), n);
          }
        }
        if (!broadcast_words<Comm>(run, words, root)) return false;
        bytes += n;
        if (a >= b || into_slice) continue;
        const auto* got = rank == root ? mine.data() : reinterpret_cast<const std::byte*>(words.data());
        write_entry(e, at, got + (a - s.offset) * eb, static_cast<std::size_t>((b - a) * eb));
      }
    }
  }
  return true;
}

/// Takes the replicated entries (all but the partitioned ones) back to own image `img`.
inline void restore_replicated(checkpoint::state& st, const memory_image& img) {
  const auto& entries = st.entries();
  if (img.sizes.size() != entries.size()) {
    throw error(errc::mismatch, "elastic_group: a snapshot image in memory has other entries than the state");
  }
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const auto& e = entries[i];
    if (e.partition) continue;
    const auto b = img.bytes(i);
    if (e.kind == checkpoint::entry_kind::object) {
      e.load(b);
    } else if (b.size() != e.bytes) {
      throw error(errc::mismatch, fmt::format("elastic_group: entry '{}' is {} bytes, its image in memory {}",
                                              e.name, e.bytes, b.size()));
    } else {
      write_entry(e, 0, b.data(), b.size());
    }
  }
}

/// What a shard resync agreed on.
struct sharded {
  std::int64_t step = 0;     ///< the step every rank's slices (and, from disk, all state) are at
  bool reloaded = false;     ///< nothing in memory held a lost slice: every rank reloaded all of its state from disk
  bool from_disk = false;    ///< reloaded, or a slice came from a newcomer that read it from the checkpoint
  int root = -1;             ///< from memory images: the rank whose image gave the replicated state at `step`
  std::size_t bytes = 0;     ///< bytes moved between ranks
  int world_before = 0;      ///< the world whose slices were moved (0: none, from disk)
  std::string sources;       ///< where each old slice came from: "live@0,replica@2,..." (empty: disk)
  std::vector<peer_address> peers;  ///< every rank's replica listener, by new rank
  wire::group_key key{};            ///< rank 0's replica key, which every rank takes
};

/// Makes every rank hold its slice of the partitioned state: at `step` (rank 0's) from the live
/// slices, at an older snapshot step from memory images when a slice was lost, or all of the
/// state at the newest committed step from disk. This rank's live slices are as of `own_step`
/// when `valid` (not after a move that failed half way). `replicas` may be null (none kept).
/// Nothing when a collective failed.
template <class Comm, class Run>
std::optional<sharded> resync_shards(Run& run, int rank, int world, std::int64_t own_step, std::int64_t step,
                                     bool valid, bool restored, checkpoint::state& st,
                                     const checkpoint::restore_fn& restore, const peer_replicas* replicas) {
  shard_holdings mine;
  mine.live = layout_of(st, valid ? own_step : -1, restored);
  std::vector<std::shared_ptr<const memory_image>> images;
  if (replicas) {
    images = replicas->images();  // pinned until the move is done
    for (const auto& i : images) mine.images.push_back(i->key);
    mine.address = replicas->address();
    mine.key = replicas->key();
  }
  const auto all = exchange_holdings<Comm>(run, rank, world, mine);
  if (!all) return std::nullopt;
  sharded out;
  out.step = step;
  for (const auto& a : *all) out.peers.push_back(a.address);
  out.key = (*all)[0].key;
  auto plan = plan_live(*all, step);
  if (!plan) plan = plan_memory(*all);
  if (plan) {
    out.step = plan->step;
    out.world_before = plan->world;
    out.root = plan->root;
    for (int o = 0; o < plan->world; ++o) {
      out.from_disk = out.from_disk || plan->sources[static_cast<std::size_t>(o)] == slice_source::restored;
      out.sources += fmt::format("{}{}@{}", o ? "," : "", to_string(plan->sources[static_cast<std::size_t>(o)]),
                                 plan->holders[static_cast<std::size_t>(o)]);
    }
    if (plan->root == rank) {
      for (const auto& i : images) {
        if (i->key.full && i->key.world == plan->world && i->key.step == plan->step) {
          restore_replicated(st, *i);
          break;
        }
      }
    }
    static const std::vector<std::size_t> none;
    if (!move_slices<Comm>(run, st, rank, world, *plan, images, replicas ? replicas->partitioned() : none, out.bytes)) {
      return std::nullopt;
    }
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
                fmt::format("elastic_group: a slice of the partitioned state at step {} was lost with its rank (and "
                            "the ranks holding its replicas), and no committed checkpoint holds the state: the run "
                            "cannot go on; restart it",
                            step));
  }
  if (rank != 0) (void)restore(static_cast<std::uint64_t>(chosen_step), rank);
  out.step = chosen_step;
  out.reloaded = out.from_disk = true;
  return out;
}

}  // namespace elastic::inline v1::comm::detail
