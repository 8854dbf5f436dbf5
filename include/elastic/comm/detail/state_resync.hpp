// How an elastic_group's ranks come to hold rank 0's state after a rebuild: a header (step,
// layout fingerprint), the partitioned state's slices (detail/shard_resync.hpp), the packed host
// state (detail/state_packing.hpp), then each replicated device buffer straight from rank 0's
// device memory when the communicator takes device memory. Every collective goes through the
// group's `run`, so a peer dying midway fails the resync like any collective, and the group
// rebuilds and resyncs again.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <vector>

#include <fmt/format.h>

#include <elastic/checkpoint/state.hpp>
#include <elastic/comm/communicator.hpp>
#include <elastic/comm/detail/shard_resync.hpp>
#include <elastic/comm/detail/state_packing.hpp>
#include <elastic/comm/group_options.hpp>
#include <elastic/error.hpp>
#include <elastic/events.hpp>

namespace elastic::inline v1::comm::detail {

/// What a resync agreed on.
struct resynced {
  std::uint64_t step = 0;   ///< rank 0's step, or the checkpoint step all ranks reloaded
  std::size_t bytes = 0;    ///< replicated host bytes moved
  sharded shards{};         ///< how the partitioned state came (when there is some)
};

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
/// (a newcomer's first resync), for the event. Nothing when a collective failed on the way. Throws errc::mismatch
/// when this rank registered other state than rank 0.
template <class Comm, class Run>
std::optional<resynced> resync_state(Run& run, int rank, int world, std::uint64_t step, checkpoint::state& st,
                                     bool& shards_valid, bool restored, const checkpoint::restore_fn& restore,
                                     const peer_replicas* replicas = nullptr) {
  std::int64_t head[2] = {static_cast<std::int64_t>(step), static_cast<std::int64_t>(fingerprint(st))};
  if (!broadcast_words<Comm>(run, std::span<std::int64_t>(head))) return std::nullopt;
  if (static_cast<std::uint64_t>(head[1]) != fingerprint(st)) {
    throw error(errc::mismatch,
                fmt::format("elastic_group: rank {} registered other state than rank 0 (names, types, sizes or "
                            "partitioning differ): every rank of a group must register the same state",
                            rank));
  }
  resynced out;
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
  events.emit("group_resynced", {{"round", round},
                                 {"step", r.step},
                                 {"bytes", r.bytes},
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
