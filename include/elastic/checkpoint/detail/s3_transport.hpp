// The S3 API's transport over libcurl: one request signed (sigv4.hpp) for the location's bucket
// and region, sent on a pooled connection, its answer's body put where the caller wants it.
// Needs libcurl (elastic::s3, ELASTIC_WITH_S3).
//
// Retries: a request that got no answer (connection refused, reset, timed out) or got
// 500/502/503/504 (the server's "slow down") is sent again after a growing pause until the
// attempts or `unavailable_timeout` run out; then errc::unavailable. Any other failure is thrown
// as what it means (s3_wire.hpp's fail()).
#pragma once

#include <curl/curl.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <elastic/checkpoint/detail/object_location.hpp>
#include <elastic/checkpoint/detail/s3_credentials.hpp>
#include <elastic/checkpoint/detail/s3_wire.hpp>
#include <elastic/checkpoint/detail/sigv4.hpp>
#include <elastic/error.hpp>
#include <elastic/internal/curl.hpp>

namespace elastic::inline v1::checkpoint::detail::objects {

/// Sends requests for one location. Thread-safe: requests from several threads run at once,
/// each on a connection of its own from the pool.
class s3_transport {
 public:
  s3_transport(location where, std::shared_ptr<credential_source> keys, client_options options)
      : where_(std::move(where)), keys_(std::move(keys)), options_(options) {
    internal::curl_global();
  }
  s3_transport(const s3_transport&) = delete;
  s3_transport& operator=(const s3_transport&) = delete;

  [[nodiscard]] const location& where() const noexcept { return where_; }
  /// s3://BUCKET/PREFIX/name, for messages.
  [[nodiscard]] std::string url_of(std::string_view name) const {
    return fmt::format("{}://{}/{}{}", where_.scheme, where_.bucket, where_.prefix.empty() ? "" : where_.prefix + "/",
                       name);
  }
  /// Requests sent so far (every attempt counts).
  [[nodiscard]] std::uint64_t requests() const noexcept { return requests_.load(std::memory_order_relaxed); }

  /// Where a ranged GET's bytes go.
  struct range_sink {
    std::span<std::byte> out;
    std::size_t at;
    bool overflow = false;
  };
  /// Where a PUT's body comes from: bytes [start, end) of a gather.
  struct gather_source {
    const gather* body;
    std::uint64_t start, end;
    std::uint64_t at = start;
  };
  /// One request: what to send, and where its answer goes.
  struct call {
    const char* method;
    std::string_view name{};
    bool bucket_level = false;  ///< the bucket itself (list), not an object
    std::vector<std::pair<std::string, std::string>> query{};
    std::vector<std::pair<std::string, std::string>> headers{};
    std::string* sink = nullptr;  ///< the body, when wanted
    range_sink* range = nullptr;
    gather_source* body = nullptr;
    std::string_view text{};  ///< a small body to send (POST)
    std::vector<long> allow{};  ///< statuses the caller handles (besides 2xx)
  };
  struct reply {
    long status = 0;
    std::uint64_t content_length = 0;
    std::string etag;
  };

  /// Sends `c` (signed afresh for each attempt), retrying what may pass later. Returns a 2xx
  /// or an allowed status; throws for anything else.
  reply send(call c) {
    const auto give_up = std::chrono::steady_clock::now() + options_.unavailable_timeout;
    std::string last;
    for (int attempt = 1;; ++attempt) {
      reply r;
      std::string error_body;
      const auto rc = attempt_once(c, r, error_body);
      bool retry = false;
      if (rc != CURLE_OK) {
        last = fmt::format("{} ({})", ::curl_easy_strerror(rc), static_cast<int>(rc));
        retry = rc != CURLE_ABORTED_BY_CALLBACK;
      } else if ((r.status >= 200 && r.status < 300) ||
                 std::find(c.allow.begin(), c.allow.end(), r.status) != c.allow.end()) {
        return r;
      } else if (r.status == 500 || r.status == 502 || r.status == 503 || r.status == 504 ||
                 (r.status == 400 && xml::first(error_body, "Code") == "RequestTimeout")) {
        last = describe(r.status, error_body);
        retry = true;
      } else {
        fail(fmt::format("{} {}", c.method, c.bucket_level ? url_of("") : url_of(c.name)), r.status, error_body);
      }
      if (!retry || attempt >= options_.attempts || std::chrono::steady_clock::now() >= give_up) {
        throw error(errc::unavailable, fmt::format("{} {}: no answer after {} attempts: {}", c.method,
                                                   c.bucket_level ? url_of("") : url_of(c.name), attempt, last));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(std::min(100 << std::min(attempt, 6), 3000)));
    }
  }

 private:
  static std::size_t on_body(char* data, std::size_t, std::size_t n, void* p) {
    static_cast<std::string*>(p)->append(data, n);
    return n;
  }
  static std::size_t on_range(char* data, std::size_t, std::size_t n, void* p) {
    auto* s = static_cast<range_sink*>(p);
    const std::size_t k = std::min(n, s->out.size() - s->at);
    std::memcpy(s->out.data() + s->at, data, k);
    s->at += k;
    if (k < n) s->overflow = true;
    return n;
  }
  static std::size_t on_read(char* buf, std::size_t, std::size_t n, void* p) {
    auto* s = static_cast<gather_source*>(p);
    const std::size_t k = static_cast<std::size_t>(std::min<std::uint64_t>(n, s->end - s->at));
    s->body->copy(s->at, reinterpret_cast<std::byte*>(buf), k);
    s->at += k;
    return k;
  }
  static std::size_t on_header(char* data, std::size_t, std::size_t n, void* p) {
    std::string_view line(data, n);
    auto* r = static_cast<reply*>(p);
    const auto colon = line.find(':');
    if (colon == std::string_view::npos) return n;
    std::string key(line.substr(0, colon));
    for (auto& c : key) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    std::string_view v = line.substr(colon + 1);
    while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
    while (!v.empty() && (v.back() == '\r' || v.back() == '\n' || v.back() == ' ')) v.remove_suffix(1);
    if (key == "etag") r->etag = std::string(v);
    if (key == "content-length") r->content_length = std::strtoull(std::string(v).c_str(), nullptr, 10);
    return n;
  }

  CURLcode attempt_once(call& c, reply& r, std::string& error_body) {
    internal::curl_ptr h = pool_.take([](CURL*) {});
    CURL* e = h.get();
    ::curl_easy_reset(e);
    configure(e);
    sigv4::request q;
    q.method = c.method;
    q.host = where_.host();
    q.path = c.bucket_level ? (where_.path_style ? "/" + where_.bucket + "/" : "/") : where_.path_of(c.name);
    q.query = c.query;
    q.headers = c.headers;
    q.region = where_.region;
    q.amz_date = sigv4::amz_date(std::chrono::system_clock::now());
    // A retry starts from the top: the body sent again, whatever came of an answer dropped.
    if (c.sink) c.sink->clear();
    if (c.range) *c.range = range_sink{c.range->out, 0};
    if (c.body) {
      c.body->at = c.body->start;
      q.payload_sha256 = "UNSIGNED-PAYLOAD";
    } else if (!c.text.empty()) {
      q.payload_sha256 = sigv4::sha256_hex(c.text);
    }
    const session who = keys_->current();
    auto s = sigv4::sign(q, who.keys);
    if (!who.bearer.empty()) {  // an OAuth token (GCS): it authorizes the request instead of a signature
      std::erase_if(s.headers, [](const auto& h) { return h.first == "authorization"; });
      s.headers.emplace_back("authorization", "Bearer " + who.bearer);
    }
    std::string url = where_.base_url() + s.encoded_path;
    if (!s.query_string.empty()) url += "?" + s.query_string;
    curl_slist* list = nullptr;
    auto add = [&](const std::string& line) {
      curl_slist* l = ::curl_slist_append(list, line.c_str());
      if (!l) {
        ::curl_slist_free_all(list);
        throw os_error("libcurl cannot make a header list", ENOMEM);
      }
      list = l;
    };
    for (const auto& [k, v] : s.headers) add(k + ": " + v);
    add("Expect:");
    if (c.body || !c.text.empty() || std::string_view(c.method) == "POST") {
      add("Content-Type: application/octet-stream");
    }
    internal::curl_headers headers(list);
    ::curl_easy_setopt(e, CURLOPT_URL, url.c_str());
    ::curl_easy_setopt(e, CURLOPT_HTTPHEADER, headers.get());
    ::curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
    ::curl_easy_setopt(e, CURLOPT_HEADERDATA, &r);
    const std::string_view method = c.method;
    if (method == "HEAD") {
      ::curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
    } else if (method == "PUT") {
      ::curl_easy_setopt(e, CURLOPT_UPLOAD, 1L);
      if (c.body) {
        ::curl_easy_setopt(e, CURLOPT_READFUNCTION, on_read);
        ::curl_easy_setopt(e, CURLOPT_READDATA, c.body);
        ::curl_easy_setopt(e, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(c.body->end - c.body->at));
      } else {
        ::curl_easy_setopt(e, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(0));
      }
    } else if (method == "POST") {
      ::curl_easy_setopt(e, CURLOPT_POST, 1L);
      ::curl_easy_setopt(e, CURLOPT_POSTFIELDS, c.text.data());
      ::curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(c.text.size()));
    } else if (method != "GET") {
      ::curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, c.method);
    }
    // The body of a success goes where the caller wants it; an error's (its XML) is kept to say
    // what went wrong.
    ::curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_write);
    write_target wt{&c, &error_body, e};
    ::curl_easy_setopt(e, CURLOPT_WRITEDATA, &wt);
    requests_.fetch_add(1, std::memory_order_relaxed);
    const CURLcode rc = ::curl_easy_perform(e);
    if (rc == CURLE_OK) ::curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &r.status);
    pool_.give_back(std::move(h));
    return rc;
  }

  struct write_target {
    call* c;
    std::string* error_body;
    CURL* e;
  };
  static std::size_t on_write(char* data, std::size_t, std::size_t n, void* p) {
    auto* w = static_cast<write_target*>(p);
    long status = 0;
    ::curl_easy_getinfo(w->e, CURLINFO_RESPONSE_CODE, &status);
    if (status < 200 || status >= 300) {
      if (w->error_body->size() < 64 * 1024) w->error_body->append(data, n);
      return n;
    }
    if (w->c->range) return on_range(data, 1, n, w->c->range);
    if (w->c->sink) return on_body(data, 1, n, w->c->sink);
    return n;
  }

  void configure(CURL* e) const {
    ::curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    ::curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(options_.connect_timeout.count()));
    ::curl_easy_setopt(e, CURLOPT_LOW_SPEED_LIMIT, 1024L);
    ::curl_easy_setopt(e, CURLOPT_LOW_SPEED_TIME,
                       static_cast<long>(std::max<std::int64_t>(1, options_.stall_timeout.count() / 1000)));
    ::curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
    ::curl_easy_setopt(e, CURLOPT_HTTP_VERSION, static_cast<long>(CURL_HTTP_VERSION_1_1));
  }

  location where_;
  std::shared_ptr<credential_source> keys_;
  client_options options_;
  std::atomic<std::uint64_t> requests_{0};
  internal::curl_pool pool_;
};

}  // namespace elastic::inline v1::checkpoint::detail::objects
