// The store for one host: a table in POSIX shared memory (Boost.Interprocess maps it), no
// ports, no files. URL: shm://NAME (the object is /dev/shm/elastic-store.NAME, mode 0600).
//
// A process-shared robust mutex guards the table: when a client dies holding it, the next one
// to lock gets EOWNERDEAD, drops the entry that was being written (entries are marked while a
// write is under way) and carries on. Waiters sleep on a futex word bumped by every change.
// Leases expire by the monotonic clock, which every process on a host shares, and die with the
// process that took them: a lease remembers its owner (pid, start time, pid namespace) and any
// client in the same pid namespace drops it once that process is gone (a zombie counts as gone).
// A participant SIGKILLed on this host thus leaves the group at once, not a heartbeat timeout
// later; in another pid namespace (a sibling container sharing /dev/shm) only the clock applies.
#pragma once

#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/shared_memory_object.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <elastic/internal/clock.hpp>
#include <elastic/internal/futex.hpp>
#include <elastic/internal/names.hpp>
#include <elastic/internal/process.hpp>
#include <elastic/internal/shm_object.hpp>
#include <elastic/error.hpp>
#include <elastic/rendezvous/store.hpp>

namespace elastic::inline v1::rendezvous {

namespace detail {

namespace bip = boost::interprocess;

inline constexpr std::uint64_t store_magic = 0x31524f5453454c45ULL;  // "ELESTOR1" little-endian
inline constexpr std::uint32_t store_layout_version = 2;  // 2: leases know their owner
inline constexpr std::size_t max_key = 255;
inline constexpr std::size_t max_value = 16 * 1024;
inline constexpr std::uint32_t store_capacity = 1024;
inline constexpr std::uint32_t max_leases = 1024;

enum entry_state : std::uint32_t { entry_free = 0, entry_live = 1, entry_writing = 2 };

struct store_entry {
  std::uint32_t state;
  std::uint32_t key_len;
  std::uint32_t value_len;
  std::uint32_t reserved;
  std::int64_t lease;
  char key[max_key + 1];
  char value[max_value];
};

struct store_lease {
  std::int64_t id;          // 0: free
  std::int64_t ttl_ns;
  std::int64_t expires_ns;  // CLOCK_MONOTONIC
  std::int32_t owner_pid;   // the process that took the lease; 0: unknown
  std::uint32_t reserved;
  std::uint64_t owner_start;  // its start time (pid reuse guard)
  std::uint64_t owner_pidns;  // inode of its pid namespace; 0: unknown
};

struct store_header {
  std::atomic<std::uint64_t> magic;  // written last
  std::uint32_t layout_version;
  std::uint32_t capacity;
  std::uint32_t owner_uid;
  std::uint32_t max_value_bytes;
  std::atomic<std::uint32_t> changes;  // futex word: bumped on every change
  std::uint32_t reserved;
  std::int64_t next_lease;
  pthread_mutex_t mutex;
  store_lease leases[max_leases];
};

struct store_layout {
  store_header head;
  store_entry entries[store_capacity];
};

}  // namespace detail

class shm_store final : public store {
 public:
  [[nodiscard]] bool local() const noexcept override { return true; }

  /// Opens the store NAME, creating it if it does not exist.
  explicit shm_store(std::string_view name, std::chrono::milliseconds ready_timeout = std::chrono::seconds(2))
      : name_(name) {
    internal::validate_shm_name("store", name);
    bool created = false;
    shm_ = internal::create_or_open_shm(object_name(name), created, [&](const auto& e) { return open_error(e); },
                                        "use another store name");
    if (created) {
      initialize();
      return;
    }
    attach(ready_timeout);
  }

  /// Removes the store NAME from /dev/shm (processes that have it open keep their mapping).
  static bool remove(std::string_view name) {
    return detail::bip::shared_memory_object::remove(object_name(name).c_str());
  }

  [[nodiscard]] const std::string& name() const noexcept { return name_; }

  void set(std::string_view key, std::string_view value, lease_id lease = 0) override {
    check_key(key);
    check_value(key, value);
    locked lk(*this);
    check_lease_locked(lease);
    write_locked(key, value, lease);
  }

  std::optional<std::string> get(std::string_view key) override {
    check_key(key);
    locked lk(*this);
    if (auto* e = find_locked(key)) return std::string(e->value, e->value_len);
    return std::nullopt;
  }
  using store::get;

  std::int64_t add(std::string_view key, std::int64_t delta) override {
    check_key(key);
    locked lk(*this);
    std::int64_t v = 0;
    if (auto* e = find_locked(key)) v = detail::parse_counter(key, std::string_view(e->value, e->value_len));
    v += delta;
    write_locked(key, std::to_string(v), 0);
    return v;
  }

  bool compare_set(std::string_view key, std::optional<std::string_view> expected, std::string_view desired,
                   lease_id lease = 0, std::optional<std::string>* actual = nullptr) override {
    check_key(key);
    check_value(key, desired);
    locked lk(*this);
    check_lease_locked(lease);
    auto* e = find_locked(key);
    const bool match = expected ? (e && std::string_view(e->value, e->value_len) == *expected) : e == nullptr;
    if (!match) {
      if (actual) *actual = e ? std::optional<std::string>(std::string(e->value, e->value_len)) : std::nullopt;
      return false;
    }
    write_locked(key, desired, lease);
    return true;
  }

  bool erase(std::string_view key) override {
    check_key(key);
    locked lk(*this);
    auto* e = find_locked(key);
    if (!e) return false;
    e->state = detail::entry_free;
    changed_locked();
    return true;
  }

  void wait(std::span<const std::string> keys, std::chrono::milliseconds timeout) override {
    const std::int64_t deadline = internal::monotonic_ns() + std::chrono::nanoseconds(timeout).count();
    for (;;) {
      const std::uint32_t seen = head().changes.load(std::memory_order_acquire);
      std::vector<std::string> missing;
      {
        locked lk(*this);
        for (const auto& k : keys)
          if (!find_locked(k)) missing.push_back(k);
      }
      if (missing.empty()) return;
      if (internal::monotonic_ns() >= deadline) {
        throw error(errc::timeout, fmt::format("store shm://{}: '{}' still missing after {} ms", name_,
                                               fmt::join(missing, "', '"), timeout.count()));
      }
      // Leases may expire while we sleep: wake at least every 100 ms to let them.
      internal::futex_wait_until(head().changes, seen,
                                        std::min(deadline, internal::monotonic_ns() + 100'000'000));
    }
  }

  std::vector<std::pair<std::string, std::string>> list(std::string_view prefix) override {
    std::vector<std::pair<std::string, std::string>> out;
    {
      locked lk(*this);
      for (auto& e : layout().entries) {
        if (e.state != detail::entry_live) continue;
        std::string_view k(e.key, e.key_len);
        if (k.substr(0, prefix.size()) == prefix) out.emplace_back(std::string(k), std::string(e.value, e.value_len));
      }
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  lease_id grant(std::chrono::milliseconds ttl) override {
    if (ttl.count() <= 0) throw error(errc::invalid_argument, "store lease time to live must be positive");
    locked lk(*this);
    for (auto& l : head().leases) {
      if (l.id != 0) continue;
      l.id = ++head().next_lease;
      l.ttl_ns = std::chrono::nanoseconds(ttl).count();
      l.expires_ns = internal::monotonic_ns() + l.ttl_ns;
      l.owner_pid = static_cast<std::int32_t>(::getpid());
      l.owner_start = internal::process_start_time(::getpid());
      l.owner_pidns = pidns_;
      return l.id;
    }
    throw error(errc::capacity_exhausted,
                fmt::format("store shm://{} has {} live leases, its limit: revoke the ones you no longer need", name_,
                            detail::max_leases));
  }

  void keep_alive(lease_id lease) override {
    locked lk(*this);
    auto* l = find_lease_locked(lease);
    if (!l) throw error(errc::not_found, fmt::format("store shm://{}: lease {} has expired; its keys are gone", name_, lease));
    l->expires_ns = internal::monotonic_ns() + l->ttl_ns;
  }

  void revoke(lease_id lease) override {
    locked lk(*this);
    if (auto* l = find_lease_locked(lease)) drop_lease_locked(*l);
  }

 private:
  // Tests reach the lock and the table through this peer (tests/support/shm_store_peer.hpp),
  // so that no test hook is part of the public API.
  friend struct shm_store_test_peer;

  struct locked {
    explicit locked(shm_store& s) : s_(s) {
      s_.lock();
      s_.expire_locked();
    }
    ~locked() { ::pthread_mutex_unlock(&s_.head().mutex); }
    locked(const locked&) = delete;
    locked& operator=(const locked&) = delete;
    shm_store& s_;
  };

  static std::string object_name(std::string_view name) { return "elastic-store." + std::string(name); }

  error open_error(const detail::bip::interprocess_exception& e) const {
    return error(errc::os_error, "cannot open store shm://" + name_ + " (/dev/shm/" + object_name(name_) + "): " + e.what(),
                 std::error_code(e.get_native_error(), std::generic_category()));
  }

  detail::store_layout& layout() const noexcept { return *static_cast<detail::store_layout*>(region_.get_address()); }
  detail::store_header& head() const noexcept { return layout().head; }

  void initialize() {
    shm_.truncate(static_cast<detail::bip::offset_t>(sizeof(detail::store_layout)));
    region_ = detail::bip::mapped_region(shm_, detail::bip::read_write);
    auto& h = head();
    h.layout_version = detail::store_layout_version;
    h.capacity = detail::store_capacity;
    h.owner_uid = ::getuid();
    h.max_value_bytes = detail::max_value;
    h.next_lease = 0;
    pthread_mutexattr_t a;
    ::pthread_mutexattr_init(&a);
    ::pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    ::pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    const int rc = ::pthread_mutex_init(&h.mutex, &a);
    ::pthread_mutexattr_destroy(&a);
    if (rc != 0) throw os_error("cannot initialize the lock of store shm://" + name_, rc);
    h.magic.store(detail::store_magic, std::memory_order_release);
  }

  void attach(std::chrono::milliseconds ready_timeout) {
    internal::check_shm_owner(shm_.get_mapping_handle().handle, "store shm://" + name_,
                              "use another name, or run as its owner", object_name(name_));
    const auto until = std::chrono::steady_clock::now() + ready_timeout;
    for (;;) {
      detail::bip::offset_t size = 0;
      shm_.get_size(size);
      if (static_cast<std::size_t>(size) >= sizeof(detail::store_header)) {
        if (!region_.get_address()) region_ = detail::bip::mapped_region(shm_, detail::bip::read_write);
        if (head().magic.load(std::memory_order_acquire) != 0) break;
      }
      if (std::chrono::steady_clock::now() >= until) {
        throw error(errc::corrupt, fmt::format("store shm://{} was never initialized (its creator died while creating "
                                               "it): remove /dev/shm/{} and retry",
                                               name_, object_name(name_)));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    const auto& h = head();
    if (h.magic.load() != detail::store_magic || h.layout_version != detail::store_layout_version ||
        h.capacity != detail::store_capacity || h.max_value_bytes != detail::max_value ||
        region_.get_size() < sizeof(detail::store_layout)) {
      throw error(errc::version_mismatch,
                  fmt::format("store shm://{} has another layout (version {}, {} entries of {} bytes); this build "
                              "uses version {}: stop the jobs using it and remove /dev/shm/{}",
                              name_, h.layout_version, h.capacity, h.max_value_bytes, detail::store_layout_version,
                              object_name(name_)));
    }
  }

  void lock() {
    const int rc = ::pthread_mutex_lock(&head().mutex);
    if (rc == EOWNERDEAD) {
      // The holder died mid-operation: drop what it was writing, then the table is consistent.
      for (auto& e : layout().entries)
        if (e.state == detail::entry_writing) e.state = detail::entry_free;
      ::pthread_mutex_consistent(&head().mutex);
      changed_locked();
      return;
    }
    if (rc != 0) throw os_error("cannot lock store shm://" + name_, rc);
  }

  void changed_locked() noexcept {
    head().changes.fetch_add(1, std::memory_order_release);
    internal::futex_wake(head().changes);
  }

  void expire_locked() {
    const std::int64_t now = internal::monotonic_ns();
    // Owners are looked up in /proc (a few microseconds each), so at most every 2 ms per handle.
    const bool check_owners = pidns_ != 0 && now - owners_checked_ns_ >= 2'000'000;
    if (check_owners) owners_checked_ns_ = now;
    for (auto& l : head().leases) {
      if (l.id == 0) continue;
      if (l.expires_ns <= now) {
        drop_lease_locked(l);
      } else if (check_owners && l.owner_pid > 0 && l.owner_pidns == pidns_ &&
                 !internal::process_alive(l.owner_pid, l.owner_start)) {
        drop_lease_locked(l);
      }
    }
  }

  void drop_lease_locked(detail::store_lease& l) {
    for (auto& e : layout().entries)
      if (e.state == detail::entry_live && e.lease == l.id) e.state = detail::entry_free;
    l.id = 0;
    changed_locked();
  }

  detail::store_lease* find_lease_locked(lease_id id) const noexcept {
    if (id == 0) return nullptr;
    for (auto& l : head().leases)
      if (l.id == id) return &l;
    return nullptr;
  }

  void check_lease_locked(lease_id lease) const {
    if (lease != 0 && !find_lease_locked(lease)) {
      throw error(errc::not_found, fmt::format("store shm://{}: lease {} has expired or was never granted", name_, lease));
    }
  }

  detail::store_entry* find_locked(std::string_view key) const noexcept {
    for (auto& e : layout().entries)
      if (e.state == detail::entry_live && std::string_view(e.key, e.key_len) == key) return &e;
    return nullptr;
  }

  void write_locked(std::string_view key, std::string_view value, lease_id lease) {
    detail::store_entry* e = find_locked(key);
    if (!e) {
      for (auto& c : layout().entries) {
        if (c.state == detail::entry_free) {
          e = &c;
          break;
        }
      }
    }
    if (!e) {
      throw error(errc::capacity_exhausted, fmt::format("store shm://{} holds {} keys, its limit: erase keys of "
                                                        "finished runs",
                                                        name_, detail::store_capacity));
    }
    // Marked first: if we die in the middle, the next locker drops the entry.
    e->state = detail::entry_writing;
    std::memcpy(e->key, key.data(), key.size());
    e->key_len = static_cast<std::uint32_t>(key.size());
    if (!value.empty()) std::memcpy(e->value, value.data(), value.size());
    e->value_len = static_cast<std::uint32_t>(value.size());
    e->lease = lease;
    e->state = detail::entry_live;
    changed_locked();
  }

  void check_key(std::string_view key) const {
    if (key.empty() || key.size() > detail::max_key) {
      throw error(errc::invalid_argument,
                  fmt::format("store key '{}' is {} bytes: use 1 to {}", internal::printable(key.substr(0, 64)),
                              key.size(), detail::max_key));
    }
  }
  void check_value(std::string_view key, std::string_view value) const {
    if (value.size() > detail::max_value) {
      throw error(errc::invalid_argument, fmt::format("value for store key '{}' is {} bytes; shm:// stores hold at most {}",
                                                      internal::printable(key), value.size(), detail::max_value));
    }
  }
  std::string name_;
  detail::bip::shared_memory_object shm_;
  detail::bip::mapped_region region_;
  std::uint64_t pidns_ = internal::pid_namespace();
  std::int64_t owners_checked_ns_ = 0;  // guarded by the store's lock
};

}  // namespace elastic::inline v1::rendezvous
