// A store reached through the host's relay (relay://PATH, a Unix socket elastic-run serves,
// tools/agent/store_relay.hpp): the one participant per host that speaks to the real store
// (etcd) for every worker of the host. Each call is forwarded as it is; what the relay makes
// per host instead of per rank:
// - one lease: a worker's lease is the relay's own record of the keys it set, renewed for free
//   (keep_alive asks nothing of etcd), its keys erased the moment the worker's last connection
//   closes (a SIGKILL included) or it revokes;
// - one watch per range: every worker's feed of the same range is fed from one etcd watch;
// - one etcd client (its connections, its lease renewals).
// A relay that is gone (its launcher died) is errc::unavailable.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <elastic/error.hpp>
#include <elastic/internal/unique_fd.hpp>
#include <elastic/rendezvous/detail/relay_wire.hpp>
#include <elastic/rendezvous/key_feed.hpp>
#include <elastic/rendezvous/store.hpp>

namespace elastic::inline v1::rendezvous {

namespace detail {

/// Sends a request on `fd` and reads the reply (its status not yet read: see succeeded()).
inline relay::reader exchange(int fd, const relay::writer& w, std::string_view what) {
  relay::send_frame(fd, w.payload(), what);
  std::vector<char> reply;
  if (!relay::recv_frame(fd, reply, what)) {
    throw error(errc::unavailable, fmt::format("{}: the relay closed the connection (is its elastic-run gone?)", what));
  }
  return relay::reader(std::move(reply));
}

/// Reads a reply's status: its results follow, or the relay's error is rethrown.
inline relay::reader& succeeded(relay::reader& r) {
  if (r.u8() != static_cast<std::uint8_t>(relay::status::ok)) throw relay::failure_of(r);
  return r;
}

/// What the relay says of its store at the hello.
struct relay_hello {
  bool local = false;         ///< store::local() of the relay's store
  std::string address;        ///< store::local_address() of the relay's store
};

/// A connection to the relay at `path`, its hello said (the client `token` names this process).
inline internal::unique_fd relay_connect(const std::string& path, const std::string& token,
                                         relay_hello* hello = nullptr) {
  const std::string what = fmt::format("store relay at '{}'", path);
  internal::unique_fd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) throw os_error("socket(AF_UNIX) for the store relay");
  const sockaddr_un a = relay::socket_address(path);
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&a), sizeof(a)) != 0) {
    throw error(errc::unavailable,
                fmt::format("{}: cannot connect (is its elastic-run still running?)", what),
                std::error_code(errno, std::generic_category()));
  }
  relay::writer w;
  w.u8(static_cast<std::uint8_t>(relay::op::hello)).str(relay::protocol).str(token);
  auto r = exchange(fd.get(), w, what);
  succeeded(r);
  const bool local = r.u8() != 0;
  auto address = r.str();
  if (hello) *hello = {local, std::move(address)};
  return fd;
}

/// A relayed watch: the relay pushes each batch of changes as one frame (a reset flag and the
/// events); take() reads what has arrived without blocking.
class relay_feed final : public key_feed {
 public:
  relay_feed(internal::unique_fd fd, std::string what) : fd_(std::move(fd)), what_(std::move(what)) {}

  std::vector<key_event> take(bool& reset) override {
    reset = false;
    std::vector<key_event> out;
    while (readable(0)) {
      std::vector<char> frame;
      if (!relay::recv_frame(fd_.get(), frame, what_)) {
        throw error(errc::unavailable, fmt::format("{}: the relay ended the watch (is its elastic-run gone?)", what_));
      }
      relay::reader r(std::move(frame));
      if (r.u8() != static_cast<std::uint8_t>(relay::status::ok)) throw relay::failure_of(r);
      if (r.u8() != 0) {  // a fresh copy of the range: what came before it is void
        reset = true;
        out.clear();
      }
      for (auto n = r.i64(); n > 0; --n) {
        key_event e;
        e.key = r.str();
        e.value = r.opt();
        e.previous = r.opt();
        out.push_back(std::move(e));
      }
    }
    return out;
  }

  bool wait(std::chrono::milliseconds timeout) override { return readable(static_cast<int>(timeout.count())); }
  [[nodiscard]] int readable_fd() const noexcept override { return fd_.get(); }

 private:
  bool readable(int timeout_ms) {
    pollfd p{fd_.get(), POLLIN, 0};
    for (;;) {
      const int n = ::poll(&p, 1, std::max(timeout_ms, 0));
      if (n < 0 && errno == EINTR) continue;
      return n > 0;
    }
  }
  internal::unique_fd fd_;
  std::string what_;
};

}  // namespace detail

/// The store of relay://PATH. Thread-safe: each concurrent call has a connection of its own
/// (kept for the next call), so a wait() in one thread does not hold up keep_alive() in another.
class relay_store final : public store {
 public:
  /// Connects to the relay listening at `path` (errc::unavailable when nothing answers there).
  explicit relay_store(std::string path) : path_(std::move(path)), token_(make_token()) {
    idle_.push_back(detail::relay_connect(path_, token_, &hello_));
  }

  void set(std::string_view key, std::string_view value, lease_id lease = 0) override {
    call(request(detail::relay::op::set).str(key).str(value).i64(lease));
  }
  std::optional<std::string> get(std::string_view key) override {
    auto r = call(request(detail::relay::op::get).str(key));
    return r.opt();
  }
  std::int64_t add(std::string_view key, std::int64_t delta) override {
    return call(request(detail::relay::op::add).str(key).i64(delta)).i64();
  }
  bool compare_set(std::string_view key, std::optional<std::string_view> expected, std::string_view desired,
                   lease_id lease = 0, std::optional<std::string>* actual = nullptr) override {
    auto r = call(request(detail::relay::op::compare_set).str(key).opt(expected).str(desired).i64(lease));
    const bool done = r.u8() != 0;
    auto held = r.opt();
    if (actual) *actual = std::move(held);
    return done;
  }
  bool erase(std::string_view key) override { return call(request(detail::relay::op::erase).str(key)).u8() != 0; }
  void wait(std::span<const std::string> keys, std::chrono::milliseconds timeout) override {
    auto w = request(detail::relay::op::wait);
    w.i64(timeout.count()).i64(static_cast<std::int64_t>(keys.size()));
    for (const auto& k : keys) w.str(k);
    call(w);
  }
  std::vector<std::pair<std::string, std::string>> list(std::string_view prefix) override {
    auto r = call(request(detail::relay::op::list).str(prefix));
    std::vector<std::pair<std::string, std::string>> out;
    for (auto n = r.i64(); n > 0; --n) {
      auto k = r.str();
      out.emplace_back(std::move(k), r.str());
    }
    return out;
  }
  std::size_t erase_prefix(std::string_view prefix) override {
    detail::check_erase_prefix(prefix);
    return static_cast<std::size_t>(call(request(detail::relay::op::erase_prefix).str(prefix)).i64());
  }
  std::unique_ptr<key_feed> watch(std::string_view from, std::string_view to, feed_options o = {}) override {
    auto fd = detail::relay_connect(path_, token_);
    auto w = request(detail::relay::op::watch);
    w.str(from).str(to).u8(o.snapshot ? 1 : 0).u8(o.puts ? 1 : 0).u8(o.previous ? 1 : 0);
    const std::string what = fmt::format("store relay at '{}' (watch)", path_);
    auto r = detail::exchange(fd.get(), w, what);
    detail::succeeded(r);
    return std::make_unique<detail::relay_feed>(std::move(fd), what);
  }
  [[nodiscard]] bool local() const noexcept override { return hello_.local; }
  [[nodiscard]] std::string local_address() const override { return hello_.address; }
  lease_id grant(std::chrono::milliseconds ttl) override {
    return call(request(detail::relay::op::grant).i64(ttl.count())).i64();
  }
  void keep_alive(lease_id lease) override { call(request(detail::relay::op::keep_alive).i64(lease)); }
  void revoke(lease_id lease) override { call(request(detail::relay::op::revoke).i64(lease)); }

 private:
  static detail::relay::writer request(detail::relay::op o) {
    detail::relay::writer w;
    w.u8(static_cast<std::uint8_t>(o));
    return w;
  }

  /// Random per store object: the relay ends this client's leases once its last connection closes.
  static std::string make_token() {
    std::random_device rd;
    return fmt::format("{}.{:016x}", ::getpid(), (static_cast<std::uint64_t>(rd()) << 32) ^ rd());
  }

  /// Sends one request on an idle connection (a new one when none is) and returns the reply's
  /// results; a failure reply is rethrown as the relay's error.
  detail::relay::reader call(const detail::relay::writer& w) {
    internal::unique_fd fd;
    {
      std::lock_guard lk(mu_);
      if (!idle_.empty()) {
        fd = std::move(idle_.back());
        idle_.pop_back();
      }
    }
    if (!fd) fd = detail::relay_connect(path_, token_);
    auto r = detail::exchange(fd.get(), w, fmt::format("store relay at '{}'", path_));
    {
      // Back to the pool before an error reply is rethrown: closing this client's last
      // connection would end its leases.
      std::lock_guard lk(mu_);
      idle_.push_back(std::move(fd));
    }
    return std::move(detail::succeeded(r));
  }

  std::string path_;
  std::string token_;
  detail::relay_hello hello_;
  std::mutex mu_;
  std::vector<internal::unique_fd> idle_;
};

}  // namespace elastic::inline v1::rendezvous
