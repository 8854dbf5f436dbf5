// Where a checkpoint directory in object storage is, and with which keys: `s3://BUCKET/PREFIX`
// (AWS S3, or any S3-compatible server given by AWS_ENDPOINT_URL: Ceph RGW, MinIO) and
// `gs://BUCKET/PREFIX` (Google Cloud Storage's S3-compatible XML API with HMAC keys). Resolved
// from the environment the way the AWS tools resolve it, so a pod that already works with
// `aws s3` works here: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, AWS_REGION, AWS_DEFAULT_REGION;
// keys from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN, else the shared
// credentials file (AWS_SHARED_CREDENTIALS_FILE, else ~/.aws/credentials) at AWS_PROFILE (else
// "default"). For gs://, GCS_ACCESS_KEY_ID / GCS_SECRET_ACCESS_KEY come first (HMAC keys).
#pragma once

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include <elastic/checkpoint/detail/sigv4.hpp>
#include <elastic/error.hpp>
#include <elastic/internal/names.hpp>

namespace elastic::inline v1::checkpoint::detail::objects {

/// What the environment is read through (tests give their own).
using environment = std::function<std::optional<std::string>(const char*)>;

inline std::optional<std::string> process_environment(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

/// A checkpoint directory in object storage.
struct location {
  std::string scheme;    ///< "s3" or "gs"
  std::string bucket;
  std::string prefix;    ///< the keys' common prefix, no leading or trailing '/'; may be empty
  std::string endpoint;  ///< scheme://host[:port], no trailing '/'
  std::string region;    ///< what requests are signed for ("auto" on GCS)
  /// Requests name the bucket in the path (http://host/BUCKET/KEY), as custom endpoints want,
  /// rather than in the host name.
  bool path_style = false;

  /// The key of object `name` under the prefix ("PREFIX/name").
  [[nodiscard]] std::string key_of(std::string_view name) const {
    return prefix.empty() ? std::string(name) : prefix + "/" + std::string(name);
  }
  /// The object `name` under the prefix, as a path ("/BUCKET/PREFIX/name" in path style).
  [[nodiscard]] std::string path_of(std::string_view name) const {
    return path_style ? "/" + bucket + "/" + key_of(name) : "/" + key_of(name);
  }
  /// The Host header: the endpoint's, with the bucket in front unless path style.
  [[nodiscard]] std::string host() const {
    const std::string h = endpoint.substr(endpoint.find("://") + 3);
    return path_style ? h : bucket + "." + h;
  }
  /// The URL for `path` (path_of()), before its encoding.
  [[nodiscard]] std::string base_url() const {
    const auto colon = endpoint.find("://");
    return endpoint.substr(0, colon + 3) + host();
  }
};

/// Whether a loop's `dir` names object storage rather than a POSIX directory.
inline bool is_object_url(std::string_view dir) { return dir.starts_with("s3://") || dir.starts_with("gs://"); }

namespace detail {

[[noreturn]] inline void refuse(std::string_view url, std::string_view why) {
  throw error(errc::invalid_argument, fmt::format("checkpoint directory '{}': {}", internal::printable(url), why));
}

/// S3's rules for bucket names (which GCS's S3 API shares): 3 to 63 of a-z 0-9 . -, starting
/// and ending with a letter or digit, no "..".
inline bool valid_bucket(std::string_view b) {
  if (b.size() < 3 || b.size() > 63 || b.find("..") != std::string_view::npos) return false;
  auto alnum = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };
  if (!alnum(b.front()) || !alnum(b.back())) return false;
  for (const char c : b) {
    if (!alnum(c) && c != '.' && c != '-') return false;
  }
  return true;
}

}  // namespace detail

/// Parses `url` (s3://BUCKET[/PREFIX], gs://BUCKET[/PREFIX]) and resolves its endpoint and region
/// from `env`. Throws errc::invalid_argument naming what is wrong.
inline location parse_location(std::string_view url, const environment& env = process_environment) {
  location l;
  if (url.starts_with("s3://")) {
    l.scheme = "s3";
  } else if (url.starts_with("gs://")) {
    l.scheme = "gs";
  } else {
    detail::refuse(url, "not s3://BUCKET/PREFIX or gs://BUCKET/PREFIX");
  }
  std::string_view rest = url.substr(5);
  const auto slash = rest.find('/');
  l.bucket = std::string(rest.substr(0, slash));
  if (!detail::valid_bucket(l.bucket)) {
    detail::refuse(url, fmt::format("'{}' is not a bucket name (3 to 63 of a-z 0-9 . -, starting and ending with a "
                                    "letter or digit)",
                                    internal::printable(l.bucket)));
  }
  std::string_view prefix = slash == std::string_view::npos ? std::string_view() : rest.substr(slash + 1);
  while (prefix.ends_with('/')) prefix.remove_suffix(1);
  for (std::size_t start = 0; start < prefix.size();) {
    const auto end = std::min(prefix.find('/', start), prefix.size());
    const std::string_view part = prefix.substr(start, end - start);
    if (part.empty() || part == "." || part == "..") detail::refuse(url, "the prefix has an empty, '.' or '..' part");
    start = end + 1;
  }
  for (const unsigned char c : prefix) {
    if (c < 0x20 || c == 0x7f) detail::refuse(url, "the prefix has a control character");
  }
  if (prefix.size() > 512) detail::refuse(url, "the prefix is longer than 512 bytes (an object key holds 1024)");
  l.prefix = std::string(prefix);

  std::optional<std::string> endpoint = env(l.scheme == "s3" ? "AWS_ENDPOINT_URL_S3" : "GCS_ENDPOINT_URL");
  if (!endpoint && l.scheme == "s3") endpoint = env("AWS_ENDPOINT_URL");
  std::optional<std::string> region = env("AWS_REGION");
  if (!region) region = env("AWS_DEFAULT_REGION");
  if (endpoint) {
    std::string e = *endpoint;
    while (e.ends_with('/')) e.pop_back();
    if (!(e.starts_with("http://") || e.starts_with("https://")) || e.size() <= e.find("://") + 3 ||
        e.find('/', e.find("://") + 3) != std::string::npos) {
      detail::refuse(url, fmt::format("the endpoint '{}' is not http(s)://HOST[:PORT]", internal::printable(*endpoint)));
    }
    l.endpoint = e;
    l.path_style = true;  // RGW, MinIO and most other servers: no bucket in the host name
    l.region = region.value_or(l.scheme == "gs" ? "auto" : "us-east-1");
  } else if (l.scheme == "gs") {
    l.endpoint = "https://storage.googleapis.com";
    l.region = "auto";
    l.path_style = l.bucket.find('.') != std::string::npos;
  } else {
    l.region = region.value_or("us-east-1");
    l.endpoint = fmt::format("https://s3.{}.amazonaws.com", l.region);
    // A bucket with dots does not match the endpoint's TLS certificate as a host name.
    l.path_style = l.bucket.find('.') != std::string::npos;
  }
  return l;
}

/// The keys for `l`, from the environment, else the shared credentials file. Throws
/// errc::not_found saying where it looked, errc::corrupt for a profile without both keys.
inline sigv4::credentials resolve_credentials(const location& l, const environment& env = process_environment) {
  sigv4::credentials c;
  if (l.scheme == "gs") {
    if (auto k = env("GCS_ACCESS_KEY_ID"), s = env("GCS_SECRET_ACCESS_KEY"); k && s) {
      c.access_key = *k;
      c.secret_key = *s;
      return c;
    }
  }
  if (auto k = env("AWS_ACCESS_KEY_ID"), s = env("AWS_SECRET_ACCESS_KEY"); k && s) {
    c.access_key = *k;
    c.secret_key = *s;
    c.session_token = env("AWS_SESSION_TOKEN").value_or("");
    return c;
  }
  std::filesystem::path file;
  if (auto f = env("AWS_SHARED_CREDENTIALS_FILE")) {
    file = *f;
  } else if (auto home = env("HOME")) {
    file = std::filesystem::path(*home) / ".aws" / "credentials";
  }
  const std::string profile = env("AWS_PROFILE").value_or("default");
  const std::string gcs = l.scheme == "gs" ? "GCS_ACCESS_KEY_ID and GCS_SECRET_ACCESS_KEY, " : "";
  const std::string looked =
      fmt::format("{}AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, then profile [{}] of {}", gcs, profile,
                  file.empty() ? std::string("~/.aws/credentials (no HOME)") : file.string());
  std::ifstream in(file);
  if (file.empty() || !in) {
    throw error(errc::not_found, fmt::format("no keys for {}://{}: looked at {}", l.scheme, l.bucket, looked));
  }
  bool in_profile = false, found = false;
  for (std::string line; std::getline(in, line);) {
    std::string_view v(line);
    while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
    while (!v.empty() && (v.back() == ' ' || v.back() == '\t' || v.back() == '\r')) v.remove_suffix(1);
    if (v.empty() || v.front() == '#' || v.front() == ';') continue;
    if (v.front() == '[' && v.back() == ']') {
      std::string_view name = v.substr(1, v.size() - 2);
      if (name.starts_with("profile ")) name.remove_prefix(8);
      in_profile = name == profile;
      found = found || in_profile;
      continue;
    }
    if (!in_profile) continue;
    const auto eq = v.find('=');
    if (eq == std::string_view::npos) continue;
    std::string_view key = v.substr(0, eq), value = v.substr(eq + 1);
    while (!key.empty() && (key.back() == ' ' || key.back() == '\t')) key.remove_suffix(1);
    while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
    if (key == "aws_access_key_id") c.access_key = std::string(value);
    if (key == "aws_secret_access_key") c.secret_key = std::string(value);
    if (key == "aws_session_token") c.session_token = std::string(value);
  }
  if (!found) throw error(errc::not_found, fmt::format("no keys for {}://{}: looked at {}", l.scheme, l.bucket, looked));
  if (c.access_key.empty() || c.secret_key.empty()) {
    throw error(errc::corrupt, fmt::format("profile [{}] of {} lacks aws_access_key_id or aws_secret_access_key", profile,
                                           file.string()));
  }
  return c;
}

}  // namespace elastic::inline v1::checkpoint::detail::objects
