// One etcd watch for etcd_store::wait: a /v3/watch stream, from a given revision, on the key
// range spanning the keys still missing, that ends at the first put there (or a cancellation,
// an error, or the window running out). The gateway streams one JSON object per line; a watch
// is only a wake-up, never the answer: the caller checks the keys again after it.
#pragma once

#include <curl/curl.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <elastic/internal/json.hpp>
#include <elastic/rendezvous/detail/etcd_gateway.hpp>
#include <elastic/rendezvous/detail/etcd_reply.hpp>

namespace elastic::inline v1::rendezvous::detail {

/// How a watch ended: a put (or a compaction) in the range, nothing within the window, or no
/// watch at all (etcd away, or it refused this one).
enum class watch_result { changed, quiet, failed };

/// The create request of a watch on the range spanning `full_keys` (keys with the store's
/// prefix), for puts only, from `revision` on: any put there wakes the waiter to check again.
inline internal::json watch_request(const std::vector<std::string>& full_keys, std::int64_t revision) {
  const auto [lo, hi] = std::minmax_element(full_keys.begin(), full_keys.end());
  internal::json create;
  create["key"] = base64_encode(*lo);
  if (full_keys.size() > 1) create["range_end"] = base64_encode(*hi + '\0');
  create["start_revision"] = std::to_string(revision);
  create["filters"].push_back("NODELETE");
  internal::json body;
  body["create_request"] = std::move(create);
  return body;
}

/// The watch stream as it arrives: whole lines are messages; the first that is events, a
/// cancellation or an error settles the result.
struct watch_stream {
  std::string buffer;
  watch_result result = watch_result::quiet;
  bool done = false;

  /// Reads one message; true when it settles the watch.
  bool settle(const std::string& line) {
    const auto m = internal::json::parse(line);
    const auto* r = m.find("result");
    if (!r) {
      result = watch_result::failed;
    } else if (const auto* ev = r->find("events"); ev && ev->size() > 0) {
      result = watch_result::changed;
    } else if (const auto* c = r->find("canceled"); c && c->is_bool() && c->as_bool()) {
      // Compacted past our revision, or refused: check again, without a watch if need be.
      result = r->find("compact_revision") ? watch_result::changed : watch_result::failed;
    } else {
      return false;
    }
    done = true;
    return true;
  }

  /// libcurl's write callback; returning 0 stops the transfer once the watch is settled.
  static std::size_t on_data(char* data, std::size_t, std::size_t n, void* p) {
    auto& s = *static_cast<watch_stream*>(p);
    try {
      return take_lines(s.buffer, data, n, [&](const std::string& line) { return !s.settle(line); }) ? n : 0;
    } catch (...) {
      s.result = watch_result::failed;
      s.done = true;
      return 0;
    }
  }
};

/// Streams /v3/watch with `request` (see watch_request) on the endpoint that answered last, for
/// up to `window`. Never throws for a failed stream: that is watch_result::failed.
inline watch_result run_watch(etcd_gateway& gateway, const internal::json& request,
                              std::chrono::milliseconds window) {
  const std::string text = request.dump();
  watch_stream st;
  const std::size_t ep = gateway.preferred_endpoint();
  etcd_gateway::borrowed h(gateway);
  auto hdrs = gateway.headers(true);
  char errbuf[CURL_ERROR_SIZE];
  gateway.prepare(h.get(), ep, "/v3/watch", text, hdrs.get(), window, errbuf);
  ::curl_easy_setopt(h.get(), CURLOPT_WRITEFUNCTION, &watch_stream::on_data);
  ::curl_easy_setopt(h.get(), CURLOPT_WRITEDATA, &st);
  const CURLcode rc = ::curl_easy_perform(h.get());
  ::curl_easy_setopt(h.get(), CURLOPT_ERRORBUFFER, nullptr);
  if (st.done) return st.result;
  if (rc == CURLE_OPERATION_TIMEDOUT) return watch_result::quiet;
  return watch_result::failed;  // the stream ended or broke: the next check finds out why
}

}  // namespace elastic::inline v1::rendezvous::detail
