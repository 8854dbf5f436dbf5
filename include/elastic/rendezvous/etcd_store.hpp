// The store across hosts: etcd v3, spoken to through its JSON gateway (the HTTP/1.1 face of
// its gRPC API, /v3/... since etcd 3.4) with libcurl. URL: etcd://HOST:PORT[,HOST:PORT...],
// or etcds:// for TLS. Needs the elastic::etcd target (libcurl; ELASTIC_WITH_ETCD=1).
//
// Why the JSON gateway and not gRPC: no protobuf/gRPC toolchain or generated code in a
// header-only library; libcurl is one C library every distribution ships (Debian:
// libcurl4-openssl-dev); and etcd's watch, a server-streaming call, reaches us as a long-lived
// HTTP/1.1 response of one JSON object per line, read by the same client.
//
// What maps to what:
//   set          /v3/kv/put (with the lease)          get, list  /v3/kv/range
//   erase        /v3/kv/deleterange                   add        txn on mod_revision, in a loop
//   compare_set  /v3/kv/txn: value == expected, or version == 0 for "absent"
//   wait         a range check, then a watch from the next revision (no event can slip between)
//   grant, keep_alive, revoke   /v3/lease/{grant,keepalive,revoke}
// Keys live under etcd_options::prefix (a namespace: "/elastic/" by default) and travel
// base64-encoded, as the gateway wants bytes.
//
// Lease times to live are whole seconds in etcd: grant() rounds up, and etcd raises a TTL below
// its minimum, 1.5 election timeouts rounded up to a second (2 s with etcd's defaults: a 1 s
// election timeout), to that minimum. etcd notices expiry within about 0.5 s of it.
//
// When no endpoint answers, each call retries, moving to the next endpoint and backing off
// (50 ms doubling to 1 s), for up to etcd_options::unavailable_timeout; then it throws
// errc::unavailable (errc::timeout when the call's own deadline comes first) naming the
// endpoints and each one's last error. So etcd may die and come back
// within that time without the caller noticing. A write whose reply was lost because etcd died
// just after applying it is retried too: set and revoke do the same again; erase then returns
// false; compare_set reports a mismatch whose `actual` is its own `desired`; add() may count
// twice. etcd's own clients retry the same way.
#pragma once

#include <curl/curl.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include <fmt/format.h>

#include <elastic/detail/base64.hpp>
#include <elastic/detail/json.hpp>
#include <elastic/detail/names.hpp>
#include <elastic/error.hpp>
#include <elastic/rendezvous/store.hpp>
#include <elastic/rendezvous/store_url.hpp>

namespace elastic::rendezvous {

/// How an etcd_store talks to etcd.
struct etcd_options {
  /// Every key is stored under this prefix, so that several jobs or tools share one etcd.
  std::string prefix = "/elastic/";
  /// Longest a single request may take (a watch is re-armed after this long, too).
  std::chrono::milliseconds request_timeout = std::chrono::seconds(5);
  /// Longest a TCP (and TLS) connect may take before the next endpoint is tried.
  std::chrono::milliseconds connect_timeout = std::chrono::seconds(1);
  /// How long a call keeps retrying while no endpoint answers before it throws errc::unavailable.
  std::chrono::milliseconds unavailable_timeout = std::chrono::seconds(30);
  /// etcd user and password, when etcd has authentication on (empty user: none).
  std::string user;
  std::string password;
  /// etcds:// only: the CA that signed the servers' certificates (empty: the system's), and a
  /// client certificate and key (PEM) for servers that require one.
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
};

namespace detail {

using elastic::detail::base64_decode;
using elastic::detail::base64_encode;

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

/// libcurl's global state, initialized once per process: it is process-wide by nature (its
/// SSL library and resolver), and never cleaned up, since a handle may outlive any owner.
inline void curl_global() {
  static const CURLcode rc = ::curl_global_init(CURL_GLOBAL_DEFAULT);
  if (rc != CURLE_OK) {
    const std::string why = fmt::format("libcurl cannot initialize: {}", ::curl_easy_strerror(rc));
    // Short of memory, or its SSL library would not start in this process.
    if (rc == CURLE_OUT_OF_MEMORY) throw os_error(why, ENOMEM);
    throw error(errc::not_supported, why);
  }
}

struct curl_cleanup {
  void operator()(CURL* h) const noexcept { ::curl_easy_cleanup(h); }
};
using curl_ptr = std::unique_ptr<CURL, curl_cleanup>;

struct curl_slist_free {
  void operator()(curl_slist* l) const noexcept { ::curl_slist_free_all(l); }
};
using curl_headers = std::unique_ptr<curl_slist, curl_slist_free>;

/// An int64 field of a gateway reply: proto3 JSON writes them as strings and leaves zeros out.
inline std::int64_t int_field(const elastic::detail::json& obj, std::string_view name) {
  const auto* f = obj.find(name);
  if (!f) return 0;
  if (f->is_integer()) return f->as_int64();
  const std::string& s = f->as_string();
  std::int64_t v = 0;
  const auto r = std::from_chars(s.data(), s.data() + s.size(), v);
  if (r.ec != std::errc() || r.ptr != s.data() + s.size()) {
    throw error(errc::corrupt, fmt::format("field '{}' holds '{}', not an integer", name, elastic::detail::printable(s)));
  }
  return v;
}

/// A bytes field of a gateway reply, decoded; absent means empty.
inline std::string bytes_field(const elastic::detail::json& obj, std::string_view name) {
  const auto* f = obj.find(name);
  if (!f) return {};
  auto v = base64_decode(f->as_string());
  if (!v) throw error(errc::corrupt, fmt::format("field '{}' is not base64", name));
  return *std::move(v);
}

}  // namespace detail

/// A store on an etcd v3 cluster (3.4 or newer). Thread-safe: calls from several threads run
/// concurrently, each on a curl handle borrowed from a small pool, so a long wait() in one
/// thread does not hold up keep_alive() in another.
class etcd_store final : public store {
 public:
  /// Connects to the etcd endpoints of `url` (etcd:// or etcds://). With a user, authenticates
  /// now, so that a wrong password fails here (retrying while etcd does not answer).
  explicit etcd_store(const store_url& url, etcd_options options = {})
      : endpoints_(url.endpoints), tls_(url.tls), options_(std::move(options)) {
    if (url.scheme != store_url::kind::etcd || endpoints_.empty()) {
      throw error(errc::invalid_argument, "etcd_store needs an etcd:// or etcds:// URL with at least one HOST:PORT");
    }
    for (std::size_t i = 0; i < endpoints_.size(); ++i) url_ += (i ? "," : "") + endpoint_name(i);
    url_ = (tls_ ? "etcds://" : "etcd://") + url_;
    validate_options();
    detail::curl_global();
    if (!options_.user.empty()) authenticate();
  }
  /// Parses `url` (see parse_store_url) and connects.
  explicit etcd_store(std::string_view url, etcd_options options = {})
      : etcd_store(parse_store_url(url), std::move(options)) {}

  etcd_store(const etcd_store&) = delete;
  etcd_store& operator=(const etcd_store&) = delete;
  ~etcd_store() override = default;

  /// The URL this store talks to, as etcd://HOST:PORT,... (for messages).
  [[nodiscard]] const std::string& url() const noexcept { return url_; }
  [[nodiscard]] const etcd_options& options() const noexcept { return options_; }

  void set(std::string_view key, std::string_view value, lease_id lease = 0) override {
    check_key(key);
    json body;
    body["key"] = detail::base64_encode(full_key(key));
    body["value"] = detail::base64_encode(value);
    if (lease != 0) body["lease"] = std::to_string(lease);
    request("/v3/kv/put", body, [](const json&) {});
  }

  std::optional<std::string> get(std::string_view key) override {
    check_key(key);
    json body;
    body["key"] = detail::base64_encode(full_key(key));
    return request("/v3/kv/range", body, [](const json& r) { return first_value(r); });
  }
  using store::get;

  std::int64_t add(std::string_view key, std::int64_t delta) override {
    check_key(key);
    const std::string k = detail::base64_encode(full_key(key));
    json range;
    range["key"] = k;
    // The key's value and mod_revision (0: absent), then swap on that revision until no one
    // else wrote in between.
    auto current = request("/v3/kv/range", range, [](const json& r) { return first_kv(r); });
    for (;;) {
      const std::int64_t v = (current ? detail::parse_counter(key, current->value) : 0) + delta;
      json cmp;
      cmp["key"] = k;
      if (current) {
        cmp["target"] = "MOD";
        cmp["result"] = "EQUAL";
        cmp["mod_revision"] = std::to_string(current->mod_revision);
      } else {
        cmp["target"] = "VERSION";
        cmp["result"] = "EQUAL";
        cmp["version"] = "0";
      }
      json put;
      put["requestPut"]["key"] = k;
      put["requestPut"]["value"] = detail::base64_encode(std::to_string(v));
      json txn;
      txn["compare"].push_back(std::move(cmp));
      txn["success"].push_back(std::move(put));
      txn["failure"].push_back(json(json::object_t{{"requestRange", range}}));
      const auto [done, now] = request("/v3/kv/txn", txn, [](const json& r) {
        if (r.find("succeeded") && r.at("succeeded").as_bool()) return std::pair{true, std::optional<kv>()};
        return std::pair{false, first_kv(r.at("responses").at(0).at("response_range"))};
      });
      if (done) return v;
      current = now;
    }
  }

  bool compare_set(std::string_view key, std::optional<std::string_view> expected, std::string_view desired,
                   lease_id lease = 0, std::optional<std::string>* actual = nullptr) override {
    check_key(key);
    const std::string k = detail::base64_encode(full_key(key));
    json cmp;
    cmp["key"] = k;
    cmp["result"] = "EQUAL";
    if (expected) {
      // etcd fails a value compare on an absent key, so "" matches only a present empty value.
      cmp["target"] = "VALUE";
      cmp["value"] = detail::base64_encode(*expected);
    } else {
      cmp["target"] = "VERSION";
      cmp["version"] = "0";
    }
    json put;
    put["requestPut"]["key"] = k;
    put["requestPut"]["value"] = detail::base64_encode(desired);
    if (lease != 0) put["requestPut"]["lease"] = std::to_string(lease);
    json range;
    range["requestRange"]["key"] = k;
    json txn;
    txn["compare"].push_back(std::move(cmp));
    txn["success"].push_back(std::move(put));
    txn["failure"].push_back(std::move(range));
    auto [done, now] = request("/v3/kv/txn", txn, [](const json& r) {
      if (r.find("succeeded") && r.at("succeeded").as_bool()) return std::pair{true, std::optional<std::string>()};
      return std::pair{false, first_value(r.at("responses").at(0).at("response_range"))};
    });
    if (!done && actual) *actual = std::move(now);
    return done;
  }

  bool erase(std::string_view key) override {
    check_key(key);
    json body;
    body["key"] = detail::base64_encode(full_key(key));
    return request("/v3/kv/deleterange", body, [](const json& r) { return detail::int_field(r, "deleted") > 0; });
  }

  void wait(std::span<const std::string> keys, std::chrono::milliseconds timeout) override {
    const auto deadline = clock::now() + timeout;
    auto backoff = std::chrono::milliseconds(10);
    for (;;) {
      std::vector<std::string> missing;
      std::int64_t revision = 0;
      try {
        revision = missing_keys(keys, missing, deadline);
      } catch (const error& e) {
        if (e.code() != errc::timeout || clock::now() < deadline) throw;
        throw error(errc::timeout, fmt::format("waited {} ms for {} key(s) while etcd did not answer: {}",
                                               timeout.count(), keys.size(), e.message()));
      }
      if (missing.empty()) return;
      const auto now = clock::now();
      if (now >= deadline) {
        std::string list;
        for (const auto& k : missing) list += (list.empty() ? "'" : ", '") + elastic::detail::printable(k) + "'";
        throw error(errc::timeout, fmt::format("store {}: {} still missing after {} ms", url_, list, timeout.count()));
      }
      // Watch from the revision after our check, so a key set since is reported at once.
      const auto window = std::min(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now),
                                   std::max(options_.request_timeout, std::chrono::milliseconds(100)));
      switch (watch(missing, revision + 1, window)) {
        case watch_result::changed: backoff = std::chrono::milliseconds(10); break;
        case watch_result::quiet: break;
        case watch_result::failed:
          // No watch (etcd away, or it refused this one): poll instead, a little slower each time.
          std::this_thread::sleep_for(std::min(backoff, std::chrono::duration_cast<std::chrono::milliseconds>(
                                                            std::max(deadline - clock::now(), clock::duration::zero()))));
          backoff = std::min(backoff * 2, std::chrono::milliseconds(50));
          break;
      }
    }
  }

  std::vector<std::pair<std::string, std::string>> list(std::string_view prefix) override {
    const std::string from = full_key(prefix);
    json body;
    // etcd refuses an empty key; "\0" is the smallest one it takes (no prefix: every key).
    body["key"] = detail::base64_encode(from.empty() ? std::string(1, '\0') : from);
    body["range_end"] = detail::base64_encode(detail::prefix_end(from));
    auto out = request("/v3/kv/range", body, [&](const json& r) {
      std::vector<std::pair<std::string, std::string>> kvs;
      if (const auto* found = r.find("kvs")) {
        for (const auto& e : found->elements()) {
          std::string k = detail::bytes_field(e, "key");
          if (k.compare(0, options_.prefix.size(), options_.prefix) != 0) {
            throw error(errc::corrupt, fmt::format("a key outside the range asked for, '{}'", elastic::detail::printable(k)));
          }
          kvs.emplace_back(k.substr(options_.prefix.size()), detail::bytes_field(e, "value"));
        }
      }
      return kvs;
    });
    std::sort(out.begin(), out.end());  // etcd sends key order already; this makes it a promise
    return out;
  }

  lease_id grant(std::chrono::milliseconds ttl) override {
    if (ttl.count() <= 0) throw error(errc::invalid_argument, "store lease time to live must be positive");
    const std::int64_t seconds = std::max<std::int64_t>(1, (ttl.count() + 999) / 1000);
    json body;
    body["TTL"] = std::to_string(seconds);
    return request("/v3/lease/grant", body, [](const json& r) {
      if (const auto* e = r.find("error"); e && !e->as_string().empty()) {
        throw error(errc::capacity_exhausted, "etcd granted no lease: " + e->as_string());
      }
      const lease_id id = detail::int_field(r, "ID");
      if (id == 0) throw error(errc::corrupt, "a lease grant without an ID");
      return id;
    });
  }

  void keep_alive(lease_id lease) override {
    json body;
    body["ID"] = std::to_string(lease);
    // A streaming call: each reply is {"result": ...}. An expired or unknown lease has TTL 0.
    const std::int64_t ttl =
        request("/v3/lease/keepalive", body, [](const json& r) { return detail::int_field(r.at("result"), "TTL"); });
    if (ttl <= 0) {
      throw error(errc::not_found, fmt::format("store {}: lease {} has expired; its keys are gone", url_, lease));
    }
  }

  void revoke(lease_id lease) override {
    json body;
    body["ID"] = std::to_string(lease);
    try {
      request("/v3/lease/revoke", body, [](const json&) {});
    } catch (const error& e) {
      if (e.code() != errc::not_found) throw;  // already gone: what revoke wanted
    }
  }

 private:
  using json = elastic::detail::json;
  using clock = std::chrono::steady_clock;

  struct kv {
    std::string value;
    std::int64_t mod_revision = 0;
  };

  enum class watch_result { changed, quiet, failed };

  /// An etcd error reply: its gRPC code and message.
  struct grpc_failure {
    int code = 0;
    std::string message;
  };

  /// A reply that says the endpoint cannot serve now (retry elsewhere or later), or that our
  /// token lapsed (sign in again).
  struct unavailable {
    std::string what;
    bool token_lapsed = false;
  };

  // gRPC status codes the gateway reports.
  static constexpr std::string_view auth_path = "/v3/auth/authenticate";

  static constexpr int grpc_invalid_argument = 3, grpc_deadline_exceeded = 4, grpc_not_found = 5,
                       grpc_permission_denied = 7, grpc_resource_exhausted = 8, grpc_failed_precondition = 9,
                       grpc_unimplemented = 12, grpc_unavailable = 14, grpc_unauthenticated = 16;

  static std::optional<kv> first_kv(const json& range_reply) {
    const auto* kvs = range_reply.find("kvs");
    if (!kvs || kvs->size() == 0) return std::nullopt;
    const auto& e = kvs->at(std::size_t{0});
    return kv{detail::bytes_field(e, "value"), detail::int_field(e, "mod_revision")};
  }
  static std::optional<std::string> first_value(const json& range_reply) {
    if (auto e = first_kv(range_reply)) return std::move(e->value);
    return std::nullopt;
  }

  std::string endpoint_name(std::size_t i) const {
    const auto& e = endpoints_[i];
    return e.host.find(':') != std::string::npos ? fmt::format("[{}]:{}", e.host, e.port)
                                                 : fmt::format("{}:{}", e.host, e.port);
  }

  void validate_options() const {
    auto positive = [&](std::chrono::milliseconds v, const char* name) {
      if (v.count() <= 0) {
        throw error(errc::invalid_argument, fmt::format("etcd_options::{} is {} ms: give a positive time", name, v.count()));
      }
    };
    positive(options_.request_timeout, "request_timeout");
    positive(options_.connect_timeout, "connect_timeout");
    positive(options_.unavailable_timeout, "unavailable_timeout");
    if (options_.user.empty() && !options_.password.empty()) {
      throw error(errc::invalid_argument, "etcd_options has a password but no user: set etcd_options::user too");
    }
    const bool any_tls_file = !options_.ca_file.empty() || !options_.cert_file.empty() || !options_.key_file.empty();
    if (any_tls_file && !tls_) {
      throw error(errc::invalid_argument, fmt::format("etcd_options names TLS files but the URL {} is plain: write "
                                                      "etcds:// to use TLS",
                                                      url_));
    }
    if (options_.cert_file.empty() != options_.key_file.empty()) {
      throw error(errc::invalid_argument, "etcd_options needs both cert_file and key_file for a client certificate, or "
                                          "neither");
    }
    for (const auto* f : {&options_.ca_file, &options_.cert_file, &options_.key_file}) {
      std::error_code ec;
      if (!f->empty() && !std::filesystem::is_regular_file(*f, ec)) {
        throw error(errc::not_found, fmt::format("TLS file '{}' for {} does not exist or is not a file",
                                                 elastic::detail::printable(*f), url_));
      }
    }
  }

  std::string full_key(std::string_view key) const { return options_.prefix + std::string(key); }

  void check_key(std::string_view key) const {
    if (key.empty()) throw error(errc::invalid_argument, fmt::format("store {}: a key must not be empty", url_));
  }

  /// Fills `missing` with the keys that do not exist; returns the revision the check saw.
  /// Gives up (errc::timeout) at `give_up_by` when etcd does not answer until then.
  std::int64_t missing_keys(std::span<const std::string> keys, std::vector<std::string>& missing,
                            clock::time_point give_up_by) {
    // One read-only transaction per 64 keys (etcd allows 128 operations in one): each sees one
    // revision; the earliest is where a watch must start.
    std::int64_t revision = 0;
    for (std::size_t at = 0; at < keys.size(); at += 64) {
      const auto chunk = keys.subspan(at, std::min<std::size_t>(64, keys.size() - at));
      json txn;
      for (const auto& k : chunk) {
        check_key(k);
        json range;
        range["requestRange"]["key"] = detail::base64_encode(full_key(k));
        range["requestRange"]["count_only"] = true;
        txn["success"].push_back(std::move(range));
      }
      const auto rev = request("/v3/kv/txn", txn, [&](const json& r) {
        const auto& responses = r.at("responses");
        for (std::size_t i = 0; i < chunk.size(); ++i) {
          if (detail::int_field(responses.at(i).at("response_range"), "count") == 0) missing.push_back(chunk[i]);
        }
        return detail::int_field(r.at("header"), "revision");
      }, true, give_up_by);
      revision = revision == 0 ? rev : std::min(revision, rev);
    }
    return revision;
  }

  // --- HTTP ---------------------------------------------------------------------------------

  /// A curl handle borrowed from the pool; goes back on destruction.
  class borrowed {
   public:
    explicit borrowed(etcd_store& s) : s_(s), h_(s.take_handle()) {}
    ~borrowed() { s_.give_back(std::move(h_)); }
    borrowed(const borrowed&) = delete;
    borrowed& operator=(const borrowed&) = delete;
    [[nodiscard]] CURL* get() const noexcept { return h_.get(); }

   private:
    etcd_store& s_;
    detail::curl_ptr h_;
  };

  detail::curl_ptr take_handle() {
    {
      std::lock_guard lk(pool_mutex_);
      if (!idle_.empty()) {
        auto h = std::move(idle_.back());
        idle_.pop_back();
        return h;
      }
    }
    detail::curl_ptr h(::curl_easy_init());
    if (!h) throw os_error("libcurl cannot make a handle", ENOMEM);  // its only reason to fail
    CURL* c = h.get();
    ::curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);  // no SIGALRM for timeouts: we live among threads
    ::curl_easy_setopt(c, CURLOPT_HTTP_VERSION, static_cast<long>(CURL_HTTP_VERSION_1_1));  // the gateway
    ::curl_easy_setopt(c, CURLOPT_PROXY, "");  // etcd members are reached directly, never via $http_proxy
    ::curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(options_.connect_timeout.count()));
    ::curl_easy_setopt(c, CURLOPT_TCP_KEEPALIVE, 1L);
    ::curl_easy_setopt(c, CURLOPT_POST, 1L);
    if (tls_) {
      if (!options_.ca_file.empty()) ::curl_easy_setopt(c, CURLOPT_CAINFO, options_.ca_file.c_str());
      if (!options_.cert_file.empty()) ::curl_easy_setopt(c, CURLOPT_SSLCERT, options_.cert_file.c_str());
      if (!options_.key_file.empty()) ::curl_easy_setopt(c, CURLOPT_SSLKEY, options_.key_file.c_str());
    }
    return h;
  }

  void give_back(detail::curl_ptr h) noexcept {
    try {
      std::lock_guard lk(pool_mutex_);
      idle_.push_back(std::move(h));
    } catch (...) {
      // Out of memory for the pool: the handle is freed instead.
    }
  }

  static std::size_t append_body(char* data, std::size_t, std::size_t n, void* out) {
    static_cast<std::string*>(out)->append(data, n);
    return n;
  }

  /// The headers every request carries, and Authorization with our token when `with_token`.
  detail::curl_headers headers(bool with_token) {
    curl_slist* l = ::curl_slist_append(nullptr, "Content-Type: application/json");
    if (l) l = ::curl_slist_append(l, "Expect:");  // no 100-continue round trip for large values
    if (with_token && !options_.user.empty() && l) {
      std::lock_guard lk(token_mutex_);
      if (!token_.empty()) l = ::curl_slist_append(l, ("Authorization: " + token_).c_str());
    }
    if (!l) throw os_error("libcurl cannot make a header list", ENOMEM);  // its only reason to fail
    return detail::curl_headers(l);
  }

  /// Prepares `h` for a POST of `body` to `path` on endpoint `ep` (curl copies the URL).
  void prepare(CURL* h, std::size_t ep, std::string_view path, const std::string& body, curl_slist* hdrs,
               std::chrono::milliseconds timeout, char* errbuf) const {
    const std::string url = fmt::format("{}://{}{}", tls_ ? "https" : "http", endpoint_name(ep), path);
    ::curl_easy_setopt(h, CURLOPT_URL, url.c_str());
    ::curl_easy_setopt(h, CURLOPT_POSTFIELDS, body.c_str());
    ::curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
    ::curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
    ::curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, static_cast<long>(std::max<std::int64_t>(1, timeout.count())));
    ::curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
    errbuf[0] = '\0';
  }

  static std::string curl_message(CURLcode rc, const char* errbuf) {
    std::string m = errbuf[0] ? std::string(errbuf) : std::string(::curl_easy_strerror(rc));
    while (!m.empty() && (m.back() == '\n' || m.back() == ' ')) m.pop_back();
    return m;
  }

  /// A curl failure that no retry can mend: our own TLS files, or a certificate the server's
  /// name or CA does not match.
  static bool configuration_failure(CURLcode rc) noexcept {
    return rc == CURLE_SSL_CERTPROBLEM || rc == CURLE_SSL_CACERT_BADFILE || rc == CURLE_PEER_FAILED_VERIFICATION ||
           rc == CURLE_SSL_CRL_BADFILE || rc == CURLE_UNSUPPORTED_PROTOCOL;
  }

  /// The gRPC error in a gateway reply, if it is one: {"error": "...", "code": N, "message": ...}
  /// for plain calls, {"error": {"grpc_code": N, "message": ...}} for streaming ones.
  static std::optional<grpc_failure> failure_of(const json& r) {
    const auto* e = r.find("error");
    if (!e) return std::nullopt;
    if (e->is_object()) {
      grpc_failure f{static_cast<int>(detail::int_field(*e, "grpc_code")), {}};
      if (const auto* m = e->find("message"); m && m->is_string()) f.message = m->as_string();
      return f;
    }
    if (!r.find("code")) return std::nullopt;  // LeaseGrantResponse has a string field "error" too
    grpc_failure f{static_cast<int>(detail::int_field(r, "code")), {}};
    if (const auto* m = r.find("message"); m && m->is_string()) f.message = m->as_string();
    if (f.message.empty() && e->is_string()) f.message = e->as_string();
    return f;
  }

  /// The error for a gRPC failure that retrying does not mend.
  error failure_error(std::size_t ep, std::string_view path, const grpc_failure& f) const {
    const std::string who = fmt::format("store {}: etcd at {}", url_, endpoint_name(ep));
    const std::string user = elastic::detail::printable(options_.user);
    if (path == auth_path && f.code == grpc_invalid_argument) {
      return error(errc::invalid_argument, fmt::format("{} refused user '{}': {}: check etcd_options::user and password",
                                                       who, user, f.message));
    }
    if (f.message.find("authentication is not enabled") != std::string::npos) {
      return error(errc::invalid_argument, fmt::format("{} has authentication off, yet etcd_options::user is '{}': "
                                                       "leave the user empty or enable auth in etcd",
                                                       who, user));
    }
    if (f.message.find("user name is empty") != std::string::npos) {
      return error(errc::invalid_argument, fmt::format("{} refused {}: {}: etcd has authentication on; set "
                                                       "etcd_options::user and password",
                                                       who, path, f.message));
    }
    const std::string where = fmt::format("{} refused {}: {}", who, path, f.message);
    switch (f.code) {
      case grpc_not_found: return error(errc::not_found, where);
      case grpc_unimplemented:
        return error(errc::version_mismatch, fmt::format("{} (gRPC code 12): this store needs etcd 3.4 or newer", where));
      case grpc_unauthenticated:
      case grpc_permission_denied:
        return error(errc::invalid_argument, fmt::format("{}: check that user '{}' and its role may read and write "
                                                         "keys under '{}'",
                                                         where, user, elastic::detail::printable(options_.prefix)));
      case grpc_invalid_argument:
      case grpc_failed_precondition: return error(errc::invalid_argument, fmt::format("{} (gRPC code {})", where, f.code));
      default: return error(errc::corrupt, fmt::format("{} (gRPC code {})", where, f.code));
    }
  }

  /// One attempt of POST `path` on endpoint `ep`: the parsed reply, or `unavailable` when the
  /// endpoint cannot serve it now. Throws what retrying cannot mend.
  std::variant<json, unavailable> attempt(std::size_t ep, std::string_view path, const std::string& body,
                                          bool with_token) {
    borrowed h(*this);
    auto hdrs = headers(with_token);
    std::string reply;
    char errbuf[CURL_ERROR_SIZE];
    prepare(h.get(), ep, path, body, hdrs.get(), options_.request_timeout, errbuf);
    ::curl_easy_setopt(h.get(), CURLOPT_WRITEFUNCTION, &etcd_store::append_body);
    ::curl_easy_setopt(h.get(), CURLOPT_WRITEDATA, &reply);
    const CURLcode rc = ::curl_easy_perform(h.get());
    ::curl_easy_setopt(h.get(), CURLOPT_ERRORBUFFER, nullptr);
    if (rc != CURLE_OK) {
      if (configuration_failure(rc)) {
        throw error(errc::invalid_argument,
                    fmt::format("store {}: cannot talk TLS to {}: {}: check etcd_options::ca_file, cert_file and "
                                "key_file",
                                url_, endpoint_name(ep), curl_message(rc, errbuf)));
      }
      return unavailable{curl_message(rc, errbuf)};
    }
    long status = 0;
    ::curl_easy_getinfo(h.get(), CURLINFO_RESPONSE_CODE, &status);
    json r;
    try {
      r = json::parse(reply);
    } catch (const error&) {
      if (status >= 500) return unavailable{fmt::format("HTTP {}", status)};
      const std::string quoted = elastic::detail::printable(std::string_view(reply).substr(0, 120));
      if (status == 404) {
        throw error(errc::version_mismatch,
                    fmt::format("store {}: {} has no etcd v3 JSON gateway at {} (HTTP 404 '{}'): point the URL at the "
                                "client port of etcd 3.4 or newer",
                                url_, endpoint_name(ep), path, quoted));
      }
      throw error(errc::corrupt, fmt::format("store {}: {} sent a reply to {} that is not JSON (HTTP {}, '{}'): is "
                                             "it an etcd client port?",
                                             url_, endpoint_name(ep), path, status, quoted));
    }
    if (auto f = failure_of(r)) {
      if (f->code == grpc_unavailable || f->code == grpc_deadline_exceeded || f->code == grpc_resource_exhausted) {
        return unavailable{f->message};
      }
      if (with_token && !options_.user.empty() &&
          (f->code == grpc_unauthenticated || f->message.find("invalid auth token") != std::string::npos ||
           f->message.find("user name is empty") != std::string::npos)) {
        return unavailable{f->message, true};  // the token lapsed (or etcd restarted): sign in again
      }
      throw failure_error(ep, path, *f);
    }
    if (!r.is_object() || status != 200) {
      throw error(errc::corrupt, fmt::format("store {}: {} sent an unexpected reply to {} (HTTP {}, '{}')", url_,
                                             endpoint_name(ep), path, status,
                                             elastic::detail::printable(std::string_view(reply).substr(0, 120))));
    }
    return r;
  }

  /// POSTs `body` to `path`, retrying across endpoints while none answers (up to
  /// unavailable_timeout, or `give_up_by` if sooner), and returns `read(reply)`. A reply `read`
  /// cannot make sense of is errc::corrupt, naming the endpoint.
  template <class Read>
  std::invoke_result_t<Read&, const json&> request(std::string_view path, const json& body, Read&& read,
                                                   bool with_token = true,
                                                   clock::time_point give_up_by = clock::time_point::max()) {
    const std::string text = body.dump();
    std::optional<clock::time_point> failing_since;
    auto backoff = std::chrono::milliseconds(50);
    std::size_t failed_in_turn = 0;
    bool signed_in_again = false;
    std::vector<std::string> last(endpoints_.size());  // each endpoint's latest failure
    for (;;) {
      const std::size_t ep = preferred_.load(std::memory_order_relaxed) % endpoints_.size();
      auto outcome = attempt(ep, path, text, with_token);
      if (auto* r = std::get_if<json>(&outcome)) {
        try {
          return read(*r);
        } catch (const error& e) {
          if (e.code() != errc::corrupt) throw;
          throw error(errc::corrupt, fmt::format("store {}: {} sent a reply to {} we cannot read ({}): '{}'", url_,
                                                 endpoint_name(ep), path, e.message(),
                                                 elastic::detail::printable(r->dump().substr(0, 200))));
        }
      }
      auto& down = std::get<unavailable>(outcome);
      if (down.token_lapsed && !signed_in_again) {
        signed_in_again = true;
        authenticate();
        continue;
      }
      last[ep] = std::move(down.what);
      const auto now = clock::now();
      if (!failing_since) failing_since = now;
      const bool out_of_patience = now - *failing_since >= options_.unavailable_timeout;
      if (out_of_patience || now >= give_up_by) {
        std::string errors;
        for (std::size_t i = 0; i < endpoints_.size(); ++i) {
          if (!last[i].empty()) errors += fmt::format("{}{}: {}", errors.empty() ? "" : "; ", endpoint_name(i), last[i]);
        }
        // Unreachable for all of unavailable_timeout is an outage; the caller's own deadline
        // coming first is only its wait running out (callers that poll retry on that).
        throw error(out_of_patience ? errc::unavailable : errc::timeout,
                    fmt::format("store {}: no etcd endpoint answered {} for {} ms ({}): check that etcd runs there "
                                "and is reachable, or raise etcd_options::unavailable_timeout ({} ms)",
                                url_, path,
                                std::chrono::duration_cast<std::chrono::milliseconds>(now - *failing_since).count(),
                                errors, options_.unavailable_timeout.count()));
      }
      // Next endpoint at once; after a whole turn without an answer, back off.
      std::size_t expected = ep;
      preferred_.compare_exchange_strong(expected, (ep + 1) % endpoints_.size(), std::memory_order_relaxed);
      if (++failed_in_turn >= endpoints_.size()) {
        failed_in_turn = 0;
        const auto left = std::min<clock::duration>(options_.unavailable_timeout - (now - *failing_since),
                                                    give_up_by - now);
        std::this_thread::sleep_for(std::min<clock::duration>(backoff, left));
        backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
      }
    }
  }

  /// Signs in with user and password and keeps the token for the requests that follow.
  void authenticate() {
    json body;
    body["name"] = options_.user;
    body["password"] = options_.password;
    std::string token = request(
        auth_path, body, [](const json& r) { return r.at("token").as_string(); }, false);
    std::lock_guard lk(token_mutex_);
    token_ = std::move(token);
  }

  /// Streams /v3/watch for puts to the keys in `missing` from `revision` on, for up to `window`.
  watch_result watch(const std::vector<std::string>& missing, std::int64_t revision, std::chrono::milliseconds window) {
    // One watch on the range spanning the missing keys: any put there wakes us to check again.
    std::string lo = full_key(missing.front()), hi = lo;
    for (const auto& k : missing) {
      const std::string f = full_key(k);
      lo = std::min(lo, f);
      hi = std::max(hi, f);
    }
    json create;
    create["key"] = detail::base64_encode(lo);
    if (missing.size() > 1) create["range_end"] = detail::base64_encode(hi + '\0');
    create["start_revision"] = std::to_string(revision);
    create["filters"].push_back("NODELETE");
    json body;
    body["create_request"] = std::move(create);
    const std::string text = body.dump();

    struct stream {
      std::string buffer;
      watch_result result = watch_result::quiet;
      bool done = false;
    } st;
    // Each line is one message; events (or a cancellation, or an error) end the watch.
    auto on_data = +[](char* data, std::size_t, std::size_t n, void* p) -> std::size_t {
      auto& s = *static_cast<stream*>(p);
      try {
        s.buffer.append(data, n);
        for (std::size_t nl; (nl = s.buffer.find('\n')) != std::string::npos;) {
          const std::string line = s.buffer.substr(0, nl);
          s.buffer.erase(0, nl + 1);
          if (line.find_first_not_of(" \r\t") == std::string::npos) continue;
          const json m = json::parse(line);
          const auto* r = m.find("result");
          if (!r) {
            s.result = watch_result::failed;
            s.done = true;
          } else if (const auto* ev = r->find("events"); ev && ev->size() > 0) {
            s.result = watch_result::changed;
            s.done = true;
          } else if (const auto* c = r->find("canceled"); c && c->is_bool() && c->as_bool()) {
            // Compacted past our revision, or refused: check again, without a watch if need be.
            s.result = r->find("compact_revision") ? watch_result::changed : watch_result::failed;
            s.done = true;
          }
          if (s.done) return 0;  // stops the transfer
        }
        return n;
      } catch (...) {
        s.result = watch_result::failed;
        s.done = true;
        return 0;
      }
    };

    const std::size_t ep = preferred_.load(std::memory_order_relaxed) % endpoints_.size();
    borrowed h(*this);
    auto hdrs = headers(true);
    char errbuf[CURL_ERROR_SIZE];
    prepare(h.get(), ep, "/v3/watch", text, hdrs.get(), window, errbuf);
    ::curl_easy_setopt(h.get(), CURLOPT_WRITEFUNCTION, on_data);
    ::curl_easy_setopt(h.get(), CURLOPT_WRITEDATA, &st);
    const CURLcode rc = ::curl_easy_perform(h.get());
    ::curl_easy_setopt(h.get(), CURLOPT_ERRORBUFFER, nullptr);
    if (st.done) return st.result;
    if (rc == CURLE_OPERATION_TIMEDOUT) return watch_result::quiet;
    return watch_result::failed;  // the stream ended or broke: the next check finds out why
  }

  std::vector<endpoint> endpoints_;
  bool tls_ = false;
  etcd_options options_;
  std::string url_;
  std::atomic<std::size_t> preferred_{0};  ///< the endpoint that answered last

  std::mutex pool_mutex_;
  std::vector<detail::curl_ptr> idle_;

  std::mutex token_mutex_;
  std::string token_;
};

}  // namespace elastic::rendezvous
