// The peer replicas' wire (detail/peer_replicas.hpp sends and receives it), in host byte order
// (the ranks of one run are one architecture), one connection per replica. Both ends prove they
// hold the group's key before anything of the state moves, and the key itself never travels on
// this wire (a process that took over a peer's recorded address, or records the traffic, learns
// nothing it can use; a replay fails against a fresh nonce):
//   client: magic "ELRP", version, a fresh 32-byte nonce Nc
//   server: a fresh 32-byte nonce Ns, HMAC-SHA256(key, "ELRP server" | Nc | Ns | its run id)
//   client: (checks the server's MAC in constant time, or closes having sent nothing else)
//           the header: run id, source rank, world, step, each entry's size;
//           HMAC-SHA256(key, "ELRP client" | Nc | Ns | the header's bytes)
//   server: (checks the client's MAC in constant time, then the header against its own state:
//           the run id, the entries, the sizes the partition gives, before it allocates anything)
//   client: the bytes, their CRC-32C; server: one byte (0 kept, 1 refused).
// The key is random (getrandom), made by each rank; every rank takes rank 0's at each resync,
// which travels only through the group's own communicator (detail/shard_resync.hpp): the same
// for the whole life of a group, another for any other group or job. The CRC, not a MAC, covers
// the bulk data: an attacker who can rewrite an established loopback connection already has the
// processes' memory.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <elastic/error.hpp>
#include <elastic/internal/sha256.hpp>
#include <elastic/internal/tcp.hpp>

namespace elastic::inline v1::comm::detail::wire {

inline constexpr std::uint32_t magic = 0x50524c45;  // "ELRP"
inline constexpr std::uint32_t version = 2;          // 2: the challenge and MACs instead of a token in clear

/// A group's secret: every member holds it, no connection carries it.
using group_key = std::array<std::uint8_t, 32>;
using nonce = std::array<std::uint8_t, 32>;
using mac = internal::sha256_digest;

/// A connection that has not proven it holds the key within this is dropped (a member's
/// handshake takes a round trip; an idle or stray connection must not hold a slot longer).
inline constexpr std::chrono::seconds handshake_time{5};

/// A bound on a transfer: 10 s, plus a second per 50 MB (a slow link, not a dead peer).
inline std::chrono::milliseconds transfer_time(std::uint64_t bytes) {
  return std::chrono::seconds(10) + std::chrono::milliseconds(bytes / 50'000);
}

template <class T>
void put(std::vector<std::byte>& out, T v) {
  const auto* p = reinterpret_cast<const std::byte*>(&v);
  out.insert(out.end(), p, p + sizeof v);
}

/// Reads one value; its bytes are also appended to `seen` when given (what a MAC covers).
template <class T>
T get(int fd, internal::tcp::clock::time_point deadline, std::vector<std::byte>* seen = nullptr) {
  T v{};
  internal::tcp::recv_all(fd, &v, sizeof v, deadline, "replica header");
  if (seen) put(*seen, v);
  return v;
}

template <class A>
A random() {
  A a{};
  internal::random_bytes(a.data(), a.size());
  return a;
}

inline bool is_zero(const group_key& k) noexcept {
  std::uint8_t any = 0;
  for (const auto b : k) any |= b;
  return any == 0;
}

inline std::span<const std::uint8_t> bytes_of(std::string_view s) noexcept {
  return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
}

/// The server's answer to the client's nonce: it holds the key, for this run.
inline mac server_proof(const group_key& key, const nonce& client, const nonce& server, std::string_view run_id) {
  return internal::hmac_sha256(key, {bytes_of("ELRP server"), client, server, bytes_of(run_id)});
}

/// The client's answer to the server's nonce, binding the header it sent.
inline mac client_proof(const group_key& key, const nonce& client, const nonce& server,
                        std::span<const std::byte> header) {
  return internal::hmac_sha256(
      key, {bytes_of("ELRP client"), client, server,
            {reinterpret_cast<const std::uint8_t*>(header.data()), header.size()}});
}

/// A replica's header: run id, source rank, world, step, each entry's size.
inline std::vector<std::byte> header(std::string_view run_id, std::int64_t rank, std::int64_t world,
                                     std::int64_t step, std::span<const std::uint64_t> sizes) {
  std::vector<std::byte> h;
  put(h, static_cast<std::uint32_t>(run_id.size()));
  const auto id = std::as_bytes(std::span(run_id.data(), run_id.size()));
  h.insert(h.end(), id.begin(), id.end());
  put(h, rank);
  put(h, world);
  put(h, step);
  put(h, static_cast<std::uint32_t>(sizes.size()));
  for (const auto s : sizes) put(h, s);
  return h;
}

/// The client's side of the handshake on the connected `fd`: proves the listener holds `key`
/// (errc::mismatch otherwise, having sent only a nonce), then sends `head` and its MAC.
inline void client_handshake(int fd, const group_key& key, std::string_view run_id, std::span<const std::byte> head,
                             internal::tcp::clock::time_point deadline, const std::string& what) {
  const auto mine = random<nonce>();
  std::vector<std::byte> hello;
  put(hello, magic);
  put(hello, version);
  hello.insert(hello.end(), reinterpret_cast<const std::byte*>(mine.data()),
               reinterpret_cast<const std::byte*>(mine.data()) + mine.size());
  internal::tcp::send_all(fd, hello.data(), hello.size(), deadline, what);
  nonce theirs{};
  mac proof{};
  internal::tcp::recv_all(fd, theirs.data(), theirs.size(), deadline, what);
  internal::tcp::recv_all(fd, proof.data(), proof.size(), deadline, what);
  if (!internal::equal_in_constant_time(proof, server_proof(key, mine, theirs, run_id))) {
    throw error(errc::mismatch, what + ": the listener there did not prove it belongs to this group (another process "
                                       "holds that address now?); nothing was sent to it");
  }
  const auto answer = client_proof(key, mine, theirs, head);
  internal::tcp::send_all(fd, head.data(), head.size(), deadline, what);
  internal::tcp::send_all(fd, answer.data(), answer.size(), deadline, what);
}

}  // namespace elastic::inline v1::comm::detail::wire
