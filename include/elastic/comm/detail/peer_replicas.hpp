// Peer-memory replicas of an elastic group's partitioned state (group_options::replicas).
//
// Each time a snapshot's staging copy is complete (checkpointer::on_copied, on the copier
// thread), the rank keeps a copy of its whole staged state in host memory (its "own image":
// replicated entries and its slices), and a sender thread sends its slices of the partitioned
// entries to its `copies` ring successors (rank+1, rank+2, ... of its world) over plain TCP,
// where a listener keeps them as "replica images". None of this runs on the training thread.
// The listener serves each connection on a thread of its own (detail/replica_listener.hpp); a
// connection that has not proven it is of the group (detail/replica_handshake.hpp: a challenge
// and an HMAC keyed by the group's secret) within wire::handshake_time is dropped. What a
// replica holds and the checks of its header: detail/replica_layout.hpp. Refusals are counted
// (replica_stats::refused) and logged at most once per refusal_interval
// (detail/replica_refusals.hpp), never once a connection. The newest two snapshot steps are kept
// of each kind, so that a rank lost while its newest replica was still on the wire leaves the
// step before it whole in memory. How a rebuild uses them: detail/shard_resync.hpp; the wire and
// its checks: detail/replica_wire.hpp.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <elastic/checkpoint/detail/host_memory.hpp>
#include <elastic/checkpoint/staged_snapshot.hpp>
#include <elastic/checkpoint/state.hpp>
#include <elastic/comm/detail/memory_image.hpp>
#include <elastic/comm/detail/replica_handshake.hpp>
#include <elastic/comm/detail/replica_layout.hpp>
#include <elastic/comm/detail/replica_listener.hpp>
#include <elastic/comm/detail/replica_refusals.hpp>
#include <elastic/comm/detail/replica_wire.hpp>
#include <elastic/error.hpp>
#include <elastic/events.hpp>
#include <elastic/internal/crc32c.hpp>
#include <elastic/internal/cuda.hpp>
#include <elastic/internal/names.hpp>
#include <elastic/internal/tcp.hpp>

namespace elastic::inline v1::comm::detail {

class peer_replicas {
 public:
  /// Connections served at once; the listener refuses (or makes room among strangers) past it.
  static constexpr std::size_t max_connections = replica_listener::max_connections;
  /// At most one `replica_refused` event per interval, with the count of refusals in it.
  static constexpr std::chrono::seconds refusal_interval = replica_refusals::interval;

  /// Listens on `host` for the replicas of the run `run_id`; `copies` successors receive this
  /// rank's slices. `st` is the group's state: its partitioned entries fix what a replica holds.
  peer_replicas(const checkpoint::state& st, std::string run_id, const std::string& host, int copies,
                event_log events)
      : run_id_(std::move(run_id)),
        copies_(copies),
        events_(std::move(events)),
        pinned_(st.has_device_entries()),
        key_(wire::random<wire::group_key>()),
        layout_(st),
        refusals_(events_) {
    if (copies < 1) throw error(errc::invalid_argument, fmt::format("peer replicas: {} copies", copies));
    if (run_id_.size() > 4096) throw error(errc::invalid_argument, "peer replicas: run id over 4096 characters");
    // Pinned images are allocated and freed on the threads below: they make the state's device
    // their own, or their first CUDA call would open a context on GPU 0.
    if (pinned_) device_ = internal::cuda::current_device();
    self_ = {host, listener_.listen(host)};
    events_.emit("replica_listening", {{"host", host}, {"port", self_.port}});
    listener_.start([this](replica_connection& c) { serve(c); },
                    [this](int fd, const std::string& why) { refuse(fd, why, -1); },
                    [this] { refusals_.log(false); });
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
    listener_.cut_off();
    listener_.join();  // it joins the connections' threads on its way out
    refusals_.log(true);
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
  [[nodiscard]] const std::vector<std::size_t>& partitioned() const noexcept { return layout_.partitioned(); }

 private:
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
    for (const std::size_t i : layout_.partitioned()) {  // the own image holds every entry; these are the slices
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
      const replica_listener::sending on(listener_, fd.get());
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

  /// Counts a refusal (logged by refusals_) and answers 1 when the peer still listens.
  void refuse(int fd, const std::string& why, std::int64_t from) {
    {
      std::lock_guard lk(mu_);
      ++stats_.refused;
    }
    refusals_.count(why, from, internal::tcp::peer_name(fd));
    refusals_.log(false);
    const std::uint8_t no = 1;
    try {
      internal::tcp::send_all(fd, &no, 1, internal::tcp::clock::now() + std::chrono::seconds(1), "replica answer");
    } catch (const std::exception&) {
    }
  }

  void serve(replica_connection& c) {
    const int fd = c.fd.get();
    std::int64_t from = -1;
    bool member = false;
    try {
      auto deadline = internal::tcp::clock::now() + wire::handshake_time;
      auto hello = wire::server_handshake(fd, run_id_, layout_.size(), [this] { return key(); }, deadline);
      if (!hello.accepted) return refuse(fd, hello.refusal, from);
      const auto& [id, k, sizes] = *hello.accepted;
      member = true;
      listener_.admit(c);
      if (id != run_id_) return refuse(fd, "another run ('" + internal::printable(std::string_view(id).substr(0, 64)) + "')", from);
      from = k.rank;
      if (auto why = layout_.refusal(k, sizes); !why.empty()) return refuse(fd, why, from);
      auto img = std::make_shared<memory_image>();
      img->key = k;
      std::size_t total = 0;
      for (const auto size : sizes) {
        img->offsets.push_back(total);
        img->sizes.push_back(static_cast<std::size_t>(size));
        total += static_cast<std::size_t>((size + 63) / 64 * 64);
      }
      // Pinned images are allocated and freed here: this thread makes the state's device its own.
      if (pinned_) internal::cuda::adopt_device(device_);
      if (std::lock_guard lk(mu_); spare_.size() == total) img->memory = std::move(spare_);  // a held one's
      if (img->memory.size() != total) img->memory = checkpoint::detail::host_memory(total, pinned_);
      deadline = internal::tcp::clock::now() + wire::transfer_time(total);
      std::uint32_t crc = 0;
      for (std::size_t i = 0; i < img->sizes.size(); ++i) {
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
        return refuse(fd,
                      listener_.dropped(c)
                          ? fmt::format("dropped to make room: {} connections at once, this one had not proven "
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
  replica_layout layout_;
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
  replica_refusals refusals_;
  replica_listener listener_;  // it and the sender last: they stop before the members they use go away
  std::jthread sender_;
};

}  // namespace elastic::inline v1::comm::detail
