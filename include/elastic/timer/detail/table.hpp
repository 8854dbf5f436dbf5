// Layout of the watchdog's shared-memory table, and the protocol by which workers write it and
// the watchdog reads it. Every process that maps the segment relies on what is written here.
//
//   [segment_header][slot 0][slot 1]...[slot N-1]
//   slot = [slot_header][scope_entry 0]...[scope_entry K-1]
//
// Who writes what:
//   - segment_header: the watchdog, except `slots_high_water`, `table_full` (workers, atomic RMW)
//     and `doorbell` (workers ring it).
//   - slot_header.owner: claimed by a worker thread with a CAS from 0; released by that thread,
//     or by the watchdog once the owning process is gone.
//   - everything else in a slot: only the owning thread, while it owns the slot.
// The watchdog never writes a slot it does not reclaim, so a worker's hot path never contends.
//
// Torn reads: an entry is live while its `generation` is non-zero. A worker writes the fields of
// a free entry (generation 0) and then publishes a generation no other push of this slot has
// used; it clears the generation to pop. The watchdog reads generation, fields, generation again
// (with the fences of a sequence lock) and trusts the fields only if both reads match. A scope's
// deadline may also change while live (extend()); it is one atomic word, so either value is
// consistent with the rest of the entry.
//
// Warnings: an entry whose `warn_lead_ms` is non-zero asks the watchdog to warn (an event, no
// signal) once its deadline is that close, and to kill only at the deadline itself: the two
// expiries of an automatic step deadline (a heuristic warns before it kills). The lead is
// relative to the deadline, so extend() moves the warning with it. The field was `reserved`
// (always 0) before warnings existed: older writers never ask for one and older watchdogs
// ignore it, so the layout version did not change.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace elastic::inline v1::timer::detail {

/// "ELWDOG01" read as a little-endian integer: the first 8 bytes of every segment.
inline constexpr std::uint64_t segment_magic = 0x3130474F'44574C45ULL;
/// Bumped on any change to the structs below. Offsets 0 (magic) and 8 (layout_version) never
/// move, so every version can read another's version number and refuse it clearly.
inline constexpr std::uint32_t layout_version = 1;

inline constexpr std::uint32_t default_slot_count = 4096;
inline constexpr std::uint32_t scopes_per_slot = 32;
inline constexpr std::size_t scope_name_bytes = 32;  ///< 31 characters and a NUL

static_assert(std::atomic<std::uint64_t>::is_always_lock_free);
static_assert(std::atomic<std::int64_t>::is_always_lock_free);
static_assert(std::atomic<std::uint32_t>::is_always_lock_free);
static_assert(sizeof(std::atomic<std::uint64_t>) == 8 && sizeof(std::atomic<std::int32_t>) == 4,
              "atomics must have the size of their values to be shared between processes");

/// One timer scope: a deadline with a name and a signal.
struct alignas(64) scope_entry {
  std::atomic<std::uint64_t> generation;  ///< 0: free; otherwise unique within the slot
  std::atomic<std::int64_t> deadline_ns;  ///< CLOCK_MONOTONIC
  std::atomic<std::int64_t> entered_ns;   ///< CLOCK_MONOTONIC when the scope began
  std::atomic<std::int32_t> signal;       ///< 0: the watchdog's default
  std::atomic<std::uint32_t> warn_lead_ms;  ///< warn this long before the deadline; 0: no warning
  std::atomic<std::uint64_t> name[scope_name_bytes / 8];  ///< NUL-padded, truncated
};
static_assert(sizeof(scope_entry) == 64);

/// Per-thread bookkeeping in front of the thread's stack of scopes.
struct alignas(64) slot_header {
  std::atomic<std::uint64_t> owner;       ///< pid of the owning process; 0: free
  std::atomic<std::uint64_t> start_time;  ///< owner's start time (see proc_stat); 0 while claiming
  std::atomic<std::int32_t> tid;          ///< owning thread
  std::atomic<std::int32_t> rank;         ///< ELASTIC_RANK of the owner, -1 unknown
  std::atomic<std::uint32_t> depth;       ///< entries [0, depth) may be live
  std::atomic<std::uint32_t> dropped;     ///< scopes not watched because the stack was full
  std::atomic<std::uint64_t> generation;  ///< next generation base; survives owners
};

struct alignas(64) slot {
  slot_header head;
  scope_entry scopes[scopes_per_slot];
};
static_assert(sizeof(slot) == 64 * (1 + scopes_per_slot));

/// The first bytes of the segment.
struct alignas(64) segment_header {
  std::atomic<std::uint64_t> magic;  ///< written last when the segment is created
  std::uint32_t layout_version;
  std::uint32_t slot_count;
  std::uint32_t scopes_per_slot;
  std::uint32_t slot_bytes;
  std::uint32_t owner_uid;
  std::uint32_t reserved0;
  std::uint64_t total_bytes;
  std::atomic<std::int32_t> watchdog_pid;   ///< the serving watchdog; 0 when none
  std::atomic<std::int32_t> default_signal; ///< what a scope with signal 0 gets
  std::atomic<std::uint64_t> watchdog_start_time;
  std::atomic<std::uint32_t> slots_high_water;  ///< slots at or above this were never claimed
  std::atomic<std::uint32_t> reserved1;
  std::atomic<std::uint64_t> table_full;  ///< scopes not watched because no slot was free

  // Its own cache line: read by workers on every scope entry, written by the watchdog once per
  // scan, so it must not share a line with anything workers write.
  alignas(64) std::atomic<std::int64_t> next_wake_ns;  ///< when the watchdog looks next
  std::atomic<std::uint32_t> doorbell;  ///< futex word: workers bump it to wake the watchdog
};
static_assert(offsetof(segment_header, magic) == 0);
static_assert(offsetof(segment_header, layout_version) == 8);

/// Bytes of a segment with `slot_count` slots.
constexpr std::size_t segment_bytes(std::uint32_t slot_count) noexcept {
  return sizeof(segment_header) + std::size_t{slot_count} * sizeof(slot);
}

// An entry is a seqlock: its fields are written relaxed after a release fence and read relaxed
// before an acquire fence. ThreadSanitizer does not model standalone fences (GCC warns, -Wtsan),
// so under it the fields are stored with release and loaded with acquire instead, and the
// fences go: that orders the same accesses, at a cost only a sanitizer build pays.
#if defined(__SANITIZE_THREAD__)
#define ELASTIC_DETAIL_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define ELASTIC_DETAIL_TSAN 1
#endif
#endif
#ifndef ELASTIC_DETAIL_TSAN
#define ELASTIC_DETAIL_TSAN 0
#endif
inline constexpr std::memory_order field_store = ELASTIC_DETAIL_TSAN ? std::memory_order_release : std::memory_order_relaxed;
inline constexpr std::memory_order field_load = ELASTIC_DETAIL_TSAN ? std::memory_order_acquire : std::memory_order_relaxed;

/// Before a writer's field stores: a reader that sees any of them also sees what came before.
inline void seqlock_write_fence() noexcept {
#if !ELASTIC_DETAIL_TSAN
  std::atomic_thread_fence(std::memory_order_release);
#endif
}
/// After a reader's field loads: the generation it loads next is not read before them.
inline void seqlock_read_fence() noexcept {
#if !ELASTIC_DETAIL_TSAN
  std::atomic_thread_fence(std::memory_order_acquire);
#endif
}

/// Copies `name` into an entry's name words (field stores: the generation publishes them).
inline void store_name(scope_entry& e, std::string_view name) noexcept {
  char buf[scope_name_bytes] = {};
  std::memcpy(buf, name.data(), name.size() < scope_name_bytes - 1 ? name.size() : scope_name_bytes - 1);
  for (std::size_t i = 0; i < scope_name_bytes / 8; ++i) {
    std::uint64_t w;
    std::memcpy(&w, buf + 8 * i, 8);
    e.name[i].store(w, field_store);
  }
}

/// A consistent copy of a live entry, as the watchdog sees it.
struct entry_snapshot {
  std::uint64_t generation = 0;
  std::int64_t deadline_ns = 0;
  std::int64_t entered_ns = 0;
  std::int32_t signal = 0;
  std::uint32_t warn_lead_ms = 0;
  char name[scope_name_bytes] = {};

  /// When the watchdog warns about this scope (CLOCK_MONOTONIC); the deadline when it asks for no
  /// warning or its lead reaches back past its entry.
  [[nodiscard]] std::int64_t warn_ns() const noexcept {
    const std::int64_t at = deadline_ns - static_cast<std::int64_t>(warn_lead_ms) * 1'000'000;
    return warn_lead_ms == 0 || at <= entered_ns ? deadline_ns : at;
  }
};

/// Reads `e` if it is live and not being rewritten. Returns false for a free entry or one that
/// changed during the read (the caller looks again at its next scan).
inline bool read_entry(const scope_entry& e, entry_snapshot& out) noexcept {
  std::uint64_t g = e.generation.load(std::memory_order_acquire);
  if (g == 0) return false;
  out.deadline_ns = e.deadline_ns.load(field_load);
  out.entered_ns = e.entered_ns.load(field_load);
  out.signal = e.signal.load(field_load);
  out.warn_lead_ms = e.warn_lead_ms.load(field_load);
  for (std::size_t i = 0; i < scope_name_bytes / 8; ++i) {
    std::uint64_t w = e.name[i].load(field_load);
    std::memcpy(out.name + 8 * i, &w, 8);
  }
  seqlock_read_fence();
  if (e.generation.load(std::memory_order_relaxed) != g) return false;
  out.name[scope_name_bytes - 1] = '\0';
  out.generation = g;
  return true;
}

/// read_entry, retried a few times when the owner is rewriting the entry right now.
inline bool read_entry_stable(const scope_entry& e, entry_snapshot& out) noexcept {
  for (int attempt = 0; attempt < 4; ++attempt) {
    if (read_entry(e, out)) return true;
    if (e.generation.load(std::memory_order_relaxed) == 0) return false;
  }
  return false;
}

/// A mapped table: the header and its slots. Cheap to copy; owns nothing.
class table_view {
 public:
  table_view() = default;
  explicit table_view(void* base) noexcept : base_(static_cast<std::byte*>(base)) {}

  [[nodiscard]] segment_header& header() const noexcept {
    return *reinterpret_cast<segment_header*>(base_);
  }
  [[nodiscard]] std::uint32_t slot_count() const noexcept { return header().slot_count; }
  [[nodiscard]] slot& at(std::uint32_t i) const noexcept {
    return reinterpret_cast<slot*>(base_ + sizeof(segment_header))[i];
  }
  [[nodiscard]] explicit operator bool() const noexcept { return base_ != nullptr; }

 private:
  std::byte* base_ = nullptr;
};

}  // namespace elastic::inline v1::timer::detail
