// libcurl's process-wide initialization and RAII owners for its easy handles and header lists,
// for the etcd gateway and the object-storage client. Needs libcurl (elastic::etcd, elastic::s3).
#pragma once

#include <curl/curl.h>

#include <cerrno>
#include <memory>
#include <string>

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

}  // namespace elastic::inline v1::internal
