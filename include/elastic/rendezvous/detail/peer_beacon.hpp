// Heartbeats between the members of a round, over UDP, so that a member that vanished without a
// word (a host that froze, lost its network or its power) is noticed in seconds without asking
// the store: each member sends a small datagram every `beat` to the next `watchers` members in
// rank order (wrapping around), and watches the `watchers` before it. A watched member silent
// for half of `silent_after` is reported quiet (a warning), for all of it silent (the rendezvous
// then says so in the store, P/gone/<id>, and every member sees a departure). A member that was
// only starved, not gone, sees itself declared gone and joins again as a new incarnation.
// Only a member heard at least once (in this life of it) is ever reported silent: where beats
// cannot pass at all (a firewall, an address others cannot route to), nobody is evicted; the
// member is reported unheard instead, once, for a warning.
//
// A datagram is "EB1 <token> <id> <incarnation>": the token (the run's) keeps runs apart; nothing
// else is trusted from it. Beats are best effort: a lost one is covered by the next, and the
// store's lease remains the backstop.
#pragma once

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <elastic/error.hpp>
#include <elastic/internal/env.hpp>
#include <elastic/internal/unique_fd.hpp>

namespace elastic::inline v1::rendezvous::detail {

/// A member as the beacon knows it: who, which life, where its beacon listens ("ip:port",
/// "[ipv6]:port"; empty: it has none).
struct beacon_peer {
  std::string id;
  std::string incarnation;
  std::string address;
  friend bool operator==(const beacon_peer&, const beacon_peer&) = default;
};

class peer_beacon {
 public:
  using clock = std::chrono::steady_clock;

  /// Listens on `host` (an address of this host the others can route to) on a port the kernel
  /// picks; `token` names the run. Throws errc::unavailable when no socket can be had.
  peer_beacon(const std::string& host, std::string token, std::chrono::milliseconds beat,
              std::chrono::milliseconds silent_after, std::size_t watchers = 2)
      : token_(std::move(token)), beat_(beat), silent_after_(silent_after), watchers_(watchers) {
    if (beat.count() <= 0) {
      throw error(errc::invalid_argument, fmt::format("peer heartbeats: interval {} ms must be positive", beat.count()));
    }
    const auto addr = resolve(host, 0);
    if (!addr) throw error(errc::invalid_argument, fmt::format("peer heartbeats: '{}' is not an address", host));
    fd_ = internal::unique_fd(::socket(addr->first.ss_family, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    sockaddr_storage bound = addr->first;
    socklen_t len = addr->second;
    if (!fd_ || ::bind(fd_.get(), reinterpret_cast<const sockaddr*>(&bound), len) != 0 ||
        ::getsockname(fd_.get(), reinterpret_cast<sockaddr*>(&bound), &len) != 0) {
      throw error(errc::unavailable, fmt::format("peer heartbeats: cannot listen on {}: {}", host, std::strerror(errno)));
    }
    wake_ = internal::unique_fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!wake_) throw error(errc::unavailable, fmt::format("peer heartbeats: no eventfd: {}", std::strerror(errno)));
    const int port = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<const sockaddr_in6*>(&bound)->sin6_port)
                                                 : ntohs(reinterpret_cast<const sockaddr_in*>(&bound)->sin_port);
    address_ = host.find(':') != std::string::npos ? fmt::format("[{}]:{}", host, port) : fmt::format("{}:{}", host, port);
    thread_ = std::jthread([this](std::stop_token st) { run(st); });
  }

  peer_beacon(const peer_beacon&) = delete;
  peer_beacon& operator=(const peer_beacon&) = delete;
  ~peer_beacon() = default;  // the thread (last member) stops and joins first

  [[nodiscard]] const std::string& address() const noexcept { return address_; }

  /// Beats for the round whose members are `members` (rank order) with us at `self`: we send
  /// to the next `watchers` and watch the previous ones, each given a full `silent_after` from now.
  void follow(const std::vector<beacon_peer>& members, std::size_t self) {
    follow(members.size(), self, [&](std::size_t i) -> const beacon_peer& { return members[i]; });
  }
  /// The same for a round of `n` members where `at(i)` gives member i: only the members around
  /// `self` are asked for (a round of 1,024 is not copied by each of its members).
  template <class At>
  void follow(std::size_t n, std::size_t self, At at) {
    std::lock_guard lk(mu_);
    targets_.clear();
    watched_.clear();
    if (n < 2 || self >= n) return;
    const std::size_t k = std::min(watchers_, n - 1);
    const auto now = clock::now();
    for (std::size_t d = 1; d <= k; ++d) {
      const beacon_peer next = at((self + d) % n);
      if (auto a = parse_address(next.address)) targets_.push_back(*a);
      beacon_peer prev = at((self + n - d) % n);
      if (!prev.address.empty()) {
        std::string id = prev.id;
        watched_.emplace(std::move(id), watch{std::move(prev), now, false, false});
      }
    }
  }

  /// Stops beating and watching (between rounds).
  void pause() {
    std::lock_guard lk(mu_);
    targets_.clear();
    watched_.clear();
  }

  /// Watched members newly silent for half of silent_after (`quiet`) and for all of it
  /// (`silent`), each reported once per follow(); `unheard`: watched members never heard at all
  /// within silent_after (their beats cannot reach us: they are never reported silent).
  void take(std::vector<beacon_peer>& quiet, std::vector<beacon_peer>& silent, std::vector<beacon_peer>& unheard) {
    std::lock_guard lk(mu_);
    const auto now = clock::now();
    // An observer that was itself stopped (frozen, starved) has not been listening: its
    // silence is no evidence. It starts counting again.
    if (now - ticked_ > stall_) {
      restart_counting(now);
      return;
    }
    for (auto& [id, w] : watched_) {
      const auto gap = now - w.heard;
      if (!heard_.contains({w.who.id, w.who.incarnation})) {
        if (!w.warned && gap >= silent_after_) {
          w.warned = true;
          unheard.push_back(w.who);
        }
        continue;
      }
      if (!w.warned && gap >= silent_after_ / 2) {
        w.warned = true;
        quiet.push_back(w.who);
      }
      if (!w.reported && gap >= silent_after_) {
        w.reported = true;
        silent.push_back(w.who);
      }
    }
  }

 private:
  struct watch {
    beacon_peer who;
    clock::time_point heard;
    bool warned = false;
    bool reported = false;
  };
  using sockaddr_pair = std::pair<sockaddr_storage, socklen_t>;

  static std::optional<sockaddr_pair> resolve(const std::string& host, int port) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_DGRAM;
    hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
    addrinfo* found = nullptr;
    if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0 || !found) return std::nullopt;
    sockaddr_pair out{};
    std::memcpy(&out.first, found->ai_addr, found->ai_addrlen);
    out.second = static_cast<socklen_t>(found->ai_addrlen);
    ::freeaddrinfo(found);
    return out;
  }

  /// "ip:port" or "[ipv6]:port" as a socket address; nothing for anything else.
  static std::optional<sockaddr_pair> parse_address(std::string_view a) {
    const auto colon = a.rfind(':');
    if (colon == std::string_view::npos || colon == 0) return std::nullopt;
    std::string_view host = a.substr(0, colon);
    if (host.starts_with('[') && host.ends_with(']')) host = host.substr(1, host.size() - 2);
    const std::string_view digits = a.substr(colon + 1);
    const auto port = digits.size() <= 5 ? internal::parse_integer(digits) : std::nullopt;
    if (!port || *port < 1 || *port > 65535) return std::nullopt;
    return resolve(std::string(host), static_cast<int>(*port));
  }

  void restart_counting(clock::time_point now) {
    for (auto& [id, w] : watched_) w.heard = std::max(w.heard, now);
  }

  // The thread wakes for a beat or a datagram, nothing else (a stop comes through wake_): at
  // 1,024 participants on two CPUs, turns every 50 ms were 20,000 wakeups a second, and a
  // round formed 10-40 % slower for them.
  void run(const std::stop_token& st) {
    const std::stop_callback on_stop(st, [this]() noexcept {
      const std::uint64_t one = 1;
      [[maybe_unused]] const ssize_t n = ::write(wake_.get(), &one, sizeof one);
    });
    auto next_beat = clock::now();
    char buf[512];
    while (!st.stop_requested()) {
      const auto now = clock::now();
      {
        std::lock_guard lk(mu_);
        if (now - ticked_ > stall_) restart_counting(now);
        ticked_ = now;
      }
      if (now >= next_beat) {
        send_beats();
        next_beat = now + beat_;
      }
      pollfd p[2]{{fd_.get(), POLLIN, 0}, {wake_.get(), POLLIN, 0}};
      const auto wait = std::chrono::ceil<std::chrono::milliseconds>(next_beat - clock::now());
      ::poll(p, 2, static_cast<int>(std::clamp<std::int64_t>(wait.count(), 0, beat_.count())));
      for (;;) {
        const ssize_t n = ::recv(fd_.get(), buf, sizeof buf, 0);
        if (n <= 0) break;
        heard(std::string_view(buf, static_cast<std::size_t>(n)));
      }
    }
  }

  void send_beats() {
    std::vector<sockaddr_pair> to;
    std::string msg;
    {
      std::lock_guard lk(mu_);
      to = targets_;
      msg = fmt::format("EB1 {} {} {}", token_, self_id_, self_incarnation_);
    }
    for (const auto& [a, len] : to) {
      (void)::sendto(fd_.get(), msg.data(), msg.size(), MSG_DONTWAIT | MSG_NOSIGNAL, reinterpret_cast<const sockaddr*>(&a),
                     len);
    }
  }

  void heard(std::string_view m) {
    // "EB1 <token> <id> <incarnation>"
    if (!m.starts_with("EB1 ")) return;
    m.remove_prefix(4);
    const auto t = m.find(' ');
    if (t == std::string_view::npos || m.substr(0, t) != token_) return;
    m.remove_prefix(t + 1);
    const auto s = m.find(' ');
    if (s == std::string_view::npos) return;
    const std::string_view id = m.substr(0, s), incarnation = m.substr(s + 1);
    std::lock_guard lk(mu_);
    const auto it = watched_.find(id);
    if (it != watched_.end() && it->second.who.incarnation == incarnation) {
      it->second.heard = clock::now();
      if (heard_.size() < 65536) heard_.emplace(it->second.who.id, it->second.who.incarnation);
    }
  }

 public:
  /// Who we are in the beats we send (set before the first follow()).
  void identify(std::string id, std::string incarnation) {
    std::lock_guard lk(mu_);
    self_id_ = std::move(id);
    self_incarnation_ = std::move(incarnation);
  }

 private:
  const std::string token_;
  const std::chrono::milliseconds beat_;
  const std::chrono::milliseconds silent_after_;
  const std::size_t watchers_;
  internal::unique_fd fd_;
  internal::unique_fd wake_;  // an eventfd: stops the thread's wait
  std::string address_;

  std::mutex mu_;
  std::string self_id_, self_incarnation_;        // mu_
  std::vector<sockaddr_pair> targets_;            // mu_
  std::map<std::string, watch, std::less<>> watched_;  // mu_
  std::set<std::pair<std::string, std::string>> heard_;  // mu_: lives heard at least once
  clock::time_point ticked_ = clock::now();             // mu_: the thread's last turn
  // A turn later than this means this process was stopped: a turn per beat at least, with
  // 450 ms of room for a loaded machine.
  const std::chrono::milliseconds stall_{std::max<std::int64_t>(2 * beat_.count(), beat_.count() + 450)};

  std::jthread thread_;  // last: it stops before the members it uses go away
};

}  // namespace elastic::inline v1::rendezvous::detail
