// Sealing a manifest: its JSON text ends with a "crc32c" field over the bytes before it, so a
// torn or altered manifest is refused (format.hpp encodes and decodes with these).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include <elastic/internal/crc32c.hpp>
#include <elastic/internal/json.hpp>
#include <elastic/error.hpp>

namespace elastic::inline v1::checkpoint::detail {

/// `body` (a JSON object) with a trailing "crc32c" over the bytes before that field.
inline std::string seal(const internal::json& body) {
  std::string text = body.dump();
  text.pop_back();  // the closing brace
  const std::uint32_t crc = internal::crc32c(text.data(), text.size());
  text += fmt::format("{}\"crc32c\":{}}}\n", body.size() ? "," : "", crc);
  return text;
}

/// Parses a sealed manifest, refusing it when its checksum does not match.
inline internal::json unseal(std::string_view text, const std::string& what) {
  const std::string_view tag = "\"crc32c\":";
  const auto at = text.rfind(tag);
  if (at == std::string_view::npos || at == 0) {
    throw error(errc::corrupt, what + " has no checksum field: not written by elastic, or cut short");
  }
  const std::size_t body_end = text[at - 1] == ',' ? at - 1 : at;
  auto doc = internal::json::parse(text);
  const std::uint64_t stored = doc.at("crc32c").as_uint64();
  const std::uint32_t actual = internal::crc32c(text.data(), body_end);
  if (stored != actual) {
    throw error(errc::corrupt, fmt::format("{} fails its checksum (stored {:08x}, computed {:08x})", what, stored, actual));
  }
  return doc;
}

}  // namespace elastic::inline v1::checkpoint::detail
