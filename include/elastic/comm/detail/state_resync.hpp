// How an elastic_group's ranks come to hold rank 0's state after a rebuild: a header (step,
// layout fingerprint, and with resync_mode::compare rank 0's state hash), the partitioned
// state's slices (detail/shard_resync.hpp), then, unless every rank proved it holds rank 0's step
// and hash already (one allreduce of a count, detail/state_hash.hpp), the packed host state
// (detail/state_packing.hpp) and each replicated device buffer straight from rank 0's device
// memory when the communicator takes device memory. Every collective goes through the group's
// `run`, so a peer dying midway fails the resync like any collective, and the group rebuilds and
// resyncs again.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <elastic/checkpoint/state.hpp>
#include <elastic/comm/communicator.hpp>
#include <elastic/comm/detail/shard_resync.hpp>
#include <elastic/comm/detail/state_hash.hpp>
#include <elastic/comm/detail/state_packing.hpp>
#include <elastic/comm/group_options.hpp>
#include <elastic/error.hpp>
#include <elastic/events.hpp>
#include <elastic/internal/clock.hpp>

namespace elastic::inline v1::comm::detail {

/// What a resync agreed on.
struct resynced {
  std::uint64_t step = 0;   ///< rank 0's step, or the checkpoint step all ranks reloaded
  std::size_t bytes = 0;    ///< replicated host bytes moved
  sharded shards{};         ///< how the partitioned state came (when there is some)
  bool compared = false;    ///< steps and hashes were compared with the root's
  bool skipped = false;     ///< every rank held the root's: the replicated state did not move
  std::int64_t differing = 0;  ///< ranks whose step or hash differed (when compared)
  std::int64_t hash_ns = 0;    ///< this rank's hashing of its replicated state
  std::string hash_error{};    ///< why this rank could not hash (it then counted as differing)
};

/// Whether `Comm` can sum a count of host words: Gloo's collectives take host memory, a device
/// communicator stages them (allreduce_host).
template <class Comm>
inline constexpr bool sums_on_host =
    !device_communicator<Comm> || requires(Comm& c, std::span<double> v) { c.allreduce_host(v, reduce_op::sum); };

/// `n` summed over the ranks (false: the collective failed).
template <class Comm, class Run>
bool sum_count(Run& run, std::int64_t& n) {
  return run("allreduce", [&](Comm& c) {
    if constexpr (!device_communicator<Comm>) {
      c.allreduce(std::span<std::int64_t>(&n, 1), reduce_op::sum);
    } else {
      double v = static_cast<double>(n);  // exact: a count of ranks
      c.allreduce_host(std::span<double>(&v, 1), reduce_op::sum);
      n = std::llround(v);
    }
  });
}

/// A device buffer from rank `root`, bit for bit, moved as 64- or 32-bit words.
template <class Comm, class Run>
bool broadcast_device(Run& run, const checkpoint::entry& e, int root) {
  const auto addr = reinterpret_cast<std::uintptr_t>(e.data);
  if (e.bytes % 8 == 0 && addr % 8 == 0) {
    return run("broadcast", [&](Comm& c) {
      c.broadcast(std::span<std::int64_t>(static_cast<std::int64_t*>(e.data), e.bytes / 8), root);
    });
  }
  if (e.bytes % 4 == 0 && addr % 4 == 0) {
    return run("broadcast", [&](Comm& c) {
      c.broadcast(std::span<std::int32_t>(static_cast<std::int32_t*>(e.data), e.bytes / 4), root);
    });
  }
  throw error(errc::invalid_argument,
              fmt::format("elastic_group: device state entry '{}' is {} bytes at {:#x}; a group moves device "
                          "buffers in 4-byte words: pad it to a multiple of 4 bytes",
                          e.name, e.bytes, addr));
}

/// Every rank ends with rank 0's step and `st`: its replicated state from rank 0, its slice of
/// the partitioned state from the ranks that hold it. When a slice was lost with its rank: the
/// state at the newest snapshot step held in memory (`replicas`' images: the replicated state
/// from the rank whose own image it is), or else all of it from the newest committed checkpoint
/// through `restore`. `shards_valid`: whether this rank's slices are whole (kept here: false once
/// a move failed half way); `restored`: whether they are what the loop read from a checkpoint
/// (a newcomer's first resync), for the event. With `mode` compare (rank 0's decides whether the
/// group compares) the replicated state moves only when some rank's step or hash differs from
/// rank 0's; `staging` (kept by the group across rebuilds) carries device buffers to the host to
/// be hashed. Nothing when a
/// collective failed on the way. Throws errc::mismatch when this rank registered other state
/// than rank 0.
template <class Comm, class Run>
std::optional<resynced> resync_state(Run& run, int rank, int world, std::uint64_t step, checkpoint::state& st,
                                     bool& shards_valid, bool restored, const checkpoint::restore_fn& restore,
                                     const peer_replicas* replicas = nullptr,
                                     resync_mode mode = resync_mode::compare, resync_staging* staging = nullptr) {
  resynced out;
  // Hashed before the header, so that rank 0 sends its hash in it: one collective fewer.
  const bool compare = mode == resync_mode::compare && world > 1 && sums_on_host<Comm>;
  bool hashed = false;
  std::uint64_t hash = 0;
  if (compare) {
    const std::int64_t t0 = internal::monotonic_ns();
    try {
      resync_staging none;
      resync_staging* device = nullptr;
      if constexpr (device_communicator<Comm>) device = staging != nullptr ? staging : &none;
      hash = replicated_hash(st, device);
      hashed = true;
    } catch (const error& e) {
      // The device could not be read or staged (a state the group cannot move at all throws
      // on): counted as differing, the state then moves as without compare.
      if (e.code() != errc::device_error && e.code() != errc::capacity_exhausted) throw;
      out.hash_error = e.what();
    }
    out.hash_ns = internal::monotonic_ns() - t0;
  }
  std::int64_t head[4] = {static_cast<std::int64_t>(step), static_cast<std::int64_t>(fingerprint(st)),
                          compare ? 1 : 0, static_cast<std::int64_t>(hash)};
  if (!broadcast_words<Comm>(run, std::span<std::int64_t>(head))) return std::nullopt;
  if (static_cast<std::uint64_t>(head[1]) != fingerprint(st)) {
    throw error(errc::mismatch,
                fmt::format("elastic_group: rank {} registered other state than rank 0 (names, types, sizes or "
                            "partitioning differ): every rank of a group must register the same state",
                            rank));
  }
  out.step = static_cast<std::uint64_t>(head[0]);
  if (st.has_shards()) {
    const auto sh = resync_shards<Comm>(run, rank, world, static_cast<std::int64_t>(step), head[0], shards_valid,
                                        restored, st, restore, replicas);
    shards_valid = sh.has_value();
    if (!sh) return std::nullopt;
    out.shards = *sh;
    out.step = static_cast<std::uint64_t>(sh->step);
    if (sh->reloaded) return out;  // every rank loaded all of its state from that step
  }
  // The replicated state: rank 0's live state, or the state the root took back from its image.
  const int root = out.shards.root >= 0 ? out.shards.root : 0;
  // A root that took its state back from an image no longer holds what it hashed: it moves.
  if (head[2] == 1 && out.shards.root < 0) {
    out.compared = true;
    out.differing = hashed && static_cast<std::int64_t>(step) == head[0] && static_cast<std::int64_t>(hash) == head[3]
                        ? 0
                        : 1;
    if (!sum_count<Comm>(run, out.differing)) return std::nullopt;
    if (out.differing == 0) {
      out.skipped = true;
      return out;
    }
  }
  std::vector<std::byte> payload;
  if (rank == root) pack(st, payload, device_communicator<Comm>);
  std::int64_t size = static_cast<std::int64_t>((payload.size() + 7) / 8);
  if (!broadcast_words<Comm>(run, std::span<std::int64_t>(&size, 1), root)) return std::nullopt;
  std::vector<std::int64_t> words(static_cast<std::size_t>(size));
  if (rank == root && !payload.empty()) std::memcpy(words.data(), payload.data(), payload.size());
  if (!broadcast_words<Comm>(run, std::span<std::int64_t>(words), root)) return std::nullopt;
  if (rank != root) unpack(st, std::as_bytes(std::span<const std::int64_t>(words)), device_communicator<Comm>);
  if constexpr (device_communicator<Comm>) {
    for (const auto& e : st.entries()) {
      if (e.kind != checkpoint::entry_kind::buffer || e.where != checkpoint::location::device || e.shard) continue;
      if (!broadcast_device<Comm>(run, e, root)) return std::nullopt;
    }
  }
  out.bytes = words.size() * 8;
  return out;
}

/// The events of a resync: group_resynced, and group_resharded where slices moved or came from disk.
inline void report_resync(const event_log& events, std::int64_t round, int world, const resynced& r,
                          const recovery_timings& t, bool shards) {
  if (world <= 1 && !shards) return;
  if (!r.hash_error.empty()) {
    events.emit("group_resync_hash_failed",
                {{"round", round}, {"message", r.hash_error}, {"effect", "this rank counted as differing: the state moved"}});
  }
  events.emit("group_resynced", {{"round", round},
                                 {"step", r.step},
                                 {"bytes", r.bytes},
                                 {"compared", r.compared},
                                 {"skipped", r.skipped},
                                 {"differing", r.differing},
                                 {"hash_ms", r.hash_ns / 1e6},
                                 {"resync_ms", (t.resynced_ns - t.connected_ns) / 1e6},
                                 {"recovery_ms", (t.resynced_ns - t.noticed_ns) / 1e6}});
  if (!shards) return;
  events.emit("group_resharded", {{"round", round},
                                  {"step", r.step},
                                  {"world_before", r.shards.world_before},
                                  {"world_after", world},
                                  {"bytes", r.shards.bytes},
                                  {"from", r.shards.from_disk ? "disk" : "memory"},
                                  {"sources", r.shards.reloaded ? std::string("disk") : r.shards.sources},
                                  {"rolled_back", r.shards.root >= 0 || r.shards.reloaded},
                                  {"ms", (t.resynced_ns - t.connected_ns) / 1e6}});
}

}  // namespace elastic::inline v1::comm::detail
