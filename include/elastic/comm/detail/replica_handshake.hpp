// The listener's side of the replica handshake (the wire and the client's side:
// detail/replica_wire.hpp). It reads the client's hello, proves this rank holds the group's key,
// reads the header, bounded before anything is allocated, and checks the client's answer to
// the challenge in constant time. What the header asks for is the caller's to check
// (detail/replica_layout.hpp) once the client has proven it is of the group.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <elastic/comm/detail/memory_image.hpp>
#include <elastic/comm/detail/replica_wire.hpp>
#include <elastic/internal/sha256.hpp>
#include <elastic/internal/tcp.hpp>

namespace elastic::inline v1::comm::detail::wire {

/// What a client that proved it holds the group's key offers: its run id and the replica's
/// header (whose slices, of which world, at which step, each entry's size).
struct offer {
  std::string run_id;
  image_key key;
  std::vector<std::uint64_t> sizes;
};

/// The handshake's outcome: the offer of a member of the group, or why the connection is refused.
struct handshake_result {
  std::optional<offer> accepted;
  std::string refusal;
};

/// Serves the handshake on the accepted `fd` for the run `run_id`, whose replicas hold
/// `entries` entries. `key_now()` gives the group's key once the client's nonce has come (a
/// resync may have changed it meanwhile). Throws when the client stalls past `deadline` or
/// closes; a refusal has not answered the client yet.
template <class KeyNow>
handshake_result server_handshake(int fd, std::string_view run_id, std::size_t entries, KeyNow&& key_now,
                                  internal::tcp::clock::time_point deadline) {
  if (get<std::uint32_t>(fd, deadline) != magic) return {{}, "not a replica (bad magic)"};
  if (const auto v = get<std::uint32_t>(fd, deadline); v != version) {
    return {{}, fmt::format("replica format version {}, this build reads {}", v, version)};
  }
  nonce theirs{};
  internal::tcp::recv_all(fd, theirs.data(), theirs.size(), deadline, "replica hello");
  const auto mine = random<nonce>();
  const auto key = key_now();
  const auto proof = server_proof(key, theirs, mine, run_id);
  internal::tcp::send_all(fd, mine.data(), mine.size(), deadline, "replica challenge");
  internal::tcp::send_all(fd, proof.data(), proof.size(), deadline, "replica challenge");
  // The header, kept as it came for the client's MAC; bounded before anything is allocated.
  std::vector<std::byte> head;
  const auto id_len = get<std::uint32_t>(fd, deadline, &head);
  if (id_len != run_id.size()) return {{}, "another run (run id length differs)"};
  offer o;
  o.run_id.assign(id_len, '\0');
  internal::tcp::recv_all(fd, o.run_id.data(), o.run_id.size(), deadline, "replica header");
  head.insert(head.end(), reinterpret_cast<const std::byte*>(o.run_id.data()),
              reinterpret_cast<const std::byte*>(o.run_id.data()) + o.run_id.size());
  o.key.rank = get<std::int64_t>(fd, deadline, &head);
  o.key.world = get<std::int64_t>(fd, deadline, &head);
  o.key.step = get<std::int64_t>(fd, deadline, &head);
  const auto n = get<std::uint32_t>(fd, deadline, &head);
  if (n != entries) return {{}, fmt::format("{} partitioned entries sent, this state has {}", n, entries)};
  for (std::uint32_t i = 0; i < n; ++i) o.sizes.push_back(get<std::uint64_t>(fd, deadline, &head));
  mac answer{};
  internal::tcp::recv_all(fd, answer.data(), answer.size(), deadline, "replica answer to the challenge");
  if (!internal::equal_in_constant_time(answer, client_proof(key, theirs, mine, head))) {
    return {{}, "not of this group: its answer to the challenge is wrong (another job, or a stranger)"};
  }
  return {std::move(o), {}};
}

}  // namespace elastic::inline v1::comm::detail::wire
