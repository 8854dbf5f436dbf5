// The S3 API's wire format, without the network: request bodies gathered from the caller's
// memory (with runs of zeros), the XML of its answers, CRC-32C as its checksum headers carry
// it, and what its error answers mean to a user. Pure computation (s3_client.hpp sends).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <elastic/error.hpp>
#include <elastic/internal/base64.hpp>
#include <elastic/internal/crc32c.hpp>

namespace elastic::inline v1::checkpoint::detail::objects {

/// How the client talks to the server.
struct client_options {
  std::chrono::milliseconds connect_timeout{5000};
  /// A request that moves fewer than 1 KiB/s for this long is abandoned (and retried).
  std::chrono::milliseconds stall_timeout{30000};
  /// How long the server may stay unreachable or busy before a request fails.
  std::chrono::milliseconds unavailable_timeout{60000};
  int attempts = 6;
};

/// One object of a listing: its name under the location's prefix.
struct object_info {
  std::string name;
  std::uint64_t size = 0;
  std::string last_modified;  ///< as the server wrote it (ISO 8601)
};

/// One multipart upload the server still holds.
struct upload_info {
  std::string name;
  std::string upload_id;
  std::string initiated;  ///< ISO 8601
};

/// A body to send: pieces of memory, or runs of zeros (a null `data`), in order.
struct gather {
  struct piece {
    const std::byte* data;  ///< nullptr: `bytes` zeros
    std::uint64_t bytes;
  };
  std::vector<piece> pieces;

  [[nodiscard]] std::uint64_t size() const noexcept {
    std::uint64_t n = 0;
    for (const auto& p : pieces) n += p.bytes;
    return n;
  }
  /// Calls f(data, k) for each stretch of bytes [at, at + n) in order: `data` points at k bytes
  /// of a piece, or is nullptr for k zeros.
  template <class F>
  void visit(std::uint64_t at, std::uint64_t n, F&& f) const {
    std::uint64_t base = 0;
    for (const auto& p : pieces) {
      if (n == 0) return;
      if (at < base + p.bytes) {
        const std::uint64_t from = at - base, k = std::min<std::uint64_t>(n, p.bytes - from);
        f(p.data ? p.data + from : nullptr, static_cast<std::size_t>(k));
        at += k;
        n -= k;
      }
      base += p.bytes;
    }
  }
  /// Copies bytes [at, at + n) into `out`.
  void copy(std::uint64_t at, std::byte* out, std::size_t n) const noexcept {
    visit(at, n, [&](const std::byte* data, std::size_t k) {
      if (data) {
        std::memcpy(out, data, k);
      } else {
        std::memset(out, 0, k);
      }
      out += k;
    });
  }
  /// CRC-32C of bytes [at, at + n).
  [[nodiscard]] std::uint32_t crc(std::uint64_t at, std::uint64_t n) const noexcept {
    static constexpr std::byte zeros[4096]{};
    std::uint32_t c = 0;
    visit(at, n, [&](const std::byte* data, std::size_t k) {
      if (data) {
        c = internal::crc32c(data, k, c);
        return;
      }
      for (std::size_t z = 0; z < k; z += sizeof zeros) c = internal::crc32c(zeros, std::min(sizeof zeros, k - z), c);
    });
    return c;
  }
};

namespace xml {

/// The text of every <tag>...</tag> in `doc`, in order, entities decoded.
inline std::vector<std::string> all(std::string_view doc, std::string_view tag) {
  std::vector<std::string> out;
  const std::string open = fmt::format("<{}>", tag), close = fmt::format("</{}>", tag);
  for (std::size_t at = 0;;) {
    const auto a = doc.find(open, at);
    if (a == std::string_view::npos) break;
    const auto b = doc.find(close, a + open.size());
    if (b == std::string_view::npos) break;
    const std::string_view raw = doc.substr(a + open.size(), b - a - open.size());
    std::string v;
    for (std::size_t i = 0; i < raw.size(); ++i) {
      if (raw[i] != '&') {
        v.push_back(raw[i]);
        continue;
      }
      static constexpr std::pair<std::string_view, char> entities[] = {
          {"&amp;", '&'}, {"&lt;", '<'}, {"&gt;", '>'}, {"&quot;", '"'}, {"&apos;", '\''}};
      bool done = false;
      for (const auto& [e, c] : entities) {
        if (raw.substr(i, e.size()) == e) {
          v.push_back(c);
          i += e.size() - 1;
          done = true;
          break;
        }
      }
      if (!done) v.push_back('&');
    }
    out.push_back(std::move(v));
    at = b + close.size();
  }
  return out;
}

/// The first <tag>...</tag> of `doc`, or "".
inline std::string first(std::string_view doc, std::string_view tag) {
  auto v = all(doc, tag);
  return v.empty() ? std::string() : std::move(v.front());
}

/// Each <tag>...</tag> block of `doc`, raw.
inline std::vector<std::string_view> blocks(std::string_view doc, std::string_view tag) {
  std::vector<std::string_view> out;
  const std::string open = fmt::format("<{}>", tag), close = fmt::format("</{}>", tag);
  for (std::size_t at = 0;;) {
    const auto a = doc.find(open, at);
    if (a == std::string_view::npos) break;
    const auto b = doc.find(close, a);
    if (b == std::string_view::npos) break;
    out.push_back(doc.substr(a, b + close.size() - a));
    at = b + close.size();
  }
  return out;
}

inline std::string escape(std::string_view s) {
  std::string out;
  for (const char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

}  // namespace xml

/// The base64 of a CRC-32C's four bytes, big-endian: the value of x-amz-checksum-crc32c.
inline std::string crc32c_base64(std::uint32_t c) {
  const char b[4] = {static_cast<char>(c >> 24), static_cast<char>(c >> 16), static_cast<char>(c >> 8),
                     static_cast<char>(c)};
  return internal::base64_encode(std::string_view(b, 4));
}

/// "HTTP 403 SignatureDoesNotMatch: ..." from an error answer's status and XML.
inline std::string describe(long status, const std::string& body) {
  const std::string code = xml::first(body, "Code"), message = xml::first(body, "Message");
  if (code.empty()) return fmt::format("HTTP {}", status);
  return fmt::format("HTTP {} {}{}{}", status, code, message.empty() ? "" : ": ", message);
}

/// Throws what an answer no retry mends means, as an error a user can act on.
[[noreturn]] inline void fail(const std::string& request, long status, const std::string& body) {
  const std::string what = fmt::format("{}: {}", request, describe(status, body));
  const std::string code = xml::first(body, "Code");
  if (status == 403 || status == 401) {
    throw error(errc::invalid_argument,
                what + (code == "SignatureDoesNotMatch" || code == "InvalidAccessKeyId"
                            ? ": the keys are wrong (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, or the profile's)"
                            : ": these keys may not do this here"));
  }
  if (status == 404 && code == "NoSuchBucket") throw error(errc::not_found, what + ": create the bucket first");
  if (status == 404) throw error(errc::not_found, what);
  if (status == 412) throw error(errc::mismatch, what);
  throw error(errc::invalid_argument, what);
}

}  // namespace elastic::inline v1::checkpoint::detail::objects
