// The keys of an s3:// or gs:// checkpoint directory, the ways the platforms hand them to a pod,
// in the AWS tools' order, and kept fresh. Needs libcurl (elastic::s3).
//
//   1. Keys in the environment (GCS_ACCESS_KEY_ID/GCS_SECRET_ACCESS_KEY for gs://, then
//      AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY/AWS_SESSION_TOKEN), or the shared credentials
//      file's profile (object_location.hpp's resolve_credentials).
//   2. A web identity (EKS IAM roles for service accounts): AWS_WEB_IDENTITY_TOKEN_FILE and
//      AWS_ROLE_ARN, exchanged with STS (AssumeRoleWithWebIdentity; AWS_ENDPOINT_URL_STS, else
//      https://sts.REGION.amazonaws.com) for keys that expire.
//   3. A container credentials endpoint (EKS Pod Identity, ECS):
//      AWS_CONTAINER_CREDENTIALS_FULL_URI (with AWS_CONTAINER_AUTHORIZATION_TOKEN[_FILE]) or
//      AWS_CONTAINER_CREDENTIALS_RELATIVE_URI on 169.254.170.2.
//   4. The machine's metadata server: for gs://, GKE Workload Identity or a VM's service account
//      (GCE_METADATA_HOST, else metadata.google.internal): an OAuth token sent as a bearer; for
//      s3://, EC2's instance role through IMDSv2 (169.254.169.254; AWS_EC2_METADATA_DISABLED=true
//      skips it). One try of a second each: off such a machine they fail fast.
// Expiring keys and tokens are fetched again five minutes before they expire (or at half their
// life when it is shorter), under a lock, so concurrent requests never sign with stale keys.
#pragma once

#include <curl/curl.h>

#include <chrono>
#include <ctime>
#include <fstream>
#include <functional>
#include <iterator>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <elastic/checkpoint/detail/object_location.hpp>
#include <elastic/checkpoint/detail/s3_wire.hpp>
#include <elastic/checkpoint/detail/sigv4.hpp>
#include <elastic/error.hpp>
#include <elastic/internal/curl.hpp>
#include <elastic/internal/json.hpp>

namespace elastic::inline v1::checkpoint::detail::objects {

/// What a request is authorized with: keys to sign it (SigV4), or a bearer token (GCS OAuth).
struct session {
  sigv4::credentials keys;
  std::string bearer;
  std::chrono::system_clock::time_point expires = std::chrono::system_clock::time_point::max();
  std::string source;  ///< where they came from, for messages ("environment", "web identity", ...)
};

namespace credentials_detail {

struct http_answer {
  long status = 0;
  std::string body;
};

/// One request to a credentials endpoint (no retry: the caller's whole resolution is retried by
/// the next request that needs keys).
inline http_answer fetch(const std::string& method, const std::string& url, const std::vector<std::string>& headers,
                         std::chrono::milliseconds timeout, bool link_local = true) {
  internal::curl_global();
  internal::curl_ptr h(::curl_easy_init());
  if (!h) throw os_error("libcurl cannot make a handle", ENOMEM);
  curl_slist* list = nullptr;
  for (const auto& line : headers) {
    curl_slist* l = ::curl_slist_append(list, line.c_str());
    if (!l) {
      ::curl_slist_free_all(list);
      throw os_error("libcurl cannot make a header list", ENOMEM);
    }
    list = l;
  }
  internal::curl_headers owned(list);
  http_answer a;
  CURL* e = h.get();
  ::curl_easy_setopt(e, CURLOPT_URL, url.c_str());
  ::curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  if (link_local) ::curl_easy_setopt(e, CURLOPT_PROXY, "");  // a metadata endpoint: never via a proxy
  ::curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(timeout.count()));
  ::curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, static_cast<long>(timeout.count() * 5));
  ::curl_easy_setopt(e, CURLOPT_HTTPHEADER, owned.get());
  if (method == "PUT") ::curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, "PUT");
  ::curl_easy_setopt(e, CURLOPT_WRITEDATA, &a.body);
  ::curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, +[](char* d, std::size_t, std::size_t n, void* p) -> std::size_t {
    auto* body = static_cast<std::string*>(p);
    if (body->size() < (1u << 20)) body->append(d, n);
    return n;
  });
  const CURLcode rc = ::curl_easy_perform(e);
  if (rc != CURLE_OK) {
    throw error(errc::unavailable, fmt::format("{} {}: {}", method, url, ::curl_easy_strerror(rc)));
  }
  ::curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &a.status);
  return a;
}

/// An ISO 8601 UTC time (2026-11-27T15:04:05Z, fractions ignored) as a time point.
inline std::chrono::system_clock::time_point parse_time(const std::string& t, const std::string& what) {
  std::tm tm{};
  if (t.size() < 19 || std::sscanf(t.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
                                   &tm.tm_min, &tm.tm_sec) != 6) {
    throw error(errc::corrupt, fmt::format("{} gave an expiration '{}' that is not an ISO 8601 time", what, t));
  }
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  return std::chrono::system_clock::from_time_t(::timegm(&tm));
}

inline std::string read_file(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw error(errc::not_found, fmt::format("{}: cannot read {}", what, path));
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

inline void check_ok(const http_answer& a, const std::string& what) {
  if (a.status < 200 || a.status >= 300) {
    const std::string code = xml::first(a.body, "Code"), message = xml::first(a.body, "Message");
    throw error(errc::invalid_argument, fmt::format("{} refused: HTTP {}{}{}", what, a.status,
                                                    code.empty() ? "" : " " + code,
                                                    message.empty() ? "" : ": " + message));
  }
}

inline session web_identity(const location& l, const environment& env) {
  const std::string token = read_file(*env("AWS_WEB_IDENTITY_TOKEN_FILE"), "AWS_WEB_IDENTITY_TOKEN_FILE");
  const std::string region = env("AWS_REGION").value_or(env("AWS_DEFAULT_REGION").value_or(l.region));
  std::string sts = env("AWS_ENDPOINT_URL_STS").value_or(fmt::format("https://sts.{}.amazonaws.com", region));
  while (sts.ends_with('/')) sts.pop_back();
  const std::string role = *env("AWS_ROLE_ARN");
  const std::string name = env("AWS_ROLE_SESSION_NAME").value_or("elastic-checkpoint");
  const std::string url =
      fmt::format("{}/?Action=AssumeRoleWithWebIdentity&Version=2011-06-15&RoleArn={}&RoleSessionName={}&"
                  "WebIdentityToken={}",
                  sts, sigv4::uri_encode(role, false), sigv4::uri_encode(name, false), sigv4::uri_encode(token, false));
  const std::string what = "STS AssumeRoleWithWebIdentity for " + role;
  const auto a = fetch("GET", url, {"Accept: application/xml"}, std::chrono::seconds(5), false);  // STS: public
  check_ok(a, what);
  session s;
  s.keys = {xml::first(a.body, "AccessKeyId"), xml::first(a.body, "SecretAccessKey"), xml::first(a.body, "SessionToken")};
  if (s.keys.access_key.empty() || s.keys.secret_key.empty()) throw error(errc::corrupt, what + " answered no keys");
  s.expires = parse_time(xml::first(a.body, "Expiration"), what);
  s.source = "web identity (" + role + ")";
  return s;
}

inline session container(const environment& env) {
  std::string url;
  if (auto full = env("AWS_CONTAINER_CREDENTIALS_FULL_URI")) {
    url = *full;
  } else {
    url = "http://169.254.170.2" + *env("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI");
  }
  std::vector<std::string> headers;
  if (auto f = env("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE")) {
    headers.push_back("Authorization: " + read_file(*f, "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE"));
  } else if (auto t = env("AWS_CONTAINER_AUTHORIZATION_TOKEN")) {
    headers.push_back("Authorization: " + *t);
  }
  const std::string what = "the container credentials endpoint " + url;
  const auto a = fetch("GET", url, headers, std::chrono::seconds(2));
  check_ok(a, what);
  const auto doc = internal::json::parse(a.body);
  session s;
  s.keys = {doc.at("AccessKeyId").as_string(), doc.at("SecretAccessKey").as_string(),
            doc.find("Token") ? doc.at("Token").as_string() : std::string()};
  if (const auto* x = doc.find("Expiration")) s.expires = parse_time(x->as_string(), what);
  s.source = "container credentials";
  return s;
}

inline session gce_metadata(const environment& env) {
  const std::string host = env("GCE_METADATA_HOST").value_or("metadata.google.internal");
  const std::string url = "http://" + host + "/computeMetadata/v1/instance/service-accounts/default/token";
  const std::string what = "the metadata server " + host;
  const auto a = fetch("GET", url, {"Metadata-Flavor: Google"}, std::chrono::seconds(1));
  check_ok(a, what);
  const auto doc = internal::json::parse(a.body);
  session s;
  s.bearer = doc.at("access_token").as_string();
  s.expires = std::chrono::system_clock::now() + std::chrono::seconds(doc.at("expires_in").as_int64());
  s.source = "the metadata server's service account";
  return s;
}

inline session ec2_instance_role() {
  const std::string base = "http://169.254.169.254/latest";
  const auto token = fetch("PUT", base + "/api/token", {"X-aws-ec2-metadata-token-ttl-seconds: 21600"}, std::chrono::seconds(1));
  check_ok(token, "EC2's metadata service");
  const std::string auth = "X-aws-ec2-metadata-token: " + token.body;
  const auto roles = fetch("GET", base + "/meta-data/iam/security-credentials/", {auth}, std::chrono::seconds(1));
  check_ok(roles, "EC2's metadata service");
  const std::string role = roles.body.substr(0, roles.body.find('\n'));
  const auto a = fetch("GET", base + "/meta-data/iam/security-credentials/" + role, {auth}, std::chrono::seconds(1));
  check_ok(a, "EC2's metadata service");
  const auto doc = internal::json::parse(a.body);
  session s;
  s.keys = {doc.at("AccessKeyId").as_string(), doc.at("SecretAccessKey").as_string(), doc.at("Token").as_string()};
  s.expires = parse_time(doc.at("Expiration").as_string(), "EC2's metadata service");
  s.source = "the instance role " + role;
  return s;
}

}  // namespace credentials_detail

/// The current keys or token of one location, fetched again before they expire.
class credential_source {
 public:
  /// Finds where the keys come from (the order above) and fetches them once, so that a wrong
  /// setting fails when the directory is opened. Throws errc::not_found naming every place it
  /// looked when none has keys.
  explicit credential_source(const location& l, const environment& env = process_environment) {
    namespace cd = credentials_detail;
    std::string looked;
    try {
      cached_ = session{resolve_credentials(l, env), {}, std::chrono::system_clock::time_point::max(), "static keys"};
      return;
    } catch (const error& e) {
      if (e.code() != errc::not_found) throw;
      looked = e.message();
    }
    if (env("AWS_WEB_IDENTITY_TOKEN_FILE") && env("AWS_ROLE_ARN")) {
      fetch_ = [l, env] { return cd::web_identity(l, env); };
    } else if (env("AWS_CONTAINER_CREDENTIALS_FULL_URI") || env("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI")) {
      fetch_ = [env] { return cd::container(env); };
    } else if (l.scheme == "gs") {
      fetch_ = [env] { return cd::gce_metadata(env); };
    } else if (env("AWS_EC2_METADATA_DISABLED").value_or("") != "true") {
      fetch_ = [] { return cd::ec2_instance_role(); };
    }
    if (!fetch_) throw error(errc::not_found, looked + "; no web identity, container or metadata credentials either");
    try {
      cached_ = fetch_();
    } catch (const error& e) {
      throw error(e.code() == errc::unavailable ? errc::not_found : e.code(),
                  fmt::format("{}; then: {}", looked, e.message()));
    }
  }

  /// Fixed keys (tests, tools).
  explicit credential_source(sigv4::credentials keys)
      : cached_{std::move(keys), {}, std::chrono::system_clock::time_point::max(), "given keys"} {}

  /// Keys or a token valid for at least a few more minutes.
  session current() {
    std::lock_guard lk(mu_);
    if (fetch_) {
      const auto now = std::chrono::system_clock::now();
      const auto margin = std::min<std::chrono::system_clock::duration>(std::chrono::minutes(5), (cached_.expires - fetched_) / 2);
      if (now + margin >= cached_.expires) {
        cached_ = fetch_();
        fetched_ = now;
      }
    }
    return cached_;
  }

 private:
  std::mutex mu_;
  std::function<session()> fetch_;  // empty: keys that never expire
  session cached_;
  std::chrono::system_clock::time_point fetched_ = std::chrono::system_clock::now();
};

}  // namespace elastic::inline v1::checkpoint::detail::objects
