// Our key-value store seen through Gloo's `gloo::rendezvous::Store` interface: how a Gloo
// communicator publishes and finds its peers' transport addresses while connecting. Its waits
// look at the preemption notice every 100 ms, so a rank connecting to peers that never come stops
// (errc::interrupted) when it is preempted; in an elastic group they also run the round's check
// (comm/rebuild.hpp), so a member of the round lost meanwhile stops them (errc::peer_lost).
// Needs Gloo (elastic::gloo).
#pragma once

#include <algorithm>
#include <chrono>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <gloo/rendezvous/store.h>

#include <elastic/checkpoint/preemption.hpp>
#include <elastic/comm/rebuild.hpp>
#include <elastic/error.hpp>
#include <elastic/rendezvous/store.hpp>

namespace elastic::inline v1::comm {

/// Our store seen through Gloo's `gloo::rendezvous::Store` interface, every key under
/// `<prefix>/`. Gloo publishes each rank's transport addresses through it while connecting.
/// Not thread-safe beyond what the underlying store is; it only lives through the connect.
class gloo_store_adapter final : public ::gloo::rendezvous::Store {
 public:
  /// Keys go to `<prefix>/<gloo key>` in `store`; a wait without its own timeout uses `timeout`.
  gloo_store_adapter(rendezvous::store& store, std::string prefix, std::chrono::milliseconds timeout)
      : store_(store), prefix_(std::move(prefix)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    store_.set(full(key), std::string_view(data.data(), data.size()));
  }

  /// Gloo expects get() to wait for a key that is not there yet; we wait up to the timeout.
  std::vector<char> get(const std::string& key) override {
    const std::string k = full(key);
    for (;;) {
      if (auto v = store_.get(k)) return std::vector<char>(v->begin(), v->end());
      wait_for(std::span<const std::string>(&k, 1), timeout_);
    }
  }

  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }

  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    std::vector<std::string> full_keys;
    full_keys.reserve(keys.size());
    for (const auto& k : keys) full_keys.push_back(full(k));
    wait_for(full_keys, timeout);
  }

 private:
  std::string full(const std::string& key) const { return prefix_ + "/" + key; }

  /// The store's wait in turns of at most 100 ms, each after a look at the preemption notice: a
  /// rank connecting to peers that never come stops (errc::interrupted) when it is preempted, and
  /// (in a group) at the round's check, which throws errc::peer_lost when a member departed.
  void wait_for(std::span<const std::string> keys, std::chrono::milliseconds timeout) {
    constexpr std::chrono::milliseconds turn(100);
    const auto until = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      if (const int sig = preemption_handler::requested(); sig != 0) {
        throw error(errc::interrupted, fmt::format("gloo connect under '{}' stopped waiting for its peers: a "
                                                   "preemption notice (signal {}) came",
                                                   prefix_, sig));
      }
      detail::check_connecting_round();
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
      if (left <= turn) {
        store_.wait(keys, std::max(left, std::chrono::milliseconds(0)));  // the store's error names the missing keys
        return;
      }
      try {
        store_.wait(keys, turn);
        return;
      } catch (const error& e) {
        if (e.code() != errc::timeout) throw;
      }
    }
  }

  rendezvous::store& store_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;
};

}  // namespace elastic::inline v1::comm
