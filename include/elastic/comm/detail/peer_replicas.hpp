// Peer-memory replicas of an elastic group's partitioned state (group_options::replicas).
//
// Each time a snapshot's staging copy is complete (checkpointer::on_copied, on the copier
// thread), the rank keeps a copy of its whole staged state in host memory (its "own image":
// replicated entries and its slices), and a sender thread sends its slices of the partitioned
// entries to its `copies` ring successors (rank+1, rank+2, ... of its world) over plain TCP,
// where a listener keeps them as "replica images". None of this runs on the training thread.
// The listener serves each connection on a thread of its own (at most max_connections at once):
// a connection that has not proven it is of the group (detail/replica_wire.hpp: a challenge
// and an HMAC keyed by the group's secret) within wire::handshake_time is dropped, and when the
// slots are full the oldest such connection makes room, so idle or stray connections never keep
// a member's replica out. Refusals are counted (replica_stats::refused) and logged at most once
// per refusal_interval (`replica_refused`: how many, the last reason), never once a connection. The newest two snapshot steps are kept of each kind, so that a rank lost while its
// newest replica was still on the wire leaves the step before it whole in memory. How a rebuild
// uses them: detail/shard_resync.hpp; the wire and its checks: detail/replica_wire.hpp.
#pragma once

#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <list>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <elastic/checkpoint/detail/host_memory.hpp>
#include <elastic/comm/detail/memory_image.hpp>
#include <elastic/comm/detail/replica_wire.hpp>
#include <elastic/checkpoint/partition.hpp>
#include <elastic/checkpoint/staged_snapshot.hpp>
#include <elastic/checkpoint/state.hpp>
#include <elastic/error.hpp>
#include <elastic/events.hpp>
#include <elastic/internal/crc32c.hpp>
#include <elastic/internal/names.hpp>
#include <elastic/internal/cuda.hpp>
#include <elastic/internal/sha256.hpp>
#include <elastic/internal/tcp.hpp>

namespace elastic::inline v1::comm::detail {

class peer_replicas {
 public:
  /// Connections served at once; the listener refuses (or makes room among strangers) past it.
  static constexpr std::size_t max_connections = 32;
  /// At most one `replica_refused` event per interval, with the count of refusals in it.
  static constexpr std::chrono::seconds refusal_interval{10};

  /// Listens on `host` for the replicas of the run `run_id`; `copies` successors receive this
  /// rank's slices. `st` is the group's state: its partitioned entries fix what a replica holds.
  peer_replicas(const checkpoint::state& st, std::string run_id, const std::string& host, int copies,
                event_log events)
      : run_id_(std::move(run_id)),
        copies_(copies),
        events_(std::move(events)),
        pinned_(st.has_device_entries()),
        key_(wire::random<wire::group_key>()) {
    if (copies < 1) throw error(errc::invalid_argument, fmt::format("peer replicas: {} copies", copies));
    if (run_id_.size() > 4096) throw error(errc::invalid_argument, "peer replicas: run id over 4096 characters");
    for (std::size_t i = 0; i < st.entries().size(); ++i) {
      const auto& e = st.entries()[i];
      if (!e.partition) continue;
      parts_.push_back({e.name, e.shard->global_count, e.element_bytes, e.partition});
      part_index_.push_back(i);
    }
    // Pinned images are allocated and freed on the threads below: they make the state's device
    // their own, or their first CUDA call would open a context on GPU 0.
    if (pinned_) device_ = internal::cuda::current_device();
    auto [fd, port] = internal::tcp::listen_on(host);
    listener_fd_ = std::move(fd);
    self_ = {host, port};
    events_.emit("replica_listening", {{"host", host}, {"port", port}});
    listener_ = std::jthread([this](std::stop_token stop) { listen_loop(stop); });
    sender_ = std::jthread([this](std::stop_token stop) { send_loop(stop); });
  }

  peer_replicas(const peer_replicas&) = delete;
  peer_replicas& operator=(const peer_replicas&) = delete;
  /// Stops every thread; a transfer in flight is cut off (its connection shut down), not
  /// waited for. Refusals not yet logged are logged.
  ~peer_replicas() {
    listener_.request_stop();
    sender_.request_stop();
    cv_.notify_all();
    {
      std::lock_guard lk(conn_mu_);
      stopping_ = true;
      for (auto& c : conns_) ::shutdown(c.fd.get(), SHUT_RDWR);
      if (sending_fd_ >= 0) ::shutdown(sending_fd_, SHUT_RDWR);
    }
    listener_.join();  // it joins the connections' threads on its way out
    log_refusals(true);
  }

  [[nodiscard]] const peer_address& address() const noexcept { return self_; }
  /// This rank's group key (its own until a resync gives it rank 0's): a secret, which only
  /// the group's own communicator carries, never a replica connection.
  [[nodiscard]] wire::group_key key() const {
    std::lock_guard lk(mu_);
    return key_;
  }
  [[nodiscard]] int copies() const noexcept { return copies_; }
  [[nodiscard]] replica_stats stats() const {
    std::lock_guard lk(mu_);
    return stats_;
  }

  /// Keeps a copy of a staged snapshot as this rank's own image (the copier thread calls it).
  void keep(const checkpoint::staged_snapshot& s) {
    image_key key{-1, 0, static_cast<std::int64_t>(s.step), true};
    for (const auto& st : s.entries) {
      if (st.source->shard) {  // records carry no callbacks: a slice in a group is partitioned
        key.rank = st.source->part_rank;
        key.world = st.source->part_world;
        break;
      }
    }
    if (key.rank < 0) return;  // no partitioned entry: nothing of ours is lost with us
    auto img = std::make_shared<memory_image>();
    img->key = key;
    std::size_t total = 0;
    bool objects = false;
    for (const auto& st : s.entries) {
      img->offsets.push_back(total);
      const bool object = st.source->kind == checkpoint::entry_kind::object;
      img->sizes.push_back(object ? 0 : st.bytes.size());
      if (!object) total += (st.bytes.size() + 63) / 64 * 64;
      objects = objects || object;
    }
    {
      // The oldest own image makes room (its memory reused when nobody holds it): two are kept.
      std::lock_guard lk(mu_);
      if (own_.size() >= 2) {
        auto oldest = std::move(own_.front());
        own_.erase(own_.begin());
        if (oldest.use_count() == 1 && oldest->memory.size() == total) img->memory = std::move(oldest->memory);
      }
    }
    if (img->memory.size() != total) img->memory = checkpoint::detail::host_memory(total, pinned_);
    if (objects) img->objects.resize(s.entries.size());
    for (std::size_t i = 0; i < s.entries.size(); ++i) {
      const auto& st = s.entries[i];
      if (st.source->kind == checkpoint::entry_kind::object) {
        img->objects[i].assign(st.bytes.begin(), st.bytes.end());
      } else if (!st.bytes.empty()) {
        std::memcpy(img->memory.data() + img->offsets[i], st.bytes.data(), st.bytes.size());
      }
    }
    {
      std::lock_guard lk(mu_);
      std::erase_if(own_, [&](const auto& o) { return o->key == key; });
      own_.push_back(std::move(img));
      ++stats_.kept;
    }
    cv_.notify_all();
  }

  /// After a resync: this rank is `rank` of `world`, its peers listen at `peers` (by rank). The
  /// newest own image, when it is of this rank and world, goes to the successors (a newcomer
  /// among them lacks it).
  void follow(int rank, int world, std::vector<peer_address> peers, const wire::group_key& key) {
    {
      std::lock_guard lk(mu_);
      if (!wire::is_zero(key)) key_ = key;
      rank_ = rank;
      world_ = world;
      peers_ = std::move(peers);
      ++generation_;
    }
    cv_.notify_all();
  }

  /// Forgets every image newer than `step` (the group went back to it: what came after is
  /// another history).
  void drop_after(std::int64_t step) {
    std::lock_guard lk(mu_);
    std::erase_if(own_, [&](const auto& o) { return o->key.step > step; });
    std::erase_if(held_, [&](const auto& o) { return o->key.step > step; });
  }

  /// Every image held now (own and replicas), pinned by the caller for as long as it keeps them.
  [[nodiscard]] std::vector<std::shared_ptr<const memory_image>> images() const {
    std::lock_guard lk(mu_);
    std::vector<std::shared_ptr<const memory_image>> all(own_.begin(), own_.end());
    all.insert(all.end(), held_.begin(), held_.end());
    return all;
  }

  /// The partitioned entries' indices among the state's entries, in order: a replica holds
  /// these, its entry j being the state's entry partitioned()[j].
  [[nodiscard]] const std::vector<std::size_t>& partitioned() const noexcept { return part_index_; }

 private:

  struct part_shape {
    std::string name;
    std::uint64_t global = 0;
    std::size_t element_bytes = 1;
    checkpoint::partition_fn partition;
  };

  /// Bytes of rank `rank` of `world`'s slice of each partitioned entry; nothing when the
  /// partition refuses that world.
  std::optional<std::vector<std::uint64_t>> slice_sizes(std::int64_t rank, std::int64_t world) const {
    std::vector<std::uint64_t> out;
    try {
      for (const auto& p : parts_) {
        const auto all = checkpoint::partition_slices(p.partition, p.name, p.global, static_cast<int>(world));
        out.push_back(all[static_cast<std::size_t>(rank)].count * p.element_bytes);
      }
    } catch (const std::exception&) {
      return std::nullopt;
    }
    return out;
  }

  // ---- the sender ----

  void send_loop(std::stop_token stop) {
    if (pinned_) internal::cuda::adopt_device(device_);  // it may free the last reference to an image
    std::uint64_t done_generation = 0;
    image_key done{};
    for (;;) {
      std::shared_ptr<const memory_image> img;
      std::vector<std::pair<int, peer_address>> to;
      std::uint64_t gen = 0;
      wire::group_key key{};
      {
        std::unique_lock lk(mu_);
        cv_.wait(lk, stop, [&] {
          if (own_.empty() || world_ <= 1) return false;
          const auto& newest = own_.back();
          if (newest->key.rank != rank_ || newest->key.world != world_) return false;
          return newest->key != done || generation_ != done_generation;
        });
        if (stop.stop_requested()) return;
        img = own_.back();
        gen = generation_;
        key = key_;
        const int n = std::min(copies_, world_ - 1);
        for (int j = 1; j <= n; ++j) {
          const int r = (rank_ + j) % world_;
          if (static_cast<std::size_t>(r) < peers_.size()) to.emplace_back(r, peers_[static_cast<std::size_t>(r)]);
        }
      }
      for (const auto& [r, addr] : to) {
        if (stop.stop_requested()) return;
        send_one(*img, r, addr, key);
      }
      done = img->key;
      done_generation = gen;
    }
  }

  void send_one(const memory_image& img, int to, const peer_address& addr, const wire::group_key& key) {
    const auto t0 = internal::tcp::clock::now();
    std::uint64_t bytes = 0;
    std::vector<std::span<const std::byte>> slices;
    std::vector<std::uint64_t> sizes;
    for (const std::size_t i : part_index_) {  // the own image holds every entry; these are the slices
      if (i >= img.sizes.size()) return;       // an image of a state laid out otherwise: not ours to send
      slices.push_back(img.bytes(i));
      sizes.push_back(img.sizes[i]);
      bytes += img.sizes[i];
    }
    try {
      const auto head = wire::header(run_id_, img.key.rank, img.key.world, img.key.step, sizes);
      const auto deadline = t0 + wire::transfer_time(bytes);
      const std::string what = fmt::format("replica of step {} to rank {} at {}:{}", img.key.step, to, addr.host, addr.port);
      auto fd = internal::tcp::connect_to(addr.host, addr.port, std::min(deadline, t0 + std::chrono::seconds(10)));
      const sending on(*this, fd.get());
      wire::client_handshake(fd.get(), key, run_id_, head, deadline, what);
      std::uint32_t crc = 0;
      for (const auto& s : slices) {
        internal::tcp::send_all(fd.get(), s.data(), s.size(), deadline, what);
        crc = internal::crc32c(s.data(), s.size(), crc);
      }
      internal::tcp::send_all(fd.get(), &crc, sizeof crc, deadline, what);
      std::uint8_t answer = 1;
      internal::tcp::recv_all(fd.get(), &answer, 1, deadline, what);
      if (answer != 0) throw error(errc::mismatch, what + ": refused by the receiver (see its replica_refused event)");
      const double ms = std::chrono::duration<double, std::milli>(internal::tcp::clock::now() - t0).count();
      {
        std::lock_guard lk(mu_);
        ++stats_.sent;
        stats_.bytes_sent += bytes;
        stats_.last_sent_step = img.key.step;
      }
      events_.emit("replica_sent", {{"step", img.key.step}, {"rank", img.key.rank}, {"to", to}, {"bytes", bytes}, {"ms", ms}});
    } catch (const std::exception& e) {
      {
        std::lock_guard lk(mu_);
        ++stats_.send_failures;
      }
      events_.emit("replica_send_failed", {{"step", img.key.step}, {"to", to}, {"reason", e.what()}});
    }
  }

  // ---- the listener ----

  /// One accepted connection, served by its own thread. The listener thread alone adds and
  /// erases them; conn_mu_ guards the flags and the shutdown of `fd` (only while it is open).
  struct connection {
    internal::unique_fd fd;
    internal::tcp::clock::time_point since;
    bool member = false;   // proved it holds the group's key
    bool dropped = false;  // shut down to make room for a newer connection
    std::atomic<bool> done{false};
    std::jthread thread;  // last: it stops before the fields it uses go away
  };

  void listen_loop(std::stop_token stop) {
    while (!stop.stop_requested()) {
      reap(false);
      log_refusals(false);
      auto fd = internal::tcp::accept_for(listener_fd_.get(), std::chrono::milliseconds(100));
      if (!fd) continue;
      {
        std::lock_guard lk(conn_mu_);
        if (stopping_) break;
        if (conns_.size() < max_connections || make_room()) {
          auto& c = conns_.emplace_back();
          c.fd = std::move(fd);
          c.since = internal::tcp::clock::now();
          c.thread = std::jthread([this, &c] {
            serve(c);
            c.done.store(true, std::memory_order_release);
          });
          continue;
        }
      }
      refuse(fd.get(), fmt::format("{} connections at once, all of them members' transfers", max_connections), -1);
    }
    reap(true);
  }

  /// Joins and closes the connections that are done (all of them with `all`, once stopping).
  void reap(bool all) {
    std::list<connection> over;
    {
      std::lock_guard lk(conn_mu_);
      for (auto it = conns_.begin(); it != conns_.end();) {
        auto next = std::next(it);
        if (all || it->done.load(std::memory_order_acquire)) over.splice(over.end(), conns_, it);
        it = next;
      }
    }
    // Joined outside conn_mu_: a connection's thread takes it on its way.
  }

  /// With conn_mu_ held: shuts down the oldest connection that has not proven it is a member,
  /// if any (its thread then ends and counts the refusal).
  bool make_room() {
    connection* oldest = nullptr;
    for (auto& c : conns_) {
      if (c.member || c.dropped || c.done.load(std::memory_order_acquire)) continue;
      if (!oldest || c.since < oldest->since) oldest = &c;
    }
    if (!oldest) return false;
    oldest->dropped = true;
    ::shutdown(oldest->fd.get(), SHUT_RDWR);
    return true;
  }

  /// The connection a sender is on, for the destructor to cut off.
  class sending {
   public:
    sending(peer_replicas& r, int fd) : r_(r) {
      std::lock_guard lk(r_.conn_mu_);
      r_.sending_fd_ = fd;
      if (r_.stopping_) ::shutdown(fd, SHUT_RDWR);  // the destructor has been through already
    }
    sending(const sending&) = delete;
    sending& operator=(const sending&) = delete;
    ~sending() {
      std::lock_guard lk(r_.conn_mu_);
      r_.sending_fd_ = -1;
    }

   private:
    peer_replicas& r_;
  };

  /// Counts a refusal (logged by log_refusals) and answers 1 when the peer still listens.
  void refuse(int fd, const std::string& why, std::int64_t from) {
    {
      std::lock_guard lk(mu_);
      ++stats_.refused;
    }
    auto peer = internal::tcp::peer_name(fd);
    {
      std::lock_guard lk(refusals_mu_);
      ++refusals_.count;
      refusals_.reason = why;
      refusals_.from = from;
      refusals_.peer = std::move(peer);
    }
    log_refusals(false);
    const std::uint8_t no = 1;
    try {
      internal::tcp::send_all(fd, &no, 1, internal::tcp::clock::now() + std::chrono::seconds(1), "replica answer");
    } catch (const std::exception&) {
    }
  }

  /// One `replica_refused` event for the refusals not logged yet, when refusal_interval has
  /// passed since the last one (or `now_anyway`): a flood of strangers costs a line per interval.
  void log_refusals(bool now_anyway) {
    std::uint64_t count = 0;
    std::string reason, peer;
    std::int64_t from = -1;
    {
      std::lock_guard lk(refusals_mu_);
      const auto now = internal::tcp::clock::now();
      if (refusals_.count == 0 || (!now_anyway && refusals_.logged && now - refusals_.last < refusal_interval)) return;
      count = std::exchange(refusals_.count, 0);
      reason = std::move(refusals_.reason);
      from = refusals_.from;
      peer = std::move(refusals_.peer);
      refusals_.last = now;
      refusals_.logged = true;
    }
    events_.emit("replica_refused", {{"count", count},
                                     {"reason", reason},
                                     {"from", from},
                                     {"peer", peer},
                                     {"interval_s", static_cast<std::int64_t>(refusal_interval.count())}});
  }

  void serve(connection& c) {
    const int fd = c.fd.get();
    std::int64_t from = -1;
    bool member = false;
    try {
      auto deadline = internal::tcp::clock::now() + wire::handshake_time;
      if (wire::get<std::uint32_t>(fd, deadline) != wire::magic) return refuse(fd, "not a replica (bad magic)", from);
      if (const auto v = wire::get<std::uint32_t>(fd, deadline); v != wire::version) {
        return refuse(fd, fmt::format("replica format version {}, this build reads {}", v, wire::version), from);
      }
      wire::nonce theirs{};
      internal::tcp::recv_all(fd, theirs.data(), theirs.size(), deadline, "replica hello");
      const auto mine = wire::random<wire::nonce>();
      const auto key = this->key();
      const auto proof = wire::server_proof(key, theirs, mine, run_id_);
      internal::tcp::send_all(fd, mine.data(), mine.size(), deadline, "replica challenge");
      internal::tcp::send_all(fd, proof.data(), proof.size(), deadline, "replica challenge");
      // The header, kept as it came for the client's MAC; bounded before anything is allocated.
      std::vector<std::byte> head;
      const auto id_len = wire::get<std::uint32_t>(fd, deadline, &head);
      if (id_len != run_id_.size()) return refuse(fd, "another run (run id length differs)", from);
      std::string id(id_len, '\0');
      internal::tcp::recv_all(fd, id.data(), id.size(), deadline, "replica header");
      head.insert(head.end(), reinterpret_cast<const std::byte*>(id.data()),
                  reinterpret_cast<const std::byte*>(id.data()) + id.size());
      image_key k;
      k.rank = wire::get<std::int64_t>(fd, deadline, &head);
      k.world = wire::get<std::int64_t>(fd, deadline, &head);
      k.step = wire::get<std::int64_t>(fd, deadline, &head);
      const auto n = wire::get<std::uint32_t>(fd, deadline, &head);
      if (n != parts_.size()) {
        return refuse(fd, fmt::format("{} partitioned entries sent, this state has {}", n, parts_.size()), from);
      }
      std::vector<std::uint64_t> sizes;
      for (std::uint32_t i = 0; i < n; ++i) sizes.push_back(wire::get<std::uint64_t>(fd, deadline, &head));
      wire::mac answer{};
      internal::tcp::recv_all(fd, answer.data(), answer.size(), deadline, "replica answer to the challenge");
      if (!internal::equal_in_constant_time(answer, wire::client_proof(key, theirs, mine, head))) {
        return refuse(fd, "not of this group: its answer to the challenge is wrong (another job, or a stranger)", from);
      }
      member = true;
      {
        std::lock_guard lk(conn_mu_);
        c.member = true;
      }
      if (id != run_id_) return refuse(fd, "another run ('" + internal::printable(std::string_view(id).substr(0, 64)) + "')", from);
      from = k.rank;
      if (k.world < 1 || k.world > (1 << 20) || k.rank < 0 || k.rank >= k.world || k.step < 0) {
        return refuse(fd, fmt::format("impossible rank {} of {} at step {}", k.rank, k.world, k.step), from);
      }
      const auto expected = slice_sizes(k.rank, k.world);
      if (!expected) return refuse(fd, fmt::format("the partition refuses a world of {}", k.world), from);
      auto img = std::make_shared<memory_image>();
      img->key = k;
      std::size_t total = 0;
      for (std::uint32_t i = 0; i < n; ++i) {
        if (sizes[i] != (*expected)[i]) {
          return refuse(fd, fmt::format("entry '{}': {} bytes sent, rank {} of {} holds {}", parts_[i].name, sizes[i],
                                        k.rank, k.world, (*expected)[i]),
                        from);
        }
        img->offsets.push_back(total);
        img->sizes.push_back(static_cast<std::size_t>(sizes[i]));
        total += static_cast<std::size_t>((sizes[i] + 63) / 64 * 64);
      }
      // Pinned images are allocated and freed here: this thread makes the state's device its own.
      if (pinned_) internal::cuda::adopt_device(device_);
      if (std::lock_guard lk(mu_); spare_.size() == total) img->memory = std::move(spare_);  // a held one's
      if (img->memory.size() != total) img->memory = checkpoint::detail::host_memory(total, pinned_);
      deadline = internal::tcp::clock::now() + wire::transfer_time(total);
      std::uint32_t crc = 0;
      for (std::uint32_t i = 0; i < n; ++i) {
        std::byte* p = img->memory.data() + img->offsets[i];
        internal::tcp::recv_all(fd, p, img->sizes[i], deadline, "replica data");
        crc = internal::crc32c(p, img->sizes[i], crc);
      }
      if (wire::get<std::uint32_t>(fd, deadline) != crc) return refuse(fd, "the data arrived damaged (CRC-32C)", from);
      hold(std::move(img));
      const std::uint8_t yes = 0;
      internal::tcp::send_all(fd, &yes, 1, deadline, "replica answer");
    } catch (const std::exception& e) {
      if (!member) {
        // A stranger that stalled, closed, or was dropped to make room: a refusal like any other.
        bool dropped = false;
        {
          std::lock_guard lk(conn_mu_);
          dropped = c.dropped;
        }
        return refuse(fd,
                      dropped ? fmt::format("dropped to make room: {} connections at once, this one had not proven "
                                            "it is of the group",
                                            max_connections)
                              : fmt::format("no valid handshake within {} s: {}", wire::handshake_time.count(), e.what()),
                      from);
      }
      // A member that died or stalled mid-way: whatever arrived is dropped, never kept.
      events_.emit("replica_receive_failed", {{"from", from}, {"reason", e.what()}});
    }
  }

  /// Keeps a replica: of each rank's, the images of the newest two steps held.
  void hold(std::shared_ptr<memory_image> img) {
    std::lock_guard lk(mu_);
    std::erase_if(held_, [&](const auto& o) { return o->key == img->key; });
    held_.push_back(std::move(img));
    std::set<std::int64_t> steps;
    for (const auto& h : held_) steps.insert(h->key.step);
    while (steps.size() > 2) steps.erase(steps.begin());
    std::erase_if(held_, [&](auto& o) {
      if (steps.contains(o->key.step)) return false;
      if (o.use_count() == 1) spare_ = std::move(o->memory);  // the next replica's, not a fresh mapping
      return true;
    });
    ++stats_.received;
  }

  std::string run_id_;
  int copies_ = 1;
  event_log events_;
  bool pinned_ = false;  // the state has device entries: images are pinned, on device_
  int device_ = 0;
  wire::group_key key_{};  // guarded by mu_ after construction
  std::vector<part_shape> parts_;
  std::vector<std::size_t> part_index_;  // each partitioned entry's index in the state
  internal::unique_fd listener_fd_;
  peer_address self_;
  mutable std::mutex mu_;
  std::condition_variable_any cv_;
  std::vector<std::shared_ptr<memory_image>> own_;   // oldest first
  std::vector<std::shared_ptr<memory_image>> held_;  // replicas kept for predecessors
  checkpoint::detail::host_memory spare_;             // an evicted replica's memory, for the next one
  int rank_ = 0, world_ = 1;
  std::vector<peer_address> peers_;
  std::uint64_t generation_ = 0;
  replica_stats stats_;
  std::mutex refusals_mu_;
  struct {
    std::uint64_t count = 0;  // refusals not logged yet
    std::string reason;       // the last one's
    std::int64_t from = -1;   // its rank, when it proved it is a member
    std::string peer;         // its address
    internal::tcp::clock::time_point last{};
    bool logged = false;
  } refusals_;  // guarded by refusals_mu_
  std::mutex conn_mu_;  // guards conns_' flags, sending_fd_, stopping_: a descriptor is shut down only while open
  std::list<connection> conns_;  // served now; only the listener thread adds or erases
  int sending_fd_ = -1;          // the sender's connection now
  bool stopping_ = false;        // the destructor has cut the connections off
  std::jthread listener_, sender_;  // last: they stop before the members they use go away
};

}  // namespace elastic::inline v1::comm::detail
