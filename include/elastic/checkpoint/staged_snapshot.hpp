// A snapshot as the checkpointer staged it: each entry's description as it was at the snapshot
// and its bytes in host staging. The persister writes it; an elastic group may also keep a copy
// of it in memory (peer replicas) while the staging is still the snapshot's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include <elastic/checkpoint/state.hpp>

namespace elastic::inline v1::checkpoint {

/// One entry's bytes as captured by a snapshot, ready to be written.
struct staged_entry {
  const entry* source = nullptr;  ///< the entry as it was at the snapshot (no memory, no callbacks)
  std::span<const std::byte> bytes;
};

/// A whole snapshot in staging: every entry of the state, in registration order.
struct staged_snapshot {
  std::uint64_t step = 0;
  std::span<const staged_entry> entries;
};

}  // namespace elastic::inline v1::checkpoint
