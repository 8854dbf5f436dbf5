#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <string_view>
#include <vector>

#include <elastic/internal/crc32c.hpp>

#include "support/catch.hpp"

using elastic::internal::crc32c;
using elastic::internal::crc32c_software;

namespace {

std::vector<unsigned char> random_bytes(std::size_t n, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<unsigned char> out(n);
  for (auto& b : out) b = static_cast<unsigned char>(gen());
  return out;
}

}  // namespace

TEST_CASE("crc32c matches the published CRC-32C check values") {
  // RFC 3720 (iSCSI) appendix B.4 and the catalogue's check value for "123456789".
  std::array<unsigned char, 32> zeros{}, ones{}, ascending{};
  ones.fill(0xff);
  for (std::size_t i = 0; i < ascending.size(); ++i) ascending[i] = static_cast<unsigned char>(i);
  const std::string_view check = "123456789";

  for (auto fn : {+[](const void* p, std::size_t n) { return crc32c(p, n); },
                  +[](const void* p, std::size_t n) { return crc32c_software(p, n); }}) {
    CHECK(fn(check.data(), check.size()) == 0xE3069283u);
    CHECK(fn(zeros.data(), zeros.size()) == 0x8A9136AAu);
    CHECK(fn(ones.data(), ones.size()) == 0x62A8AB43u);
    CHECK(fn(ascending.data(), ascending.size()) == 0x46DD794Eu);
  }
}

TEST_CASE("crc32c of no bytes is the crc it continues from") {
  CHECK(crc32c(nullptr, 0) == 0u);
  CHECK(crc32c(nullptr, 0, 0xE3069283u) == 0xE3069283u);
  CHECK(crc32c_software(nullptr, 0, 0x12345678u) == 0x12345678u);
}

TEST_CASE("crc32c of a byte span equals crc32c of its pointer and size") {
  const auto data = random_bytes(1000, 1);
  const auto bytes = std::as_bytes(std::span(data));
  CHECK(crc32c(bytes) == crc32c(data.data(), data.size()));
  CHECK(crc32c(bytes.subspan(400), crc32c(bytes.first(400))) == crc32c(bytes));
}

TEST_CASE("crc32c chains: the crc of a then b continues from the crc of a") {
  const auto data = random_bytes(200000, 2);
  const std::uint32_t whole = crc32c(data.data(), data.size());
  // Split points on both sides of the block sizes the instruction path switches between.
  for (std::size_t split : {0u, 1u, 7u, 8u, 9u, 767u, 768u, 769u, 12287u, 12288u, 12289u, 24576u, 100001u, 200000u}) {
    CAPTURE(split);
    CHECK(crc32c(data.data() + split, data.size() - split, crc32c(data.data(), split)) == whole);
    CHECK(crc32c_software(data.data() + split, data.size() - split, crc32c_software(data.data(), split)) == whole);
  }
}

TEST_CASE("the instruction path agrees with the table path at every length and alignment") {
  INFO("crc32c_hardware() == " << elastic::internal::crc32c_hardware());
  const auto data = random_bytes(4097 + 16, 3);
  std::size_t mismatches = 0;
  for (std::size_t offset = 0; offset < 8; ++offset) {
    for (std::size_t n = 0; n <= 4097; ++n) {
      if (crc32c(data.data() + offset, n) != crc32c_software(data.data() + offset, n)) ++mismatches;
    }
  }
  CHECK(mismatches == 0);

  const auto big = random_bytes(10u << 20, 4);
  for (std::size_t offset : {0u, 1u, 3u, 5u}) {
    CAPTURE(offset);
    const std::size_t n = big.size() - offset - (offset ? 13 : 0);
    CHECK(crc32c(big.data() + offset, n) == crc32c_software(big.data() + offset, n));
  }
}

TEST_CASE("crc32c changes when any single bit of its input flips") {
  auto data = random_bytes(64, 5);
  const std::uint32_t clean = crc32c(data.data(), data.size());
  std::size_t unnoticed = 0;
  for (std::size_t bit = 0; bit < data.size() * 8; ++bit) {
    data[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
    if (crc32c(data.data(), data.size()) == clean) ++unnoticed;
    data[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
  }
  CHECK(unnoticed == 0);
}

TEST_CASE("crc32c_hardware reports whether the CPU has the SSE4.2 instruction") {
#if defined(__x86_64__)
  __builtin_cpu_init();
  CHECK(elastic::internal::crc32c_hardware() == static_cast<bool>(__builtin_cpu_supports("sse4.2")));
#else
  CHECK_FALSE(elastic::internal::crc32c_hardware());
#endif
}
