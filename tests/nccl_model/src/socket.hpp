// Loopback TCP for the NCCL model: every socket is non-blocking on 127.0.0.1, every wait is a
// poll of at most a millisecond followed by a look at the caller's stop condition, so nothing
// here can block past an abort. No timeouts of its own: like NCCL's sockets, a silent peer is
// waited for until the caller gives up (the one exception is connect(), which retries a refused
// connection for a bounded time, as ncclSocketConnect does with NCCL_SOCKET_RETRY_CNT).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>

namespace nccl_model::net {

/// Polled between waits; true ends the operation with io::stopped.
using stop_fn = std::function<bool()>;

enum class io { ok, closed, stopped, failed };

/// An owned file descriptor.
class fd {
 public:
  fd() = default;
  explicit fd(int v) noexcept : v_(v) {}
  fd(fd&& o) noexcept : v_(std::exchange(o.v_, -1)) {}
  fd& operator=(fd&& o) noexcept {
    if (this != &o) {
      reset();
      v_ = std::exchange(o.v_, -1);
    }
    return *this;
  }
  fd(const fd&) = delete;
  fd& operator=(const fd&) = delete;
  ~fd() { reset(); }
  void reset() noexcept;
  [[nodiscard]] int get() const noexcept { return v_; }
  explicit operator bool() const noexcept { return v_ >= 0; }

 private:
  int v_ = -1;
};

/// A listening socket on 127.0.0.1 with an ephemeral port.
struct listener {
  fd sock;
  std::uint16_t port = 0;
};

/// Opens a listener; `*why` says what failed.
bool listen_loopback(listener& out, std::string* why);

/// Connects to 127.0.0.1:`port`, retrying a refused connection for up to `refused_for`.
io connect_loopback(std::uint16_t port, fd& out, const stop_fn& stop, std::chrono::milliseconds refused_for,
                    std::string* why);

/// Accepts one connection.
io accept_one(const listener& l, fd& out, const stop_fn& stop);

/// Sends/receives exactly `bytes` (io::closed: the peer went away: EOF, ECONNRESET or EPIPE).
io send_all(int s, const void* data, std::size_t bytes, const stop_fn& stop);
io recv_all(int s, void* data, std::size_t bytes, const stop_fn& stop);

/// Sends `sbytes` on `out` while receiving `rbytes` on `in`, both progressing together (a ring
/// step: every rank sends to its successor and receives from its predecessor at once, so that no
/// socket buffer can fill up and deadlock the ring). `*which` says which side failed: 0 send,
/// 1 receive.
io exchange(int out, const void* sdata, std::size_t sbytes, int in, void* rdata, std::size_t rbytes, const stop_fn& stop,
            int* which);

}  // namespace nccl_model::net
