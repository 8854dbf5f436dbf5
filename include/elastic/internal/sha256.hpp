// SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), for the handshakes of the library's own
// connections (the peer replicas' challenge and answer, comm/detail/replica_wire.hpp): they hash
// a few hundred bytes per connection, so a plain portable implementation is fast enough, and a
// header-only library keeps no dependency on libcrypto for it. Not for bulk data (CRC-32C is).
// Also: a constant-time comparison of MACs and random bytes from the kernel (getrandom).
#pragma once

#include <sys/random.h>
#include <sys/types.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <span>

#include <elastic/error.hpp>

namespace elastic::inline v1::internal {

using sha256_digest = std::array<std::uint8_t, 32>;

/// An incremental SHA-256: update() any number of times, then digest() once.
class sha256 {
 public:
  sha256& update(const void* data, std::size_t n) noexcept {
    auto p = static_cast<const std::uint8_t*>(data);
    bits_ += static_cast<std::uint64_t>(n) * 8;
    while (n > 0) {
      const std::size_t take = std::min(n, block_.size() - used_);
      std::memcpy(block_.data() + used_, p, take);
      used_ += take;
      p += take;
      n -= take;
      if (used_ == block_.size()) {
        compress();
        used_ = 0;
      }
    }
    return *this;
  }
  sha256& update(std::span<const std::uint8_t> b) noexcept { return update(b.data(), b.size()); }

  [[nodiscard]] sha256_digest digest() noexcept {
    const std::uint64_t bits = bits_;
    const std::uint8_t one = 0x80, zero = 0;
    update(&one, 1);
    while (used_ != 56) update(&zero, 1);
    std::uint8_t len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<std::uint8_t>(bits >> (56 - 8 * i));
    update(len, 8);
    sha256_digest out{};
    for (int i = 0; i < 8; ++i) {
      for (int j = 0; j < 4; ++j) out[static_cast<std::size_t>(4 * i + j)] = static_cast<std::uint8_t>(h_[static_cast<std::size_t>(i)] >> (24 - 8 * j));
    }
    return out;
  }

 private:
  static constexpr std::uint32_t rotr(std::uint32_t x, int n) noexcept { return (x >> n) | (x << (32 - n)); }

  void compress() noexcept {
    static constexpr std::uint32_t k[64] = {
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
        0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
        0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
        0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
        0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
        0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
        0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};
    std::uint32_t w[64];
    for (int i = 0; i < 16; ++i) {
      const auto* b = block_.data() + 4 * i;
      w[i] = std::uint32_t{b[0]} << 24 | std::uint32_t{b[1]} << 16 | std::uint32_t{b[2]} << 8 | b[3];
    }
    for (int i = 16; i < 64; ++i) {
      const std::uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      const std::uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    auto [a, b, c, d, e, f, g, h] = h_;
    for (int i = 0; i < 64; ++i) {
      const std::uint32_t t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + k[i] + w[i];
      const std::uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      h = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    const std::uint32_t add[8] = {a, b, c, d, e, f, g, h};
    for (std::size_t i = 0; i < 8; ++i) h_[i] += add[i];
  }

  std::array<std::uint32_t, 8> h_{0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                  0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  std::array<std::uint8_t, 64> block_{};
  std::size_t used_ = 0;
  std::uint64_t bits_ = 0;
};

/// HMAC-SHA256 of the concatenation of `parts` under `key` (any length).
inline sha256_digest hmac_sha256(std::span<const std::uint8_t> key,
                                 std::initializer_list<std::span<const std::uint8_t>> parts) noexcept {
  std::array<std::uint8_t, 64> k{};
  if (key.size() > k.size()) {
    const auto d = sha256().update(key).digest();
    std::memcpy(k.data(), d.data(), d.size());
  } else if (!key.empty()) {
    std::memcpy(k.data(), key.data(), key.size());
  }
  std::array<std::uint8_t, 64> pad{};
  for (std::size_t i = 0; i < k.size(); ++i) pad[i] = k[i] ^ 0x36;
  sha256 inner;
  inner.update(pad);
  for (const auto& p : parts) inner.update(p);
  const auto in = inner.digest();
  for (std::size_t i = 0; i < k.size(); ++i) pad[i] = k[i] ^ 0x5c;
  return sha256().update(pad).update(in).digest();
}

/// Whether `a` and `b` are equal, in a time that does not depend on where they differ (a MAC
/// compared with memcmp tells a prober how many of its leading bytes were right).
inline bool equal_in_constant_time(std::span<const std::uint8_t> a, std::span<const std::uint8_t> b) noexcept {
  if (a.size() != b.size()) return false;
  volatile std::uint8_t diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i) diff = diff | (a[i] ^ b[i]);
  return diff == 0;
}

/// `n` bytes from the kernel's random source (keys and nonces: never std::random_device, whose
/// source the standard leaves open).
inline void random_bytes(void* out, std::size_t n) {
  auto p = static_cast<std::uint8_t*>(out);
  while (n > 0) {
    const ssize_t got = ::getrandom(p, n, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      throw os_error("getrandom");
    }
    p += got;
    n -= static_cast<std::size_t>(got);
  }
}

}  // namespace elastic::inline v1::internal
