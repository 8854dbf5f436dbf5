// A rank's flight recorder: its recent collectives (round, index #k in the round, operation,
// bytes, entered and left times, outcome) in a small shared-memory ring, so that when a group
// hangs someone outside the rank (the launcher on its host, after a kill) can tell which rank
// never entered collective #k. Every rank of a round issues the same collectives in the same
// order, so #k names the same collective everywhere.
//
// Layout (version 1), the object /dev/shm/elastic.flight.<run id>.<pid>, mode 0600:
//   flight_head, then two areas of `capacity` flight_slots: the current round's and the one
//   before (a survivor that rebuilt and trains on would otherwise overwrite the round it waited
//   in before the launcher reads it); slot (index - 1) % capacity of an area holds collective #index.
// One writer (the thread that issues the group's collectives; a group's collectives are
// issued by one thread at a time, or their order would differ between ranks) and any number of
// readers in other processes. Every shared field is a lock-free atomic. A slot is a seqlock, as
// the timer table's entries are (timer/detail/table.hpp, whose fences and field orders it uses:
// TSan builds order the fields instead of fencing): index <- 0, a fence, its fields, index <- #k
// (release); a reader takes a slot only when it reads the same nonzero index before and after
// its fields, so it never mixes two collectives. The cost per collective is two clock reads and a few stores: nothing
// allocates, locks or makes a syscall (benchmarks/flight_bench).
//
// The object outlives a process that is killed (that is the point); the process removes it
// when it ends normally, the launcher when it has read a dead worker's record.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <elastic/error.hpp>
#include <elastic/internal/clock.hpp>
#include <elastic/internal/shm_owner.hpp>
#include <elastic/internal/unique_fd.hpp>
#include <elastic/timer/detail/table.hpp>

namespace elastic::inline v1::comm::detail {

inline constexpr std::uint64_t flight_magic = 0x544847494c464c45ull;  // "ELFLIGHT"
inline constexpr std::uint32_t flight_version = 1;
inline constexpr std::uint32_t flight_capacity = 64;

/// How a recorded collective ended.
enum class flight_outcome : std::uint64_t { inside = 0, done = 1, failed = 2 };

struct flight_head {
  std::atomic<std::uint64_t> magic;  ///< stored last: the rest of the head is then written
  std::uint32_t version;
  std::uint32_t capacity;
  std::int64_t pid;
  std::atomic<std::int64_t> round;  ///< the round of the newest collective (-1: none yet)
  std::atomic<std::int64_t> rank;
  std::atomic<std::int64_t> world;
  std::atomic<std::uint64_t> entered;  ///< index of the newest collective entered in `round`
};

struct flight_slot {
  std::atomic<std::uint64_t> index;  ///< #k in its round; 0 while written
  std::atomic<std::int64_t> round;
  std::atomic<std::int64_t> rank;  ///< this process's rank and world in that round
  std::atomic<std::int64_t> world;
  std::atomic<std::uint64_t> op[2];  ///< the operation's name, up to 16 bytes
  std::atomic<std::uint64_t> bytes;
  std::atomic<std::int64_t> entered_ns;  ///< CLOCK_MONOTONIC, comparable across one host
  std::atomic<std::int64_t> left_ns;     ///< 0 while inside
  std::atomic<std::uint64_t> outcome;
};

static_assert(std::atomic<std::uint64_t>::is_always_lock_free && std::atomic<std::int64_t>::is_always_lock_free,
              "the flight recorder's slots are shared between processes");

inline constexpr std::size_t flight_bytes = sizeof(flight_head) + 2 * flight_capacity * sizeof(flight_slot);

/// The object's name for process `pid` of run `run_id` (no leading slash).
inline std::string flight_name(std::string_view run_id, long pid) {
  return "elastic.flight." + std::string(run_id) + "." + std::to_string(pid);
}

/// The prefix of every flight object of run `run_id`.
inline std::string flight_prefix(std::string_view run_id) { return "elastic.flight." + std::string(run_id) + "."; }

/// A mapping of a flight object, unmapped on destruction.
class flight_mapping {
 public:
  flight_mapping() = default;
  flight_mapping(void* p, std::size_t n) noexcept : p_(p), n_(n) {}
  flight_mapping(flight_mapping&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(o.n_) {}
  flight_mapping& operator=(flight_mapping&& o) noexcept {
    if (this != &o) {
      reset();
      p_ = std::exchange(o.p_, nullptr);
      n_ = o.n_;
    }
    return *this;
  }
  ~flight_mapping() { reset(); }
  [[nodiscard]] flight_head& head() const noexcept { return *static_cast<flight_head*>(p_); }
  /// Collective #index's slot in area 0 or 1.
  [[nodiscard]] flight_slot& slot(unsigned area, std::uint64_t index) const noexcept {
    auto* slots = reinterpret_cast<flight_slot*>(static_cast<std::byte*>(p_) + sizeof(flight_head));
    return slots[area * flight_capacity + (index - 1) % flight_capacity];
  }
  explicit operator bool() const noexcept { return p_ != nullptr; }

 private:
  void reset() noexcept {
    if (p_) ::munmap(p_, n_);
    p_ = nullptr;
  }
  void* p_ = nullptr;
  std::size_t n_ = 0;
};

/// The writing end: one per process that takes part in a group.
class flight_recorder {
 public:
  /// Creates (replacing a stale one of a dead process with this pid) the object of this process
  /// in run `run_id`. Throws elastic::error when shared memory cannot be had.
  explicit flight_recorder(std::string_view run_id) : name_(flight_name(run_id, ::getpid())) {
    const std::string path = "/" + name_;
    ::shm_unlink(path.c_str());  // a pid is reused only after its process is gone
    internal::unique_fd fd(::shm_open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    if (fd.get() < 0) throw os_error("cannot create the flight recorder /dev/shm/" + name_);
    if (::ftruncate(fd.get(), static_cast<off_t>(flight_bytes)) != 0) {
      const int err = errno;
      ::shm_unlink(path.c_str());
      errno = err;
      throw os_error("cannot size the flight recorder /dev/shm/" + name_);
    }
    void* p = ::mmap(nullptr, flight_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::shm_unlink(path.c_str());
      errno = err;
      throw os_error("cannot map the flight recorder /dev/shm/" + name_);
    }
    map_ = flight_mapping(p, flight_bytes);
    auto& h = map_.head();  // fresh: zero-filled by ftruncate
    h.version = flight_version;
    h.capacity = flight_capacity;
    h.pid = ::getpid();
    h.round.store(-1, std::memory_order_relaxed);
    h.rank.store(-1, std::memory_order_relaxed);
    h.world.store(0, std::memory_order_relaxed);
    h.magic.store(flight_magic, std::memory_order_release);
  }
  flight_recorder(const flight_recorder&) = delete;
  flight_recorder& operator=(const flight_recorder&) = delete;
  /// Removes the object: a process that ends normally leaves nothing to read.
  ~flight_recorder() { ::shm_unlink(("/" + name_).c_str()); }

  [[nodiscard]] const std::string& name() const noexcept { return name_; }

  /// A new round: this process is rank `rank` of `world`; its collectives count from #1 again.
  void begin_round(std::int64_t round, int rank, int world) noexcept {
    area_ ^= 1u;  // the round before stays readable in the other area
    for (std::uint64_t k = 1; k <= flight_capacity; ++k) map_.slot(area_, k).index.store(0, std::memory_order_release);
    auto& h = map_.head();
    h.rank.store(rank, std::memory_order_relaxed);
    h.world.store(world, std::memory_order_relaxed);
    h.entered.store(0, std::memory_order_relaxed);
    h.round.store(round, std::memory_order_release);
    next_ = 0;
  }

  /// Collective #k of the round begins at `now_ns` (CLOCK_MONOTONIC): `op` (its first 16 bytes
  /// kept) over `bytes`.
  void enter(std::string_view op, std::uint64_t bytes, std::int64_t now_ns = internal::monotonic_ns()) noexcept {
    const std::uint64_t k = ++next_;
    auto& s = map_.slot(area_, k);
    s.index.store(0, std::memory_order_relaxed);
    timer::detail::seqlock_write_fence();  // the 0 is seen before any field changes
    std::uint64_t name[2] = {0, 0};
    std::memcpy(name, op.data(), std::min(op.size(), sizeof name));
    const auto& h = map_.head();
    s.round.store(h.round.load(std::memory_order_relaxed), timer::detail::field_store);
    s.rank.store(h.rank.load(std::memory_order_relaxed), timer::detail::field_store);
    s.world.store(h.world.load(std::memory_order_relaxed), timer::detail::field_store);
    s.op[0].store(name[0], timer::detail::field_store);
    s.op[1].store(name[1], timer::detail::field_store);
    s.bytes.store(bytes, timer::detail::field_store);
    s.left_ns.store(0, timer::detail::field_store);
    s.outcome.store(static_cast<std::uint64_t>(flight_outcome::inside), timer::detail::field_store);
    s.entered_ns.store(now_ns, timer::detail::field_store);
    s.index.store(k, std::memory_order_release);
    map_.head().entered.store(k, std::memory_order_release);
  }

  /// The collective entered last ends (`ok`: it completed).
  void leave(bool ok, std::int64_t now_ns = internal::monotonic_ns()) noexcept {
    if (next_ == 0) return;
    auto& s = map_.slot(area_, next_);
    s.index.store(0, std::memory_order_relaxed);
    timer::detail::seqlock_write_fence();
    s.left_ns.store(now_ns, timer::detail::field_store);
    s.outcome.store(static_cast<std::uint64_t>(ok ? flight_outcome::done : flight_outcome::failed),
                    timer::detail::field_store);
    s.index.store(next_, std::memory_order_release);
  }

 private:
  std::string name_;
  flight_mapping map_;
  std::uint64_t next_ = 0;
  unsigned area_ = 0;
};

/// One collective as a reader found it.
struct flight_entry {
  std::int64_t round = -1;
  int rank = -1, world = 0;
  std::uint64_t index = 0;
  std::string op;
  std::uint64_t bytes = 0;
  std::int64_t entered_ns = 0, left_ns = 0;
  flight_outcome outcome = flight_outcome::inside;
};

/// A process's record: who it was and its recent collectives, oldest first.
struct flight_log {
  long pid = 0;
  int rank = -1, world = 0;
  std::int64_t round = -1;
  std::vector<flight_entry> entries;
};

/// A rank or world size read from a record, or -1 when no int can hold it (a record is read,
/// never trusted).
inline int record_int(std::int64_t v) noexcept {
  return v >= 0 && v <= std::numeric_limits<int>::max() ? static_cast<int>(v) : -1;
}

/// Reads the flight object `name` (see flight_name); nothing when it does not exist or is not a
/// flight recorder of this version. Anything under the name that is not a regular file of this
/// user (a FIFO, socket, device or link that a local user planted) is refused unread, without
/// blocking: errc::unsafe_path or errc::owner_mismatch, saying what is there. Of the contents
/// only collectives that sit in their own slot, with a rank inside their world, are kept.
inline std::optional<flight_log> read_flight(const std::string& name) {
  constexpr std::string_view remedy = "leave it: no record is read there";
  internal::unique_fd fd = internal::open_shm(name, O_RDONLY);
  if (!fd) {
    if (errno == ENOENT) return std::nullopt;
    if (const auto planted = internal::planted_reason(name); !planted.empty()) throw internal::planted_error(planted, remedy);
    return std::nullopt;
  }
  internal::check_shm_owner(fd.get(), "flight recorder /dev/shm/" + name, remedy, name);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || static_cast<std::size_t>(st.st_size) < flight_bytes) return std::nullopt;
  void* p = ::mmap(nullptr, flight_bytes, PROT_READ, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) return std::nullopt;
  const flight_mapping map(p, flight_bytes);
  const auto& h = map.head();
  if (h.magic.load(std::memory_order_acquire) != flight_magic ||
      h.version != flight_version || h.capacity != flight_capacity) {
    return std::nullopt;
  }
  flight_log out;
  out.pid = static_cast<long>(h.pid);
  out.round = h.round.load(std::memory_order_acquire);
  out.rank = record_int(h.rank.load(std::memory_order_relaxed));
  out.world = std::max(0, record_int(h.world.load(std::memory_order_relaxed)));
  for (std::uint32_t i = 0; i < 2 * flight_capacity; ++i) {
    const auto& s = map.slot(i / flight_capacity, i % flight_capacity + 1);
    const std::uint64_t k = s.index.load(std::memory_order_acquire);
    if (k == 0 || (k - 1) % flight_capacity != i % flight_capacity) continue;  // not where #k is written
    flight_entry e;
    e.index = k;
    e.round = s.round.load(timer::detail::field_load);
    e.rank = record_int(s.rank.load(timer::detail::field_load));
    e.world = record_int(s.world.load(timer::detail::field_load));
    const std::uint64_t name[2] = {s.op[0].load(timer::detail::field_load), s.op[1].load(timer::detail::field_load)};
    e.op.assign(reinterpret_cast<const char*>(name), ::strnlen(reinterpret_cast<const char*>(name), sizeof name));
    e.bytes = s.bytes.load(timer::detail::field_load);
    e.entered_ns = s.entered_ns.load(timer::detail::field_load);
    e.left_ns = s.left_ns.load(timer::detail::field_load);
    e.outcome = static_cast<flight_outcome>(s.outcome.load(timer::detail::field_load));
    timer::detail::seqlock_read_fence();
    if (s.index.load(std::memory_order_relaxed) != k) continue;  // rewritten meanwhile
    if (e.world <= 0 || e.rank < 0 || e.rank >= e.world) continue;
    for (char& c : e.op)
      if (c < 0x20 || c > 0x7e) c = '?';  // a name the group wrote is a literal of plain letters
    if (e.outcome > flight_outcome::failed) e.outcome = flight_outcome::inside;
    out.entries.push_back(std::move(e));
  }
  std::sort(out.entries.begin(), out.entries.end(), [](const flight_entry& a, const flight_entry& b) {
    return a.round != b.round ? a.round < b.round : a.index < b.index;
  });
  return out;
}

}  // namespace elastic::inline v1::comm::detail
