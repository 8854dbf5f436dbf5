// Reading the etcd v3 JSON gateway's replies (proto3 JSON: int64 as strings, bytes as base64,
// zero values left out) and the one key-range rule the store needs (a prefix's range_end).
// Every reader throws errc::corrupt on a field it cannot make sense of; the caller names the
// endpoint. Fuzzed by tests/fuzz/fuzz_etcd_reply.cpp.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include <elastic/internal/base64.hpp>
#include <elastic/internal/env.hpp>
#include <elastic/internal/json.hpp>
#include <elastic/internal/names.hpp>
#include <elastic/error.hpp>

namespace elastic::inline v1::rendezvous::detail {

using internal::base64_decode;
using internal::base64_encode;

/// The smallest key above every key that starts with `prefix`: etcd's range_end for a prefix.
/// "\0" (every key from `prefix` on) when no such key exists (empty, or all bytes 0xff).
inline std::string prefix_end(std::string prefix) {
  while (!prefix.empty()) {
    auto& c = prefix.back();
    if (static_cast<unsigned char>(c) != 0xff) {
      c = static_cast<char>(static_cast<unsigned char>(c) + 1);
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');
}

/// An int64 field of a gateway reply: proto3 JSON writes them as strings and leaves zeros out.
inline std::int64_t int_field(const internal::json& obj, std::string_view name) {
  const auto* f = obj.find(name);
  if (!f) return 0;
  if (f->is_integer()) return f->as_int64();
  const std::string& s = f->as_string();
  const auto v = internal::parse_integer(s);
  if (!v) {
    throw error(errc::corrupt, fmt::format("field '{}' holds '{}', not an integer", name, internal::printable(s)));
  }
  return *v;
}

/// A bytes field of a gateway reply, decoded; absent means empty.
inline std::string bytes_field(const internal::json& obj, std::string_view name) {
  const auto* f = obj.find(name);
  if (!f) return {};
  auto v = base64_decode(f->as_string());
  if (!v) throw error(errc::corrupt, fmt::format("field '{}' is not base64", name));
  return *std::move(v);
}

/// Appends `n` bytes of a stream of JSON lines (the gateway's streaming replies) to `buffer` and
/// hands each whole, non-blank line to `on_line`, until it returns false; false then.
template <class OnLine>
bool take_lines(std::string& buffer, const char* data, std::size_t n, OnLine&& on_line) {
  buffer.append(data, n);
  for (std::size_t nl; (nl = buffer.find('\n')) != std::string::npos;) {
    const std::string line = buffer.substr(0, nl);
    buffer.erase(0, nl + 1);
    if (line.find_first_not_of(" \r\t") == std::string::npos) continue;
    if (!on_line(line)) return false;
  }
  return true;
}

/// A key's value and the revision that last changed it (0: never), from a range reply.
struct etcd_kv {
  std::string value;
  std::int64_t mod_revision = 0;
};

/// The first key of a range reply, or none when the range is empty.
inline std::optional<etcd_kv> first_kv(const internal::json& range_reply) {
  const auto* kvs = range_reply.find("kvs");
  if (!kvs || kvs->size() == 0) return std::nullopt;
  const auto& e = kvs->at(std::size_t{0});
  return etcd_kv{bytes_field(e, "value"), int_field(e, "mod_revision")};
}

/// The first key's value of a range reply, or none when the range is empty.
inline std::optional<std::string> first_value(const internal::json& range_reply) {
  if (auto e = first_kv(range_reply)) return std::move(e->value);
  return std::nullopt;
}

}  // namespace elastic::inline v1::rendezvous::detail
