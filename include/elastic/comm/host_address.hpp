// The address this rank's peers reach it at, for the connections a group makes itself (Gloo's
// pairs, peer-memory replicas): one rule, so that both listen where elastic-run said.
#pragma once

#include <algorithm>
#include <string>

#include <elastic/error.hpp>
#include <elastic/internal/env.hpp>
#include <elastic/internal/names.hpp>

namespace elastic::inline v1::comm {

/// The address a rank listens on and publishes: $ELASTIC_HOST_ADDR (elastic-run sets it to this
/// host's address towards the store, so that ranks on other hosts reach it), else loopback.
inline std::string default_host_address() {
  auto addr = internal::env_string("ELASTIC_HOST_ADDR");
  if (!addr) return "127.0.0.1";
  // A host name, an IPv4 or an IPv6 address: anything else would fail later, inside a
  // connect, with a message that does not say where the value came from.
  const bool ok = addr->size() <= 253 && std::all_of(addr->begin(), addr->end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '-' || c == ':';
  });
  if (!ok) {
    throw error(errc::invalid_argument,
                "ELASTIC_HOST_ADDR='" + internal::printable(*addr) +
                    "' is not a host name or an IP address (up to 253 characters of A-Z a-z 0-9 . - :); fix or "
                    "unset it (elastic-run sets it)");
  }
  return *addr;
}

}  // namespace elastic::inline v1::comm
