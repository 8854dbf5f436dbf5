// What a group's peer replicas hold (detail/peer_replicas.hpp) and how a rank names it to the
// others at a resync (detail/shard_resync.hpp): snapshot images in host memory, keyed by whose
// slices they are, of which world, at which step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <elastic/checkpoint/detail/host_memory.hpp>

namespace elastic::inline v1::comm::detail {

/// Which image: rank `rank` of a world of `world`'s state at snapshot `step`; `full` for a
/// rank's own whole image, else a replica of its slices.
struct image_key {
  std::int64_t rank = -1;
  std::int64_t world = 0;
  std::int64_t step = -1;
  bool full = false;
  friend bool operator==(const image_key&, const image_key&) = default;
};

/// A snapshot held in memory: an own image has every entry of the state (objects serialized),
/// a replica the partitioned entries only, in registration order.
struct memory_image {
  image_key key;
  std::vector<std::size_t> offsets, sizes;  // into memory, per entry held
  checkpoint::detail::host_memory memory;
  std::vector<std::vector<std::byte>> objects;  // own images: each object's bytes (by entry index)

  [[nodiscard]] std::span<const std::byte> bytes(std::size_t i) const {
    if (!objects.empty() && !objects[i].empty()) return objects[i];
    return {memory.data() + offsets[i], sizes[i]};
  }
};

/// Where a rank's listener is.
struct peer_address {
  std::string host;
  std::uint16_t port = 0;
};

/// What the replicas have done so far (on this rank).
struct replica_stats {
  std::uint64_t kept = 0;      ///< own images taken
  std::uint64_t sent = 0;      ///< replicas a successor kept
  std::uint64_t received = 0;  ///< replicas kept for a predecessor
  std::uint64_t refused = 0;   ///< connections refused (another run, wrong sizes, torn)
  std::uint64_t send_failures = 0;
  std::uint64_t bytes_sent = 0;
  std::optional<std::int64_t> last_sent_step;
};

}  // namespace elastic::inline v1::comm::detail
