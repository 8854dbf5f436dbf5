// Standby communicators: after each round of an nccl_group, one NCCL communicator per possible
// single departure (the round's members but one), built in the background by independent init.
// When exactly that member goes and nobody comes, the survivors switch to it (path "standby"):
// no init, no shrink, and nothing of the old communicator in the way (its sticky network error,
// its abort), so the survivors' first step waits only for the rendezvous.
//
// Store keys, under the round's own prefix K ("P/round/<r>/comm/", the round the standbys are
// for): K standby/<m>: the NCCL unique id of the standby without rank m, made by its rank 0
// (rank 1 of the round when m is 0, else rank 0).
//
// Every rank builds them in the same order (m = 0, 1, ...; its own skipped), one at a time, and
// runs one barrier on each (NCCL connects peers at the first collective), so no two ranks wait
// for each other in different standbys. A round change stops the building at
// once (the half-made one is aborted on the pool's thread, off the critical path).
//
// Cost: world-1 communicators more per rank, each with NCCL's buffers, and the build's CPU and
// GPU work beside training (benchmarks/nccl_standby_bench). Hence only up to a world size
// (nccl_standby::max_world).
#pragma once

#include <elastic/config.hpp>

#if !ELASTIC_WITH_NCCL
#error "elastic/comm/detail/nccl_standby.hpp needs NCCL: link elastic::nccl (which sets ELASTIC_WITH_NCCL=1)"
#endif

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <elastic/comm/detail/nccl_rebuild.hpp>
#include <elastic/comm/nccl.hpp>
#include <elastic/comm/rebuild.hpp>
#include <elastic/error.hpp>
#include <elastic/rendezvous/store.hpp>

namespace elastic::inline v1::comm::detail {

/// The standbys of one round on this rank: built on a thread of their own.
class nccl_standby_pool {
 public:
  /// How long after the round formed the building starts.
  static constexpr std::chrono::milliseconds build_delay{1000};

  /// Starts building, for round `round` (store keys `keys`) in which this rank is `rank` of
  /// `world`, the communicators without each other member.
  nccl_standby_pool(rendezvous::store& store, std::string keys, std::int64_t round, int rank, int world,
                    const nccl_settings& s)
      : store_(store), keys_(std::move(keys)), round_(round), rank_(rank), world_(world), s_(s),
        made_(static_cast<std::size_t>(world)) {
    thread_ = std::jthread([this](std::stop_token st) { build_all(st); });
  }
  nccl_standby_pool(const nccl_standby_pool&) = delete;
  nccl_standby_pool& operator=(const nccl_standby_pool&) = delete;
  ~nccl_standby_pool() { thread_ = {}; }  // stop and join first: the thread uses what follows

  [[nodiscard]] std::int64_t round() const noexcept { return round_; }
  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int world() const noexcept { return world_; }
  [[nodiscard]] const std::string& keys() const noexcept { return keys_; }

  /// Stops building (the thread ends soon: a half-made one is aborted first). Never blocks.
  void stop() noexcept { thread_.request_stop(); }
  /// Whether the building thread has ended (joining it then costs nothing).
  [[nodiscard]] bool finished() const noexcept {
    std::lock_guard lk(mu_);
    return finished_;
  }
  /// How many standbys are ready.
  [[nodiscard]] int ready() const noexcept {
    std::lock_guard lk(mu_);
    int n = 0;
    for (const auto& c : made_) n += c ? 1 : 0;
    return n;
  }

  /// The ready standby without rank `m` (nullptr: none), and every other one built, which the
  /// caller gives up.
  std::unique_ptr<nccl_communicator> take(int m, std::vector<std::unique_ptr<nccl_communicator>>& rest) {
    std::lock_guard lk(mu_);
    taken_ = true;  // one finished after this is destroyed on the pool's thread
    std::unique_ptr<nccl_communicator> out;
    for (int i = 0; i < static_cast<int>(made_.size()); ++i) {
      auto& c = made_[static_cast<std::size_t>(i)];
      if (!c) continue;
      if (i == m && c->ok()) out = std::move(c);
      else rest.push_back(std::move(c));
    }
    return out;
  }

 private:
  void build_all(const std::stop_token& st) noexcept {
    // Not at once: the round's first steps (a resync, the first collectives, the previous
    // communicator's teardown) would share the CPU, the GPU and NCCL's lock with the build
    // (on the H200 a standby switch's first step came 200 ms later than a fresh init's).
    const auto start = std::chrono::steady_clock::now() + build_delay;
    while (!st.stop_requested() && std::chrono::steady_clock::now() < start) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    for (int m = 0; m < world_ && !st.stop_requested(); ++m) {
      if (m == rank_) continue;
      try {
        auto c = build(m, st);
        std::lock_guard lk(mu_);
        if (!taken_) made_[static_cast<std::size_t>(m)] = std::move(c);
      } catch (...) {
        // Stopped, a member gone, a timeout: the change it stood in for gets no standby; the
        // others may still be built.
      }
    }
    std::lock_guard lk(mu_);
    finished_ = true;
  }

  std::unique_ptr<nccl_communicator> build(int m, const std::stop_token& st) {
    const int rank = rank_ - (m < rank_ ? 1 : 0);
    const int size = world_ - 1;
    const std::string key = keys_ + "standby/" + std::to_string(m);
    const auto deadline = std::chrono::steady_clock::now() + s_.timeout;
    const creation_check stopped = [&st] {
      if (st.stop_requested()) throw error(errc::interrupted, "standby communicator: the round changed");
    };
    std::string id;
    if (rank == 0) {
      id = nccl_unique_id();
      store_.set(key, id);
    } else {
      for (;;) {
        stopped();
        if (auto v = store_.get(key)) {
          id = std::move(*v);
          break;
        }
        if (std::chrono::steady_clock::now() >= deadline) {
          throw error(errc::timeout, "standby communicator: no id from its rank 0 in time");
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
    try {
      auto c = std::make_unique<nccl_communicator>(id, rank, size, s_.device, s_.timeout, s_.stream, s_.options,
                                                   stopped);
      // NCCL connects a communicator's peers at its first collective (NCCL_RUNTIME_CONNECT, the
      // default since 2.22): one here, so that the switch finds them connected.
      c->barrier();
      return c;
    } catch (...) {
      // Our id's bootstrap root would wait forever for ranks that never came.
      if (rank == 0) release_bootstrap_root(id, size, s_.device);
      throw;
    }
  }

  rendezvous::store& store_;
  std::string keys_;
  std::int64_t round_;
  int rank_;
  int world_;
  nccl_settings s_;
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<nccl_communicator>> made_;  // index: the rank left out
  bool taken_ = false;  // take() was called: nothing more is kept
  bool finished_ = false;
  std::jthread thread_;  // last: stopped and joined before the rest goes
};

/// The pools of a factory: the current round's, and stopped ones whose threads are ending.
class nccl_standbys {
 public:
  explicit nccl_standbys(int max_world) : max_world_(max_world) {}
  nccl_standbys(const nccl_standbys&) = delete;
  nccl_standbys& operator=(const nccl_standbys&) = delete;

  [[nodiscard]] int max_world() const noexcept { return max_world_; }

  /// Before round change `ch`: this rank's ready standby for it (nullptr: none); the pool stops
  /// and every other standby it built goes to `spare`, for the caller to give up AFTER the
  /// previous communicator: with NCCL < 2.28 an abort frees through cudaFree, which waits for the
  /// whole device, so one queued before the abort that stops a stuck kernel would wait for ever.
  /// Never blocks on a build.
  std::unique_ptr<nccl_communicator> before(round_change<nccl_communicator>& ch,
                                            std::vector<std::unique_ptr<nccl_communicator>>& spare) {
    std::unique_ptr<nccl_standby_pool> pool;
    {
      std::lock_guard lk(mu_);
      pool = std::move(current_);
      reap_locked();
    }
    if (!pool) return nullptr;
    pool->stop();
    std::unique_ptr<nccl_communicator> out;
    const bool same_round = pool->round() == ch.previous.round && pool->rank() == ch.previous.rank &&
                            pool->world() == ch.previous.world_size && run_of(pool->keys()) == run_of(ch.keys);
    const int gone = same_round ? only_departure(ch) : -1;
    out = pool->take(gone, spare);
    std::lock_guard lk(mu_);
    stopping_.push_back(std::move(pool));
    return out;
  }

  /// After round change `ch` made this rank's communicator `made`: the next round's pool.
  void after(round_change<nccl_communicator>& ch, const nccl_communicator& made, const nccl_settings& s) {
    const int world = made.size();
    if (max_world_ < 2 || world < 2 || world > max_world_) return;
    auto pool = std::make_unique<nccl_standby_pool>(ch.store, ch.keys, ch.next.round, made.rank(), world, s);
    std::lock_guard lk(mu_);
    current_ = std::move(pool);
  }

  /// How many standbys the current round's pool has ready (for tests and benchmarks).
  [[nodiscard]] int ready() const {
    std::lock_guard lk(mu_);
    return current_ ? current_->ready() : 0;
  }

 private:
  // The previous round's rank that departed, when exactly one did and nobody came; else -1.
  static int only_departure(const round_change<nccl_communicator>& ch) {
    if (ch.next.world_size + 1 != ch.previous.world_size ||
        ch.previous.members.size() != static_cast<std::size_t>(ch.previous.world_size) ||
        ch.previous.incarnations.size() != ch.previous.members.size()) {
      return -1;
    }
    const auto gone = departed_ranks(ch.previous, ch.next);
    return gone.size() == 1 ? gone.front() : -1;
  }

  // "P" of a round's keys "P/round/<r>/comm/": a pool of another run is never used.
  static std::string run_of(const std::string& keys) { return keys.substr(0, keys.rfind("/round/")); }

  // Joins the stopped pools whose threads have ended (the others are left for later).
  void reap_locked() {
    std::erase_if(stopping_, [](const std::unique_ptr<nccl_standby_pool>& p) { return p->finished(); });
  }

  int max_world_;
  mutable std::mutex mu_;
  std::unique_ptr<nccl_standby_pool> current_;
  std::vector<std::unique_ptr<nccl_standby_pool>> stopping_;
};

}  // namespace elastic::inline v1::comm::detail
