// The hash an elastic group's resync compares before it moves replicated state
// (comm/detail/state_hash.hpp): it must see any difference a resync would mend, and nothing else.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <vector>

#include <elastic/checkpoint/state.hpp>
#include <elastic/comm/detail/state_hash.hpp>

#include "support/catch.hpp"

using elastic::comm::detail::replicated_hash;
using elastic::comm::detail::state_digest;

namespace {

std::vector<std::byte> random_bytes(std::size_t n, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<std::byte> out(n);
  for (auto& b : out) b = static_cast<std::byte>(gen());
  return out;
}

/// The hash of `segments`, each fed in pieces of `piece` bytes.
std::uint64_t hash_of(const std::vector<std::vector<std::byte>>& segments, std::size_t piece) {
  state_digest d;
  for (const auto& s : segments) {
    for (std::size_t at = 0; at < s.size(); at += piece) {
      d.add(std::span<const std::byte>(s).subspan(at, std::min(piece, s.size() - at)));
    }
    d.end_segment();
  }
  return d.value();
}

struct cursor {
  std::vector<std::uint32_t> seen;
};
template <class Archive>
void elastic_checkpoint(Archive& ar, cursor& c) {
  ar(c.seen);
}

}  // namespace

TEST_CASE("a state hash does not depend on the pieces a segment arrives in") {
  const std::vector<std::vector<std::byte>> segs{random_bytes(1000, 1), random_bytes(4099, 2), {}, random_bytes(13, 3)};
  const std::uint64_t whole = hash_of(segs, 1 << 20);
  for (std::size_t piece : {1u, 3u, 7u, 8u, 9u, 4096u}) CHECK(hash_of(segs, piece) == whole);
}

TEST_CASE("a state hash changes with one flipped bit, two swapped words, or a byte moved to the next segment") {
  const std::vector<std::vector<std::byte>> segs{random_bytes(4096, 4), random_bytes(4096, 5)};
  const std::uint64_t base = hash_of(segs, 4096);
  for (std::size_t bit : {0u, 7u, 8 * 2048u + 3, 8 * 4095u + 7}) {
    auto flipped = segs;
    flipped[1][bit / 8] ^= static_cast<std::byte>(1u << (bit % 8));
    CHECK(hash_of(flipped, 4096) != base);
  }
  auto swapped = segs;
  std::swap_ranges(swapped[0].begin(), swapped[0].begin() + 8, swapped[0].begin() + 64);
  CHECK(hash_of(swapped, 4096) != base);
  auto moved = segs;
  moved[1].insert(moved[1].begin(), moved[0].back());
  moved[0].pop_back();
  CHECK(hash_of(moved, 4096) != base);
}

TEST_CASE("the replicated hash of a state covers its buffers, values and objects") {
  std::vector<float> w(1000, 0.5f);
  std::uint64_t step = 7;
  cursor c{{1, 2, 3}};
  elastic::checkpoint::state st;
  st.add("w", w).add_value("step", step).add_object("cursor", c);
  const std::uint64_t base = replicated_hash(st, nullptr);
  CHECK(replicated_hash(st, nullptr) == base);
  w[999] = 0.25f;
  CHECK(replicated_hash(st, nullptr) != base);
  w[999] = 0.5f;
  step = 8;
  CHECK(replicated_hash(st, nullptr) != base);
  step = 7;
  c.seen.push_back(4);
  CHECK(replicated_hash(st, nullptr) != base);
  c.seen.pop_back();
  CHECK(replicated_hash(st, nullptr) == base);
}
