// A participant's copy of its run's membership keys, kept by a key feed: the keys from
// P/alive/ up to P/round (heartbeats, outcomes, closers, bootstraps, the bounds, departures on
// purpose, pending joiners, the round number) and none of a round's own keys (P/round/<r>/...:
// joins, communicator bootstraps), which change often and concern fewer readers. Every wait of
// the rendezvous and every poll() reads this copy: on etcd, that costs the store nothing until a
// key in the range changes.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <elastic/rendezvous/key_feed.hpp>
#include <elastic/rendezvous/store.hpp>

namespace elastic::inline v1::rendezvous::detail {

class run_view {
 public:
  using keys = std::map<std::string, std::string, std::less<>>;

  /// The range a run's view follows, under run prefix P: [P/alive/, P/round] (the byte after
  /// "P/round" is '\0', so "P/round/..." lies beyond it).
  static std::string range_from(std::string_view prefix) { return std::string(prefix) + "/alive/"; }
  static std::string range_to(std::string_view prefix) { return std::string(prefix) + "/round" + '\0'; }

  [[nodiscard]] bool open() const noexcept { return feed_ != nullptr; }

  /// Starts following the run under `prefix` in `s` (reads the range once).
  void open(store& s, std::string_view prefix) {
    feed_ = s.watch(range_from(prefix), range_to(prefix));
    keys_.clear();
    refresh();
  }

  /// Takes in what the feed has (nothing asked of a pushing store; one list() of a polled one).
  void refresh() {
    bool reset = false;
    auto events = feed_->take(reset);
    if (reset) keys_.clear();
    for (auto& e : events) {
      if (e.value) {
        keys_.insert_or_assign(std::move(e.key), *std::move(e.value));
      } else {
        keys_.erase(e.key);
      }
    }
  }

  /// Waits up to `timeout` for a change (a polled feed: a short sleep), then takes it in.
  void wait(std::chrono::milliseconds timeout) {
    feed_->wait(timeout);
    refresh();
  }

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
  std::unique_ptr<key_feed> feed_;
  keys keys_;
};

}  // namespace elastic::inline v1::rendezvous::detail
