// SplitMix64: the test workers' own small generator (reproducible draws that no library's RNG
// state, and so no checkpoint, sees).
#pragma once

#include <cstdint>

namespace elastic::test {

inline std::uint64_t splitmix(std::uint64_t& s) {
  std::uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace elastic::test
