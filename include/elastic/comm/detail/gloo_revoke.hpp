// Failing a Gloo communicator's connections from outside the collective: how gloo_communicator's
// revoke() ends a collective in flight on another thread at once. Needs Gloo (elastic::gloo).
//
// Gloo 0.5 (Debian's 0.0~git20220518) has no public abort, and Debian's headers cannot name its
// tcp::Pair (gloo/common/memory.h is not shipped). What it does have: a pair whose socket reads
// end-of-stream fails itself (its device loop calls Pair::signalException), which hands an
// IoException to the buffers queued on the pair, so the collective waiting there throws now;
// the pair moves to CLOSED, so later sends and receives throw too. (Not to a transfer already on
// the wire: detail/gloo_waits.hpp wakes those.) That is what a peer that died
// causes; shutdown(2) of our own end causes the same, at once, and sends the peer a FIN so its
// collectives with us fail as well. shutdown leaves the descriptor Gloo's: Gloo still closes it.
//
// Gloo keeps each pair's descriptor to itself, so the sockets are found by their endpoints: right
// after the connect, the process's sockets whose local address is a pair's (Gloo's own
// getsockname of it) are noted with their peers; a revoke shuts down the sockets of the process
// whose (local, peer) is one of those. A TCP connection's two endpoints are unique on the host,
// and every socket is looked at through a dup of its descriptor, so a descriptor that Gloo closes
// (and the process reuses) meanwhile is never taken for a pair's. Without /proc/self/fd nothing
// is found: a revoke then still refuses every later call, and the collective in flight ends at
// its timeout as before.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <gloo/context.h>
#include <gloo/transport/pair.h>
#include <gloo/transport/tcp/address.h>

#include <elastic/internal/unique_fd.hpp>

namespace elastic::inline v1::comm::detail {

/// The connected TCP sockets of one Gloo context's pairs, and a way to shut them all down.
class gloo_pair_sockets {
 public:
  gloo_pair_sockets() = default;

  /// Notes the sockets of `context`'s pairs (a tcp device's, all connected): call it right after
  /// the connect, on the connecting thread. Allocates; throws std::bad_alloc only.
  explicit gloo_pair_sockets(::gloo::Context& context) {
    std::vector<std::string> locals;
    for (int i = 0; i < context.size; ++i) {
      if (i == context.rank || !context.getPair(i)) continue;
      const auto& a = static_cast<const ::gloo::transport::tcp::Address&>(context.getPair(i)->address());
      if (auto k = key(a.getSockaddr())) locals.push_back(std::move(*k));
    }
    std::sort(locals.begin(), locals.end());
    each_socket([&](int, const std::string& local, const std::string& peer) {
      if (std::binary_search(locals.begin(), locals.end(), local)) connections_.emplace_back(local, peer);
    });
    std::sort(connections_.begin(), connections_.end());
  }

  /// How many connections were found (size - 1 for a healthy context).
  [[nodiscard]] std::size_t size() const noexcept { return connections_.size(); }

  /// Shuts every noted connection down, both ways: the collectives waiting on them fail now.
  /// Any thread, any number of times; a connection Gloo closed already is simply not found.
  void shut_down() const noexcept {
    if (connections_.empty()) return;
    try {
      each_socket([&](int fd, const std::string& local, const std::string& peer) {
        if (std::binary_search(connections_.begin(), connections_.end(), std::pair(local, peer))) {
          ::shutdown(fd, SHUT_RDWR);
        }
      });
    } catch (...) {
      // No memory to look: the collective's own timeout still ends it.
    }
  }

 private:
  /// An endpoint as comparable bytes: family, address, port (nothing for other families).
  static std::optional<std::string> key(const sockaddr_storage& ss) {
    std::string k(1, static_cast<char>(ss.ss_family));
    if (ss.ss_family == AF_INET) {
      const auto& a = reinterpret_cast<const sockaddr_in&>(ss);
      k.append(reinterpret_cast<const char*>(&a.sin_addr), sizeof a.sin_addr);
      k.append(reinterpret_cast<const char*>(&a.sin_port), sizeof a.sin_port);
    } else if (ss.ss_family == AF_INET6) {
      const auto& a = reinterpret_cast<const sockaddr_in6&>(ss);
      k.append(reinterpret_cast<const char*>(&a.sin6_addr), sizeof a.sin6_addr);
      k.append(reinterpret_cast<const char*>(&a.sin6_port), sizeof a.sin6_port);
    } else {
      return std::nullopt;
    }
    return k;
  }

  /// Calls f(fd, local, peer) for each connected IP socket of the process, `fd` a dup of its
  /// descriptor (closed after the call): what it names cannot change under f.
  template <class F>
  static void each_socket(F&& f) {
    DIR* dir = ::opendir("/proc/self/fd");
    if (dir == nullptr) return;
    const int own = ::dirfd(dir);
    while (const dirent* e = ::readdir(dir)) {
      char* end = nullptr;
      const long n = std::strtol(e->d_name, &end, 10);
      if (end == e->d_name || *end != '\0' || n == own) continue;
      const internal::unique_fd fd(::fcntl(static_cast<int>(n), F_DUPFD_CLOEXEC, 0));
      if (!fd) continue;  // closed meanwhile
      sockaddr_storage self{}, peer{};
      socklen_t self_len = sizeof self, peer_len = sizeof peer;
      if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&self), &self_len) != 0) continue;  // not a socket
      if (::getpeername(fd.get(), reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) continue;  // not connected
      auto local = key(self), remote = key(peer);
      if (local && remote) {
        try {
          f(fd.get(), *local, *remote);
        } catch (...) {
          ::closedir(dir);
          throw;
        }
      }
    }
    ::closedir(dir);
  }

  std::vector<std::pair<std::string, std::string>> connections_;  // (local, peer), sorted
};

}  // namespace elastic::inline v1::comm::detail
