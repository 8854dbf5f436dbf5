// How an elastic_group's ranks come to hold rank 0's replicated state after a rebuild: a header
// (step, layout fingerprint, payload size), the packed host state (detail/state_packing.hpp), then
// each device buffer straight from rank 0's device memory when the communicator takes device
// memory. Every collective goes through the group's `run`, so a peer dying midway fails the
// resync like any collective, and the group rebuilds and resyncs again.
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
#include <elastic/comm/detail/state_packing.hpp>
#include <elastic/error.hpp>

namespace elastic::inline v1::comm::detail {

/// What a resync agreed on.
struct resynced {
  std::uint64_t step = 0;   ///< rank 0's step
  std::size_t bytes = 0;    ///< host bytes moved
};

/// Host words from rank 0 to every rank, through `run(what, f(Comm&))` (false: a collective failed).
template <class Comm, class Run>
bool broadcast_words(Run& run, std::span<std::int64_t> words) {
  return run("broadcast", [&](Comm& c) {
    if constexpr (device_communicator<Comm>) {
      c.broadcast_host(words, 0);
    } else {
      c.broadcast(words, 0);
    }
  });
}

/// A device buffer from rank 0, bit for bit, moved as 64- or 32-bit words.
template <class Comm, class Run>
bool broadcast_device(Run& run, const checkpoint::entry& e) {
  const auto addr = reinterpret_cast<std::uintptr_t>(e.data);
  if (e.bytes % 8 == 0 && addr % 8 == 0) {
    return run("broadcast",
               [&](Comm& c) { c.broadcast(std::span<std::int64_t>(static_cast<std::int64_t*>(e.data), e.bytes / 8), 0); });
  }
  if (e.bytes % 4 == 0 && addr % 4 == 0) {
    return run("broadcast",
               [&](Comm& c) { c.broadcast(std::span<std::int32_t>(static_cast<std::int32_t*>(e.data), e.bytes / 4), 0); });
  }
  throw error(errc::invalid_argument,
              fmt::format("elastic_group: device state entry '{}' is {} bytes at {:#x}; a group moves device "
                          "buffers in 4-byte words: pad it to a multiple of 4 bytes",
                          e.name, e.bytes, addr));
}

/// Every rank ends with rank 0's step and `st`; nothing when a collective failed on the way.
/// Throws errc::mismatch when this rank registered other state than rank 0.
template <class Comm, class Run>
std::optional<resynced> resync_state(Run& run, int rank, std::uint64_t step, checkpoint::state& st) {
  // A group copies rank 0's state to every rank and writes it alone: a slice would become rank
  // 0's slice everywhere, and the others' slices would never reach a checkpoint.
  for (const auto& e : st.entries()) {
    if (e.shard) {
      throw error(errc::not_supported,
                  fmt::format("elastic_group: state entry '{}' is sharded (add_shard), and a group resyncs and "
                              "checkpoints replicated state only (every rank would get rank 0's slice): register "
                              "replicated state with a group, or checkpoint sharded state from ranks that run "
                              "without one (training_loop with rank and world_size)",
                              e.name));
    }
  }
  std::vector<std::byte> payload;
  if (rank == 0) pack(st, payload, device_communicator<Comm>);
  std::int64_t head[3] = {static_cast<std::int64_t>(step), static_cast<std::int64_t>(fingerprint(st)),
                          static_cast<std::int64_t>((payload.size() + 7) / 8)};
  if (!broadcast_words<Comm>(run, std::span<std::int64_t>(head))) return std::nullopt;
  if (static_cast<std::uint64_t>(head[1]) != fingerprint(st)) {
    throw error(errc::mismatch,
                fmt::format("elastic_group: rank {} registered other state than rank 0 (names, types or sizes "
                            "differ): every rank of a group must register the same replicated state",
                            rank));
  }
  std::vector<std::int64_t> words(static_cast<std::size_t>(head[2]));
  if (rank == 0 && !payload.empty()) std::memcpy(words.data(), payload.data(), payload.size());
  if (!broadcast_words<Comm>(run, std::span<std::int64_t>(words))) return std::nullopt;
  if (rank != 0) unpack(st, std::as_bytes(std::span<const std::int64_t>(words)), device_communicator<Comm>);
  if constexpr (device_communicator<Comm>) {
    for (const auto& e : st.entries()) {
      if (e.kind != checkpoint::entry_kind::buffer || e.where != checkpoint::location::device) continue;
      if (!broadcast_device<Comm>(run, e)) return std::nullopt;
    }
  }
  return resynced{static_cast<std::uint64_t>(head[0]), words.size() * 8};
}

}  // namespace elastic::inline v1::comm::detail
