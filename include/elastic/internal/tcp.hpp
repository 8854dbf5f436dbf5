// Plain TCP for the library's own bulk transfers (a group's peer-memory replicas): a listener on
// an address with a port the kernel picks, a connect bounded in time, and reads and writes with
// a deadline, so that a peer that stops answering can stall a background thread at most that long.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include <fmt/format.h>

#include <elastic/error.hpp>
#include <elastic/internal/unique_fd.hpp>

namespace elastic::inline v1::internal::tcp {

using clock = std::chrono::steady_clock;

/// Waits until `fd` is ready for `events` or `deadline` passes (errc::timeout naming `what`).
inline void wait_ready(int fd, short events, clock::time_point deadline, const std::string& what) {
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now()).count();
    if (left <= 0) throw error(errc::timeout, what + ": the peer did not answer in time");
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, static_cast<int>(std::min<long long>(left, 1000)));
    if (rc > 0) return;
    if (rc < 0 && errno != EINTR) throw os_error(what);
  }
}

/// Resolves `host`:`port` (numeric or a name; IPv4 or IPv6).
inline std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> resolve(const std::string& host, std::uint16_t port,
                                                                     bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* found = nullptr;
  const std::string p = std::to_string(port);
  if (const int rc = ::getaddrinfo(host.c_str(), p.c_str(), &hints, &found); rc != 0) {
    throw error(errc::not_found, fmt::format("cannot resolve '{}': {}", host, ::gai_strerror(rc)));
  }
  return {found, &::freeaddrinfo};
}

/// A listening socket on `host` (port chosen by the kernel); returns it and the port.
inline std::pair<unique_fd, std::uint16_t> listen_on(const std::string& host) {
  const auto list = resolve(host, 0, true);
  std::string why = "no address";
  for (const addrinfo* a = list.get(); a != nullptr; a = a->ai_next) {
    unique_fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd || ::bind(fd.get(), a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd.get(), SOMAXCONN) != 0) {
      why = std::strerror(errno);
      continue;
    }
    sockaddr_storage self{};
    socklen_t len = sizeof self;
    if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&self), &len) != 0) throw os_error("getsockname");
    const std::uint16_t port = ntohs(self.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&self)->sin6_port
                                                                : reinterpret_cast<sockaddr_in*>(&self)->sin_port);
    return {std::move(fd), port};
  }
  throw error(errc::os_error, fmt::format("cannot listen on {}: {}", host, why));
}

/// A connection accepted from `listener` within `wait` (an empty fd when none came), blocking.
inline unique_fd accept_for(int listener, std::chrono::milliseconds wait) {
  pollfd p{listener, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(wait.count())) <= 0) return {};
  unique_fd fd(::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
  return fd;
}

/// The address of the peer of the connected `fd` ("host:port", "[v6]:port"; "?" when unknown).
inline std::string peer_name(int fd) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  char text[INET6_ADDRSTRLEN] = "?";
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return "?";
  if (a.ss_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(&a);
    ::inet_ntop(AF_INET, &v4->sin_addr, text, sizeof text);
    return fmt::format("{}:{}", text, ntohs(v4->sin_port));
  }
  if (a.ss_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&a);
    ::inet_ntop(AF_INET6, &v6->sin6_addr, text, sizeof text);
    return fmt::format("[{}]:{}", text, ntohs(v6->sin6_port));
  }
  return "?";
}

/// Connects to `host`:`port` by `deadline` (errc::timeout, or errc::os_error saying why).
inline unique_fd connect_to(const std::string& host, std::uint16_t port, clock::time_point deadline) {
  const auto list = resolve(host, port, false);
  const std::string what = fmt::format("connect to {}:{}", host, port);
  std::string why = "no address";
  for (const addrinfo* a = list.get(); a != nullptr; a = a->ai_next) {
    unique_fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd) {
      why = std::strerror(errno);
      continue;
    }
    if (::connect(fd.get(), a->ai_addr, a->ai_addrlen) != 0) {
      if (errno != EINPROGRESS) {
        why = std::strerror(errno);
        continue;
      }
      wait_ready(fd.get(), POLLOUT, deadline, what);
      int err = 0;
      socklen_t len = sizeof err;
      if (::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
        why = std::strerror(err != 0 ? err : errno);
        continue;
      }
    }
    const int one = 1;
    (void)::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
  }
  throw error(errc::os_error, fmt::format("{}: {}", what, why));
}

/// Sends all `n` bytes by `deadline` (never raises SIGPIPE: a peer that died is an os_error).
inline void send_all(int fd, const void* data, std::size_t n, clock::time_point deadline, const std::string& what) {
  auto p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w > 0) {
      p += w;
      n -= static_cast<std::size_t>(w);
      continue;
    }
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      wait_ready(fd, POLLOUT, deadline, what);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    throw os_error(what);
  }
}

/// Receives exactly `n` bytes by `deadline`; a peer that closes first is errc::peer_lost.
inline void recv_all(int fd, void* data, std::size_t n, clock::time_point deadline, const std::string& what) {
  auto p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = ::recv(fd, p, n, 0);
    if (r > 0) {
      p += r;
      n -= static_cast<std::size_t>(r);
      continue;
    }
    if (r == 0) throw error(errc::peer_lost, what + ": the peer closed the connection");
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      wait_ready(fd, POLLIN, deadline, what);
      continue;
    }
    if (errno == EINTR) continue;
    throw os_error(what);
  }
}

}  // namespace elastic::inline v1::internal::tcp
