// The names a rendezvous hands around, checked where they are read: run ids ([A-Za-z0-9._-],
// 1..64), participant ids ([A-Za-z0-9._:@-], 1..128) and incarnations (lower-case hex, 1..32),
// and the random hex an incarnation or a default participant id is made of. A name that fails
// these never reaches a store key.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <string_view>

namespace elastic::inline v1::rendezvous::detail {

inline bool run_id_char(char c) noexcept {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
         c == '-';
}
/// The one rule for a run id, wherever it comes from: 1 to 64 characters of A-Z a-z 0-9 . _ -,
/// not starting with '.' or '-', so never ".", ".." or an option: it names a store, its keys and a
/// log directory.
inline bool valid_run_id(std::string_view s) noexcept {
  return !s.empty() && s.size() <= 64 && s.front() != '.' && s.front() != '-' &&
         std::all_of(s.begin(), s.end(), run_id_char);
}
inline bool participant_char(char c) noexcept { return run_id_char(c) || c == ':' || c == '@'; }
inline bool hex_char(char c) noexcept { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }

inline bool valid_incarnation(std::string_view s) noexcept {
  return !s.empty() && s.size() <= 32 && std::all_of(s.begin(), s.end(), hex_char);
}
inline bool valid_participant(std::string_view s) noexcept {
  return !s.empty() && s.size() <= 128 && std::all_of(s.begin(), s.end(), participant_char);
}

/// `bytes` random bytes as lower-case hex (an incarnation: distinct per lease and process).
inline std::string random_hex(std::size_t bytes) {
  std::random_device rd;
  std::mt19937_64 gen((static_cast<std::uint64_t>(rd()) << 32) ^ rd() ^ static_cast<std::uint64_t>(::getpid()));
  std::string out;
  constexpr char hex[] = "0123456789abcdef";
  for (std::size_t i = 0; i < bytes; ++i) {
    const auto b = static_cast<unsigned>(gen() & 0xff);
    out += hex[b >> 4];
    out += hex[b & 15];
  }
  return out;
}

}  // namespace elastic::inline v1::rendezvous::detail
