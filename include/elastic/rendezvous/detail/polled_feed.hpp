// The key feed of a store that cannot push changes: each take() lists the range and reports the
// difference from the previous list. Nothing runs between looks, so an idle reader costs the
// store nothing; each look costs one list() of the range's longest common prefix.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <elastic/rendezvous/key_feed.hpp>

namespace elastic::inline v1::rendezvous::detail {

class polled_feed final : public key_feed {
 public:
  using lister = std::function<std::vector<std::pair<std::string, std::string>>(std::string_view prefix)>;

  /// Follows [from, to) through `list`; wait() sleeps at most `period` (a look's latency).
  polled_feed(lister list, std::string from, std::string to, std::chrono::milliseconds period, feed_options o = {})
      : list_(std::move(list)), from_(std::move(from)), to_(std::move(to)), period_(period), options_(o) {
    const auto end = std::mismatch(from_.begin(), from_.end(), to_.begin(), to_.end()).first;
    prefix_.assign(from_.begin(), end);
    if (!options_.snapshot) seen_ = look();  // changes from now on
  }

  std::vector<key_event> take(bool& reset) override {
    reset = false;
    auto now = look();
    std::vector<key_event> out;
    if (options_.puts) {
      for (const auto& [k, v] : now) {
        const auto it = seen_.find(k);
        if (it == seen_.end() || it->second != v) out.push_back({k, v, std::nullopt});
      }
    }
    for (auto& [k, v] : seen_) {
      if (!now.contains(k)) out.push_back({k, std::nullopt, options_.previous ? std::optional(std::move(v)) : std::nullopt});
    }
    seen_ = std::move(now);
    return out;
  }

  bool wait(std::chrono::milliseconds timeout) override {
    std::this_thread::sleep_for(std::clamp(timeout, std::chrono::milliseconds(0), period_));
    return true;
  }

 private:
  std::map<std::string, std::string, std::less<>> look() {
    std::map<std::string, std::string, std::less<>> now;
    for (auto& [k, v] : list_(prefix_)) {
      if (k >= from_ && k < to_) now.emplace(std::move(k), std::move(v));
    }
    return now;
  }

  lister list_;
  std::string from_, to_, prefix_;
  std::chrono::milliseconds period_;
  feed_options options_;
  std::map<std::string, std::string, std::less<>> seen_;
};

}  // namespace elastic::inline v1::rendezvous::detail
