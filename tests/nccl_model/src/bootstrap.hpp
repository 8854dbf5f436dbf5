// Bootstrap in the NCCL model (after src/bootstrap.cc): unique ids, the root thread that collects
// every rank's address, the check-in a rank makes to it, and the "hellos" ranks exchange on each
// other's listeners to build rings, shrink and grow.
//
// A unique id (128 bytes) holds a tag, the new communicator's magic and the root's port on
// 127.0.0.1. The root thread lives until all nranks have checked in, with no timeout, exactly as
// bootstrapRoot: a round that never completes leaks it (live_roots() counts them). It leaves
// early, as bootstrapRoot's "goto out" does, when a check-in's nranks differs from the first one's
// or when a rank checks in twice; the ranks already checked in then wait until they are aborted.
#pragma once

#include <nccl.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "socket.hpp"

namespace nccl_model::boot {

/// What every rank learns about every other (NCCL allgathers struct ncclPeerInfo).
struct peer_info {
  std::int32_t rank = -1;
  std::int32_t device = -1;
  std::int32_t version = 0;
  std::int32_t pid = 0;
  std::uint16_t listen_port = 0;  // the rank's communicator listener
  std::uint16_t pad = 0;
  char host[64] = {};             // host identity: NCCL_HOSTID or the host name
};

enum class id_kind : std::uint8_t { init = 1, grow = 2 };

/// The content of an ncclUniqueId made by the model.
struct id_payload {
  char tag[8] = {};
  std::uint64_t magic = 0;  // the new communicator's magic
  std::uint16_t port = 0;   // the root's port on 127.0.0.1
  id_kind kind = id_kind::init;
  std::uint8_t pad[5] = {};
  std::int32_t parent_nranks = 0;  // grow: the size of the communicator that made the id
};

/// Reads `id`; false if it was not made by the model.
bool decode(const ncclUniqueId& id, id_payload& out);

/// Starts a root thread on a fresh listener and writes its id into `*out`.
bool start_root(std::uint64_t magic, id_kind kind, int parent_nranks, ncclUniqueId* out, std::string* why);

/// Roots of this process still waiting for check-ins.
int live_roots();

enum class outcome { ok, stopped, failed };

/// Checks rank `rank` of `nranks` in at the root of `id` and receives every rank's peer_info
/// (in rank order). If the root goes away first, waits for `stop`, as NCCL's ranks wait for a
/// root that will never contact them.
outcome check_in(const id_payload& id, int nranks, int rank, const peer_info& me, std::vector<peer_info>& table,
                 const net::stop_fn& stop, std::string* why);

enum class hello_kind : std::uint32_t { ring = 1, shrink = 2, grow_handle = 3 };

/// The first message on every connection between ranks; `extra` follows it.
struct hello {
  std::uint32_t tag = 0;
  hello_kind kind = hello_kind::ring;
  std::uint64_t magic = 0;
  std::int32_t from_rank = -1;
  std::int32_t extra_ints = 0;
};

/// Connects to the listener on `port` and sends a hello with `extra`.
outcome send_hello(std::uint16_t port, hello_kind kind, std::uint64_t magic, int from_rank,
                   const std::vector<std::int32_t>& extra, net::fd& out, const net::stop_fn& stop, std::string* why);

/// A communicator's listener, with the connections it accepted but nobody asked for yet (NCCL
/// keeps these too: bootstrap.cc unexpectedEnqueue/unexpectedDequeue).
class mailbox {
 public:
  /// Opens the listener.
  bool open(std::string* why) { return net::listen_loopback(listener_, why); }
  [[nodiscard]] std::uint16_t port() const noexcept { return listener_.port; }
  void close();

  /// The first connection, stashed or new, whose hello satisfies `match`.
  outcome accept(const std::function<bool(const hello&)>& match, net::fd& conn, hello& h,
                 std::vector<std::int32_t>& extra, const net::stop_fn& stop);

 private:
  struct letter {
    net::fd conn;
    hello h;
    std::vector<std::int32_t> extra;
  };
  std::mutex mu_;  // guards stash_ (accept runs on one thread at a time; close() may come from another)
  net::listener listener_;
  std::deque<letter> stash_;
};

/// Builds the ring of `table` for rank `rank`: connects to the successor's listener and accepts
/// the predecessor on `mb`. Nothing to do for one rank.
outcome connect_ring(mailbox& mb, std::uint64_t magic, int rank, const std::vector<peer_info>& table, net::fd& to_succ,
                     net::fd& from_pred, const net::stop_fn& stop, std::string* why);

/// Every rank's entry of `table` around the ring `to_succ`/`from_pred` (each rank fills its own).
outcome ring_allgather(std::vector<peer_info>& table, int rank, int to_succ, int from_pred, const net::stop_fn& stop,
                       std::string* why);

}  // namespace nccl_model::boot
