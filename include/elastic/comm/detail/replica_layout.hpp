// What a replica of a group's state holds (detail/peer_replicas.hpp): the state's partitioned
// entries, in registration order, and of each the bytes that rank r of a world of w holds, as the
// entry's partition gives them. A listener checks a replica's header against it before it
// allocates anything of the sender's size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <elastic/checkpoint/partition.hpp>
#include <elastic/checkpoint/state.hpp>
#include <elastic/comm/detail/memory_image.hpp>

namespace elastic::inline v1::comm::detail {

class replica_layout {
 public:
  explicit replica_layout(const checkpoint::state& st) {
    for (std::size_t i = 0; i < st.entries().size(); ++i) {
      const auto& e = st.entries()[i];
      if (!e.partition) continue;
      parts_.push_back({e.name, e.shard->global_count, e.element_bytes, e.partition});
      index_.push_back(i);
    }
  }

  /// The partitioned entries' indices among the state's entries, in order: a replica holds
  /// these, its entry j being the state's entry partitioned()[j].
  [[nodiscard]] const std::vector<std::size_t>& partitioned() const noexcept { return index_; }
  /// How many entries a replica holds.
  [[nodiscard]] std::size_t size() const noexcept { return parts_.size(); }

  /// Bytes of rank `rank` of `world`'s slice of each partitioned entry; nothing when the
  /// partition refuses that world.
  [[nodiscard]] std::optional<std::vector<std::uint64_t>> slice_sizes(std::int64_t rank, std::int64_t world) const {
    std::vector<std::uint64_t> out;
    try {
      for (const auto& p : parts_) {
        const auto all = checkpoint::partition_slices(p.partition, p.name, p.global, static_cast<int>(world));
        out.push_back(all[static_cast<std::size_t>(rank)].count * p.element_bytes);
      }
    } catch (const std::exception&) {
      return std::nullopt;
    }
    return out;
  }

  /// Why a replica of rank k.rank of k.world at step k.step, with entries of `sizes` bytes (one
  /// an entry of this layout), is none of this state's; empty when it is one.
  [[nodiscard]] std::string refusal(const image_key& k, std::span<const std::uint64_t> sizes) const {
    if (k.world < 1 || k.world > (1 << 20) || k.rank < 0 || k.rank >= k.world || k.step < 0) {
      return fmt::format("impossible rank {} of {} at step {}", k.rank, k.world, k.step);
    }
    const auto expected = slice_sizes(k.rank, k.world);
    if (!expected) return fmt::format("the partition refuses a world of {}", k.world);
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      if (sizes[i] != (*expected)[i]) {
        return fmt::format("entry '{}': {} bytes sent, rank {} of {} holds {}", parts_[i].name, sizes[i], k.rank,
                           k.world, (*expected)[i]);
      }
    }
    return {};
  }

 private:
  struct part_shape {
    std::string name;
    std::uint64_t global = 0;
    std::size_t element_bytes = 1;
    checkpoint::partition_fn partition;
  };

  std::vector<part_shape> parts_;
  std::vector<std::size_t> index_;  // each partitioned entry's index in the state
};

}  // namespace elastic::inline v1::comm::detail
