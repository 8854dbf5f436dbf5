// A participant's copy of its run's membership keys, kept by two key feeds:
// - the keys from P/bootstrap/ up to P/round (outcomes, closers, bootstraps, the bounds,
//   members declared gone by their peers, departures on purpose, pending joiners, the round
//   number), none of a round's own keys
//   (P/round/<r>/...: joins, communicator bootstraps), which change often and concern fewer
//   readers;
// - the heartbeat keys P/alive/, erasures only, each with the incarnation it ended: a departure.
//   Their puts (N participants starting, each seen by N) are not sent, and the copy takes a
//   member for alive unless it saw that incarnation end or a read of the keys missed it.
// Every wait of the rendezvous and every poll() reads this copy: on etcd, that costs the store
// nothing until a key changes.
#pragma once

#include <poll.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <elastic/rendezvous/key_feed.hpp>
#include <elastic/rendezvous/store.hpp>

namespace elastic::inline v1::rendezvous::detail {

/// A copy of keys, and the changes a feed brings applied to it.
using key_copy = std::map<std::string, std::string, std::less<>>;

/// Takes what `feed` has into `copy` (dropping the copy first when the feed lost its place);
/// whether anything came.
inline bool take_into(key_feed& feed, key_copy& copy) {
  bool reset = false;
  auto events = feed.take(reset);
  if (reset) copy.clear();
  for (auto& e : events) {
    if (e.value) {
      copy.insert_or_assign(std::move(e.key), *std::move(e.value));
    } else {
      copy.erase(e.key);
    }
  }
  return reset || !events.empty();
}

class run_view {
 public:
  using keys = key_copy;

  [[nodiscard]] bool open() const noexcept { return feed_ != nullptr; }

  /// Starts following the run under `prefix` in `s` (reads the membership keys once).
  void open(store& s, std::string_view prefix) {
    store_ = &s;
    alive_prefix_ = std::string(prefix) + "/alive/";
    gone_prefix_ = std::string(prefix) + "/gone/";
    // [P/bootstrap/, P/round]: the byte after "P/round" is '\0', so "P/round/..." lies beyond.
    feed_ = s.watch(std::string(prefix) + "/bootstrap/", std::string(prefix) + "/round" + '\0');
    gone_ = s.watch(alive_prefix_, std::string(prefix) + "/alive0", feed_options{false, false, true});
    keys_.clear();
    ended_.clear();
    ++version_;
    refresh();
  }

  /// Takes in what the feeds have (nothing asked of a pushing store; a list() of a polled one).
  void refresh() {
    if (take_into(*feed_, keys_)) ++version_;
    bool reset = false;
    auto events = gone_->take(reset);
    if (reset || !events.empty()) ++version_;
    for (auto& e : events) {
      if (e.previous && e.key.starts_with(alive_prefix_)) ended_.emplace(e.key.substr(alive_prefix_.size()), *e.previous);
    }
    if (reset) {
      // The erasures in the gap are lost: what the heartbeat keys hold now says who ended.
      stale_ = true;
    }
  }

  /// Waits up to `timeout` for a change to either feed, then takes it in. Feeds that cannot be
  /// waited on together are polled ones (a shm:// store's), whose wait() is a look every 2 ms.
  void wait(std::chrono::milliseconds timeout) {
    const int keys = feed_->readable_fd(), ends = gone_->readable_fd();
    if (keys >= 0 && ends >= 0) {
      pollfd p[2] = {{keys, POLLIN, 0}, {ends, POLLIN, 0}};
      // A signal (a preemption notice) ends the wait early: the caller looks at it.
      (void)::poll(p, 2, static_cast<int>(std::max<std::int64_t>(timeout.count(), 0)));
    } else {
      feed_->wait(timeout);
    }
    refresh();
  }

  /// Whether the participant `id` in its life `incarnation` is alive, as far as the view knows.
  /// A life ends when its heartbeat key is erased, or when a peer declared it gone
  /// (P/gone/<id>: its peer heartbeats stopped).
  [[nodiscard]] bool alive(const std::string& id, const std::string& incarnation) const {
    if (ended_.contains({id, incarnation})) return false;
    // poll() asks this of every member at each look: no key built unless some life is gone.
    const auto first = keys_.lower_bound(gone_prefix_);
    if (first == keys_.end() || !first->first.starts_with(gone_prefix_)) return true;
    const auto gone = keys_.find(gone_prefix_ + id);
    return gone == keys_.end() || gone->second != incarnation;
  }

  /// Takes in a key the store answered this participant with (a compare_set's outcome) ahead of
  /// its feed, which brings the same value later: only for keys written once. A closer that
  /// waited for its own outcome to come back round sent it again, once per look (1,024 members:
  /// 50 KB each time, 100-150 ms per request, 2026-12-07).
  void learn(const std::string& key, std::string value) {
    keys_.insert_or_assign(key, std::move(value));
    ++version_;
  }

  /// Takes the life `incarnation` of `id` for ended (we declared it gone ourselves).
  void mark_ended(const std::string& id, const std::string& incarnation) {
    if (ended_.emplace(id, incarnation).second) ++version_;
  }

  /// Counts the changes taken in (feed events, heartbeat reads, lives marked ended): what a
  /// reader derived from the copy holds while this stays the same.
  [[nodiscard]] std::uint64_t version() const noexcept { return version_; }

  /// Reads the heartbeat keys (one list) and takes each of `lives` without one for ended: for a
  /// reader that needs to know of lives that ended before its feeds began (a newcomer), or after
  /// a feed lost its place.
  template <class Lives>
  void read_alive(const Lives& lives) {
    std::map<std::string, std::string, std::less<>> now;
    for (auto& [k, v] : store_->list(alive_prefix_)) now.emplace(k.substr(alive_prefix_.size()), std::move(v));
    for (const auto& l : lives) {
      const auto it = now.find(l.id);
      if (it == now.end() || it->second != l.incarnation) ended_.emplace(l.id, l.incarnation);
    }
    ++version_;  // the lives read may have been others' than the copy took for alive
    stale_ = false;
  }

  /// Whether a feed of heartbeats lost its place since the last read_alive().
  [[nodiscard]] bool stale() const noexcept { return stale_; }

  [[nodiscard]] std::optional<std::string> get(std::string_view key) const {
    const auto it = keys_.find(key);
    if (it == keys_.end()) return std::nullopt;
    return it->second;
  }

  /// Each key under `prefix` with its value, the prefix cut off the key.
  [[nodiscard]] std::vector<std::pair<std::string, std::string>> under(std::string_view prefix) const {
    std::vector<std::pair<std::string, std::string>> out;
    for (auto it = keys_.lower_bound(prefix); it != keys_.end() && it->first.starts_with(prefix); ++it) {
      out.emplace_back(it->first.substr(prefix.size()), it->second);
    }
    return out;
  }

 private:
  store* store_ = nullptr;
  std::string alive_prefix_, gone_prefix_;
  std::unique_ptr<key_feed> feed_;  // the membership keys but the heartbeats
  std::unique_ptr<key_feed> gone_;  // the heartbeats' erasures
  keys keys_;
  std::set<std::pair<std::string, std::string>> ended_;  // (id, incarnation) whose heartbeat ended
  bool stale_ = false;
  std::uint64_t version_ = 0;
};

}  // namespace elastic::inline v1::rendezvous::detail
