// CRC-32C (Castagnoli, polynomial 0x1EDC6F41; iSCSI, ext4): the checksum of checkpoint data and
// manifests. On x86-64 the SSE4.2 crc32 instruction computes it (chosen at run time, so one
// binary runs everywhere); elsewhere, and on CPUs without it, a slicing-by-8 table does.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace elastic::inline v1::internal {

namespace crc32c_impl {

inline constexpr std::uint32_t poly = 0x82F63B78u;  // 0x1EDC6F41 bit-reversed: the CRC is reflected

// Polynomials mod P in the reflected register layout: bit 31 holds x^0, bit 0 holds x^31.

/// a(x) * b(x) mod P.
constexpr std::uint32_t multiply(std::uint32_t a, std::uint32_t b) noexcept {
  std::uint32_t product = 0;
  for (std::uint32_t m = 1u << 31; m; m >>= 1) {
    if (a & m) product ^= b;
    b = (b & 1) ? (b >> 1) ^ poly : b >> 1;  // b *= x
  }
  return product;
}

/// x^k mod P, by square and multiply.
constexpr std::uint32_t x_pow(std::uint64_t k) noexcept {
  std::uint32_t result = 1u << 31, square = 1u << 30;  // x^0, x^1
  for (; k; k >>= 1) {
    if (k & 1) result = multiply(result, square);
    square = multiply(square, square);
  }
  return result;
}

struct tables {
  std::uint32_t t[8][256];
};

constexpr tables make_tables() noexcept {
  tables tb{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ poly : c >> 1;
    tb.t[0][i] = c;
  }
  // t[s][i]: the register after byte i followed by s zero bytes, so 8 bytes take 8 lookups.
  for (std::uint32_t i = 0; i < 256; ++i) {
    for (int s = 1; s < 8; ++s) tb.t[s][i] = (tb.t[s - 1][i] >> 8) ^ tb.t[0][tb.t[s - 1][i] & 0xff];
  }
  return tb;
}

inline constexpr tables table = make_tables();

/// Slicing-by-8 on the (already inverted) register `c`.
inline std::uint32_t software(const unsigned char* p, std::size_t n, std::uint32_t c) noexcept {
  const auto& t = table.t;
  for (; n >= 8; p += 8, n -= 8) {
    std::uint64_t v;
    std::memcpy(&v, p, 8);
    if constexpr (std::endian::native == std::endian::big) v = __builtin_bswap64(v);
    v ^= c;
    c = t[7][v & 0xff] ^ t[6][(v >> 8) & 0xff] ^ t[5][(v >> 16) & 0xff] ^ t[4][(v >> 24) & 0xff] ^
        t[3][(v >> 32) & 0xff] ^ t[2][(v >> 40) & 0xff] ^ t[1][(v >> 48) & 0xff] ^ t[0][v >> 56];
  }
  while (n--) c = t[0][(c ^ *p++) & 0xff] ^ (c >> 8);
  return c;
}

#if defined(__x86_64__)

/// The register after `n` bytes with the crc32 instruction, one dependent chain: its 3-cycle
/// latency limits it to ~8 bytes every 3 cycles. Used for short inputs and tails.
__attribute__((target("sse4.2"))) inline std::uint32_t one_stream(const unsigned char* p, std::size_t n,
                                                                   std::uint32_t c) noexcept {
  std::uint64_t c64 = c;
  for (; n >= 8; p += 8, n -= 8) {
    std::uint64_t v;
    std::memcpy(&v, p, 8);
    c64 = _mm_crc32_u64(c64, v);
  }
  c = static_cast<std::uint32_t>(c64);
  while (n--) c = _mm_crc32_u8(c, *p++);
  return c;
}

/// The register `c` moved past `Bytes` zero bytes, c(x) * x^(8*Bytes) mod P, in ~10 cycles:
/// the carry-less product of two reflected 32-bit values is the 64-bit reflected value of
/// c*k*x, and crc32(0, v) reduces v*x^32 mod P; so k = x^(8*Bytes - 33) gives the shift.
template <std::size_t Bytes>
__attribute__((target("sse4.2,pclmul"))) inline std::uint32_t shift(std::uint32_t c) noexcept {
  static constexpr std::uint32_t k = x_pow(8 * Bytes - 33);
  const __m128i product = _mm_clmulepi64_si128(_mm_cvtsi32_si128(static_cast<int>(c)), _mm_cvtsi32_si128(static_cast<int>(k)), 0);
  return static_cast<std::uint32_t>(_mm_crc32_u64(0, static_cast<std::uint64_t>(_mm_cvtsi128_si64(product))));
}

/// Runs three independent chains over consecutive blocks of `Block` bytes (so the instruction
/// issues every cycle instead of every third), then joins them: crc(A B C) = A shifted past
/// B and C, xor B shifted past C, xor C. Consumes whole groups of 3 blocks.
template <std::size_t Block>
__attribute__((target("sse4.2,pclmul"))) inline std::uint32_t three_streams(const unsigned char*& p, std::size_t& n,
                                                                          std::uint32_t c) noexcept {
  static_assert(Block % 8 == 0 && Block >= 8);
  for (; n >= 3 * Block; p += 3 * Block, n -= 3 * Block) {
    std::uint64_t c0 = c, c1 = 0, c2 = 0;
    for (std::size_t i = 0; i < Block; i += 8) {
      std::uint64_t a, b, d;
      std::memcpy(&a, p + i, 8);
      std::memcpy(&b, p + Block + i, 8);
      std::memcpy(&d, p + 2 * Block + i, 8);
      c0 = _mm_crc32_u64(c0, a);
      c1 = _mm_crc32_u64(c1, b);
      c2 = _mm_crc32_u64(c2, d);
    }
    c = shift<2 * Block>(static_cast<std::uint32_t>(c0)) ^ shift<Block>(static_cast<std::uint32_t>(c1)) ^
        static_cast<std::uint32_t>(c2);
  }
  return c;
}

/// The fast path: large blocks while the input lasts (joins are then rare), smaller ones for
/// what remains, one stream for the tail.
__attribute__((target("sse4.2,pclmul"))) inline std::uint32_t hardware(const unsigned char* p, std::size_t n,
                                                                     std::uint32_t c) noexcept {
  c = three_streams<4096>(p, n, c);
  c = three_streams<256>(p, n, c);
  return one_stream(p, n, c);
}

#endif

/// What this CPU offers, decided once.
enum class level { software, crc32, crc32_clmul };

inline level cpu_level() noexcept {
#if defined(__x86_64__)
  static const level l = [] {
    __builtin_cpu_init();  // we may run before the constructors that normally initialize it
    if (!__builtin_cpu_supports("sse4.2")) return level::software;
    return __builtin_cpu_supports("pclmul") ? level::crc32_clmul : level::crc32;
  }();
  return l;
#else
  return level::software;
#endif
}

}  // namespace crc32c_impl

/// True when this CPU computes CRC-32C with the SSE4.2 instruction (for reporting).
inline bool crc32c_hardware() noexcept { return crc32c_impl::cpu_level() != crc32c_impl::level::software; }

/// CRC-32C of `n` bytes, continuing from `crc` (the result for the bytes before them), so that
/// crc32c(b, nb, crc32c(a, na)) == CRC-32C of a followed by b. Starts from 0 for a new message.
inline std::uint32_t crc32c(const void* data, std::size_t n, std::uint32_t crc = 0) noexcept {
  const auto* p = static_cast<const unsigned char*>(data);
  const std::uint32_t c = ~crc;  // the standard pre- and post-inversion: leading zeros count
#if defined(__x86_64__)
  switch (crc32c_impl::cpu_level()) {
    case crc32c_impl::level::crc32_clmul: return ~crc32c_impl::hardware(p, n, c);
    case crc32c_impl::level::crc32: return ~crc32c_impl::one_stream(p, n, c);
    case crc32c_impl::level::software: break;
  }
#endif
  return ~crc32c_impl::software(p, n, c);
}

/// CRC-32C of a byte span, continuing from `crc`.
inline std::uint32_t crc32c(std::span<const std::byte> bytes, std::uint32_t crc = 0) noexcept {
  return crc32c(bytes.data(), bytes.size(), crc);
}

/// The table-driven path alone, whatever the CPU: lets tests hold the instruction to it.
inline std::uint32_t crc32c_software(const void* data, std::size_t n, std::uint32_t crc = 0) noexcept {
  return ~crc32c_impl::software(static_cast<const unsigned char*>(data), n, ~crc);
}

}  // namespace elastic::inline v1::internal
