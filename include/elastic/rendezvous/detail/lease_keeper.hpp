// The heartbeat of a rendezvous participant: a background thread that renews the participant's
// lease every heartbeat_interval (its alive key and join records live on it) and re-creates the
// run's registration (<key_prefix>/.runs/<run_id>, run_keys.hpp) under that lease. It notices
// when the store says the lease has expired (the group then counts us dead) and reports it
// through lost().
//
// Contract: the owner declares the keeper after everything the keeper's store reference needs;
// stop() (and the destructor) joins the thread, so no renewal runs after it returns.
#pragma once

#include <atomic>
#include <chrono>
#include <optional>
#include <string>
#include <utility>

#include <elastic/internal/periodic_thread.hpp>
#include <elastic/error.hpp>
#include <elastic/rendezvous/store.hpp>

namespace elastic::inline v1::rendezvous::detail {

class lease_keeper {
 public:
  /// Renews leases on `s` once start() is called.
  explicit lease_keeper(store& s) : store_(s) {}

  lease_keeper(const lease_keeper&) = delete;
  lease_keeper& operator=(const lease_keeper&) = delete;

  /// The lease being renewed (0: none).
  [[nodiscard]] lease_id lease() const noexcept { return lease_.load(); }
  /// Whether the store said our lease expired since the last replace().
  [[nodiscard]] bool lost() const noexcept { return lost_.load(); }

  /// Renews `fresh` from now on and returns the lease it replaces (0: none); clears lost().
  lease_id replace(lease_id fresh) noexcept {
    const lease_id old = lease_.exchange(fresh);
    lost_ = false;
    return old;
  }

  /// Starts the renewal thread, every `interval`, unless it runs already; `run_key` is the
  /// run's registration, re-created on each renewal.
  void start(std::chrono::milliseconds interval, std::string run_key) {
    if (!thread_.started()) {
      run_key_ = std::move(run_key);
      thread_ = internal::periodic_thread(interval, [this] {
        renew();
        return true;
      });
    }
  }

  /// Stops the renewal thread (waits for it) and hands back the lease, now no longer renewed.
  lease_id stop() noexcept {
    thread_.stop();
    return lease_.exchange(0);
  }

 private:
  void renew() noexcept {
    const lease_id l = lease_.load();
    if (l == 0) return;
    try {
      store_.keep_alive(l);
      store_.compare_set(run_key_, std::nullopt, "", l);
    } catch (const error& e) {
      // Only the lease we renewed counts: join() may have replaced it meanwhile.
      if (e.code() == errc::not_found && lease_.load() == l) lost_ = true;
    } catch (...) {
    }
  }

  store& store_;
  std::string run_key_;  // written only while no thread runs
  std::atomic<lease_id> lease_{0};
  std::atomic<bool> lost_{false};
  internal::periodic_thread thread_;  // last: it stops before the members it uses go away
};

}  // namespace elastic::inline v1::rendezvous::detail
