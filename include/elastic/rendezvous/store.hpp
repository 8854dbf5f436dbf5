// The key-value store the rendezvous runs on: what every backend (shm_store on one host,
// etcd_store across hosts) offers.
//
// Keys and values are byte strings. A key set with a lease vanishes when the lease expires,
// that is when its owner stops calling keep_alive() for longer than the lease's time to live:
// that is how the rendezvous notices a participant that died without a word.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <elastic/internal/env.hpp>
#include <elastic/internal/names.hpp>
#include <elastic/error.hpp>
#include <elastic/rendezvous/detail/polled_feed.hpp>
#include <elastic/rendezvous/key_feed.hpp>

namespace elastic::inline v1::rendezvous {

namespace detail {

/// The integer a counter key holds (add() stores decimal text); anything else is an error that
/// names the key.
inline std::int64_t parse_counter(std::string_view key, std::string_view v) {
  // At most 18 digits, so that add() never overflows on what it reads.
  const std::size_t digits = v.size() - (v.starts_with('-') ? 1 : 0);
  const auto out = digits <= 18 ? internal::parse_integer(v) : std::nullopt;
  if (!out) {
    throw error(errc::invalid_argument, fmt::format("store key '{}' holds '{}', not an integer: add() cannot count on it",
                                                    internal::printable(key),
                                                    internal::printable(v.substr(0, 64))));
  }
  return *out;
}

/// erase_prefix("") would erase every key of the store (every run's): refused.
inline void check_erase_prefix(std::string_view prefix) {
  if (prefix.empty()) {
    throw error(errc::invalid_argument, "erase_prefix refuses an empty prefix: it would erase every key of the store");
  }
}

}  // namespace detail

/// A lease handle; 0 means "no lease".
using lease_id = std::int64_t;

/// One write of a batch (store::apply): set, compare_set or erase of one key.
struct write_request {
  enum class kind : std::uint8_t { set, compare_set, erase };
  kind what = kind::set;
  std::string key;
  std::optional<std::string> expected;  ///< compare_set: what the key must hold (nothing: absent)
  std::string value;                    ///< set, compare_set: the value written
  lease_id lease = 0;                   ///< set, compare_set: the lease it goes on (0: none)

  static write_request setting(std::string key, std::string value, lease_id lease = 0) {
    return {kind::set, std::move(key), std::nullopt, std::move(value), lease};
  }
  static write_request comparing(std::string key, std::optional<std::string> expected, std::string desired,
                                 lease_id lease = 0) {
    return {kind::compare_set, std::move(key), std::move(expected), std::move(desired), lease};
  }
  static write_request erasing(std::string key) { return {kind::erase, std::move(key), std::nullopt, {}, 0}; }
};

/// What one write of a batch did, as the call of its kind would return it.
struct write_result {
  bool done = false;                   ///< set: true; compare_set: it wrote; erase: the key was there
  std::optional<std::string> actual;   ///< a compare_set that did not write: what the key held
  std::exception_ptr failure;          ///< what this write threw (an elastic::error); the others stand
};

namespace detail {

/// A batch writes each key once (etcd refuses a transaction that touches a key twice).
inline void check_distinct(std::span<const write_request> writes) {
  std::vector<std::string_view> keys;
  keys.reserve(writes.size());
  for (const auto& w : writes) keys.push_back(w.key);
  std::sort(keys.begin(), keys.end());
  if (const auto d = std::adjacent_find(keys.begin(), keys.end()); d != keys.end()) {
    throw error(errc::invalid_argument,
                fmt::format("a batch of store writes names key '{}' twice: one write per key", internal::printable(*d)));
  }
}

}  // namespace detail

class store {
 public:
  virtual ~store() = default;

  /// Sets `key` to `value`, attached to `lease` when it is not 0.
  virtual void set(std::string_view key, std::string_view value, lease_id lease = 0) = 0;
  /// The value of `key`, or nothing.
  [[nodiscard]] virtual std::optional<std::string> get(std::string_view key) = 0;
  /// Adds `delta` to the integer held by `key` (0 when absent) and returns the new value.
  virtual std::int64_t add(std::string_view key, std::int64_t delta) = 0;
  /// Sets `key` to `desired` if it holds `expected` (nothing: if it is absent). Returns whether
  /// it did; `actual` receives what the key held otherwise.
  virtual bool compare_set(std::string_view key, std::optional<std::string_view> expected, std::string_view desired,
                           lease_id lease = 0, std::optional<std::string>* actual = nullptr) = 0;
  /// Removes `key`; false if it was absent.
  virtual bool erase(std::string_view key) = 0;
  /// Blocks until every key in `keys` exists; throws errc::timeout naming the missing ones.
  virtual void wait(std::span<const std::string> keys, std::chrono::milliseconds timeout) = 0;
  /// Every key starting with `prefix`, with its value, in key order.
  [[nodiscard]] virtual std::vector<std::pair<std::string, std::string>> list(std::string_view prefix) = 0;
  /// Removes every key starting with `prefix` (not empty: errc::invalid_argument) and returns
  /// how many. This one lists and erases key by key; a store that can do it in one request
  /// overrides it (etcd: one deleterange).
  virtual std::size_t erase_prefix(std::string_view prefix) {
    detail::check_erase_prefix(prefix);
    std::size_t n = 0;
    for (const auto& kv : list(prefix)) n += erase(kv.first) ? 1 : 0;
    return n;
  }

  /// Applies `writes` and returns what each did, in their order. Each is applied as its own
  /// call would be (a compare_set's condition is its own); what one write's own call would throw
  /// (its lease gone) is that write's write_result::failure, and the others stand. Keys must be
  /// distinct (errc::invalid_argument otherwise). This one calls set/compare_set/erase in turn; a
  /// store that can send them together overrides it (etcd: one transaction), so that a relay
  /// writing for many workers asks the store once, not once per worker.
  virtual std::vector<write_result> apply(std::span<const write_request> writes) {
    detail::check_distinct(writes);
    return apply_each(writes);
  }

  /// The keys in [from, to) and every change to them from now on (key_feed.hpp). This one lists
  /// the range at each look (one list() per take(), a 2 ms sleep per wait()); a store that can
  /// push changes overrides it (etcd: one watch stream, nothing asked while nothing changes).
  [[nodiscard]] virtual std::unique_ptr<key_feed> watch(std::string_view from, std::string_view to,
                                                        feed_options o = {}) {
    return std::make_unique<detail::polled_feed>([this](std::string_view p) { return list(p); }, std::string(from),
                                                 std::string(to), std::chrono::milliseconds(2), o);
  }

  /// Whether every participant of this store is on this host (shm://): then a participant that
  /// dies is seen by its launcher at once, and peers need not beat to each other.
  [[nodiscard]] virtual bool local() const noexcept { return false; }
  /// An address of this host that the store's other participants can reach (for the peer
  /// heartbeats): loopback here; a store across hosts knows better (etcd: the address this
  /// host uses towards it).
  [[nodiscard]] virtual std::string local_address() const { return "127.0.0.1"; }

  /// A lease that expires `ttl` after its last keep_alive().
  virtual lease_id grant(std::chrono::milliseconds ttl) = 0;
  /// Renews `lease`; throws errc::not_found when it has already expired (its keys are gone).
  virtual void keep_alive(lease_id lease) = 0;
  /// Ends `lease` now and removes its keys.
  virtual void revoke(lease_id lease) = 0;

  /// Each write through the call of its kind, its failure kept in its result.
  std::vector<write_result> apply_each(std::span<const write_request> writes) {
    std::vector<write_result> out;
    out.reserve(writes.size());
    for (const auto& w : writes) {
      try {
        out.push_back(apply_one(w));
      } catch (...) {
        write_result r;
        r.failure = std::current_exception();
        out.push_back(std::move(r));
      }
    }
    return out;
  }

  /// One write of a batch through the call of its kind.
  write_result apply_one(const write_request& w) {
    switch (w.what) {
      case write_request::kind::set: set(w.key, w.value, w.lease); return {true, std::nullopt, nullptr};
      case write_request::kind::compare_set: {
        write_result r;
        r.done = compare_set(w.key, w.expected ? std::optional<std::string_view>(*w.expected) : std::nullopt, w.value,
                             w.lease, &r.actual);
        return r;
      }
      case write_request::kind::erase: return {erase(w.key), std::nullopt, nullptr};
    }
    throw error(errc::invalid_argument, "a store write of an unknown kind");
  }

  /// Waits for `key` and returns its value.
  std::string get(std::string_view key, std::chrono::milliseconds timeout) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    const std::string k(key);
    for (;;) {
      if (auto v = get(key)) return *v;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
      wait(std::span<const std::string>(&k, 1), std::max(left, std::chrono::milliseconds(0)));
    }
  }
};

}  // namespace elastic::inline v1::rendezvous
