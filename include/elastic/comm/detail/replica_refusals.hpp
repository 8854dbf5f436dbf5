// How a rank's replica listener (detail/replica_listener.hpp) reports the connections it
// refuses: each refusal is counted, and one `replica_refused` event per interval says how many,
// the last one's reason, its rank (when it proved it is a member) and its address. A flood of
// strangers costs a line per interval, never one a connection.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>

#include <elastic/events.hpp>
#include <elastic/internal/tcp.hpp>

namespace elastic::inline v1::comm::detail {

class replica_refusals {
 public:
  /// At most one `replica_refused` event per interval, with the count of refusals in it.
  static constexpr std::chrono::seconds interval{10};

  explicit replica_refusals(event_log events) : events_(std::move(events)) {}

  /// Counts a refusal, logged by the next log() that finds the interval over. `from` is the
  /// peer's rank once it proved it is a member (else -1), `peer` its address.
  void count(const std::string& why, std::int64_t from, std::string peer) {
    std::lock_guard lk(mu_);
    ++pending_.count;
    pending_.reason = why;
    pending_.from = from;
    pending_.peer = std::move(peer);
  }

  /// One `replica_refused` event for the refusals not logged yet, when the interval has passed
  /// since the last one (or `now_anyway`).
  void log(bool now_anyway) {
    std::uint64_t count = 0;
    std::string reason, peer;
    std::int64_t from = -1;
    {
      std::lock_guard lk(mu_);
      const auto now = internal::tcp::clock::now();
      if (pending_.count == 0 || (!now_anyway && pending_.logged && now - pending_.last < interval)) return;
      count = std::exchange(pending_.count, 0);
      reason = std::move(pending_.reason);
      from = pending_.from;
      peer = std::move(pending_.peer);
      pending_.last = now;
      pending_.logged = true;
    }
    events_.emit("replica_refused", {{"count", count},
                                     {"reason", reason},
                                     {"from", from},
                                     {"peer", peer},
                                     {"interval_s", static_cast<std::int64_t>(interval.count())}});
  }

 private:
  event_log events_;
  std::mutex mu_;
  struct {
    std::uint64_t count = 0;  // refusals not logged yet
    std::string reason;       // the last one's
    std::int64_t from = -1;   // its rank, when it proved it is a member
    std::string peer;         // its address
    internal::tcp::clock::time_point last{};
    bool logged = false;
  } pending_;  // guarded by mu_
};

}  // namespace elastic::inline v1::comm::detail
