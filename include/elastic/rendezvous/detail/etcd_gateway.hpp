// The HTTP client of the etcd v3 JSON gateway under etcd_store: it POSTs a JSON body to one of
// the endpoints, fails over to the next while none answers and backs off (50 ms doubling to
// 1 s) for up to etcd_options::unavailable_timeout, signs in (and again when the token lapses),
// and turns the gateway's gRPC failures into elastic::error with what to do. Thread-safe: each
// call borrows a curl handle from a small pool. A streaming call (a watch) borrows a handle and
// the request headers from here and reads the stream itself (detail/etcd_watch.hpp).
//
// Contract: request() returns `read(reply)` or throws errc::unavailable (no endpoint for the
// whole unavailable_timeout), errc::timeout (the caller's give_up_by came first), or an error
// that retrying cannot mend (TLS files, auth, an endpoint that is not etcd), each naming the
// store URL and the endpoint.
#pragma once

#include <curl/curl.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include <fmt/format.h>

#include <elastic/internal/json.hpp>
#include <elastic/internal/names.hpp>
#include <elastic/error.hpp>
#include <elastic/internal/curl.hpp>
#include <elastic/rendezvous/detail/etcd_reply.hpp>
#include <elastic/rendezvous/etcd_options.hpp>
#include <elastic/rendezvous/store_url.hpp>

namespace elastic::inline v1::rendezvous::detail {

/// The etcd endpoints of one store URL, with failover, retry and authentication.
class etcd_gateway {
 public:
  using json = internal::json;
  using clock = std::chrono::steady_clock;

  /// Checks `url` and `options`; with a user, authenticates now, so that a wrong password fails
  /// here (retrying while etcd does not answer).
  etcd_gateway(const store_url& url, etcd_options options)
      : endpoints_(url.endpoints), tls_(url.tls), options_(std::move(options)) {
    if (url.scheme != store_url::kind::etcd || endpoints_.empty()) {
      throw error(errc::invalid_argument, "etcd_store needs an etcd:// or etcds:// URL with at least one HOST:PORT");
    }
    for (std::size_t i = 0; i < endpoints_.size(); ++i) url_ += (i ? "," : "") + endpoint_name(i);
    url_ = (tls_ ? "etcds://" : "etcd://") + url_;
    validate_options();
    internal::curl_global();
    if (!options_.user.empty()) authenticate();
  }

  etcd_gateway(const etcd_gateway&) = delete;
  etcd_gateway& operator=(const etcd_gateway&) = delete;

  /// The URL, as etcd://HOST:PORT,... (for messages).
  [[nodiscard]] const std::string& url() const noexcept { return url_; }
  [[nodiscard]] const etcd_options& options() const noexcept { return options_; }
  /// HTTP requests sent so far (each attempt and each watch stream counts once): the store load
  /// this client makes, which benchmarks and tests read.
  [[nodiscard]] std::uint64_t requests() const noexcept { return requests_.load(std::memory_order_relaxed); }

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
                                                 internal::printable(r->dump().substr(0, 200))));
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

  // --- for streaming calls -------------------------------------------------------------

  /// The endpoint that answered last (where a stream should go).
  [[nodiscard]] std::size_t preferred_endpoint() const noexcept {
    return preferred_.load(std::memory_order_relaxed) % endpoints_.size();
  }

  /// A curl handle borrowed from the pool; goes back on destruction.
  class borrowed {
   public:
    explicit borrowed(etcd_gateway& s) : s_(s), h_(s.take_handle()) {}
    ~borrowed() { s_.give_back(std::move(h_)); }
    borrowed(const borrowed&) = delete;
    borrowed& operator=(const borrowed&) = delete;
    [[nodiscard]] CURL* get() const noexcept { return h_.get(); }

   private:
    etcd_gateway& s_;
    internal::curl_ptr h_;
  };

  /// The headers every request carries, and Authorization with our token when `with_token`.
  internal::curl_headers headers(bool with_token) {
    curl_slist* l = ::curl_slist_append(nullptr, "Content-Type: application/json");
    if (l) l = ::curl_slist_append(l, "Expect:");  // no 100-continue round trip for large values
    if (with_token && !options_.user.empty() && l) {
      std::lock_guard lk(token_mutex_);
      if (!token_.empty()) l = ::curl_slist_append(l, ("Authorization: " + token_).c_str());
    }
    if (!l) throw os_error("libcurl cannot make a header list", ENOMEM);  // its only reason to fail
    return internal::curl_headers(l);
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
    requests_.fetch_add(1, std::memory_order_relaxed);
  }

 private:
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

  static constexpr std::string_view auth_path = "/v3/auth/authenticate";

  // gRPC status codes the gateway reports.
  static constexpr int grpc_invalid_argument = 3, grpc_deadline_exceeded = 4, grpc_not_found = 5,
                       grpc_permission_denied = 7, grpc_resource_exhausted = 8, grpc_failed_precondition = 9,
                       grpc_unimplemented = 12, grpc_unavailable = 14, grpc_unauthenticated = 16;

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
                                                 internal::printable(*f), url_));
      }
    }
  }

  internal::curl_ptr take_handle() {
    return pool_.take([&](CURL* c) {
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
    });
  }

  void give_back(internal::curl_ptr h) noexcept { pool_.give_back(std::move(h)); }

  static std::size_t append_body(char* data, std::size_t, std::size_t n, void* out) {
    static_cast<std::string*>(out)->append(data, n);
    return n;
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
    const std::string user = internal::printable(options_.user);
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
                                                         where, user, internal::printable(options_.prefix)));
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
    ::curl_easy_setopt(h.get(), CURLOPT_WRITEFUNCTION, &etcd_gateway::append_body);
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
      const std::string quoted = internal::printable(std::string_view(reply).substr(0, 120));
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
                                             internal::printable(std::string_view(reply).substr(0, 120))));
    }
    return r;
  }

  std::vector<endpoint> endpoints_;
  bool tls_ = false;
  etcd_options options_;
  std::string url_;
  std::atomic<std::size_t> preferred_{0};  ///< the endpoint that answered last
  mutable std::atomic<std::uint64_t> requests_{0};  ///< counted in prepare(): every request sent

  internal::curl_pool pool_;

  std::mutex token_mutex_;
  std::string token_;
};

}  // namespace elastic::inline v1::rendezvous::detail
