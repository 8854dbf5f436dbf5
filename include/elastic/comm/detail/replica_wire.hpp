// The peer replicas' wire (detail/peer_replicas.hpp sends and receives it), in host byte order
// (the ranks of one run are one architecture), one connection per
// replica: magic "ELRP", version, run id, group token, source rank, world, step, each entry's
// size, the bytes, their CRC-32C; the receiver answers one byte (0 kept, 1 refused). A receiver
// checks all of it against its own state (the run id and its group's token, the entries, the
// sizes the partition gives) before it allocates anything, so a stray or hostile connection, or
// another job that reuses the run id on the host, is refused, and a replica that arrives torn
// is never kept. The token is random, made by each rank, and every rank takes rank 0's at each
// resync: the same for the whole life of a group, another for any other group.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <elastic/internal/tcp.hpp>

namespace elastic::inline v1::comm::detail::wire {

inline constexpr std::uint32_t magic = 0x50524c45;  // "ELRP"
inline constexpr std::uint32_t version = 1;

/// A bound on a transfer: 10 s, plus a second per 50 MB (a slow link, not a dead peer).
inline std::chrono::milliseconds transfer_time(std::uint64_t bytes) {
  return std::chrono::seconds(10) + std::chrono::milliseconds(bytes / 50'000);
}

template <class T>
void put(std::vector<std::byte>& out, T v) {
  const auto* p = reinterpret_cast<const std::byte*>(&v);
  out.insert(out.end(), p, p + sizeof v);
}

template <class T>
T get(int fd, internal::tcp::clock::time_point deadline) {
  T v{};
  internal::tcp::recv_all(fd, &v, sizeof v, deadline, "replica header");
  return v;
}

/// A random nonzero token.
inline std::uint64_t random_token() {
  std::random_device rd;
  std::uint64_t t = 0;
  while (t == 0) t = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
  return t;
}

}  // namespace elastic::inline v1::comm::detail::wire
