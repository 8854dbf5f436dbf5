// A hash of the replicated state, so that a resync moves nothing when every rank already holds
// rank 0's (detail/state_resync.hpp). The host state is hashed as pack() lays it out; a device
// buffer is copied to the host in chunks through pinned staging that a group allocates once
// and keeps across rebuilds (no cudaHostAlloc per rebuild), the copy of one chunk overlapping
// the hashing of the previous one. (The resync's host words go through the communicator's own
// device scratch: nccl_communicator::broadcast_host.)
//
// 64 bits, two independent 32-bit checks over the same bytes:
// - CRC-32C (hardware): any difference of up to 32 bits in a row, any odd number of flipped
//   bits; linear over GF(2);
// - a position-weighted sum of 64-bit words (Fletcher's construction modulo 2^64, mixed and
//   folded to 32 bits): linear over the integers, so a difference that the CRC cannot see (one
//   in its kernel) is caught here unless it also cancels arithmetically.
// What is guarded against is divergence by accident (a rank that restored another step, missed
// an update, or computed differently), not an adversary: a random difference escapes both with
// probability ~2^-64, and the step and layout fingerprint are compared as well.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include <elastic/checkpoint/detail/host_memory.hpp>
#include <elastic/checkpoint/state.hpp>
#include <elastic/comm/detail/state_packing.hpp>
#include <elastic/internal/crc32c.hpp>
#include <elastic/internal/cuda.hpp>

namespace elastic::inline v1::comm::detail {

/// The running hash of a sequence of segments (the packed host state, each device buffer); a
/// segment may arrive in pieces of any length, its length counts.
class state_digest {
 public:
  /// Adds the next bytes of the current segment.
  void add(std::span<const std::byte> s) {
    // In blocks that stay in the core's cache between the CRC's pass and the sum's.
    constexpr std::size_t block = std::size_t{32} << 10;
    while (s.size() > block) {
      add_block(s.first(block));
      s = s.subspan(block);
    }
    add_block(s);
  }

  /// Ends a segment: a partial word is zero-padded and the length counted, so moving bytes
  /// from one segment to the next changes the hash.
  void end_segment() {
    if (pending_ > 0) {
      std::fill(pending_word_.begin() + static_cast<std::ptrdiff_t>(pending_), pending_word_.end(), std::byte{0});
      word(pending_word_.data());
      pending_ = 0;
    }
    const std::uint64_t n = length_;
    crc_ = internal::crc32c(&n, sizeof n, crc_);
    sum_ += n;
    weighted_ += sum_;
    length_ = 0;
  }

  [[nodiscard]] std::uint64_t value() const noexcept {
    std::uint64_t x = sum_ + 0x9e3779b97f4a7c15ull * weighted_;  // splitmix64's finalizer
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    x ^= x >> 31;
    return (static_cast<std::uint64_t>(crc_) << 32) | (x >> 32);
  }

 private:
  void add_block(std::span<const std::byte> s) {
    crc_ = internal::crc32c(s, crc_);
    length_ += s.size();
    const std::byte* p = s.data();
    std::size_t n = s.size();
    if (pending_ > 0) {  // finish the word a previous piece began
      const std::size_t k = std::min(n, pending_word_.size() - pending_);
      std::memcpy(pending_word_.data() + pending_, p, k);
      pending_ += k, p += k, n -= k;
      if (pending_ < pending_word_.size()) return;
      word(pending_word_.data());
      pending_ = 0;
    }
    for (; n >= 8; p += 8, n -= 8) word(p);
    std::memcpy(pending_word_.data(), p, n);
    pending_ = n;
  }

  void word(const std::byte* p) noexcept {
    std::uint64_t w;
    std::memcpy(&w, p, 8);
    sum_ += w;
    weighted_ += sum_;
  }

  std::uint32_t crc_ = 0;
  std::uint64_t sum_ = 0, weighted_ = 0, length_ = 0;
  std::array<std::byte, 8> pending_word_{};
  std::size_t pending_ = 0;
};

/// What a group keeps for its resyncs over a device communicator, made at the first use and kept
/// for the group's life: pinned host staging for hashing device buffers (two halves, one being
/// filled by a copy while the other is hashed, and an event each). Nothing CUDA happens before a
/// method is called, so a host-only group never needs it.
class resync_staging {
 public:
  static constexpr std::size_t half_bytes = std::size_t{4} << 20;

  /// Adds the `bytes` of device memory at `src` to `d`, as one segment. The copies run on the
  /// legacy default stream (as cudaMemcpy, so after the kernels a trainer queued there or on a
  /// blocking stream, like the slice copies of detail/shard_resync.hpp).
  void hash_device(const void* src, std::size_t bytes, state_digest& d) {
    if (bytes > 0) {
      ready();
      const auto* from = static_cast<const std::byte*>(src);
      std::size_t queued = 0, hashed = 0;
      std::array<std::size_t, 2> length{};
      const auto enqueue = [&](int h) {
        const std::size_t k = std::min(half_bytes, bytes - queued);
        internal::cuda::copy_to_host_async(half(h), from + queued, k, internal::cuda::stream_t{});
        copied_[static_cast<std::size_t>(h)].record(internal::cuda::stream_t{});
        length[static_cast<std::size_t>(h)] = k;
        queued += k;
      };
      enqueue(0);
      if (queued < bytes) enqueue(1);
      for (int h = 0; hashed < bytes; h ^= 1) {
        copied_[static_cast<std::size_t>(h)].synchronize();
        d.add(std::span<const std::byte>(half(h), length[static_cast<std::size_t>(h)]));
        hashed += length[static_cast<std::size_t>(h)];
        if (queued < bytes) enqueue(h);
      }
    }
    d.end_segment();
  }

  /// Whether the pinned staging was made (once, at the first device buffer hashed).
  [[nodiscard]] bool allocated() const noexcept { return memory_.data() != nullptr; }

 private:
  void ready() {
    if (allocated()) return;
    checkpoint::detail::host_memory m(2 * half_bytes, true);
    std::array<internal::cuda::event, 2> e{internal::cuda::event::create(), internal::cuda::event::create()};
    memory_ = std::move(m);
    copied_ = std::move(e);
  }
  std::byte* half(int h) const noexcept { return memory_.data() + static_cast<std::size_t>(h) * half_bytes; }

  checkpoint::detail::host_memory memory_;
  std::array<internal::cuda::event, 2> copied_;
};

/// The hash of the replicated state of `st`: its packed host state, then, with a device
/// communicator (`staging` given), each replicated device buffer. Slices are left out: they
/// move on their own (detail/shard_resync.hpp).
inline std::uint64_t replicated_hash(const checkpoint::state& st, resync_staging* staging) {
  state_digest d;
  const bool device_comm = staging != nullptr;
  for_each_packed(st, device_comm, [&](std::span<const std::byte> s) { d.add(s); });
  d.end_segment();
  if (device_comm) {
    for (const auto& e : st.entries()) {
      if (e.kind != checkpoint::entry_kind::buffer || e.where != checkpoint::location::device || e.shard) continue;
      staging->hash_device(e.data, e.bytes, d);
    }
  }
  return d.value();
}

}  // namespace elastic::inline v1::comm::detail
