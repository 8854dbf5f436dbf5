// The connections of a rank's peer replicas (detail/peer_replicas.hpp). The listener accepts on
// a thread of its own and serves each connection on a thread of its own, at most
// max_connections at once: when the slots are full, the oldest connection that has not proven
// it is of the group is shut down to make room, so idle or stray connections never keep a
// member's replica out (and, full of members, it refuses the newcomer). It also knows the
// connection this rank's sender is on, so that cut_off() ends every transfer in flight, both
// ways, and any that starts after it.
#pragma once

#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iterator>
#include <list>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include <elastic/internal/tcp.hpp>
#include <elastic/internal/unique_fd.hpp>

namespace elastic::inline v1::comm::detail {

/// One accepted connection, served by its own thread. The listener thread alone adds and
/// erases them; the listener's mutex guards the flags and the shutdown of `fd` (only while it
/// is open).
struct replica_connection {
  internal::unique_fd fd;
  internal::tcp::clock::time_point since;
  bool member = false;   // proved it holds the group's key
  bool dropped = false;  // shut down to make room for a newer connection
  std::atomic<bool> done{false};
  std::jthread thread;  // last: it stops before the fields it uses go away
};

class replica_listener {
 public:
  /// Connections served at once; the listener refuses (or makes room among strangers) past it.
  static constexpr std::size_t max_connections = 32;

  /// Serves one connection, on its own thread.
  using serve_fn = std::function<void(replica_connection&)>;
  /// Refuses a connection (answers it and counts the refusal) for the reason given.
  using refuse_fn = std::function<void(int fd, const std::string& why)>;
  /// Runs on the listener's thread between two accepts (at least every 100 ms).
  using turn_fn = std::function<void()>;

  replica_listener() = default;
  replica_listener(const replica_listener&) = delete;
  replica_listener& operator=(const replica_listener&) = delete;

  /// Listens on `host`, on a port of the system's choice, which it returns; nothing is
  /// accepted before start().
  std::uint16_t listen(const std::string& host) {
    auto [fd, port] = internal::tcp::listen_on(host);
    fd_ = std::move(fd);
    return port;
  }

  /// Accepts on a thread of its own until a stop is requested; it joins the connections'
  /// threads on its way out.
  void start(serve_fn serve, refuse_fn refuse, turn_fn each_turn) {
    serve_ = std::move(serve);
    refuse_ = std::move(refuse);
    each_turn_ = std::move(each_turn);
    thread_ = std::jthread([this](std::stop_token stop) { loop(stop); });
  }

  void request_stop() { thread_.request_stop(); }
  void join() { thread_.join(); }

  /// Shuts down every connection served and the sender's, and any the sender opens later.
  void cut_off() {
    std::lock_guard lk(mu_);
    stopping_ = true;
    for (auto& c : conns_) ::shutdown(c.fd.get(), SHUT_RDWR);
    if (sending_fd_ >= 0) ::shutdown(sending_fd_, SHUT_RDWR);
  }

  /// `c` proved it holds the group's key: it is never dropped to make room.
  void admit(replica_connection& c) {
    std::lock_guard lk(mu_);
    c.member = true;
  }

  /// Whether `c` was shut down to make room for a newer connection.
  [[nodiscard]] bool dropped(const replica_connection& c) {
    std::lock_guard lk(mu_);
    return c.dropped;
  }

  /// The connection the sender is on, for cut_off() to shut down.
  class sending {
   public:
    sending(replica_listener& l, int fd) : l_(l) {
      std::lock_guard lk(l_.mu_);
      l_.sending_fd_ = fd;
      if (l_.stopping_) ::shutdown(fd, SHUT_RDWR);  // cut_off() has been through already
    }
    sending(const sending&) = delete;
    sending& operator=(const sending&) = delete;
    ~sending() {
      std::lock_guard lk(l_.mu_);
      l_.sending_fd_ = -1;
    }

   private:
    replica_listener& l_;
  };

 private:
  void loop(std::stop_token stop) {
    while (!stop.stop_requested()) {
      reap(false);
      each_turn_();
      auto fd = internal::tcp::accept_for(fd_.get(), std::chrono::milliseconds(100));
      if (!fd) continue;
      {
        std::lock_guard lk(mu_);
        if (stopping_) break;
        if (conns_.size() < max_connections || make_room()) {
          auto& c = conns_.emplace_back();
          c.fd = std::move(fd);
          c.since = internal::tcp::clock::now();
          c.thread = std::jthread([this, &c] {
            serve_(c);
            c.done.store(true, std::memory_order_release);
          });
          continue;
        }
      }
      refuse_(fd.get(), fmt::format("{} connections at once, all of them members' transfers", max_connections));
    }
    reap(true);
  }

  /// Joins and closes the connections that are done (all of them with `all`, once stopping).
  void reap(bool all) {
    std::list<replica_connection> over;
    {
      std::lock_guard lk(mu_);
      for (auto it = conns_.begin(); it != conns_.end();) {
        auto next = std::next(it);
        if (all || it->done.load(std::memory_order_acquire)) over.splice(over.end(), conns_, it);
        it = next;
      }
    }
    // Joined outside mu_: a connection's thread takes it on its way.
  }

  /// With mu_ held: shuts down the oldest connection that has not proven it is a member, if
  /// any (its thread then ends and counts the refusal).
  bool make_room() {
    replica_connection* oldest = nullptr;
    for (auto& c : conns_) {
      if (c.member || c.dropped || c.done.load(std::memory_order_acquire)) continue;
      if (!oldest || c.since < oldest->since) oldest = &c;
    }
    if (!oldest) return false;
    oldest->dropped = true;
    ::shutdown(oldest->fd.get(), SHUT_RDWR);
    return true;
  }

  internal::unique_fd fd_;
  serve_fn serve_;
  refuse_fn refuse_;
  turn_fn each_turn_;
  std::mutex mu_;  // guards conns_' flags, sending_fd_, stopping_: a descriptor is shut down only while open
  std::list<replica_connection> conns_;  // served now; only the listener thread adds or erases
  int sending_fd_ = -1;                  // the sender's connection now
  bool stopping_ = false;                // cut_off() has been through
  std::jthread thread_;                  // last: it stops before the members it uses go away
};

}  // namespace elastic::inline v1::comm::detail
