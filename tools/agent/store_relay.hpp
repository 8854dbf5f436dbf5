// elastic-run's store relay: the one participant per host that speaks to the run's store (etcd)
// for every worker of the host. The workers reach it as relay://PATH (a Unix socket in a
// directory only this user can enter; rendezvous/relay_store.hpp is their side). Per host, not
// per rank:
// - one lease on the store, renewed here. A worker's lease is a record of the keys it set
//   under it: its keep_alive asks the store nothing; its keys are erased when it revokes, or
//   the moment its last connection closes (a worker SIGKILLed included: the kernel closes its
//   sockets). The store's lease lapsing (this host frozen or cut off) voids every worker's lease
//   here too: each then starts a new life, as it would on its own lease;
// - one watch per range and options: every worker following the same range is fed from one
//   stream of the store (a copy of the range serves a worker that comes later);
// - one store client (its connections and renewals);
// - one request for the writes its workers make at the same moment (write_batcher.hpp: sets,
//   compare_sets and erases; etcd: one transaction): a host's workers joining a round together
//   ask the store once per round trip, not once each.
// Every other call is forwarded as it is, on the calling worker's connection's thread.
#pragma once

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <elastic/error.hpp>
#include <elastic/internal/periodic_thread.hpp>
#include <elastic/internal/unique_fd.hpp>
#include <elastic/rendezvous/detail/relay_wire.hpp>
#include <elastic/rendezvous/detail/run_view.hpp>
#include <elastic/rendezvous/key_feed.hpp>
#include <elastic/rendezvous/store.hpp>

#include "agent/write_batcher.hpp"

namespace elastic::agent {

class store_relay {
 public:
  /// Serves `upstream` at the Unix socket `socket` (created; its directory must exist and be
  /// private to this user). `address` is the host's address its workers' peers reach (what each
  /// worker's hello is told); empty: the store's own answer, asked once here.
  store_relay(std::unique_ptr<rendezvous::store> upstream, std::filesystem::path socket, std::string address = {})
      : up_(std::move(upstream)), socket_(std::move(socket)), address_(std::move(address)) {
    if (address_.empty()) address_ = up_->local_address();
    const sockaddr_un a = rendezvous::detail::relay::socket_address(socket_.string());
    listener_ = internal::unique_fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!listener_) throw os_error("socket(AF_UNIX) for the store relay");
    ::unlink(socket_.c_str());  // one of a launcher that died (the directory is ours alone)
    if (::bind(listener_.get(), reinterpret_cast<const sockaddr*>(&a), sizeof(a)) != 0) {
      throw os_error(fmt::format("binding the store relay's socket '{}'", socket_.string()));
    }
    ::chmod(socket_.c_str(), 0600);
    if (::listen(listener_.get(), 512) != 0) throw os_error("listen() on the store relay's socket");
    accept_ = std::jthread([this](std::stop_token st) { accept_loop(st); });
  }

  store_relay(const store_relay&) = delete;
  store_relay& operator=(const store_relay&) = delete;

  ~store_relay() { stop(); }

  /// Ends every connection and the store's lease (the workers' keys with it).
  void stop() noexcept {
    if (stopped_.exchange(true)) return;
    accept_.request_stop();
    if (accept_.joinable()) accept_.join();
    {
      std::lock_guard lk(conns_mu_);
      for (auto& c : conns_) ::shutdown(c.fd.get(), SHUT_RDWR);
    }
    {
      std::lock_guard lk(conns_mu_);
      for (auto& c : conns_) c.thread.request_stop();
    }
    for (;;) {
      std::list<connection> done;
      {
        std::lock_guard lk(conns_mu_);
        if (conns_.empty()) break;
        done.splice(done.end(), conns_);
      }
      done.clear();  // joins
    }
    renewer_.reset();
    std::lock_guard lk(hubs_mu_);
    hubs_.clear();
    const rendezvous::lease_id l = std::exchange(host_lease_, 0);
    if (l != 0) {
      try {
        up_->revoke(l);
      } catch (...) {  // a store that is gone: the lease lapses by itself
      }
    }
    ::unlink(socket_.c_str());
  }

  /// What a worker passes to open_store.
  [[nodiscard]] std::string url() const { return "relay://" + socket_.string(); }
  /// Leases granted to workers that are still in force; watches of the store now open.
  [[nodiscard]] std::size_t leases() const {
    std::lock_guard lk(mu_);
    return leases_.size();
  }
  [[nodiscard]] std::size_t watches() const {
    std::lock_guard lk(hubs_mu_);
    return hubs_.size();
  }

 private:
  using clock = std::chrono::steady_clock;
  using reader = rendezvous::detail::relay::reader;
  using writer = rendezvous::detail::relay::writer;
  using op = rendezvous::detail::relay::op;
  using write = rendezvous::write_request;

  // The socket outlives its thread (declared first, closed after the join), so stop() never
  // shuts down a number the system has given to another file since.
  struct connection {
    internal::unique_fd fd;
    std::jthread thread;
    std::shared_ptr<std::atomic<bool>> done = std::make_shared<std::atomic<bool>>(false);
  };

  /// A worker's lease: the keys it set under it, whose it is, and when it lapses unless renewed
  /// (a worker that stops renewing, frozen with its connections open, loses its keys as it
  /// would on a lease of its own).
  struct worker_lease {
    std::string client;
    std::set<std::string, std::less<>> keys;
    std::chrono::milliseconds ttl{0};
    clock::time_point renewed;
  };

  /// One watch of the store, shared by every worker following that range with those options.
  // Its connection's thread sleeps in poll() on the socket and this eventfd: no wakeup while
  // nothing changes, and a watcher that closes (a worker that died) is seen at once.
  struct subscriber {
    std::mutex mu;
    std::deque<std::string> frames;
    bool overflow = false;
    internal::unique_fd wake{::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)};
  };
  struct hub {
    std::string from, to;   // the range [from, to)
    bool mirrored = false;  // keeps a copy of the range, for workers that come later
    bool whole = false;     // the copy holds the whole range (a snapshot came first, and it did)
    rendezvous::detail::key_copy mirror;
    std::unique_ptr<rendezvous::key_feed> feed;
    bool snapshot = false;  // the store's feed began with the range's contents
    std::mutex mu;
    std::vector<std::shared_ptr<subscriber>> subs;
    std::jthread pump;  // last: joined before the rest goes
  };

  static constexpr std::size_t max_queued_frames = 100000;

  void accept_loop(const std::stop_token& st) noexcept {
    while (!st.stop_requested()) {
      pollfd p{listener_.get(), POLLIN, 0};
      const int n = ::poll(&p, 1, 100);
      reap_finished();
      if (n <= 0) continue;
      internal::unique_fd fd(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (!fd) continue;
      try {
        std::lock_guard lk(conns_mu_);
        auto& c = conns_.emplace_back();
        c.fd = std::move(fd);
        try {
          c.thread = std::jthread([this, f = c.fd.get(), done = c.done](std::stop_token cst) {
            serve(f, cst);
            done->store(true);
          });
        } catch (...) {
          conns_.pop_back();
          throw;
        }
      } catch (...) {  // no memory or thread to be had: the client sees its connection end (unavailable)
      }
    }
  }

  void reap_finished() noexcept {
    std::list<connection> finished;
    {
      std::lock_guard lk(conns_mu_);
      for (auto it = conns_.begin(); it != conns_.end();) {
        auto next = std::next(it);
        if (it->done->load()) finished.splice(finished.end(), conns_, it);
        it = next;
      }
    }
    // joined here, outside the lock
  }

  /// One connection: its hello, then requests until it closes (or a watch, to its end).
  void serve(int fd, const std::stop_token& st) noexcept {
    const std::string what = fmt::format("store relay at '{}'", socket_.string());
    // A watch's hub this connection was the last follower of: let go of after client_closed, so
    // a SIGKILLed worker's keys are erased at once, not after a pump's join (up to 100 ms; its
    // other connections' threads are not waiting on this one).
    std::shared_ptr<hub> dropped;
    std::string client;
    try {
      std::vector<char> first;
      if (!rendezvous::detail::relay::recv_frame(fd, first, what)) return;
      reader r(std::move(first));
      if (static_cast<op>(r.u8()) != op::hello || r.str() != rendezvous::detail::relay::protocol) {
        rendezvous::detail::relay::send_frame(
            fd,
            rendezvous::detail::relay::failure(error(errc::version_mismatch,
                                                     fmt::format("{} speaks '{}', and this client another protocol: "
                                                                 "use the elastic-run of the same build",
                                                                 what, rendezvous::detail::relay::protocol))),
            what);
        return;
      }
      client = r.str();
      {
        std::lock_guard lk(mu_);
        ++clients_[client];
      }
      writer hello;
      hello.u8(0).u8(up_->local() ? 1 : 0).str(address_);
      rendezvous::detail::relay::send_frame(fd, hello.payload(), what);
      while (!st.stop_requested()) {
        std::vector<char> frame;
        if (!rendezvous::detail::relay::recv_frame(fd, frame, what)) break;
        reader req(std::move(frame));
        const auto o = static_cast<op>(req.u8());
        if (o == op::watch) {
          dropped = follow(fd, req, st, what);
          break;
        }
        std::string reply;
        try {
          reply = answer(o, req, client);
        } catch (const error& e) {
          reply = rendezvous::detail::relay::failure(e);
        } catch (const std::exception& e) {
          reply = rendezvous::detail::relay::failure(error(errc::unavailable, fmt::format("{}: {}", what, e.what())));
        }
        rendezvous::detail::relay::send_frame(fd, reply, what);
      }
    } catch (...) {  // a client that broke the connection or the protocol: it is gone
    }
    if (!client.empty()) client_closed(client);
  }

  std::string answer(op o, reader& r, const std::string& client) {
    writer w;
    w.u8(0);
    switch (o) {
      case op::set: {
        const auto key = r.str(), value = r.str();
        const auto lease = r.i64();
        const auto on = store_lease(lease);
        if (on == 0 || held(key) != value) writes_.write(write::setting(key, value, on));
        own(key, lease, value);
        break;
      }
      case op::get:
        w.opt(up_->get(r.str()));
        break;
      case op::add: {
        const auto key = r.str();
        w.i64(up_->add(key, r.i64()));
        break;
      }
      case op::compare_set: {
        const auto key = r.str();
        const auto expected = r.opt();
        const auto desired = r.str();
        const auto lease = r.i64();
        const auto on = store_lease(lease);
        // Creating a key a worker of this host holds would fail: answered here. Every worker
        // re-creates the run's registration at each heartbeat; one per host reaches the store.
        if (!expected) {
          if (auto have = held(key)) {
            w.u8(0).opt(std::move(have));
            break;
          }
          if (auto have = registered_elsewhere(key)) {
            w.u8(0).opt(std::move(have));
            break;
          }
          if (auto have = watched(key)) {
            w.u8(0).opt(std::move(have));
            break;
          }
        }
        std::optional<std::string> actual;
        bool done = false;
        try {
          auto r = writes_.write(write::comparing(key, expected, desired, on));
          done = r.done;
          actual = std::move(r.actual);
        } catch (...) {
          if (!expected) registration_answered(key, std::nullopt);
          throw;
        }
        if (done) own(key, lease, desired);
        if (!expected) registration_answered(key, done ? std::nullopt : actual);
        w.u8(done ? 1 : 0).opt(actual);
        break;
      }
      case op::erase: {
        const auto key = r.str();
        disown(key);
        w.u8(writes_.write(write::erasing(key)).done ? 1 : 0);
        break;
      }
      case op::wait: {
        const std::chrono::milliseconds timeout(r.i64());
        std::vector<std::string> keys;
        for (auto n = r.i64(); n > 0; --n) keys.push_back(r.str());  // each read is bounded by the frame
        up_->wait(keys, timeout);
        break;
      }
      case op::list: {
        const auto kvs = up_->list(r.str());
        w.i64(static_cast<std::int64_t>(kvs.size()));
        for (const auto& [k, v] : kvs) w.str(k).str(v);
        break;
      }
      case op::erase_prefix: {
        const auto prefix = r.str();
        disown_prefix(prefix);
        w.i64(static_cast<std::int64_t>(up_->erase_prefix(prefix)));
        break;
      }
      case op::grant:
        w.i64(grant(std::chrono::milliseconds(r.i64()), client));
        break;
      case op::keep_alive:
        keep_alive(r.i64());
        break;
      case op::revoke:
        revoke(r.i64());
        break;
      default:
        throw error(errc::invalid_argument, fmt::format("store relay: unknown request {}", static_cast<int>(o)));
    }
    return w.payload();
  }

  // --- leases -----------------------------------------------------------------------------

  /// The store's lease behind worker lease `l` (0: none); errc::not_found when it has ended.
  rendezvous::lease_id store_lease(rendezvous::lease_id l) {
    if (l == 0) return 0;
    std::lock_guard lk(mu_);
    if (!leases_.contains(l)) throw lease_gone(l);
    return host_lease_;
  }

  static error lease_gone(rendezvous::lease_id l) {
    return error(errc::not_found, fmt::format("lease {} has expired or was revoked (the store relay's lease on the "
                                              "store lapsed, or its worker ended it): its keys are gone",
                                              l));
  }

  rendezvous::lease_id grant(std::chrono::milliseconds ttl, const std::string& client) {
    std::lock_guard g(grant_mu_);
    bool fresh = false;
    {
      std::lock_guard lk(mu_);
      fresh = host_lease_ == 0;
    }
    if (fresh) {
      // The store's lease is the host's, and lives the first worker's time to live but at least
      // host_lease_floor: the members' peer heartbeats notice a host that froze or vanished
      // (rendezvous_options::peer_silence_timeout, 2 s by default) and the lease is their
      // backstop, so a host asks the store for a renewal every 2.5 s however short its workers'
      // heartbeats (200 ms and 2 s renewed 3 times a second per host), and a store slow to
      // answer lapses it less often. A worker's own lease keeps its time to live (sweep(), at a
      // sixth of it).
      const auto host_ttl = std::max(ttl, host_lease_floor);
      const auto l = up_->grant(host_ttl);
      renewer_.reset();
      {
        std::lock_guard lk(mu_);
        host_lease_ = l;
      }
      const auto renew_every = std::clamp<std::chrono::milliseconds>(host_ttl / 6, std::chrono::milliseconds(50),
                                                                      std::chrono::milliseconds(5000));
      const auto sweep_every = std::clamp<std::chrono::milliseconds>(ttl / 6, std::chrono::milliseconds(50), renew_every);
      const auto sweeps_per_renewal = std::max<std::int64_t>(1, renew_every / sweep_every);
      renewer_.emplace(sweep_every, [this, l, sweeps_per_renewal, tick = std::int64_t{0}]() mutable {
        if (++tick % sweeps_per_renewal == 0) renew(l);
        sweep();
        return true;
      });
    }
    std::lock_guard lk(mu_);
    const auto id = next_lease_++;
    auto& l = leases_[id];
    l.client = client;
    l.ttl = ttl;
    l.renewed = clock::now();
    return id;
  }

  void renew(rendezvous::lease_id l) noexcept {
    try {
      up_->keep_alive(l);
    } catch (const error& e) {
      if (e.code() != errc::not_found) return;  // the store away: the next renewal tries again
      // Lapsed: the store erased every key on it. Every worker lease ends with it.
      std::lock_guard lk(mu_);
      if (host_lease_ != l) return;
      host_lease_ = 0;
      leases_.clear();
      owners_.clear();
    } catch (...) {
    }
  }

  void keep_alive(rendezvous::lease_id l) {
    std::lock_guard lk(mu_);
    const auto it = leases_.find(l);
    if (it == leases_.end()) throw lease_gone(l);
    it->second.renewed = clock::now();
  }

  /// Ends the worker leases not renewed within their time to live (on the renewal thread).
  void sweep() noexcept {
    std::vector<rendezvous::lease_id> lapsed;
    {
      std::lock_guard lk(mu_);
      const auto now = clock::now();
      for (const auto& [id, l] : leases_) {
        if (now - l.renewed > l.ttl) lapsed.push_back(id);
      }
    }
    for (auto id : lapsed) revoke(id);
  }

  void revoke(rendezvous::lease_id l) {
    std::set<std::string, std::less<>> keys;
    {
      std::lock_guard lk(mu_);
      const auto it = leases_.find(l);
      if (it == leases_.end()) return;
      keys = std::move(it->second.keys);
      leases_.erase(it);
      for (const auto& k : keys) owners_.erase(k);
    }
    // One request for all of them.
    std::vector<write> erases;
    for (const auto& k : keys) erases.push_back(write::erasing(k));
    try {
      up_->apply(erases);
    } catch (...) {  // a store that is away: the host's lease takes the keys when it lapses
    }
  }

  /// The value a live worker lease of this host holds `key` at, if one does. The key is on the
  /// store's lease of this relay, so it is there unless another host erased it (no worker
  /// erases another's leased keys in the rendezvous, and a lapse ends every lease here).
  std::optional<std::string> held(const std::string& key) {
    std::lock_guard lk(mu_);
    const auto it = owners_.find(key);
    if (it == owners_.end()) return std::nullopt;
    return it->second.value;
  }

  /// The value `key` holds in a watch this relay keeps whole, if it holds one: creating it would
  /// fail. Every joiner of a round tries to claim its closer; the workers of a host other than the
  /// closer's are answered here, from what the watch has shown (a claim refused by a copy a few
  /// milliseconds old is tried again at the joiner's next look, as one refused by the store).
  std::optional<std::string> watched(const std::string& key) {
    std::lock_guard lk(hubs_mu_);
    for (const auto& [name, h] : hubs_) {
      if (key < h->from || key >= h->to) continue;
      std::lock_guard hl(h->mu);
      if (!h->whole) continue;
      if (const auto it = h->mirror.find(key); it != h->mirror.end()) return it->second;
    }
    return std::nullopt;
  }

  /// A run's registration (rendezvous/run_keys.hpp: <key_prefix>/.runs/<run id>) that another
  /// host holds: each worker re-creates it at every heartbeat (the workers of a host beat
  /// together), so its failure is remembered for registration_recheck, and while one worker's
  /// try is on its way the others are given the last answer. Only the registration: it says a
  /// run is live (live_runs(), a hint for a participant alone under the wrong run id), and a gap
  /// of a few seconds after its holder ended costs nothing; a closer's claim must see its holder
  /// go at once.
  std::optional<std::string> registered_elsewhere(const std::string& key) {
    if (key.find("/.runs/") == std::string::npos) return std::nullopt;
    std::lock_guard lk(mu_);
    const auto it = registrations_.find(key);
    if (it == registrations_.end()) return std::nullopt;
    auto& r = it->second;
    if (r.asking || clock::now() - r.at < registration_recheck) return r.value;
    r.asking = true;  // this caller asks the store; the others meanwhile get this answer
    return std::nullopt;
  }
  /// The store's answer to a registration's creation: held by another (`value`), or not.
  void registration_answered(const std::string& key, const std::optional<std::string>& value) {
    if (key.find("/.runs/") == std::string::npos) return;
    std::lock_guard lk(mu_);
    if (value) {
      registrations_[key] = {*value, clock::now(), false};
    } else {
      registrations_.erase(key);
    }
  }

  /// `key` was set to `value` under worker lease `l` (0: under none): it goes with `l` now.
  void own(const std::string& key, rendezvous::lease_id l, const std::string& value = {}) {
    std::lock_guard lk(mu_);
    if (const auto it = owners_.find(key); it != owners_.end()) {
      if (auto prev = leases_.find(it->second.lease); prev != leases_.end()) prev->second.keys.erase(key);
      owners_.erase(it);
    }
    if (l == 0) return;
    const auto it = leases_.find(l);
    if (it == leases_.end()) return;
    it->second.keys.insert(key);
    owners_[key] = {l, value};
  }
  void disown(const std::string& key) { own(key, 0); }
  void disown_prefix(std::string_view prefix) {
    std::lock_guard lk(mu_);
    for (auto it = owners_.lower_bound(prefix); it != owners_.end() && it->first.starts_with(prefix);) {
      if (auto l = leases_.find(it->second.lease); l != leases_.end()) l->second.keys.erase(it->first);
      it = owners_.erase(it);
    }
  }

  /// A client's last connection closed: its leases end now (a SIGKILLed worker's keys go at once).
  void client_closed(const std::string& client) {
    std::vector<rendezvous::lease_id> ended;
    {
      std::lock_guard lk(mu_);
      if (--clients_[client] > 0) return;
      clients_.erase(client);
      for (const auto& [id, l] : leases_) {
        if (l.client == client) ended.push_back(id);
      }
    }
    for (auto id : ended) revoke(id);
  }

  // --- watches ----------------------------------------------------------------------------

  /// The rest of a watch connection's life: events from the shared watch, until it closes.
  /// Returns the hub this watcher was the last of, for the caller to let go of once the worker's
  /// leases are settled: its pump takes up to 100 ms to join.
  [[nodiscard]] std::shared_ptr<hub> follow(int fd, reader& r, const std::stop_token& st, const std::string& what) {
    const auto from = r.str(), to = r.str();
    rendezvous::feed_options o;
    o.snapshot = r.u8() != 0;
    o.puts = r.u8() != 0;
    o.previous = r.u8() != 0;
    auto sub = std::make_shared<subscriber>();
    std::shared_ptr<hub> h;
    try {
      h = subscribe(from, to, o, sub);
    } catch (const error& e) {
      rendezvous::detail::relay::send_frame(fd, rendezvous::detail::relay::failure(e), what);
      return nullptr;
    }
    try {
      writer ok;
      ok.u8(0);
      rendezvous::detail::relay::send_frame(fd, ok.payload(), what);
      if (!sub->wake) throw os_error("eventfd for a relayed watch");
      while (!st.stop_requested()) {
        pollfd p[2] = {{fd, POLLIN, 0}, {sub->wake.get(), POLLIN, 0}};
        if (::poll(p, 2, -1) < 0 && errno != EINTR) break;
        if (p[0].revents != 0) break;  // a watcher never writes: this is its end (or stop()'s shutdown)
        std::uint64_t count = 0;
        [[maybe_unused]] const auto n = ::read(sub->wake.get(), &count, sizeof count);
        std::deque<std::string> frames;
        {
          std::lock_guard lk(sub->mu);
          if (sub->overflow) break;  // a worker that stopped reading: it gets an end, not a gap
          frames.swap(sub->frames);
        }
        for (const auto& f : frames) rendezvous::detail::relay::send_frame(fd, f, what);
      }
    } catch (...) {
    }
    return unsubscribe(from, to, o, h, sub);
  }

  static std::string hub_key(std::string_view from, std::string_view to, const rendezvous::feed_options& o) {
    return fmt::format("{}\n{}\n{}{}{}", from, to, o.snapshot ? 1 : 0, o.puts ? 1 : 0, o.previous ? 1 : 0);
  }

  static std::string encode(bool reset, const std::vector<rendezvous::key_event>& events) {
    writer w;
    w.u8(0).u8(reset ? 1 : 0).i64(static_cast<std::int64_t>(events.size()));
    for (const auto& e : events) {
      w.str(e.key);
      w.opt(e.value ? std::optional<std::string_view>(*e.value) : std::nullopt);
      w.opt(e.previous ? std::optional<std::string_view>(*e.previous) : std::nullopt);
    }
    return w.payload();
  }

  static void push(subscriber& s, const std::string& frame) {
    {
      std::lock_guard lk(s.mu);
      if (s.frames.size() >= max_queued_frames) {
        s.overflow = true;
      } else {
        s.frames.push_back(frame);
      }
    }
    const std::uint64_t one = 1;
    [[maybe_unused]] const auto n = ::write(s.wake.get(), &one, sizeof one);
  }

  std::shared_ptr<hub> subscribe(const std::string& from, const std::string& to, const rendezvous::feed_options& o,
                                 const std::shared_ptr<subscriber>& sub) {
    std::lock_guard lk(hubs_mu_);
    auto& h = hubs_[hub_key(from, to, o)];
    if (!h) {
      auto fresh = std::make_shared<hub>();
      fresh->from = from;
      fresh->to = to;
      fresh->mirrored = o.puts;
      fresh->feed = up_->watch(from, to, o);
      fresh->snapshot = o.snapshot;
      fresh->pump = std::jthread([hp = fresh.get()](std::stop_token st) { pump(*hp, st); });
      h = std::move(fresh);
    }
    std::lock_guard hl(h->mu);
    if (o.snapshot && h->mirrored && !h->mirror.empty()) {
      std::vector<rendezvous::key_event> now;
      for (const auto& [k, v] : h->mirror) now.push_back({k, v, std::nullopt});
      push(*sub, encode(false, now));
    }
    h->subs.push_back(sub);
    return h;
  }

  /// Removes `sub` from `h`; returns `h` when it was the last, out of hubs_, for the caller to
  /// let go of outside every lock (its pump is joined then).
  [[nodiscard]] std::shared_ptr<hub> unsubscribe(const std::string& from, const std::string& to,
                                                 const rendezvous::feed_options& o, const std::shared_ptr<hub>& h,
                                                 const std::shared_ptr<subscriber>& sub) {
    std::shared_ptr<hub> last;
    std::lock_guard lk(hubs_mu_);
    {
      std::lock_guard hl(h->mu);
      std::erase(h->subs, sub);
      if (!h->subs.empty()) return nullptr;
    }
    if (auto it = hubs_.find(hub_key(from, to, o)); it != hubs_.end() && it->second == h) {
      last = std::move(it->second);
      hubs_.erase(it);
    }
    return last;
  }

  static void pump(hub& h, const std::stop_token& st) noexcept {
    while (!st.stop_requested()) {
      try {
        h.feed->wait(std::chrono::milliseconds(100));
        bool reset = false;
        auto events = h.feed->take(reset);
        std::lock_guard lk(h.mu);
        // The first take of a feed that begins with a snapshot holds the range's contents.
        if (h.mirrored && h.snapshot) h.whole = true;
        if (events.empty() && !reset) continue;
        if (h.mirrored) {
          if (reset) h.mirror.clear();
          for (const auto& e : events) {
            if (e.value) {
              h.mirror.insert_or_assign(e.key, *e.value);
            } else {
              h.mirror.erase(e.key);
            }
          }
        }
        const std::string frame = encode(reset, events);
        for (const auto& s : h.subs) push(*s, frame);
      } catch (...) {  // the store away: the feed picks up again when it is back
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    }
  }

  std::unique_ptr<rendezvous::store> up_;
  write_batcher writes_{*up_};
  std::filesystem::path socket_;
  std::string address_;  // told to every worker at its hello
  internal::unique_fd listener_;
  std::atomic<bool> stopped_{false};

  mutable std::mutex mu_;  // leases, owners, clients
  std::mutex grant_mu_;
  rendezvous::lease_id host_lease_ = 0;
  rendezvous::lease_id next_lease_ = 1;
  std::map<rendezvous::lease_id, worker_lease> leases_;
  /// Each leased key a worker of this host set, with its lease and value.
  struct owned_key {
    rendezvous::lease_id lease = 0;
    std::string value;
  };
  std::map<std::string, owned_key, std::less<>> owners_;
  struct registration {
    std::string value;
    clock::time_point at;
    bool asking = false;
  };
  std::map<std::string, registration> registrations_;  // see registered_elsewhere()
  static constexpr std::chrono::milliseconds host_lease_floor{15000};      // see grant()
  static constexpr std::chrono::milliseconds registration_recheck{10000};  // see registered_elsewhere()
  std::map<std::string, int> clients_;
  std::optional<internal::periodic_thread> renewer_;

  mutable std::mutex hubs_mu_;
  std::map<std::string, std::shared_ptr<hub>> hubs_;

  std::mutex conns_mu_;
  std::list<connection> conns_;
  std::jthread accept_;  // last: stopped before what it serves goes
};

}  // namespace elastic::agent
