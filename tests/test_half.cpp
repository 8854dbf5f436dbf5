// bfloat16 and float16: exact conversions to float, round-to-nearest-even from float, and the
// special values (±0, subnormals, infinities, NaN) against known bit patterns.
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <type_traits>

#include <elastic/comm/half.hpp>

#include "support/catch.hpp"

using elastic::comm::bfloat16;
using elastic::comm::float16;

namespace {

float from_u32(std::uint32_t u) { return std::bit_cast<float>(u); }
std::uint16_t bf(float x) { return bfloat16(x).bits; }
std::uint16_t fp(float x) { return float16(x).bits; }
std::uint32_t f_of_bf(std::uint16_t b) {
  return std::bit_cast<std::uint32_t>(static_cast<float>(bfloat16::from_bits(b)));
}
float f_of_fp(std::uint16_t b) { return static_cast<float>(float16::from_bits(b)); }

}  // namespace

TEST_CASE("the 16-bit types are plain 2-byte values that can alias CUDA's __nv_bfloat16 and __half", "[half]") {
  STATIC_REQUIRE(sizeof(bfloat16) == 2);
  STATIC_REQUIRE(alignof(float16) == 2);
  STATIC_REQUIRE(std::is_trivially_copyable_v<bfloat16>);
  STATIC_REQUIRE(std::is_standard_layout_v<float16>);
  STATIC_REQUIRE(bfloat16(1.0f).bits == 0x3f80);  // usable in constant expressions
  STATIC_REQUIRE(float16(1.0f).bits == 0x3c00);
}

TEST_CASE("bfloat16 converts known values to their bit patterns", "[half]") {
  CHECK(bf(0.0f) == 0x0000);
  CHECK(bf(-0.0f) == 0x8000);
  CHECK(bf(1.0f) == 0x3f80);
  CHECK(bf(-2.0f) == 0xc000);
  CHECK(bf(from_u32(0x40490fdb)) == 0x4049);  // pi rounds down
  CHECK(bf(0.1f) == 0x3dcd);                  // 0x3dcccccd rounds up
  CHECK(bf(std::numeric_limits<float>::infinity()) == 0x7f80);
  CHECK(bf(-std::numeric_limits<float>::infinity()) == 0xff80);
  CHECK(bf(std::numeric_limits<float>::max()) == 0x7f80);  // beyond the largest bf16: infinity
  CHECK(bf(from_u32(0x7f7f7fff)) == 0x7f7f);               // just below the halfway point: finite
  CHECK(bf(std::numeric_limits<float>::denorm_min()) == 0x0000);
  CHECK(bf(from_u32(0x00010000)) == 0x0001);  // the smallest bf16 subnormal is exact
  CHECK(f_of_bf(0x3f80) == 0x3f800000);
  CHECK(f_of_bf(0x0001) == 0x00010000);
}

TEST_CASE("bfloat16 rounds halfway cases to even", "[half]") {
  CHECK(bf(from_u32(0x3f808000)) == 0x3f80);  // tie, kept bit even: down
  CHECK(bf(from_u32(0x3f818000)) == 0x3f82);  // tie, kept bit odd: up
  CHECK(bf(from_u32(0x3f808001)) == 0x3f81);  // above the tie: up
  CHECK(bf(from_u32(0x3f807fff)) == 0x3f80);  // below the tie: down
  CHECK(bf(from_u32(0x00018000)) == 0x0002);  // subnormal tie, odd: up
  CHECK(bf(from_u32(0x3fffffff)) == 0x4000);  // the mantissa carry moves into the exponent
  CHECK(bf(from_u32(0xbf818000)) == 0xbf82);  // negative values round by magnitude
}

TEST_CASE("bfloat16 keeps NaN a NaN", "[half]") {
  CHECK(std::isnan(static_cast<float>(bfloat16(std::numeric_limits<float>::quiet_NaN()))));
  // A signaling NaN whose payload lies only in the dropped bits must not become infinity.
  const std::uint16_t b = bf(from_u32(0x7f800001));
  CHECK((b & 0x7f80) == 0x7f80);
  CHECK((b & 0x007f) != 0);
  CHECK(bf(from_u32(0xffc00000)) == 0xffc0);  // sign kept
}

TEST_CASE("every bfloat16 pattern survives a round trip through float", "[half]") {
  for (std::uint32_t p = 0; p < 0x10000; ++p) {
    const auto b = static_cast<std::uint16_t>(p);
    const float f = static_cast<float>(bfloat16::from_bits(b));
    if (std::isnan(f)) {
      const std::uint16_t back = bf(f);
      INFO("pattern " << p);
      CHECK(std::isnan(static_cast<float>(bfloat16::from_bits(back))));
      CHECK((back & 0x8000) == (b & 0x8000));
      CHECK(((back & 0x7f) | 0x40) == ((b & 0x7f) | 0x40));  // payload kept, quiet bit set
    } else if (bf(f) != b) {
      FAIL("bfloat16 pattern " << p << " came back as " << bf(f));
    }
  }
}

TEST_CASE("float16 converts known values to their bit patterns", "[half]") {
  CHECK(fp(0.0f) == 0x0000);
  CHECK(fp(-0.0f) == 0x8000);
  CHECK(fp(1.0f) == 0x3c00);
  CHECK(fp(-2.0f) == 0xc000);
  CHECK(fp(0.1f) == 0x2e66);
  CHECK(fp(65504.0f) == 0x7bff);  // the largest finite float16
  CHECK(fp(65519.0f) == 0x7bff);  // below the halfway point to 65536: finite
  CHECK(fp(65520.0f) == 0x7c00);  // the tie goes to even, which is infinity
  CHECK(fp(1e10f) == 0x7c00);
  CHECK(fp(-1e10f) == 0xfc00);
  CHECK(fp(std::numeric_limits<float>::infinity()) == 0x7c00);
  CHECK(fp(std::ldexp(1.0f, -14)) == 0x0400);  // the smallest normal
  CHECK(fp(std::ldexp(1.0f, -24)) == 0x0001);  // the smallest subnormal
  CHECK(fp(std::ldexp(1.0f, -25)) == 0x0000);  // half of it: a tie, to even zero
  CHECK(fp(std::ldexp(1.5f, -25)) == 0x0001);  // above the tie
  CHECK(fp(std::ldexp(1.0f, -30)) == 0x0000);
  CHECK(fp(-std::ldexp(1.0f, -30)) == 0x8000);
  CHECK(fp(std::numeric_limits<float>::denorm_min()) == 0x0000);
  CHECK(f_of_fp(0x3c00) == 1.0f);
  CHECK(f_of_fp(0x7bff) == 65504.0f);
  CHECK(f_of_fp(0x0001) == std::ldexp(1.0f, -24));
  CHECK(f_of_fp(0x03ff) == std::ldexp(1023.0f, -24));
  CHECK(f_of_fp(0x8001) == -std::ldexp(1.0f, -24));
  CHECK(std::isinf(f_of_fp(0xfc00)));
  CHECK(f_of_fp(0xfc00) < 0);
}

TEST_CASE("float16 rounds halfway cases to even", "[half]") {
  CHECK(fp(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);         // tie between 1 and 1+2^-10: even
  CHECK(fp(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3c02);     // tie after an odd mantissa: up
  CHECK(fp(std::ldexp(3.0f, -25)) == 0x0002);                // subnormal tie 1.5 ulp: up to even 2
  CHECK(fp(std::ldexp(5.0f, -25)) == 0x0002);                // 2.5 ulp: down to even 2
  CHECK(fp(std::ldexp(1.0f, -14) - std::ldexp(1.0f, -25)) == 0x0400);  // into the smallest normal
  CHECK(fp(2047.0f / 1024.0f + std::ldexp(1.0f, -11)) == 0x4000);      // mantissa carry into exponent
}

TEST_CASE("float16 keeps NaN a NaN", "[half]") {
  const std::uint16_t q = fp(std::numeric_limits<float>::quiet_NaN());
  CHECK((q & 0x7c00) == 0x7c00);
  CHECK((q & 0x03ff) != 0);
  const std::uint16_t s = fp(from_u32(0x7f800001));  // payload only in the dropped bits
  CHECK((s & 0x7c00) == 0x7c00);
  CHECK((s & 0x03ff) != 0);
  CHECK((fp(from_u32(0xffc00000)) & 0x8000) == 0x8000);
}

TEST_CASE("every float16 pattern survives a round trip through float", "[half]") {
  float previous = -1.0f;
  for (std::uint32_t p = 0; p < 0x10000; ++p) {
    const auto h = static_cast<std::uint16_t>(p);
    const float f = f_of_fp(h);
    if (std::isnan(f)) {
      const std::uint16_t back = fp(f);
      INFO("pattern " << p);
      CHECK(std::isnan(f_of_fp(back)));
      CHECK((back & 0x8000) == (h & 0x8000));
      CHECK((back & 0x1ff) == (h & 0x1ff));  // payload kept, quiet bit set
    } else if (fp(f) != h) {
      FAIL("float16 pattern " << p << " came back as " << fp(f));
    }
    if (p <= 0x7c00) {  // positive values grow with their patterns
      if (!(f > previous)) FAIL("float16 pattern " << p << " is not above the one before");
      previous = f;
    }
  }
}

#ifdef __FLT16_MAX__
TEST_CASE("float16 rounds every float like the compiler's _Float16", "[half]") {
  // Every float whose 13 dropped bits are a tie, just below or just above, for every kept
  // pattern, plus random bits: the compiler's conversion is the reference.
  for (std::uint32_t p = 0; p < 0x10000; ++p) {
    for (std::uint32_t low : {0x0fffu, 0x1000u, 0x1001u}) {
      const float x = from_u32((p << 16) | low);
      if (std::isnan(x)) continue;
      const auto want = std::bit_cast<std::uint16_t>(static_cast<_Float16>(x));
      if (fp(x) != want) FAIL("float " << x << " gave " << fp(x) << ", want " << want);
    }
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 2'000'000; ++i) {
    const float x = from_u32(static_cast<std::uint32_t>(rng()));
    if (std::isnan(x)) continue;
    const auto want = std::bit_cast<std::uint16_t>(static_cast<_Float16>(x));
    if (fp(x) != want) FAIL("float " << x << " gave " << fp(x) << ", want " << want);
  }
}
#endif

TEST_CASE("bfloat16 rounds like the nearest-even choice between its two neighbours", "[half]") {
  std::mt19937 rng(11);
  for (int i = 0; i < 2'000'000; ++i) {
    const std::uint32_t u = static_cast<std::uint32_t>(rng());
    const float x = from_u32(u);
    if (std::isnan(x) || std::isinf(x)) continue;
    const std::uint16_t down = static_cast<std::uint16_t>(u >> 16);  // truncation toward zero
    const std::uint16_t up = static_cast<std::uint16_t>(down + 1);   // next by magnitude
    const double dx = std::fabs(static_cast<double>(x));
    const double dd = dx - std::fabs(static_cast<double>(static_cast<float>(bfloat16::from_bits(down))));
    // Past the largest finite bf16 the next value up counts as 2^128, as IEEE rounding has it.
    const double up_value = (up & 0x7fff) == 0x7f80
                                ? std::ldexp(1.0, 128)
                                : std::fabs(static_cast<double>(static_cast<float>(bfloat16::from_bits(up))));
    const double du = up_value - dx;
    const std::uint16_t want = dd < du ? down : du < dd ? up : ((down & 1) ? up : down);
    if (bf(x) != want) FAIL("float bits " << u << " gave " << bf(x) << ", want " << want);
  }
}
