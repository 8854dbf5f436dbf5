// The snapshot engine and the background persister.
//
// snapshot(step) returns at once: values and objects are captured on the spot (they are small),
// buffers are copied into host staging in the background: memcpy on the copier thread for host
// buffers, cudaMemcpyAsync on a non-blocking side stream for device buffers (after an event on
// the user's stream, so the copy sees every kernel queued before the snapshot). The next step's
// forward/backward runs meanwhile; before_update() is the fence the optimizer step must pass.
// A persister thread then writes the staged copy (storage.hpp) while training goes on. Staging
// is allocated once: two slots when the budget allows, so one snapshot can be copied while the
// previous one is written; set_world() lays it out again when the world's slices change sizes.
//
// Nothing but elastic::error leaves the engine: whatever a background thread catches is turned
// into one before a caller sees it.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <elastic/internal/cuda.hpp>
#include <elastic/checkpoint/detail/host_memory.hpp>
#include <elastic/checkpoint/detail/library_error.hpp>
#include <elastic/checkpoint/detail/step_store.hpp>
#include <elastic/checkpoint/format.hpp>
#include <elastic/checkpoint/staged_snapshot.hpp>
#include <elastic/checkpoint/state.hpp>
#include <elastic/checkpoint/storage.hpp>
#include <elastic/internal/clock.hpp>
#include <elastic/internal/env.hpp>
#include <elastic/internal/private_dir.hpp>
#include <elastic/error.hpp>
#include <elastic/events.hpp>

namespace elastic::inline v1::checkpoint {

/// A CUDA stream as the caller has it (cudaStream_t), or the default stream.
using stream_handle = internal::cuda::stream_t;

struct checkpointer_options {
  std::filesystem::path dir{};      ///< where steps are written (created if missing; must be ours, see private_dir)
  std::size_t keep_last = 3;        ///< valid committed steps kept (at least 1)
  int rank = -1;                    ///< -1: ELASTIC_RANK, else 0
  int world_size = -1;              ///< -1: ELASTIC_WORLD_SIZE, else 1
  std::string run_id{};             ///< empty: ELASTIC_RUN_ID
  std::size_t staging_budget = 0;   ///< host staging bytes; 0: two copies, at most half the RAM
  std::chrono::milliseconds commit_timeout{std::chrono::minutes(2)};  ///< rank 0 waits this long for the others
  std::uint64_t chunk_bytes = default_chunk_bytes;
  std::optional<event_log> events{};  ///< nothing: event_log::from_env()
};

/// What the engine has done so far.
struct checkpointer_stats {
  std::uint64_t snapshots = 0;
  std::uint64_t committed = 0;  ///< parts written (rank != 0) or steps committed (rank 0)
  std::uint64_t failed = 0;
  std::uint64_t abandoned = 0;  ///< steps rank 0 gave up committing when the world changed (set_world)
  std::optional<std::uint64_t> last_durable_step;
  double stall_seconds = 0;       ///< caller blocked in snapshot() and before_update()
  double last_stall_seconds = 0;  ///< of the newest snapshot
  double last_persist_seconds = 0;
  std::uint64_t bytes_written = 0;
};

class checkpointer {
 public:
  checkpointer(state& st, checkpointer_options opts) : st_(st), opts_(std::move(opts)), events_(resolve_events(opts_)) {
    if (opts_.dir.empty()) throw error(errc::invalid_argument, "checkpointer: no directory given");
    if (opts_.rank < 0) opts_.rank = static_cast<int>(internal::env_index("ELASTIC_RANK").value_or(0));
    if (opts_.world_size < 0) opts_.world_size = static_cast<int>(internal::env_index("ELASTIC_WORLD_SIZE").value_or(1));
    if (opts_.run_id.empty()) opts_.run_id = internal::env_string("ELASTIC_RUN_ID").value_or("");
    if (opts_.world_size < 1 || opts_.rank >= opts_.world_size) {
      throw error(errc::invalid_argument, "checkpointer: rank " + std::to_string(opts_.rank) + " of world size " +
                                              std::to_string(opts_.world_size) + " is impossible");
    }
    if (opts_.chunk_bytes == 0) throw error(errc::invalid_argument, "checkpointer: chunk_bytes must be positive");
    store_ = detail::step_store::open(opts_.dir);
    started_ = now_rfc3339();
    // The copier waits on events of this device: it makes the device its own, or its first CUDA
    // call would open a context on GPU 0 (a rank on GPU 3 would hold memory on GPU 0).
    if (st_.has_device_entries()) device_ = internal::cuda::current_device();
    layout_ = lay_out();
    slots_ = make_slots(layout_);
    if (st_.has_device_entries()) side_ = internal::cuda::stream::create();
    copier_ = std::jthread([this] { copy_loop(); });
    persister_ = std::jthread([this] { persist_loop(); });
  }

  checkpointer(const checkpointer&) = delete;
  checkpointer& operator=(const checkpointer&) = delete;

  /// Finishes what was queued (a snapshot taken is a snapshot kept), then stops the threads.
  ~checkpointer() {
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return idle_locked(); });
      stopping_ = true;
    }
    cv_.notify_all();
  }

  [[nodiscard]] int rank() const noexcept { return opts_.rank; }
  [[nodiscard]] int world_size() const noexcept { return opts_.world_size; }
  [[nodiscard]] const checkpointer_options& options() const noexcept { return opts_; }
  [[nodiscard]] const event_log& events() const noexcept { return events_; }
  [[nodiscard]] std::size_t staging_slots() const noexcept { return slots_.size(); }
  /// Bytes of one staging slot: one copy of the registered buffers and values.
  [[nodiscard]] std::size_t staging_bytes() const noexcept { return layout_.bytes; }

  /// Loads the newest valid step into the state; returns its manifest, or nothing for a fresh
  /// start (no step, or none usable). Call before training (no snapshot in flight). Steps it
  /// had to skip as damaged are moved aside by rank 0 (storage::quarantine_step), and the step
  /// it loads is never deleted by this checkpointer's retention.
  std::optional<format::step_manifest> restore() {
    wait_durable_quiet();
    const auto t0 = std::chrono::steady_clock::now();
    // Idle, so a snapshot slot is free to serve as the restore's staging.
    std::span<std::byte> scratch;
    if (!slots_.empty()) scratch = {slots_.front()->memory.data(), slots_.front()->memory.size()};
    std::vector<storage::skipped_step> skipped;
    auto m = store_.restore_newest(st_, opts_.rank, events_, scratch, &skipped);
    if (opts_.rank == 0) {
      // Left in place, a damaged step would shadow the steps this run commits (retention would
      // count it; a restart would try it first). Every rank of a group may race us here.
      for (const auto& s : skipped) {
        if (!storage::is_damage(s.why)) continue;
        try {
          store_.quarantine_step(s.step, s.why.what(), events_);
        } catch (const error& e) {
          events_.emit("checkpoint_quarantine_failed", {{"step", s.step}, {"reason", e.what()}});
        }
      }
    }
    if (m) {
      {
        std::lock_guard lk(mu_);
        resumed_from_ = m->step;
      }
      const double s = seconds_since(t0);
      events_.emit("checkpoint_restore", {{"step", m->step},
                                          {"dir", store_.step_location(m->step)},
                                          {"world_size_then", m->world_size},
                                          {"world_size_now", opts_.world_size},
                                          {"seconds", s}});
    }
    return m;
  }

  /// Loads committed step `step` into the state as rank `rank` of any world (an elastic
  /// group's restore after a rebuild); storage::load_step_at's contract.
  format::step_manifest load_step(std::uint64_t step, int rank) { return store_.load_step(step, st_, rank); }
  /// Loads the newest valid step as rank `rank`, skipping damaged ones (with an event); nothing
  /// when there is none.
  std::optional<format::step_manifest> load_newest(int rank) { return store_.restore_newest(st_, rank, events_); }
  /// Whether the steps are in object storage (s3://, gs://) rather than a POSIX directory.
  [[nodiscard]] bool in_object_storage() const noexcept { return store_.in_object_storage(); }

  /// Captures the state as of now under `step` and returns; the copy and the write go on in
  /// the background. `stream` is the stream whose queued work must land in the snapshot.
  /// Throws errc::mismatch when an entry changed size since the staging was laid out (a
  /// state::repartition() not yet followed by set_world()).
  void snapshot(std::uint64_t step, std::map<std::string, std::string> metadata = {}, stream_handle stream = nullptr) {
    const auto t0 = std::chrono::steady_clock::now();
    check_staging();
    std::unique_lock lk(mu_);
    // Backpressure: with every slot still being written, wait (the stall is counted).
    slot* s = nullptr;
    cv_.wait(lk, [&] { return (s = free_slot_locked()) != nullptr; });
    fill(*s, lk, t0, step, std::move(metadata), stream);
  }

  /// snapshot(), unless every staging slot is still being written: then nothing happens and it
  /// returns false at once (persistence is behind; a caller that can wait a step tries again).
  bool try_snapshot(std::uint64_t step, std::map<std::string, std::string> metadata = {},
                    stream_handle stream = nullptr) {
    const auto t0 = std::chrono::steady_clock::now();
    check_staging();
    std::unique_lock lk(mu_);
    slot* s = free_slot_locked();
    if (s == nullptr) return false;
    fill(*s, lk, t0, step, std::move(metadata), stream);
    return true;
  }

  /// The fence before the optimizer overwrites the state: host buffers of the newest snapshot
  /// must be copied (a host wait), device buffers are waited for on `stream` (no host wait).
  void before_update(stream_handle stream = nullptr) {
    std::unique_lock lk(mu_);
    slot* s = fence_slot_;
    if (!s) return;
    if (s->has_device_copies && !s->device_fenced) {
      s->copied.make_wait(stream);
      s->device_fenced = true;
    }
    if (s->phase == slot_phase::copying && s->has_host_copies) {
      const auto t0 = std::chrono::steady_clock::now();
      cv_.wait(lk, [&] { return s->phase != slot_phase::copying; });
      const double stall = seconds_since(t0);
      stats_.stall_seconds += stall;
      stats_.last_stall_seconds += stall;
    }
    if (!s->has_device_copies || s->device_fenced) fence_slot_ = nullptr;
  }

  /// Waits until no snapshot's staging copy still reads the state (its writes may go on) and no
  /// on_copied hook still runs: an elastic group calls it before it moves or resizes slices of
  /// the state (repartition), and looks at the images the hook kept.
  void wait_copied() {
    std::unique_lock lk(mu_);
    cv_.wait(lk, [&] {
      return std::none_of(slots_.begin(), slots_.end(), [](const auto& s) {
        return s->phase == slot_phase::filling || s->phase == slot_phase::copying || s->hooked;
      });
    });
  }

  /// Blocks until every snapshot taken so far is durable, failed or abandoned (set_world), then
  /// throws the error of the newest snapshot if that one failed (an elastic::error), for as long
  /// as it stays the newest. An older failure that a later snapshot's commit superseded is not
  /// thrown: its checkpoint_failed event told of it, and the newest state is saved. An abandoned
  /// step is no failure: it is never thrown.
  void wait_durable() {
    std::unique_lock lk(mu_);
    cv_.wait(lk, [&] { return durable_locked(); });
    if (newest_failure_) std::rethrow_exception(newest_failure_);
  }

  /// Like wait_durable() but up to `timeout`; false if still writing.
  bool wait_durable_for(std::chrono::milliseconds timeout) {
    std::unique_lock lk(mu_);
    if (!cv_.wait_for(lk, timeout, [&] { return durable_locked(); })) return false;
    if (newest_failure_) std::rethrow_exception(newest_failure_);
    return true;
  }

  /// Makes later snapshots parts of rank `rank` of a world of `world` (an elastic group after a
  /// rebuild). Call it at a safe point, with no snapshot() running, after state::repartition()
  /// (the old world's snapshots must be past before_update(): their copies read the old slices).
  ///
  /// The old world's snapshots finish copying and their parts are written; rank 0 of the old
  /// world waits for no other rank: a step still missing a part is abandoned at once (left
  /// uncommitted, its pending directory for the next retention sweep; event
  /// checkpoint_abandoned, reason "the group changed"; never thrown by wait_durable()). Returns
  /// once nothing of the old world is in flight, so never later than the local copies and
  /// writes take. When an entry's size changed, the staging is laid out and allocated again.
  ///
  /// Throws errc::invalid_argument (no such rank) or errc::capacity_exhausted (the new layout
  /// does not fit staging_budget) with nothing changed. When the new staging cannot be
  /// allocated (the old one is freed first), the old layout is allocated again, rank and world
  /// stay, and snapshots of the resized state throw errc::mismatch until a set_world() succeeds.
  ///
  /// `epoch` names this incarnation of the world (an elastic group's round, the same on every
  /// rank): parts carry it, and rank 0 commits a step only from parts of its own epoch, so a
  /// part an earlier world left for a step written again (after the group went back to an older
  /// step) is never taken for the new one. 0: no epoch (only the world size is checked).
  void set_world(int rank, int world, std::uint64_t epoch = 0);

  /// Calls `f` on the copier thread each time a snapshot's staging copy is complete, while the
  /// write goes on (before_update() does not wait for it; the slot is not reused until it
  /// returns); `f` must not keep the spans. An exception from it becomes an event
  /// (checkpoint_copy_hook_failed); the snapshot is written all the same. Set it before the
  /// first snapshot.
  void on_copied(std::function<void(const staged_snapshot&)> f) {
    std::lock_guard lk(mu_);
    on_copied_ = std::move(f);
  }

  [[nodiscard]] checkpointer_stats stats() const {
    std::lock_guard lk(mu_);
    return stats_;
  }

 private:
  // released: written (or failed) while the copy hook still reads the staging; free once it is done.
  enum class slot_phase { free, filling, copying, persisting, released };

  struct slot {
    detail::host_memory memory;
    std::vector<std::vector<std::byte>> objects;
    std::vector<staged_entry> staged;
    // What the writer and the copier need, taken at snapshot time: neither reads the state's
    // entries, which state::repartition() may change while this slot is being written.
    std::vector<entry> records;  // each entry's description (no memory, no callbacks)
    struct host_copy {
      std::byte* to;
      const void* from;
      std::size_t bytes;
    };
    std::vector<host_copy> host_copies;  // the copier's work: host buffers into staging
    std::map<std::string, std::string> metadata;
    std::uint64_t step = 0;
    std::uint64_t sequence = 0;
    slot_phase phase = slot_phase::free;
    bool copy_started = false;
    bool persist_started = false;
    bool has_host_copies = false;
    bool has_device_copies = false;
    bool device_fenced = false;
    bool hooked = false;  // on_copied runs on the copier thread, reading the staging
    internal::cuda::event ready, copied;
  };

  static event_log resolve_events(const checkpointer_options& o) { return o.events ? *o.events : event_log::from_env(); }

  static double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  /// Where each entry's copy sits in a slot, and how many slots the budget allows.
  struct staging_layout {
    std::vector<std::size_t> sizes;    // each entry's bytes when laid out (objects: 0)
    std::vector<std::size_t> offsets;  // into a slot's memory
    std::size_t bytes = 0;             // of one slot
    std::size_t slots = 0;
  };

  // The definitions of these are in detail/checkpointer_workers.hpp.
  /// The layout of the state as it is now: two slots when the budget allows, else one; throws
  /// errc::capacity_exhausted when not even one fits.
  staging_layout lay_out() const;
  std::vector<std::unique_ptr<slot>> make_slots(const staging_layout& layout) const;
  /// Throws unless the staging fits the state as it is now (caller's thread, like set_world).
  void check_staging() const;

  // Stages the state into slot `s` (free, found under `lk`) and hands it to the writer.
  void fill(slot& s, std::unique_lock<std::mutex>& lk, std::chrono::steady_clock::time_point t0, std::uint64_t step,
            std::map<std::string, std::string> metadata, stream_handle stream);

  slot* free_slot_locked() {
    if (changing_world_) return nullptr;  // set_world is replacing the staging
    for (auto& s : slots_)
      if (s->phase == slot_phase::free) return s.get();
    return nullptr;
  }
  /// Every snapshot taken is durable (or failed).
  bool durable_locked() const {
    for (const auto& s : slots_)
      if (s->phase != slot_phase::free) return false;
    return true;
  }
  /// ...and the persister is not deleting old steps either.
  bool idle_locked() const { return durable_locked() && !retaining_; }
  void wait_durable_quiet() {
    std::unique_lock lk(mu_);
    cv_.wait(lk, [&] { return idle_locked(); });
  }

  /// The copier thread: copies each filled slot's buffers into staging, in order.
  void copy_loop();
  /// The persister thread: writes, commits and retires each copied slot, in order.
  void persist_loop();

  slot* oldest_persisting_locked() {
    slot* best = nullptr;
    for (auto& s : slots_)
      if (s->phase == slot_phase::persisting && !s->persist_started && (!best || s->sequence < best->sequence)) best = s.get();
    return best;
  }

  void fail_locked(slot& s, std::exception_ptr e) {
    ++stats_.failed;
    std::string what = "unknown error";
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      what = x.what();
    } catch (...) {
    }
    events_.emit("checkpoint_failed", {{"step", s.step}, {"reason", what}});
    settle_locked(s, e);
    release_locked(s);
  }

  /// Records how snapshot `s` ended, if it is the newest to have ended: wait_durable() reports
  /// the newest outcome only. (Copies and writes finish in order, but a copy may fail while an
  /// older snapshot is still being written.)
  void settle_locked(const slot& s, std::exception_ptr e) {
    if (s.sequence < settled_sequence_) return;
    settled_sequence_ = s.sequence;
    newest_failure_ = std::move(e);
  }

  void release_locked(slot& s) {
    if (s.hooked) {  // the copy hook still reads the staging: it frees the slot when done
      s.phase = slot_phase::released;
      cv_.notify_all();
      return;
    }
    s.phase = slot_phase::free;
    s.copy_started = false;
    s.persist_started = false;
    s.device_fenced = false;
    if (fence_slot_ == &s) fence_slot_ = nullptr;
    cv_.notify_all();
  }

  static std::string now_rfc3339() { return internal::rfc3339_now(); }

  state& st_;
  checkpointer_options opts_;
  event_log events_;
  staging_layout layout_;  // changed by set_world only, with every slot free
  std::vector<std::unique_ptr<slot>> slots_;
  internal::cuda::stream side_;
  int device_ = 0;  // the device of the device entries, made current on the copier thread
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  bool retaining_ = false;  // the persister is deleting old steps (after a commit)
  bool changing_world_ = false;       // set_world: no slot is handed out
  std::atomic<bool> abandon_{false};  // set_world: rank 0 stops waiting for the old world's parts
  std::uint64_t sequence_ = 0;
  std::uint64_t epoch_ = 0;  // set_world's, for the parts and commits (changed with every slot free)
  slot* fence_slot_ = nullptr;
  checkpointer_stats stats_;
  detail::step_store store_;  // a POSIX directory (every write through a private_dir) or object storage
  std::string started_;      // RFC 3339: a step committed before it is an earlier incarnation's
  std::optional<std::uint64_t> resumed_from_;  // the step restore() loaded
  std::uint64_t committed_max_ = 0;            // the newest step this checkpointer committed
  std::uint64_t settled_sequence_ = 0;         // the newest snapshot that has ended, and
  std::exception_ptr newest_failure_;          // its error if it failed
  std::function<void(const staged_snapshot&)> on_copied_;  // set before the first snapshot
  std::jthread copier_, persister_;  // last: they stop before the members they use go away
};

}  // namespace elastic::inline v1::checkpoint

// The out-of-class definitions of the staging and the background threads.
#include <elastic/checkpoint/detail/checkpointer_workers.hpp>
