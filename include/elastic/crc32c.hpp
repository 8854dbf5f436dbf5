// CRC-32C (Castagnoli; iSCSI, ext4), the checksum the checkpoint format uses, for users who
// want to checksum their own data the same way (a fingerprint of the state a run resumed with,
// say). Hardware-accelerated on x86-64 when the CPU has SSE4.2, chosen at run time.
#pragma once

#include <cstdint>
#include <span>

#include <elastic/internal/crc32c.hpp>

namespace elastic::inline v1 {

/// CRC-32C of `bytes`, continuing from `crc` (the result for the bytes before them), so that
/// crc32c(b, crc32c(a)) is the CRC-32C of a followed by b. Starts from 0 for a new message.
[[nodiscard]] inline std::uint32_t crc32c(std::span<const std::byte> bytes, std::uint32_t crc = 0) noexcept {
  return internal::crc32c(bytes, crc);
}

}  // namespace elastic::inline v1
