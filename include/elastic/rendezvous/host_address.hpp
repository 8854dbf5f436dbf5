// The address a rank's peers reach it at. Ranks on one host meet on loopback; ranks on several
// hosts must listen on, and publish, an address of theirs that the others can route to, and the
// one sure to exist is the address this host uses towards the store every rank already reaches.
#pragma once

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>

#include <fmt/format.h>

#include <elastic/internal/file.hpp>
#include <elastic/error.hpp>
#include <elastic/rendezvous/store_url.hpp>

namespace elastic::inline v1::rendezvous {

/// This host's source address on the route to `to` (the kernel's choice for a UDP socket
/// connected there; no packet is sent). Fails, saying why, if `to` does not resolve or route.
inline std::string host_address_towards(const endpoint& to) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(to.port);
  if (const int rc = ::getaddrinfo(to.host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    throw error(errc::not_found, fmt::format("cannot resolve '{}': {}", to.host, ::gai_strerror(rc)));
  }
  const std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> list(found, &::freeaddrinfo);
  std::string why = "no address";
  for (const addrinfo* a = list.get(); a != nullptr; a = a->ai_next) {
    internal::unique_fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, 0));
    sockaddr_storage self{};
    socklen_t len = sizeof self;
    if (!fd || ::connect(fd.get(), a->ai_addr, a->ai_addrlen) != 0 ||
        ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&self), &len) != 0) {
      why = std::strerror(errno);
      continue;
    }
    char text[INET6_ADDRSTRLEN] = {};
    const char* ok = nullptr;
    if (self.ss_family == AF_INET6) {
      sockaddr_in6 in6{};
      std::memcpy(&in6, &self, sizeof in6);
      ok = ::inet_ntop(AF_INET6, &in6.sin6_addr, text, sizeof text);
    } else {
      sockaddr_in in4{};
      std::memcpy(&in4, &self, sizeof in4);
      ok = ::inet_ntop(AF_INET, &in4.sin_addr, text, sizeof text);
    }
    if (ok != nullptr) return text;
    why = std::strerror(errno);
  }
  throw error(errc::not_found, fmt::format("no route from this host to {}:{}: {}", to.host, to.port, why));
}

/// The address to listen on and publish for a store: loopback for shm:// (one host), else this
/// host's address towards the first etcd endpoint that routes.
inline std::string host_address_for(const store_url& url) {
  if (url.scheme == store_url::kind::shm) return "127.0.0.1";
  std::string why;
  for (const auto& ep : url.endpoints) {
    try {
      return host_address_towards(ep);
    } catch (const error& e) {
      why += (why.empty() ? "" : "; ") + e.message();
    }
  }
  throw error(errc::not_found, fmt::format("cannot tell this host's address for its peers ({}): give it with "
                                           "--host-addr or ELASTIC_HOST_ADDR",
                                           why));
}

}  // namespace elastic::inline v1::rendezvous
