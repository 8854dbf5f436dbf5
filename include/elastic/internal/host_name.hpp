// This host's name, as events report it and as ids carry it. One sanitiser for every id that
// embeds the host (rendezvous participants, launcher slots, checkpoint probes and final-step
// files), so that the same host is spelled the same way in all of them.
#pragma once

#include <unistd.h>

#include <string>

namespace elastic::inline v1::internal {

/// gethostname(), or "" when the host has no name.
inline std::string host_name() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) return {};
  return host;
}

/// The host's name as ids carry it: [A-Za-z0-9.-] kept, anything else '_', at most 64
/// characters; "host" when it has no name.
inline std::string host_name_for_ids() {
  std::string h = host_name();
  if (h.empty()) return "host";
  for (char& c : h) {
    const bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '-';
    if (!plain) c = '_';
  }
  return h.substr(0, 64);
}

}  // namespace elastic::inline v1::internal
