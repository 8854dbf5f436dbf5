// How an etcd_store talks to etcd: the prefix its keys live under, timeouts, authentication and
// TLS files. A plain options struct (designated initializers), checked when a store is made.
#pragma once

#include <chrono>
#include <string>

namespace elastic::inline v1::rendezvous {

/// How an etcd_store talks to etcd.
struct etcd_options {
  /// Every key is stored under this prefix, so that several jobs or tools share one etcd.
  std::string prefix = "/elastic/";
  /// Longest a single request may take (a watch is re-armed after this long, too).
  std::chrono::milliseconds request_timeout = std::chrono::seconds(5);
  /// Longest a TCP (and TLS) connect may take before the next endpoint is tried.
  std::chrono::milliseconds connect_timeout = std::chrono::seconds(1);
  /// How long a call keeps retrying while no endpoint answers before it throws errc::unavailable.
  std::chrono::milliseconds unavailable_timeout = std::chrono::seconds(30);
  /// etcd user and password, when etcd has authentication on (empty user: none).
  std::string user;
  std::string password;
  /// etcds:// only: the CA that signed the servers' certificates (empty: the system's), and a
  /// client certificate and key (PEM) for servers that require one.
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
};

}  // namespace elastic::inline v1::rendezvous
