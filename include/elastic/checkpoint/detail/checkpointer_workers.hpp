// The checkpointer's staging and its two background threads, defined out of the class
// (checkpointer.hpp holds the engine's interface and its invariants): allocate_slots sizes the
// staging once; fill stages a snapshot; copy_loop copies buffers into staging (memcpy, or
// cudaMemcpyAsync on the side stream); persist_loop writes, commits and retires steps in order.
#pragma once

#include <elastic/checkpoint/checkpointer.hpp>

namespace elastic::inline v1::checkpoint {

inline void checkpointer::allocate_slots() {
  std::size_t fixed = 0;
  offsets_.clear();
  for (const auto& e : st_.entries()) {
    offsets_.push_back(fixed);
    if (e.kind != entry_kind::object) fixed += (e.bytes + 63) / 64 * 64;  // cache-line aligned copies
  }
  std::size_t budget = opts_.staging_budget;
  if (budget == 0) {
    const auto ram = static_cast<std::size_t>(::sysconf(_SC_PHYS_PAGES)) * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    budget = std::min(2 * fixed, std::max(fixed, ram / 2));
  }
  if (fixed > budget) {
    throw error(errc::capacity_exhausted,
                fmt::format("checkpoint staging needs {} bytes for one snapshot of the registered state but the "
                            "budget is {} bytes: raise staging_budget, or register less state",
                            fixed, budget));
  }
  const std::size_t n = fixed == 0 ? 2 : std::min<std::size_t>(2, budget / fixed);
  const bool pinned = st_.has_device_entries();
  for (std::size_t i = 0; i < n; ++i) {
    auto& s = slots_.emplace_back(std::make_unique<slot>());
    s->memory = detail::host_memory(fixed, pinned);
    if (st_.has_device_entries()) {
      s->ready = internal::cuda::event::create();
      s->copied = internal::cuda::event::create();
    }
  }
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
  s.has_host_copies = false;
  s.has_device_copies = false;
  const auto& entries = st_.entries();
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const entry& e = entries[i];
    if (e.kind == entry_kind::object) {
      auto& bytes = s.objects.emplace_back();
      e.save(bytes);
      s.staged.push_back({&e, std::span<const std::byte>(bytes)});
      continue;
    }
    std::byte* dst = s.memory.data() + offsets_[i];
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
      s.has_host_copies = true;
    }
    s.staged.push_back({&e, std::span<const std::byte>(dst, e.bytes)});
  }
  if (s.has_device_copies) s.copied.record(side_.get());

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
      const auto& entries = st_.entries();
      for (std::size_t i = 0; i < entries.size(); ++i) {
        const entry& e = entries[i];
        if (e.kind == entry_kind::buffer && e.where == location::host && e.bytes) {
          std::memcpy(s->memory.data() + offsets_[i], e.data, e.bytes);
        }
      }
      if (s->has_device_copies) s->copied.synchronize();
    } catch (...) {
      // A failed device copy: the snapshot is lost, training is not.
      auto failure = detail::as_library_error(std::current_exception(), fmt::format("checkpoint step {}: staging copy", s->step));
      lk.lock();
      fail_locked(*s, failure);
      continue;
    }
    lk.lock();
    s->phase = slot_phase::persisting;
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
    try {
      bytes = storage::write_rank_part(dir_, s->step, opts_.rank, opts_.world_size, opts_.run_id, s->staged,
                                       opts_.chunk_bytes);
      if (opts_.rank == 0) {
        format::step_manifest m;
        m.step = s->step;
        m.world_size = opts_.world_size;
        m.run_id = opts_.run_id;
        m.time = now_rfc3339();
        m.metadata = s->metadata;
        storage::commit_step(dir_, m, opts_.commit_timeout, events_);
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
    ++stats_.committed;
    stats_.last_durable_step = s->step;
    committed_max_ = std::max(committed_max_, s->step);
    settle_locked(*s, nullptr);
    stats_.last_persist_seconds = secs;
    stats_.bytes_written += bytes;
    events_.emit(opts_.rank == 0 ? "checkpoint_commit" : "checkpoint_part",
                 {{"step", s->step},
                  {"dir", (opts_.dir / format::step_dir_name(s->step)).string()},
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
        storage::retain(dir_, opts_.keep_last, floor, events_);
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
