// The checkpointer's staging and its two background threads, defined out of the class
// (checkpointer.hpp holds the engine's interface and its invariants): lay_out and make_slots size
// the staging; fill stages a snapshot; copy_loop copies buffers into staging (memcpy, or
// cudaMemcpyAsync on the side stream); persist_loop writes, commits and retires steps in order;
// set_world drains the old world and lays the staging out again for the new one.
#pragma once

#include <elastic/checkpoint/checkpointer.hpp>

namespace elastic::inline v1::checkpoint {

namespace detail {
/// Bytes entry `e` takes in staging (objects are serialized apart).
inline std::size_t staged_bytes(const entry& e) noexcept { return e.kind == entry_kind::object ? 0 : e.bytes; }
}  // namespace detail

inline checkpointer::staging_layout checkpointer::lay_out() const {
  staging_layout l;
  for (const auto& e : st_.entries()) {
    const std::size_t bytes = detail::staged_bytes(e);
    l.sizes.push_back(bytes);
    l.offsets.push_back(l.bytes);
    l.bytes += (bytes + 63) / 64 * 64;  // cache-line aligned copies
  }
  std::size_t budget = opts_.staging_budget;
  if (budget == 0) {
    const auto ram = static_cast<std::size_t>(::sysconf(_SC_PHYS_PAGES)) * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    budget = std::min(2 * l.bytes, std::max(l.bytes, ram / 2));
  }
  if (l.bytes > budget) {
    throw error(errc::capacity_exhausted,
                fmt::format("checkpoint staging needs {} bytes for one snapshot of the registered state but the "
                            "budget is {} bytes: raise staging_budget, or register less state",
                            l.bytes, budget));
  }
  l.slots = l.bytes == 0 ? 2 : std::min<std::size_t>(2, budget / l.bytes);
  return l;
}

inline std::vector<std::unique_ptr<checkpointer::slot>> checkpointer::make_slots(const staging_layout& layout) const {
  std::vector<std::unique_ptr<slot>> slots;
  const bool device = st_.has_device_entries();
  for (std::size_t i = 0; i < layout.slots; ++i) {
    auto& s = slots.emplace_back(std::make_unique<slot>());
    s->memory = detail::host_memory(layout.bytes, device);  // pinned for device copies
    if (device) {
      s->ready = internal::cuda::event::create();
      s->copied = internal::cuda::event::create();
    }
  }
  return slots;
}

inline void checkpointer::check_staging() const {
  if (slots_.empty()) {
    throw error(errc::capacity_exhausted, "checkpoint staging could not be allocated again after set_world failed: "
                                          "call set_world again once memory is free");
  }
  const auto& entries = st_.entries();
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const std::size_t bytes = detail::staged_bytes(entries[i]);
    if (i >= layout_.sizes.size() || bytes != layout_.sizes[i]) {
      throw error(errc::mismatch,
                  fmt::format("checkpoint entry '{}' is {} bytes, but the staging was laid out for {}: after "
                              "state::repartition() or adding entries, call set_world(rank, world) before a snapshot",
                              entries[i].name, bytes, i < layout_.sizes.size() ? layout_.sizes[i] : 0));
    }
  }
}

inline void checkpointer::set_world(int rank, int world, std::uint64_t epoch) {
  if (world < 1 || rank < 0 || rank >= world) {
    throw error(errc::invalid_argument,
                fmt::format("checkpointer::set_world: rank {} of world size {} is impossible", rank, world));
  }
  staging_layout next;
  try {
    next = lay_out();  // a layout that does not fit is refused before anything changes
  } catch (...) {
    std::rethrow_exception(detail::as_library_error(std::current_exception(), "checkpointer::set_world"));
  }
  // Slots of the old layout serve as long as every entry still sits where it did.
  const bool relayout = next.offsets != layout_.offsets || next.bytes != layout_.bytes || slots_.empty();
  std::vector<std::unique_ptr<slot>> old;
  {
    std::unique_lock lk(mu_);
    changing_world_ = true;                           // no snapshot starts meanwhile
    abandon_.store(true, std::memory_order_release);  // rank 0 stops waiting for the old world
    cv_.wait(lk, [&] { return idle_locked(); });
    // Every slot is free: neither thread holds one, and none is handed out until we are done.
    fence_slot_ = nullptr;
    if (relayout) old = std::exchange(slots_, {});
  }
  std::exception_ptr failure;
  std::vector<std::unique_ptr<slot>> fresh;
  if (relayout) {
    old.clear();  // the old staging goes first: the new one may need the memory
    try {
      fresh = make_slots(next);
    } catch (...) {
      failure = detail::as_library_error(std::current_exception(), "checkpointer::set_world: new staging");
      try {
        fresh = make_slots(layout_);  // the size just freed; still, snapshots check (check_staging)
      } catch (...) {
      }
    }
  }
  {
    std::lock_guard lk(mu_);
    if (relayout) slots_ = std::move(fresh);
    if (!failure) {
      layout_ = std::move(next);
      opts_.rank = rank;
      opts_.world_size = world;
      epoch_ = epoch;
    }
    abandon_.store(false, std::memory_order_release);
    changing_world_ = false;
  }
  cv_.notify_all();
  if (failure) std::rethrow_exception(failure);
}

inline void checkpointer::fill(slot& s, std::unique_lock<std::mutex>& lk, std::chrono::steady_clock::time_point t0, std::uint64_t step,
                                     std::map<std::string, std::string> metadata, stream_handle stream) {
  s.phase = slot_phase::filling;  // ours while we fill it unlocked
  lk.unlock();

  s.step = step;
  s.metadata = std::move(metadata);
  s.staged.clear();
  s.objects.clear();
  s.objects.reserve(st_.entries().size());
  s.host_copies.clear();
  s.has_host_copies = false;
  s.has_device_copies = false;
  const auto& entries = st_.entries();
  s.records.resize(entries.size());  // before staged points into it
  // A hook that throws (an object's save, a check of the user's) must not leave the slot taken
  // forever: every later snapshot and the destructor would wait for it. Objects are serialized
  // first, before any copy is queued into the slot's memory, so that a throw there has nothing in
  // flight; a CUDA error later waits for what was queued. The slot is then free again.
  try {
    for (const auto& e : entries) {
      if (e.kind == entry_kind::object) e.save(s.objects.emplace_back());
    }
  } catch (...) {
    lk.lock();
    s.phase = slot_phase::free;
    cv_.notify_all();
    throw;
  }
  try {
    std::size_t object = 0;
    for (std::size_t i = 0; i < entries.size(); ++i) {
      const entry& e = entries[i];
      entry& r = s.records[i];  // assigned field by field: capacity is reused, callbacks are not copied
      r.name = e.name;
      r.kind = e.kind;
      r.type = e.type;
      r.shape = e.shape;
      r.element_bytes = e.element_bytes;
      r.where = e.where;
      r.bytes = e.bytes;
      r.shard = e.shard;
      r.part_rank = e.part_rank;
      r.part_world = e.part_world;
      if (e.kind == entry_kind::object) {
        s.staged.push_back({&r, std::span<const std::byte>(s.objects[object++])});
        continue;
      }
      std::byte* dst = s.memory.data() + layout_.offsets[i];
      if (e.kind == entry_kind::value) {
        std::memcpy(dst, e.data, e.bytes);
      } else if (e.where == location::device) {
        if (!s.has_device_copies) {
          // The copies start once everything queued on the user's stream before now is done.
          s.ready.record(stream);
          s.ready.make_wait(side_.get());
        }
        internal::cuda::copy_to_host_async(dst, e.data, e.bytes, side_.get());
        s.has_device_copies = true;
      } else {
        if (e.bytes) s.host_copies.push_back({dst, e.data, e.bytes});
        s.has_host_copies = true;
      }
      s.staged.push_back({&r, std::span<const std::byte>(dst, e.bytes)});
    }
    if (s.has_device_copies) s.copied.record(side_.get());
  } catch (...) {
    if (s.has_device_copies) {
      try {
        s.copied.record(side_.get());
        s.copied.synchronize();
      } catch (...) {  // the device failed: nothing more of it can be waited for
      }
    }
    lk.lock();
    s.phase = slot_phase::free;
    cv_.notify_all();
    throw;
  }

  lk.lock();
  s.phase = slot_phase::copying;
  s.sequence = ++sequence_;
  fence_slot_ = &s;
  ++stats_.snapshots;
  const double stall = seconds_since(t0);
  stats_.stall_seconds += stall;
  stats_.last_stall_seconds = stall;
  lk.unlock();
  cv_.notify_all();
}

inline void checkpointer::copy_loop() {
  if (st_.has_device_entries()) internal::cuda::adopt_device(device_);
  std::unique_lock lk(mu_);
  for (;;) {
    slot* s = nullptr;
    cv_.wait(lk, [&] {
      for (auto& c : slots_)
        if (c->phase == slot_phase::copying && !c->copy_started && (!s || c->sequence < s->sequence)) s = c.get();
      return s != nullptr || stopping_;
    });
    if (!s) return;
    s->copy_started = true;
    lk.unlock();
    try {
      for (const auto& c : s->host_copies) std::memcpy(c.to, c.from, c.bytes);
      if (s->has_device_copies) s->copied.synchronize();
    } catch (...) {
      // A failed device copy: the snapshot is lost, training is not.
      auto failure = detail::as_library_error(std::current_exception(), fmt::format("checkpoint step {}: staging copy", s->step));
      lk.lock();
      fail_locked(*s, failure);
      continue;
    }
    lk.lock();
    s->phase = slot_phase::persisting;  // before_update() may go on: the state is copied
    s->hooked = static_cast<bool>(on_copied_);
    cv_.notify_all();
    if (!s->hooked) continue;
    // The staging holds the snapshot until the slot is free again, which waits for the hook: a
    // copy of it may be taken (peer replicas) while it is written, off the training thread.
    lk.unlock();
    try {
      on_copied_(staged_snapshot{s->step, s->staged});
    } catch (const std::exception& e) {
      events_.emit("checkpoint_copy_hook_failed", {{"step", s->step}, {"reason", e.what()}});
    } catch (...) {
      events_.emit("checkpoint_copy_hook_failed", {{"step", s->step}, {"reason", "unknown error"}});
    }
    lk.lock();
    s->hooked = false;
    if (s->phase == slot_phase::released) release_locked(*s);
    cv_.notify_all();
  }
}

inline void checkpointer::persist_loop() {
  std::unique_lock lk(mu_);
  for (;;) {
    slot* s = nullptr;
    cv_.wait(lk, [&] { return (s = oldest_persisting_locked()) != nullptr || (stopping_ && idle_locked()); });
    if (!s) return;
    s->persist_started = true;
    lk.unlock();
    const auto t0 = std::chrono::steady_clock::now();
    std::uint64_t bytes = 0;
    std::exception_ptr failure;
    bool abandoned = false;
    try {
      bytes = store_.write_rank_part(s->step, opts_.rank, opts_.world_size, opts_.run_id, s->staged,
                                       opts_.chunk_bytes, epoch_);
      if (opts_.rank == 0) {
        format::step_manifest m;
        m.step = s->step;
        m.world_size = opts_.world_size;
        m.run_id = opts_.run_id;
        m.time = now_rfc3339();
        m.metadata = s->metadata;
        abandoned = !store_.commit_step(m, opts_.commit_timeout, events_, &abandon_, epoch_, started_);
      }
    } catch (...) {
      failure = detail::as_library_error(std::current_exception(), fmt::format("checkpoint step {}", s->step));
    }
    const double secs = seconds_since(t0);
    lk.lock();
    if (failure) {
      fail_locked(*s, failure);
      continue;
    }
    if (abandoned) {
      // Not a failure: the old world's step simply will not be complete. The settled outcome
      // stays as it was, so wait_durable() throws nothing new for it.
      ++stats_.abandoned;
      events_.emit("checkpoint_abandoned", {{"step", s->step}, {"reason", "the group changed"}});
      release_locked(*s);
      continue;
    }
    ++stats_.committed;
    stats_.last_durable_step = s->step;
    committed_max_ = std::max(committed_max_, s->step);
    settle_locked(*s, nullptr);
    stats_.last_persist_seconds = secs;
    stats_.bytes_written += bytes;
    events_.emit(opts_.rank == 0 ? "checkpoint_commit" : "checkpoint_part",
                 {{"step", s->step},
                  {"dir", store_.step_location(s->step)},
                  {"bytes", bytes},
                  {"persist_s", secs},
                  {"write_mb_s", secs > 0 ? static_cast<double>(bytes) / secs / 1e6 : 0.0}});
    release_locked(*s);
    if (opts_.rank == 0) {
      // Housekeeping after the step is durable, so waiters do not wait for old steps to go.
      retaining_ = true;
      // Never below what this run resumed from or committed: whatever else the directory holds.
      std::optional<std::uint64_t> floor = resumed_from_;
      if (!floor || *floor < committed_max_) floor = committed_max_;
      lk.unlock();
      try {
        store_.retain(opts_.keep_last, floor, events_);
      } catch (const std::exception& e) {
        events_.emit("checkpoint_retention_failed", {{"reason", e.what()}});
      } catch (...) {
        events_.emit("checkpoint_retention_failed", {{"reason", "unexpected failure"}});
      }
      lk.lock();
      retaining_ = false;
      cv_.notify_all();
    }
  }
}

}  // namespace elastic::inline v1::checkpoint
