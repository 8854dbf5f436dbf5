// libcurl's process-wide initialization and RAII owners for its easy handles and header lists,
// for the etcd gateway and the object-storage client. Needs libcurl (elastic::etcd, elastic::s3).
#pragma once

#include <curl/curl.h>

#include <cerrno>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <elastic/error.hpp>

namespace elastic::inline v1::internal {

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

/// Easy handles kept between requests, so that each keeps its connection alive. Thread-safe.
class curl_pool {
 public:
  /// An idle handle, else a new one after `setup(handle)` (options every request of its owner
  /// wants and curl_easy_reset keeps are set there).
  template <class Setup>
  curl_ptr take(Setup&& setup) {
    {
      std::lock_guard lk(mu_);
      if (!idle_.empty()) {
        auto h = std::move(idle_.back());
        idle_.pop_back();
        return h;
      }
    }
    curl_ptr h(::curl_easy_init());
    if (!h) throw os_error("libcurl cannot make a handle", ENOMEM);  // its only reason to fail
    setup(h.get());
    return h;
  }
  void give_back(curl_ptr h) noexcept {
    try {
      std::lock_guard lk(mu_);
      idle_.push_back(std::move(h));
    } catch (...) {
      // Out of memory for the pool: the handle (and its connection) is freed instead.
    }
  }

 private:
  std::mutex mu_;
  std::vector<curl_ptr> idle_;
};

}  // namespace elastic::inline v1::internal
