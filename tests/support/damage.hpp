// Damaging checkpoint files on purpose, as a bad disk or a stray write would.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>

namespace elastic::test {

/// Flips one bit of the byte at `at` in the file `p`.
inline void flip_byte(const std::filesystem::path& p, std::uint64_t at) {
  std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(at));
  char b = 0;
  f.read(&b, 1);
  b = static_cast<char>(b ^ 0x20);
  f.seekp(static_cast<std::streamoff>(at));
  f.write(&b, 1);
}

}  // namespace elastic::test
