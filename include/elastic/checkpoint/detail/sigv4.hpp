// AWS Signature Version 4, as S3-compatible stores check it (AWS S3, Google Cloud Storage's XML
// API with HMAC keys, Ceph RGW, MinIO): the canonical request, the string to sign, the signing
// key and the Authorization header of one request. Pure computation (no network), so the
// object-storage checkpoint backend can be checked against AWS's published examples.
//
// Paths are encoded segment by segment (S3 signs the path once-encoded, '/' kept), query
// parameters sorted by encoded name then value, header names lower-cased, values trimmed with
// inner runs of spaces folded to one, headers sorted by name. For service "s3" the payload's
// hash is also sent and signed as x-amz-content-sha256 (S3 requires it); a session token
// (temporary credentials) is sent and signed as x-amz-security-token.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cctype>
#include <ctime>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <elastic/error.hpp>
#include <elastic/internal/sha256.hpp>

namespace elastic::inline v1::checkpoint::detail::sigv4 {

/// An access key pair, and the session token of temporary credentials (empty: none).
struct credentials {
  std::string access_key;
  std::string secret_key;
  std::string session_token;
};

/// What is signed. Header and query values are as sent (not encoded); `path` is the object's
/// path as the server sees it, not encoded ("/bucket/step 7/a+b").
struct request {
  std::string method = "GET";
  std::string host;  ///< with ":port" when not the scheme's default, as the Host header carries it
  std::string path = "/";
  std::vector<std::pair<std::string, std::string>> query;
  std::vector<std::pair<std::string, std::string>> headers;  ///< more headers to sign (range, if-none-match, ...)
  std::string payload_sha256;  ///< hex SHA-256 of the body, or "UNSIGNED-PAYLOAD"; empty: of no body
  std::string amz_date;        ///< YYYYMMDD'T'HHMMSS'Z', UTC
  std::string region = "us-east-1";
  std::string service = "s3";
};

/// A request ready to send: its headers (Authorization, x-amz-date, ... and the caller's), the
/// encoded path and query string, and what was signed (for a server's SignatureDoesNotMatch).
struct signed_request {
  std::vector<std::pair<std::string, std::string>> headers;
  std::string encoded_path;
  std::string query_string;
  std::string canonical_request;
  std::string string_to_sign;
  std::string signature;
};

/// RFC 3986 unreserved characters kept, everything else as %XX (upper-case hex); '/' kept when
/// `keep_slash`.
inline std::string uri_encode(std::string_view s, bool keep_slash) {
  static constexpr char hex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size());
  for (const unsigned char c : s) {
    const bool unreserved = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
                            c == '_' || c == '.' || c == '~';
    if (unreserved || (keep_slash && c == '/')) {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(hex[c >> 4]);
      out.push_back(hex[c & 15]);
    }
  }
  return out;
}

inline std::string to_hex(std::span<const std::uint8_t> bytes) {
  static constexpr char hex[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const auto b : bytes) {
    out.push_back(hex[b >> 4]);
    out.push_back(hex[b & 15]);
  }
  return out;
}

inline std::string sha256_hex(std::string_view data) {
  return to_hex(internal::sha256().update(data.data(), data.size()).digest());
}

/// The x-amz-date of `t`.
inline std::string amz_date(std::chrono::system_clock::time_point t) {
  const std::time_t s = std::chrono::system_clock::to_time_t(t);
  std::tm utc{};
  ::gmtime_r(&s, &utc);
  char buf[17];
  std::strftime(buf, sizeof buf, "%Y%m%dT%H%M%SZ", &utc);
  return buf;
}

namespace detail {

inline std::span<const std::uint8_t> bytes(std::string_view s) {
  return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
}

inline std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

/// Leading and trailing blanks gone, inner runs of spaces one space.
inline std::string trimmed(std::string_view v) {
  std::string out;
  bool space = false;
  for (const char c : v) {
    if (c == ' ' || c == '\t') {
      space = !out.empty();
      continue;
    }
    if (space) out.push_back(' ');
    space = false;
    out.push_back(c);
  }
  return out;
}

}  // namespace detail

/// Signs `r` with `c`. Throws errc::invalid_argument for a request that cannot be signed (no
/// host, a malformed date, a header name with a character HTTP does not allow).
inline signed_request sign(const request& r, const credentials& c) {
  if (r.host.empty()) throw error(errc::invalid_argument, "sigv4: the request has no host");
  if (r.amz_date.size() != 16 || r.amz_date[8] != 'T' || r.amz_date[15] != 'Z') {
    throw error(errc::invalid_argument, fmt::format("sigv4: '{}' is not an x-amz-date (YYYYMMDDTHHMMSSZ)", r.amz_date));
  }
  signed_request out;
  const std::string payload = r.payload_sha256.empty() ? sha256_hex("") : r.payload_sha256;

  std::vector<std::pair<std::string, std::string>> headers{{"host", r.host}, {"x-amz-date", r.amz_date}};
  if (r.service == "s3") headers.emplace_back("x-amz-content-sha256", payload);
  if (!c.session_token.empty()) headers.emplace_back("x-amz-security-token", c.session_token);
  for (const auto& [k, v] : r.headers) {
    if (k.empty() || k.find_first_of(" \t\r\n:") != std::string::npos || v.find_first_of("\r\n") != std::string::npos) {
      throw error(errc::invalid_argument, fmt::format("sigv4: header '{}' cannot be sent", k));
    }
    headers.emplace_back(detail::lower(k), detail::trimmed(v));
  }
  std::sort(headers.begin(), headers.end());
  std::string canonical_headers, signed_headers;
  for (std::size_t i = 0; i < headers.size(); ++i) {
    // Two headers of one name are one, their values joined by commas.
    if (i > 0 && headers[i].first == headers[i - 1].first) {
      canonical_headers.back() = ',';
      canonical_headers += headers[i].second + "\n";
      continue;
    }
    canonical_headers += headers[i].first + ":" + headers[i].second + "\n";
    if (!signed_headers.empty()) signed_headers += ';';
    signed_headers += headers[i].first;
  }

  std::vector<std::pair<std::string, std::string>> query;
  for (const auto& [k, v] : r.query) query.emplace_back(uri_encode(k, false), uri_encode(v, false));
  std::sort(query.begin(), query.end());
  for (const auto& [k, v] : query) {
    if (!out.query_string.empty()) out.query_string += '&';
    out.query_string += k + "=" + v;
  }
  out.encoded_path = uri_encode(r.path.empty() ? "/" : r.path, true);

  out.canonical_request = fmt::format("{}\n{}\n{}\n{}\n{}\n{}", r.method, out.encoded_path, out.query_string,
                                      canonical_headers, signed_headers, payload);
  const std::string day = r.amz_date.substr(0, 8);
  const std::string scope = fmt::format("{}/{}/{}/aws4_request", day, r.region, r.service);
  out.string_to_sign =
      fmt::format("AWS4-HMAC-SHA256\n{}\n{}\n{}", r.amz_date, scope, sha256_hex(out.canonical_request));

  const std::string k_secret = "AWS4" + c.secret_key;
  auto key = internal::hmac_sha256(detail::bytes(k_secret), {detail::bytes(day)});
  key = internal::hmac_sha256(key, {detail::bytes(r.region)});
  key = internal::hmac_sha256(key, {detail::bytes(r.service)});
  key = internal::hmac_sha256(key, {detail::bytes("aws4_request")});
  out.signature = to_hex(internal::hmac_sha256(key, {detail::bytes(out.string_to_sign)}));

  for (const auto& [k, v] : headers) {
    if (k != "host") out.headers.emplace_back(k, v);
  }
  out.headers.emplace_back("authorization",
                           fmt::format("AWS4-HMAC-SHA256 Credential={}/{},SignedHeaders={},Signature={}", c.access_key,
                                       scope, signed_headers, out.signature));
  return out;
}

}  // namespace elastic::inline v1::checkpoint::detail::sigv4
