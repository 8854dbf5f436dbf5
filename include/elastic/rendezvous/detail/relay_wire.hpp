// What a relay store (relay_store.hpp) and the relay that serves it (elastic-run's, in
// tools/agent/store_relay.hpp) say to each other over a Unix stream socket: frames of a 4-byte
// little-endian length and a payload of fields (a byte, a 64-bit integer, a length-prefixed
// string). A request is an op and its arguments; a reply is a status byte, then the results or an
// error (its errc, os code and message, rethrown as the same elastic::error on the client side).
// A connection's first request is a hello naming the client process, so the relay knows when
// a client is gone (its last connection closed) and ends its leases at once; its reply says
// whether the relay's store is local (shm) and the host's address towards it.
#pragma once

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <fmt/format.h>

#include <elastic/error.hpp>
#include <elastic/internal/unique_fd.hpp>

namespace elastic::inline v1::rendezvous::detail::relay {

/// Said in every hello: a relay and a client of another protocol refuse each other.
inline constexpr std::string_view protocol = "elastic-relay 1";
/// No frame is larger (a list of a huge range would be a bug or an attack).
inline constexpr std::size_t max_frame = std::size_t{256} << 20;

enum class op : std::uint8_t {
  hello = 1,
  set,
  get,
  add,
  compare_set,
  erase,
  wait,
  list,
  erase_prefix,
  grant,
  keep_alive,
  revoke,
  watch,
};

enum class status : std::uint8_t { ok = 0, failed = 1 };

/// Builds a payload field by field.
class writer {
 public:
  writer& u8(std::uint8_t v) {
    buf_.push_back(static_cast<char>(v));
    return *this;
  }
  writer& i64(std::int64_t v) {
    for (int i = 0; i < 8; ++i) buf_.push_back(static_cast<char>((static_cast<std::uint64_t>(v) >> (8 * i)) & 0xff));
    return *this;
  }
  writer& str(std::string_view s) {
    i64(static_cast<std::int64_t>(s.size()));
    buf_.append(s);
    return *this;
  }
  writer& opt(const std::optional<std::string_view>& s) {
    u8(s ? 1 : 0);
    if (s) str(*s);
    return *this;
  }
  [[nodiscard]] const std::string& payload() const noexcept { return buf_; }

 private:
  std::string buf_;
};

/// Reads a payload field by field; a payload shorter than its fields is errc::corrupt.
class reader {
 public:
  // A vector, not a string: GCC 12 at -O2 takes a moved-from string's inline buffer for
  // uninitialized here (-Wmaybe-uninitialized), which users building with -Werror would hit.
  explicit reader(std::vector<char> payload) : buf_(std::move(payload)) {}
  std::uint8_t u8() {
    need(1);
    return static_cast<std::uint8_t>(buf_[at_++]);
  }
  std::int64_t i64() {
    need(8);
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < 8; ++i) v |= static_cast<std::uint64_t>(static_cast<unsigned char>(buf_[at_ + i])) << (8 * i);
    at_ += 8;
    return static_cast<std::int64_t>(v);
  }
  std::string str() {
    const auto n = i64();
    if (n < 0) bad();
    need(static_cast<std::size_t>(n));
    std::string out(buf_.data() + at_, static_cast<std::size_t>(n));
    at_ += static_cast<std::size_t>(n);
    return out;
  }
  std::optional<std::string> opt() {
    if (u8() == 0) return std::nullopt;
    return str();
  }

 private:
  void need(std::size_t n) const {
    if (n > buf_.size() - at_) bad();
  }
  [[noreturn]] static void bad() {
    throw error(errc::corrupt, "store relay: a message is shorter than its fields (another protocol, or a bug)");
  }
  std::vector<char> buf_;
  std::size_t at_ = 0;
};

/// errno after a failed send/recv (none when the call returned 0: the peer closed).
inline std::error_code os_code(ssize_t result) {
  return result < 0 ? std::error_code(errno, std::generic_category()) : std::error_code();
}

/// Sends one frame whole (a peer that is gone: errc::unavailable saying `what`).
inline void send_frame(int fd, std::string_view payload, std::string_view what) {
  std::string frame(4, '\0');
  const auto n = static_cast<std::uint32_t>(payload.size());
  for (int i = 0; i < 4; ++i) frame[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  frame.append(payload);
  std::size_t sent = 0;
  while (sent < frame.size()) {
    const ssize_t k = ::send(fd, frame.data() + sent, frame.size() - sent, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) throw error(errc::unavailable, fmt::format("{}: the connection broke while sending", what), os_code(k));
    sent += static_cast<std::size_t>(k);
  }
}

/// Reads exactly n bytes; false at an orderly end before the first byte.
inline bool recv_exact(int fd, char* out, std::size_t n, std::string_view what) {
  std::size_t got = 0;
  while (got < n) {
    const ssize_t k = ::recv(fd, out + got, n - got, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k == 0 && got == 0) return false;
    if (k <= 0) throw error(errc::unavailable, fmt::format("{}: the connection broke while receiving", what), os_code(k));
    got += static_cast<std::size_t>(k);
  }
  return true;
}

/// Reads one whole frame into `payload`; false when the peer closed the connection between
/// frames.
inline bool recv_frame(int fd, std::vector<char>& payload, std::string_view what) {
  char len[4];
  if (!recv_exact(fd, len, 4, what)) return false;
  std::uint32_t n = 0;
  for (int i = 0; i < 4; ++i) n |= static_cast<std::uint32_t>(static_cast<unsigned char>(len[i])) << (8 * i);
  if (n > max_frame) throw error(errc::corrupt, fmt::format("{}: a frame of {} bytes, more than any message", what, n));
  payload.assign(n, '\0');
  if (n > 0 && !recv_exact(fd, payload.data(), n, what)) {
    throw error(errc::unavailable, fmt::format("{}: the connection ended inside a frame", what));
  }
  return true;
}

/// A Unix socket address for `path` (errc::invalid_argument when it does not fit sun_path).
inline sockaddr_un socket_address(std::string_view path) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(a.sun_path)) {
    throw error(errc::invalid_argument, fmt::format("store relay socket path '{}' is empty or longer than {} bytes",
                                                    path, sizeof(a.sun_path) - 1));
  }
  std::memcpy(a.sun_path, path.data(), path.size());
  return a;
}

/// The error an error reply carries, as the relay threw it (an os code as errno).
inline error failure_of(reader& r) {
  const auto code = static_cast<errc>(r.i64());
  const auto os = static_cast<int>(r.i64());
  return error(code, r.str(), os != 0 ? std::error_code(os, std::generic_category()) : std::error_code());
}

/// An error reply.
inline std::string failure(const error& e) {
  writer w;
  w.u8(static_cast<std::uint8_t>(status::failed))
      .i64(static_cast<std::int64_t>(e.code()))
      .i64(e.os_code().value())
      .str(e.message());
  return w.payload();
}

}  // namespace elastic::inline v1::rendezvous::detail::relay
