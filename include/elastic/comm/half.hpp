// 16-bit floating-point element types for the collectives: bfloat16 (8-bit exponent, 7-bit
// mantissa) and float16 (IEEE 754 binary16: 5-bit exponent, 10-bit mantissa).
//
// Each is one `std::uint16_t bits` and nothing else: trivially copyable, standard layout, size 2,
// alignment 2, the same layout as CUDA's __nv_bfloat16 / __half. A program can therefore view
// its device or host buffer of those types as std::span<elastic::comm::bfloat16> (or float16)
// through a reinterpret_cast of the pointer, and hand it to a communicator.
//
// They are storage types, not arithmetic types: convert to float to compute. Conversions are
// explicit, constexpr, and do not depend on the FPU's rounding mode or flush-to-zero setting:
//   float -> 16 bits  rounds to nearest, ties to even; values beyond the largest finite one
//                     become ±infinity; NaN stays NaN (quiet, sign kept, payload kept where it
//                     fits); results below the smallest normal become subnormals or ±0.
//   16 bits -> float  exact (every bf16 and fp16 value is a float).
#pragma once

#include <bit>
#include <cstdint>
#include <type_traits>

namespace elastic::inline v1::comm {

/// bfloat16: the top half of a float (sign, 8-bit exponent, 7-bit mantissa).
struct bfloat16 {
  std::uint16_t bits;  ///< the raw pattern, as __nv_bfloat16 stores it

  /// Uninitialised, like a float (keeps the type trivial).
  bfloat16() = default;

  /// `x` rounded to the nearest bfloat16, ties to even.
  constexpr explicit bfloat16(float x) noexcept : bits(round(x)) {}

  /// The value whose pattern is `b`.
  [[nodiscard]] static constexpr bfloat16 from_bits(std::uint16_t b) noexcept {
    bfloat16 h{};
    h.bits = b;
    return h;
  }

  /// The exact float value.
  constexpr explicit operator float() const noexcept {
    return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
  }

 private:
  static constexpr std::uint16_t round(float x) noexcept {
    const std::uint32_t f = std::bit_cast<std::uint32_t>(x);
    if ((f & 0x7fffffffu) > 0x7f800000u) {
      // NaN: truncating could clear every mantissa bit left and make it infinity; set the quiet bit.
      return static_cast<std::uint16_t>((f >> 16) | 0x0040u);
    }
    // Adding 0x7fff rounds halfway cases down, plus the kept lowest bit makes ties go to even; a
    // carry out of the mantissa bumps the exponent, which is right (and yields infinity at the top).
    const std::uint32_t lsb = (f >> 16) & 1u;
    return static_cast<std::uint16_t>((f + 0x7fffu + lsb) >> 16);
  }
};

/// float16: IEEE 754 binary16 (sign, 5-bit exponent, 10-bit mantissa), as CUDA's __half.
struct float16 {
  std::uint16_t bits;  ///< the raw pattern, as __half stores it

  /// Uninitialised, like a float (keeps the type trivial).
  float16() = default;

  /// `x` rounded to the nearest float16, ties to even.
  constexpr explicit float16(float x) noexcept : bits(round(x)) {}

  /// The value whose pattern is `b`.
  [[nodiscard]] static constexpr float16 from_bits(std::uint16_t b) noexcept {
    float16 h{};
    h.bits = b;
    return h;
  }

  /// The exact float value.
  constexpr explicit operator float() const noexcept {
    const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
    std::uint32_t exp = (bits >> 10) & 0x1fu;
    std::uint32_t mant = bits & 0x3ffu;
    if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));  // inf, NaN
    if (exp == 0) {
      if (mant == 0) return std::bit_cast<float>(sign);  // ±0
      // Subnormal: mant * 2^-24. Shift the leading 1 up to the implicit bit, one exponent per step.
      exp = 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ffu;
    }
    // Rebias the exponent from 15 to 127 (exp may be 0 or negative here: unsigned wrap-around
    // adds back correctly since the sum is positive).
    return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
  }

 private:
  static constexpr std::uint16_t round(float x) noexcept {
    const std::uint32_t f = std::bit_cast<std::uint32_t>(x);
    const auto sign = static_cast<std::uint16_t>((f >> 16) & 0x8000u);
    const std::uint32_t a = f & 0x7fffffffu;
    if (a >= 0x7f800000u) {  // infinity or NaN
      if (a == 0x7f800000u) return sign | 0x7c00u;
      return static_cast<std::uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));  // quiet, top payload bits
    }
    // 65520 lies halfway between the largest finite value (65504, odd mantissa) and 65536: ties to
    // even round it, and everything above, to infinity.
    if (a >= 0x477ff000u) return sign | 0x7c00u;
    if (a >= 0x38800000u) {  // a normal float16 (>= 2^-14)
      // Rebias the exponent (127 -> 15: subtract 112 << 23) and round the 13 dropped bits to
      // nearest even in one addition; a mantissa carry moves into the exponent, as it should.
      const std::uint32_t lsb = (a >> 13) & 1u;
      return static_cast<std::uint16_t>(sign | ((a - 0x38000000u + 0xfffu + lsb) >> 13));
    }
    // Subnormal float16 (or zero): the result is round(value / 2^-24), value = m * 2^(e - 150).
    const std::uint32_t e = a >> 23;
    if (e < 102) return sign;  // below 2^-25: rounds to ±0 (2^-25 itself is a tie, to even 0)
    const std::uint32_t m = (a & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126 - e;  // 14..24
    std::uint32_t q = m >> shift;
    const std::uint32_t rem = m & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u) != 0)) ++q;  // may carry into the smallest normal: right
    return static_cast<std::uint16_t>(sign | q);
  }
};

static_assert(sizeof(bfloat16) == 2 && alignof(bfloat16) == 2);
static_assert(sizeof(float16) == 2 && alignof(float16) == 2);
static_assert(std::is_trivially_copyable_v<bfloat16> && std::is_standard_layout_v<bfloat16>);
static_assert(std::is_trivially_copyable_v<float16> && std::is_standard_layout_v<float16>);
static_assert(std::is_trivial_v<bfloat16> && std::is_trivial_v<float16>);

/// True for the two 16-bit floating-point element types.
template <class T>
inline constexpr bool is_half_v = std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>;

}  // namespace elastic::inline v1::comm
