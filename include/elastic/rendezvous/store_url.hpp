// Store URLs (docs/design.md): shm://NAME for one host, etcd://HOST:PORT[,HOST:PORT...] (or
// etcds:// for TLS) across hosts, relay:///PATH for the host's store relay (the Unix socket
// elastic-run serves its workers' store through: relay_store.hpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include <elastic/internal/env.hpp>
#include <elastic/internal/names.hpp>
#include <elastic/error.hpp>

namespace elastic::inline v1::rendezvous {

struct endpoint {
  std::string host;
  std::uint16_t port = 0;
  friend bool operator==(const endpoint&, const endpoint&) = default;
};

struct store_url {
  enum class kind { shm, etcd, relay };
  kind scheme = kind::shm;
  std::string name;                 ///< shm: the store name; relay: the socket's absolute path
  std::vector<endpoint> endpoints;  ///< etcd: one or more
  bool tls = false;                 ///< etcds://
};

/// Parses a store URL; bad input is errc::invalid_argument (or bad_name) saying what to write.
inline store_url parse_store_url(std::string_view url) {
  auto bad = [&](const std::string& why) -> store_url {
    throw error(errc::invalid_argument, fmt::format("store URL '{}' {}: use shm://NAME or etcd://HOST:PORT[,HOST:PORT]",
                                                    internal::printable(url), why));
  };
  const auto sep = url.find("://");
  if (sep == std::string_view::npos) return bad("has no scheme");
  const std::string_view scheme = url.substr(0, sep), rest = url.substr(sep + 3);
  store_url out;
  if (scheme == "shm") {
    out.scheme = store_url::kind::shm;
    internal::validate_shm_name("store", rest);
    out.name = std::string(rest);
    return out;
  }
  if (scheme == "relay") {
    if (!rest.starts_with('/')) return bad("names no absolute socket path (relay:///PATH)");
    if (rest.find('\0') != std::string_view::npos) return bad("holds a NUL");
    out.scheme = store_url::kind::relay;
    out.name = std::string(rest);
    return out;
  }
  if (scheme != "etcd" && scheme != "etcds") return bad("has the unknown scheme '" + std::string(scheme) + "'");
  out.scheme = store_url::kind::etcd;
  out.tls = scheme == "etcds";
  if (rest.empty()) return bad("names no endpoint");
  std::size_t start = 0;
  while (start <= rest.size()) {
    const auto comma = rest.find(',', start);
    const std::string_view ep = rest.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    // [v6]:port or host:port
    std::string_view host, port;
    if (!ep.empty() && ep.front() == '[') {
      const auto close = ep.find(']');
      if (close == std::string_view::npos || close + 1 >= ep.size() || ep[close + 1] != ':') return bad("has a malformed IPv6 endpoint");
      host = ep.substr(1, close - 1);
      port = ep.substr(close + 2);
    } else {
      const auto colon = ep.rfind(':');
      if (colon == std::string_view::npos) return bad("has the endpoint '" + std::string(ep) + "' without a port");
      host = ep.substr(0, colon);
      port = ep.substr(colon + 1);
    }
    if (host.empty()) return bad("has an endpoint without a host");
    for (char c : host) {
      const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '-' || c == ':';
      if (!ok) return bad("has a host with the character '" + internal::printable(std::string_view(&c, 1)) + "'");
    }
    const auto p = port.size() <= 5 ? internal::parse_integer(port) : std::nullopt;
    if (!p || *p < 1 || *p > 65535) return bad("has the port '" + std::string(port) + "', not 1 to 65535");
    out.endpoints.push_back({std::string(host), static_cast<std::uint16_t>(*p)});
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

}  // namespace elastic::inline v1::rendezvous
