// Base64 (RFC 4648, standard alphabet, with padding): how etcd's JSON gateway carries keys and
// values. Strict on reading: any other character, a missing or misplaced '=' is "not base64".
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace elastic::inline v1::internal {

/// `in` in standard base64 with padding, as etcd's gateway writes bytes.
inline std::string base64_encode(std::string_view in) {
  static constexpr char digits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  std::size_t i = 0;
  for (; i + 3 <= in.size(); i += 3) {
    const auto v = (static_cast<std::uint32_t>(static_cast<unsigned char>(in[i])) << 16) |
                   (static_cast<std::uint32_t>(static_cast<unsigned char>(in[i + 1])) << 8) |
                   static_cast<std::uint32_t>(static_cast<unsigned char>(in[i + 2]));
    out += digits[(v >> 18) & 63];
    out += digits[(v >> 12) & 63];
    out += digits[(v >> 6) & 63];
    out += digits[v & 63];
  }
  if (const std::size_t rest = in.size() - i; rest > 0) {
    std::uint32_t v = static_cast<std::uint32_t>(static_cast<unsigned char>(in[i])) << 16;
    if (rest == 2) v |= static_cast<std::uint32_t>(static_cast<unsigned char>(in[i + 1])) << 8;
    out += digits[(v >> 18) & 63];
    out += digits[(v >> 12) & 63];
    out += rest == 2 ? digits[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

/// The bytes `in` encodes in standard base64 with padding; nothing when it is not that.
inline std::optional<std::string> base64_decode(std::string_view in) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  if (in.size() % 4 != 0) return std::nullopt;
  std::string out;
  out.reserve(in.size() / 4 * 3);
  for (std::size_t i = 0; i < in.size(); i += 4) {
    const bool last = i + 4 == in.size();
    const int pad = last ? (in[i + 3] == '=') + (in[i + 2] == '=' && in[i + 3] == '=') : 0;
    std::uint32_t v = 0;
    for (int k = 0; k < 4 - pad; ++k) {
      const int d = value(in[i + static_cast<std::size_t>(k)]);
      if (d < 0) return std::nullopt;
      v = (v << 6) | static_cast<std::uint32_t>(d);
    }
    v <<= 6 * pad;
    out += static_cast<char>((v >> 16) & 0xff);
    if (pad < 2) out += static_cast<char>((v >> 8) & 0xff);
    if (pad < 1) out += static_cast<char>(v & 0xff);
  }
  return out;
}

}  // namespace elastic::inline v1::internal
