#include "socket.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

namespace nccl_model::net {
namespace {

constexpr int poll_ms = 1;  // the longest any wait goes without looking at the stop condition

std::string errno_text(const char* what, int e) { return std::string(what) + ": " + std::strerror(e); }

int new_socket() {
  const int s = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (s < 0) return -1;
  const int one = 1;
  ::setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  ::setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return s;
}

sockaddr_in loopback(std::uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  return a;
}

bool peer_gone(int e) { return e == ECONNRESET || e == EPIPE || e == ENOTCONN || e == ETIMEDOUT; }

// Waits up to poll_ms for `events` on `s`.
void wait_for(int s, short events) {
  pollfd p{s, events, 0};
  (void)::poll(&p, 1, poll_ms);
}

// One non-blocking step of a send; io::ok with *done advanced, or closed/failed.
io send_some(int s, const char* data, std::size_t bytes, std::size_t* done) {
  const ssize_t n = ::send(s, data + *done, bytes - *done, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (n >= 0) {
    *done += static_cast<std::size_t>(n);
    return io::ok;
  }
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return io::ok;
  return peer_gone(errno) ? io::closed : io::failed;
}

io recv_some(int s, char* data, std::size_t bytes, std::size_t* done) {
  const ssize_t n = ::recv(s, data + *done, bytes - *done, MSG_DONTWAIT);
  if (n > 0) {
    *done += static_cast<std::size_t>(n);
    return io::ok;
  }
  if (n == 0) return io::closed;
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return io::ok;
  return peer_gone(errno) ? io::closed : io::failed;
}

}  // namespace

void fd::reset() noexcept {
  if (v_ >= 0) ::close(v_);
  v_ = -1;
}

bool listen_loopback(listener& out, std::string* why) {
  fd s(new_socket());
  if (!s) return *why = errno_text("socket", errno), false;
  sockaddr_in a = loopback(0);
  if (::bind(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return *why = errno_text("bind", errno), false;
  if (::listen(s.get(), 128) != 0) return *why = errno_text("listen", errno), false;
  socklen_t len = sizeof a;
  if (::getsockname(s.get(), reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    return *why = errno_text("getsockname", errno), false;
  }
  out.sock = std::move(s);
  out.port = ntohs(a.sin_port);
  return true;
}

io connect_loopback(std::uint16_t port, fd& out, const stop_fn& stop, std::chrono::milliseconds refused_for,
                    std::string* why) {
  const auto give_up = std::chrono::steady_clock::now() + refused_for;
  for (;;) {
    fd s(new_socket());
    if (!s) return *why = errno_text("socket", errno), io::failed;
    const sockaddr_in a = loopback(port);
    int rc = ::connect(s.get(), reinterpret_cast<const sockaddr*>(&a), sizeof a);
    int err = rc == 0 ? 0 : errno;
    while (err == EINPROGRESS || err == EALREADY) {
      if (stop()) return io::stopped;
      pollfd p{s.get(), POLLOUT, 0};
      if (::poll(&p, 1, poll_ms) > 0) {
        socklen_t len = sizeof err;
        ::getsockopt(s.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      }
    }
    if (err == 0) {
      out = std::move(s);
      return io::ok;
    }
    if (err != ECONNREFUSED || std::chrono::steady_clock::now() >= give_up) {
      *why = "connect to 127.0.0.1:" + std::to_string(port) + " failed: " + std::strerror(err);
      return io::failed;
    }
    for (int i = 0; i < 10; ++i) {  // NCCL retries a refused connection after a short sleep
      if (stop()) return io::stopped;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
}

io accept_one(const listener& l, fd& out, const stop_fn& stop) {
  for (;;) {
    const int s = ::accept4(l.sock.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (s >= 0) {
      const int one = 1;
      ::setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      out = fd(s);
      return io::ok;
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED) return io::failed;
    if (stop()) return io::stopped;
    wait_for(l.sock.get(), POLLIN);
  }
}

io send_all(int s, const void* data, std::size_t bytes, const stop_fn& stop) {
  std::size_t done = 0;
  while (done < bytes) {
    if (const io r = send_some(s, static_cast<const char*>(data), bytes, &done); r != io::ok) return r;
    if (done == bytes) break;
    if (stop()) return io::stopped;
    wait_for(s, POLLOUT);
  }
  return io::ok;
}

io recv_all(int s, void* data, std::size_t bytes, const stop_fn& stop) {
  std::size_t done = 0;
  while (done < bytes) {
    if (const io r = recv_some(s, static_cast<char*>(data), bytes, &done); r != io::ok) return r;
    if (done == bytes) break;
    if (stop()) return io::stopped;
    wait_for(s, POLLIN);
  }
  return io::ok;
}

io exchange(int out, const void* sdata, std::size_t sbytes, int in, void* rdata, std::size_t rbytes, const stop_fn& stop,
            int* which) {
  std::size_t sent = 0;
  std::size_t got = 0;
  while (sent < sbytes || got < rbytes) {
    if (sent < sbytes) {
      if (const io r = send_some(out, static_cast<const char*>(sdata), sbytes, &sent); r != io::ok) {
        *which = 0;
        return r;
      }
    }
    if (got < rbytes) {
      if (const io r = recv_some(in, static_cast<char*>(rdata), rbytes, &got); r != io::ok) {
        *which = 1;
        return r;
      }
    }
    if (sent == sbytes && got == rbytes) break;
    if (stop()) return io::stopped;
    pollfd p[2] = {{out, sent < sbytes ? short(POLLOUT) : short(0), 0}, {in, got < rbytes ? short(POLLIN) : short(0), 0}};
    (void)::poll(p, 2, poll_ms);
    // A successor that died is noticed even when there is nothing left to send to it: its socket
    // reports an error or a hang-up (the predecessor's shows up as EOF on the next receive).
    if (sent == sbytes && (p[0].revents & (POLLERR | POLLHUP)) != 0) {
      *which = 0;
      return io::closed;
    }
  }
  return io::ok;
}

}  // namespace nccl_model::net
