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
//   erase_prefix /v3/kv/deleterange with range_end
//   compare_set  /v3/kv/txn: value == expected, or version == 0 for "absent"
//   apply        /v3/kv/txn of up to 64 writes, each compare_set a transaction nested in it
//   wait         a range check, then a watch from the next revision (no event can slip between)
//   watch        a range read, then one watch stream held open from the revision after it
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

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <elastic/internal/json.hpp>
#include <elastic/internal/names.hpp>
#include <elastic/error.hpp>
#include <elastic/rendezvous/detail/etcd_gateway.hpp>
#include <elastic/rendezvous/detail/etcd_feed.hpp>
#include <elastic/rendezvous/detail/etcd_reply.hpp>
#include <elastic/rendezvous/detail/etcd_watch.hpp>
#include <elastic/rendezvous/etcd_options.hpp>
#include <elastic/rendezvous/host_address.hpp>
#include <elastic/rendezvous/store.hpp>
#include <elastic/rendezvous/store_url.hpp>

namespace elastic::inline v1::rendezvous {

/// A store on an etcd v3 cluster (3.4 or newer). Thread-safe: calls from several threads run
/// concurrently, each on a curl handle borrowed from a small pool, so a long wait() in one
/// thread does not hold up keep_alive() in another.
class etcd_store final : public store {
 public:
  /// Connects to the etcd endpoints of `url` (etcd:// or etcds://). With a user, authenticates
  /// now, so that a wrong password fails here (retrying while etcd does not answer).
  explicit etcd_store(const store_url& url, etcd_options options = {}) : gateway_(url, std::move(options)) {}
  /// Parses `url` (see parse_store_url) and connects.
  explicit etcd_store(std::string_view url, etcd_options options = {})
      : etcd_store(parse_store_url(url), std::move(options)) {}

  etcd_store(const etcd_store&) = delete;
  etcd_store& operator=(const etcd_store&) = delete;
  ~etcd_store() override = default;
  /// The URL this store talks to, as etcd://HOST:PORT,... (for messages).
  [[nodiscard]] const std::string& url() const noexcept { return gateway_.url(); }
  [[nodiscard]] const etcd_options& options() const noexcept { return gateway_.options(); }
  /// HTTP requests this client has sent to etcd so far, watches included (its share of the load).
  [[nodiscard]] std::uint64_t requests() const noexcept { return gateway_.requests(); }

  void set(std::string_view key, std::string_view value, lease_id lease = 0) override {
    check_key(key);
    json body;
    body["key"] = detail::base64_encode(full_key(key));
    body["value"] = detail::base64_encode(value);
    if (lease != 0) body["lease"] = std::to_string(lease);
    gateway_.request("/v3/kv/put", body, [](const json&) {});
  }

  std::optional<std::string> get(std::string_view key) override {
    check_key(key);
    json body;
    body["key"] = detail::base64_encode(full_key(key));
    return gateway_.request("/v3/kv/range", body, [](const json& r) { return detail::first_value(r); });
  }
  using store::get;

  std::int64_t add(std::string_view key, std::int64_t delta) override {
    check_key(key);
    const std::string k = detail::base64_encode(full_key(key));
    json range;
    range["key"] = k;
    // The key's value and mod_revision (0: absent), then swap on that revision until no one
    // else wrote in between.
    auto current = gateway_.request("/v3/kv/range", range, [](const json& r) { return detail::first_kv(r); });
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
      json txn;
      txn["compare"].push_back(std::move(cmp));
      txn["success"].push_back(put_operation(k, std::to_string(v), 0));
      txn["failure"].push_back(json(json::object_t{{"requestRange", range}}));
      const auto [done, now] = gateway_.request("/v3/kv/txn", txn, [](const json& r) {
        if (r.find("succeeded") && r.at("succeeded").as_bool()) return std::pair{true, std::optional<detail::etcd_kv>()};
        return std::pair{false, detail::first_kv(r.at("responses").at(0).at("response_range"))};
      });
      if (done) return v;
      current = now;
    }
  }

  bool compare_set(std::string_view key, std::optional<std::string_view> expected, std::string_view desired,
                   lease_id lease = 0, std::optional<std::string>* actual = nullptr) override {
    check_key(key);
    auto [done, now] = gateway_.request("/v3/kv/txn", compare_set_txn(key, expected, desired, lease), compare_set_reply);
    if (!done && actual) *actual = std::move(now);
    return done;
  }

  /// Up to 64 writes in one transaction (etcd takes 128 operations in one): each compare_set is a
  /// transaction of its own inside it (etcd 3.3 and newer), so each keeps its own condition. What
  /// etcd refuses in one write (a lease that expired) refuses the whole transaction: those writes
  /// are then applied one by one, so that only that one fails. etcd unreachable (for the whole
  /// unavailable_timeout) is every remaining write's failure.
  std::vector<write_result> apply(std::span<const write_request> writes) override {
    detail::check_distinct(writes);
    std::vector<write_result> out;
    out.reserve(writes.size());
    for (std::size_t at = 0; at < writes.size(); at += 64) {
      const auto chunk = writes.subspan(at, std::min<std::size_t>(64, writes.size() - at));
      json txn;
      for (const auto& w : chunk) {
        check_key(w.key);
        txn["success"].push_back(operation(w));
      }
      std::vector<write_result> got;
      try {
        got = gateway_.request("/v3/kv/txn", txn, [&](const json& r) {
          std::vector<write_result> results;
          const auto& responses = r.at("responses");
          for (std::size_t i = 0; i < chunk.size(); ++i) results.push_back(result_of(chunk[i], responses.at(i)));
          return results;
        });
      } catch (const error& e) {
        if (e.code() == errc::unavailable || e.code() == errc::timeout) {
          // etcd away for the whole unavailable_timeout: this and every later write fail with
          // that, at once (applied one by one, each would wait as long again).
          const auto away = std::current_exception();
          while (out.size() < writes.size()) out.push_back({false, std::nullopt, away});
          return out;
        }
        // Anything else was said of one of them: each on its own says which.
        for (auto& r : apply_each(chunk)) out.push_back(std::move(r));
        continue;
      }
      for (auto& g : got) out.push_back(std::move(g));
    }
    return out;
  }

  bool erase(std::string_view key) override {
    check_key(key);
    json body;
    body["key"] = detail::base64_encode(full_key(key));
    return gateway_.request("/v3/kv/deleterange", body,
                            [](const json& r) { return detail::int_field(r, "deleted") > 0; });
  }

  std::size_t erase_prefix(std::string_view prefix) override {
    detail::check_erase_prefix(prefix);
    const std::string from = full_key(prefix);
    json body;
    body["key"] = detail::base64_encode(from);
    body["range_end"] = detail::base64_encode(detail::prefix_end(from));
    return gateway_.request("/v3/kv/deleterange", body, [](const json& r) {
      return static_cast<std::size_t>(std::max<std::int64_t>(0, detail::int_field(r, "deleted")));
    });
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
        for (auto& k : missing) k = internal::printable(k);
        throw error(errc::timeout, fmt::format("store {}: '{}' still missing after {} ms", gateway_.url(),
                                               fmt::join(missing, "', '"), timeout.count()));
      }
      // Watch from the revision after our check, so a key set since is reported at once.
      const auto window = std::min(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now),
                                   std::max(gateway_.options().request_timeout, std::chrono::milliseconds(100)));
      switch (watch(missing, revision + 1, window)) {
        case detail::watch_result::changed: backoff = std::chrono::milliseconds(10); break;
        case detail::watch_result::quiet: break;
        case detail::watch_result::failed:
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
    auto out = gateway_.request("/v3/kv/range", body, [&](const json& r) {
      std::vector<std::pair<std::string, std::string>> kvs;
      if (const auto* found = r.find("kvs")) {
        for (const auto& e : found->elements()) {
          std::string k = detail::bytes_field(e, "key");
          if (k.compare(0, gateway_.options().prefix.size(), gateway_.options().prefix) != 0) {
            throw error(errc::corrupt, fmt::format("a key outside the range asked for, '{}'", internal::printable(k)));
          }
          kvs.emplace_back(k.substr(gateway_.options().prefix.size()), detail::bytes_field(e, "value"));
        }
      }
      return kvs;
    });
    std::sort(out.begin(), out.end());  // etcd sends key order already; this makes it a promise
    return out;
  }

  /// This host's address towards the first etcd endpoint that routes (host_address.hpp).
  [[nodiscard]] std::string local_address() const override { return host_address_for(parse_store_url(url())); }

  /// One range read, then one watch stream held open: nothing is asked of etcd while nothing in
  /// [from, to) changes (detail/etcd_feed.hpp).
  std::unique_ptr<key_feed> watch(std::string_view from, std::string_view to, feed_options o = {}) override {
    return std::make_unique<detail::etcd_feed>(gateway_, full_key(from), full_key(to), gateway_.options().prefix.size(),
                                               o);
  }

  lease_id grant(std::chrono::milliseconds ttl) override {
    if (ttl.count() <= 0) throw error(errc::invalid_argument, "store lease time to live must be positive");
    const std::int64_t seconds = std::max<std::int64_t>(1, (ttl.count() + 999) / 1000);
    json body;
    body["TTL"] = std::to_string(seconds);
    return gateway_.request("/v3/lease/grant", body, [](const json& r) {
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
        gateway_.request("/v3/lease/keepalive", body,
                         [](const json& r) { return detail::int_field(r.at("result"), "TTL"); });
    if (ttl <= 0) {
      throw error(errc::not_found,
                  fmt::format("store {}: lease {} has expired; its keys are gone", gateway_.url(), lease));
    }
  }

  void revoke(lease_id lease) override {
    json body;
    body["ID"] = std::to_string(lease);
    try {
      gateway_.request("/v3/lease/revoke", body, [](const json&) {});
    } catch (const error& e) {
      if (e.code() != errc::not_found) throw;  // already gone: what revoke wanted
    }
  }

 private:
  using json = internal::json;
  using clock = std::chrono::steady_clock;

  std::string full_key(std::string_view key) const { return gateway_.options().prefix + std::string(key); }

  /// A compare_set as a transaction: put if `expected` holds (nothing: the key is absent), else
  /// read the key.
  json compare_set_txn(std::string_view key, std::optional<std::string_view> expected, std::string_view desired,
                       lease_id lease) const {
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
    json range;
    range["requestRange"]["key"] = k;
    json txn;
    txn["compare"].push_back(std::move(cmp));
    txn["success"].push_back(put_operation(k, desired, lease));
    txn["failure"].push_back(std::move(range));
    return txn;
  }
  /// Whether a compare_set's transaction wrote, else what the key held.
  static std::pair<bool, std::optional<std::string>> compare_set_reply(const json& r) {
    if (r.find("succeeded") && r.at("succeeded").as_bool()) return {true, std::nullopt};
    return {false, detail::first_value(r.at("responses").at(0).at("response_range"))};
  }
  static json put_operation(const std::string& encoded_key, std::string_view value, lease_id lease) {
    json put;
    put["requestPut"]["key"] = encoded_key;
    put["requestPut"]["value"] = detail::base64_encode(value);
    if (lease != 0) put["requestPut"]["lease"] = std::to_string(lease);
    return put;
  }
  /// One write of a batch as an operation of its transaction.
  json operation(const write_request& w) const {
    switch (w.what) {
      case write_request::kind::set: return put_operation(detail::base64_encode(full_key(w.key)), w.value, w.lease);
      case write_request::kind::erase: {
        json del;
        del["requestDeleteRange"]["key"] = detail::base64_encode(full_key(w.key));
        return del;
      }
      case write_request::kind::compare_set: {
        json op;
        op["requestTxn"] = compare_set_txn(w.key, w.expected, w.value, w.lease);
        return op;
      }
    }
    throw error(errc::invalid_argument, "a store write of an unknown kind");
  }
  /// What etcd answered to that operation.
  static write_result result_of(const write_request& w, const json& response) {
    switch (w.what) {
      case write_request::kind::set: return {true, std::nullopt, nullptr};
      case write_request::kind::erase:
        return {detail::int_field(response.at("response_delete_range"), "deleted") > 0, std::nullopt, nullptr};
      case write_request::kind::compare_set: {
        auto [done, actual] = compare_set_reply(response.at("response_txn"));
        return {done, std::move(actual), nullptr};
      }
    }
    throw error(errc::invalid_argument, "a store write of an unknown kind");
  }

  void check_key(std::string_view key) const {
    if (key.empty()) {
      throw error(errc::invalid_argument, fmt::format("store {}: a key must not be empty", gateway_.url()));
    }
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
      const auto rev = gateway_.request("/v3/kv/txn", txn, [&](const json& r) {
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


  /// Watches for puts to the keys in `missing` from `revision` on, for up to `window`.
  detail::watch_result watch(const std::vector<std::string>& missing, std::int64_t revision,
                             std::chrono::milliseconds window) {
    std::vector<std::string> full;
    full.reserve(missing.size());
    for (const auto& k : missing) full.push_back(full_key(k));
    return detail::run_watch(gateway_, detail::watch_request(full, revision), window);
  }

  detail::etcd_gateway gateway_;
};

}  // namespace elastic::inline v1::rendezvous
