// Names that become files under /dev/shm: a watchdog segment, a store.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include <elastic/error.hpp>

namespace elastic::inline v1::internal {

/// Longest name accepted (the shm object adds a prefix; NAME_MAX is 255).
inline constexpr std::size_t max_shm_name = 200;

/// `name` with control and non-ASCII bytes written as \xNN, so an error message can quote it.
inline std::string printable(std::string_view name) {
  std::string out;
  for (char c : name) {
    auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u >= 0x7f) {
      constexpr char hex[] = "0123456789abcdef";
      out += "\\x";
      out += hex[u >> 4];
      out += hex[u & 15];
    } else {
      out += c;
    }
  }
  return out;
}

/// Throws errc::bad_name unless `name` is 1..200 characters of [A-Za-z0-9._-], not starting
/// with '.' or '-'. `what` names the thing in the message ("watchdog segment", "store").
inline void validate_shm_name(std::string_view what, std::string_view name) {
  auto bad = [&](const std::string& why) {
    throw error(errc::bad_name, std::string(what) + " name '" + printable(name) + "' " + why +
                                    ": use 1 to 200 characters of A-Z a-z 0-9 . _ -");
  };
  if (name.empty()) bad("is empty");
  if (name.size() > max_shm_name) bad("is " + std::to_string(name.size()) + " characters long");
  if (name.front() == '.' || name.front() == '-') bad("starts with '" + std::string(1, name.front()) + "'");
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                    c == '_' || c == '-';
    if (!ok) {
      const auto u = static_cast<unsigned char>(c);
      bad(u < 0x20 || u >= 0x7f ? "holds a control or non-ASCII byte" : "holds the character '" + std::string(1, c) + "'");
    }
  }
}

}  // namespace elastic::inline v1::internal
