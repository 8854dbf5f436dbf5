// CRC-32C (Castagnoli): the checksum of checkpoint data and manifests. x86-64 computes it with
// the SSE4.2 crc32 instruction (chosen at run time); elsewhere a slicing-by-8 table does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace elastic::detail {

namespace crc32c_impl {

inline constexpr std::uint32_t poly = 0x82F63B78u;  // 0x1EDC6F41 reflected

struct tables {
  std::uint32_t t[8][256];
};

constexpr tables make_tables() {
  tables tb{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ poly : c >> 1;
    tb.t[0][i] = c;
  }
  for (std::uint32_t i = 0; i < 256; ++i) {
    for (int s = 1; s < 8; ++s) tb.t[s][i] = (tb.t[s - 1][i] >> 8) ^ tb.t[0][tb.t[s - 1][i] & 0xff];
  }
  return tb;
}

inline constexpr tables table = make_tables();

/// Slicing-by-8 on the pre- and post-inverted register.
inline std::uint32_t software(const unsigned char* p, std::size_t n, std::uint32_t c) noexcept {
  while (n && (reinterpret_cast<std::uintptr_t>(p) & 7)) {
    c = table.t[0][(c ^ *p++) & 0xff] ^ (c >> 8);
    --n;
  }
  while (n >= 8) {
    std::uint64_t v;
    std::memcpy(&v, p, 8);
    v ^= c;
    c = table.t[7][v & 0xff] ^ table.t[6][(v >> 8) & 0xff] ^ table.t[5][(v >> 16) & 0xff] ^
        table.t[4][(v >> 24) & 0xff] ^ table.t[3][(v >> 32) & 0xff] ^ table.t[2][(v >> 40) & 0xff] ^
        table.t[1][(v >> 48) & 0xff] ^ table.t[0][v >> 56];
    p += 8;
    n -= 8;
  }
  while (n--) c = table.t[0][(c ^ *p++) & 0xff] ^ (c >> 8);
  return c;
}

#if defined(__x86_64__)
/// Multiplies a CRC register by x^(8*n) mod P: shifts it over n zero bytes, so that three
/// independent streams can be combined. Done with the table (n is a fixed block size).
inline std::uint32_t shift_zeros(std::uint32_t c, std::size_t n) noexcept {
  // GF(2) matrix power by squaring over the operator "one zero bit".
  std::uint32_t odd[32], even[32];
  odd[0] = poly;
  for (int i = 1; i < 32; ++i) odd[i] = 1u << (i - 1);
  auto times = [](const std::uint32_t* mat, std::uint32_t vec) {
    std::uint32_t sum = 0;
    for (int i = 0; vec; ++i, vec >>= 1)
      if (vec & 1) sum ^= mat[i];
    return sum;
  };
  auto square = [&](std::uint32_t* sq, const std::uint32_t* mat) {
    for (int i = 0; i < 32; ++i) sq[i] = times(mat, mat[i]);
  };
  square(even, odd);  // 2 zero bits
  square(odd, even);  // 4 zero bits
  std::size_t bytes = n;
  do {
    square(even, odd);  // first pass: 8 bits = one byte
    if (bytes & 1) c = times(even, c);
    bytes >>= 1;
    if (!bytes) break;
    square(odd, even);
    if (bytes & 1) c = times(odd, c);
    bytes >>= 1;
  } while (bytes);
  return c;
}

/// Three interleaved streams of `block` bytes each hide the crc32 instruction's 3-cycle latency.
inline constexpr std::size_t block = 8192;

struct shifts {
  // Register after `block` zero bytes, as a byte-wise table for each of the 4 register bytes.
  std::uint32_t one[4][256];
  std::uint32_t two[4][256];
};

inline const shifts& shift_tables() noexcept {
  static const shifts s = [] {
    shifts r{};
    for (int b = 0; b < 4; ++b) {
      for (std::uint32_t v = 0; v < 256; ++v) {
        r.one[b][v] = shift_zeros(v << (8 * b), block);
        r.two[b][v] = shift_zeros(v << (8 * b), 2 * block);
      }
    }
    return r;
  }();
  return s;
}

inline std::uint32_t apply(const std::uint32_t (&t)[4][256], std::uint32_t c) noexcept {
  return t[0][c & 0xff] ^ t[1][(c >> 8) & 0xff] ^ t[2][(c >> 16) & 0xff] ^ t[3][c >> 24];
}

__attribute__((target("sse4.2"))) inline std::uint32_t hardware(const unsigned char* p, std::size_t n,
                                                                 std::uint32_t c) noexcept {
  while (n && (reinterpret_cast<std::uintptr_t>(p) & 7)) {
    c = _mm_crc32_u8(c, *p++);
    --n;
  }
  if (n >= 3 * block) {
    const shifts& sh = shift_tables();
    while (n >= 3 * block) {
      std::uint64_t c0 = c, c1 = 0, c2 = 0;
      for (std::size_t i = 0; i < block; i += 8) {
        std::uint64_t a, b, d;
        std::memcpy(&a, p + i, 8);
        std::memcpy(&b, p + block + i, 8);
        std::memcpy(&d, p + 2 * block + i, 8);
        c0 = _mm_crc32_u64(c0, a);
        c1 = _mm_crc32_u64(c1, b);
        c2 = _mm_crc32_u64(c2, d);
      }
      // crc(A B C) = shift(crcA, 2 blocks) ^ shift(crcB, 1 block) ^ crcC  (registers, no inversion)
      c = apply(sh.two, static_cast<std::uint32_t>(c0)) ^ apply(sh.one, static_cast<std::uint32_t>(c1)) ^
          static_cast<std::uint32_t>(c2);
      p += 3 * block;
      n -= 3 * block;
    }
  }
  std::uint64_t c64 = c;
  while (n >= 8) {
    std::uint64_t v;
    std::memcpy(&v, p, 8);
    c64 = _mm_crc32_u64(c64, v);
    p += 8;
    n -= 8;
  }
  c = static_cast<std::uint32_t>(c64);
  while (n--) c = _mm_crc32_u8(c, *p++);
  return c;
}
#endif

}  // namespace crc32c_impl

/// True when this CPU computes CRC-32C with the SSE4.2 instruction.
inline bool crc32c_hardware() noexcept {
#if defined(__x86_64__)
  static const bool yes = __builtin_cpu_supports("sse4.2");
  return yes;
#else
  return false;
#endif
}

/// CRC-32C of `n` bytes, continuing from `crc` (the result of the bytes before): chaining
/// crc32c(b, nb, crc32c(a, na)) gives the CRC of a followed by b.
inline std::uint32_t crc32c(const void* data, std::size_t n, std::uint32_t crc = 0) noexcept {
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint32_t c = ~crc;
#if defined(__x86_64__)
  if (crc32c_hardware()) return ~crc32c_impl::hardware(p, n, c);
#endif
  return ~crc32c_impl::software(p, n, c);
}

inline std::uint32_t crc32c(std::span<const std::byte> bytes, std::uint32_t crc = 0) noexcept {
  return crc32c(bytes.data(), bytes.size(), crc);
}

/// The software path alone (for tests that compare it with the instruction).
inline std::uint32_t crc32c_software(const void* data, std::size_t n, std::uint32_t crc = 0) noexcept {
  return ~crc32c_impl::software(static_cast<const unsigned char*>(data), n, ~crc);
}

}  // namespace elastic::detail
