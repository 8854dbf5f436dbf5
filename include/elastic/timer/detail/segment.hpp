// The watchdog's side of its shared-memory segment: creating or adopting it, with every check
// that keeps a wrong segment from being overwritten. Workers attach with attached_segment.hpp;
// both sides check the same things (segment_checks.hpp).
//
// The serving watchdog holds an exclusive flock on the segment for as long as it lives; the
// kernel drops it when the watchdog dies, however it dies. So "is a watchdog serving this
// segment?" is one non-blocking flock, with no pid to go stale, and a new watchdog can adopt the
// segment of a dead one (its slots, and so the deadlines of running workers, carry on).
//
// A watchdog that is killed leaves its segment behind on purpose, so that a new one can adopt it
// while workers still run. What nobody can adopt any more (no process maps it, no watchdog locks
// it) is removed by the next watchdog to start on this host, whatever its name: see
// create_or_adopt().
#pragma once

#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/shared_memory_object.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <elastic/internal/shm_object.hpp>
#include <elastic/internal/process.hpp>
#include <elastic/error.hpp>
#include <elastic/timer/detail/segment_checks.hpp>
#include <elastic/timer/detail/table.hpp>

namespace elastic::inline v1::timer::detail {

namespace bip = boost::interprocess;

/// The watchdog's mapped segment. Move-only; unmaps and closes on destruction (and so releases the
/// watchdog's lock); it unlinks the name only when asked with remove().
class segment {
 public:
  segment() = default;

  /// For a watchdog: creates the segment with `slot_count` slots and mode 0600, or adopts an
  /// existing one whose watchdog is gone (keeping its slots and their deadlines). Throws
  /// already_running when a live watchdog serves it, owner_mismatch when another user made it,
  /// version_mismatch or corrupt when it is not a segment this build can read; none of these
  /// writes a byte to the existing segment.
  ///
  /// First it removes the segments of this user, under other names, that nothing can use any
  /// more: no worker maps them and no watchdog serves them (sweep_stale_shm; swept() lists
  /// them). A segment some worker still maps is kept for a new watchdog to adopt.
  static segment create_or_adopt(std::string_view name, std::uint32_t slot_count) {
    validate_segment_name(name);
    if (slot_count == 0 || slot_count > (1u << 20)) {
      throw error(errc::invalid_argument, "watchdog capacity " + std::to_string(slot_count) +
                                              " slots is out of range: use 1 to 1048576");
    }
    segment s;
    s.name_ = std::string(name);
    const std::string obj = shm_object_name(name);
    s.swept_ = internal::sweep_stale_shm(shm_object_prefix, 2, obj, &s.planted_);
    s.shm_ = internal::create_or_open_shm(obj, s.created_, [&](const auto& e) { return open_error(name, e); },
                                          "choose another --name");
    s.check_owner();
    if (::flock(s.fd(), LOCK_EX | LOCK_NB) != 0) {
      if (errno != EWOULDBLOCK) throw os_error("cannot lock watchdog segment '" + s.name_ + "'");
      std::string who = s.peek_watchdog_pid();
      throw error(errc::already_running,
                  "watchdog segment '" + s.name_ + "' is already served by a live watchdog" + who +
                      ": stop it first or choose another --name");
    }
    // We hold the lock: no other watchdog touches the segment until we drop it.
    const auto size = s.file_size();
    if (size == 0) {
      s.initialize(slot_count);
    } else if (size < sizeof(segment_header)) {
      throw error(errc::corrupt, "watchdog segment '" + s.name_ + "' is " + std::to_string(size) +
                                     " bytes, too small for a header: it is not ours; remove /dev/shm/" +
                                     obj + " if it is stale, or choose another --name");
    } else {
      s.map();
      auto& h = s.table().header();
      if (h.magic.load(std::memory_order_acquire) == 0 && s.all_zero()) {
        // A watchdog died while creating it; no worker ever used it.
        s.region_ = bip::mapped_region();
        s.initialize(slot_count);
      } else {
        s.validate();
        s.adopted_ = true;
      }
    }
    auto& h = s.table().header();
    h.watchdog_start_time.store(internal::process_start_time(::getpid()), std::memory_order_relaxed);
    h.watchdog_pid.store(static_cast<std::int32_t>(::getpid()), std::memory_order_release);
    return s;
  }

  [[nodiscard]] table_view table() const noexcept { return table_view(region_.get_address()); }
  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  /// True when create_or_adopt() found the segment of a dead watchdog and took it over.
  [[nodiscard]] bool adopted() const noexcept { return adopted_; }
  [[nodiscard]] int fd() const noexcept { return shm_.get_mapping_handle().handle; }
  /// The device and inode of the object: what /proc/PID/maps shows for a process that maps it.
  [[nodiscard]] internal::file_identity identity() const noexcept {
    return internal::file_identity::of(fd());
  }
  /// Shared-memory objects of other, dead segments that create_or_adopt() removed.
  [[nodiscard]] const std::vector<std::string>& swept() const noexcept { return swept_; }
  /// Names under the segments' prefix that are no shared-memory objects (a FIFO, socket, device
  /// or link someone planted), which create_or_adopt() left alone: one sentence each.
  [[nodiscard]] const std::vector<std::string>& planted() const noexcept { return planted_; }

  /// Unlinks the name; workers that have it mapped keep their mapping.
  void remove() noexcept {
    if (!name_.empty()) bip::shared_memory_object::remove(shm_object_name(name_).c_str());
  }

  /// Removes the segment named `name` if it exists; true when something was removed.
  static bool remove(std::string_view name) {
    validate_segment_name(name);
    return bip::shared_memory_object::remove(shm_object_name(name).c_str());
  }

 private:
  static error open_error(std::string_view name, const bip::interprocess_exception& e) {
    return segment_open_error(name, e.get_native_error(), e.what());
  }

  [[nodiscard]] std::uint64_t file_size() const {
    struct stat st{};
    if (::fstat(fd(), &st) != 0) throw os_error("cannot stat watchdog segment '" + name_ + "'");
    return static_cast<std::uint64_t>(st.st_size);
  }

  void check_owner() const {
    internal::check_shm_owner(fd(), "watchdog segment '" + name_ + "'", "run as that user or choose another --name",
                              shm_object_name(name_));
  }

  void map() { region_ = bip::mapped_region(shm_, bip::read_write); }

  [[nodiscard]] bool all_zero() const noexcept {
    const auto* p = static_cast<const unsigned char*>(region_.get_address());
    for (std::size_t i = 0; i < region_.get_size(); ++i)
      if (p[i] != 0) return false;
    return true;
  }

  /// Fills a fresh (or abandoned, all-zero) segment and publishes its magic last, so a worker
  /// never sees a half-written header.
  void initialize(std::uint32_t slot_count) {
    const std::size_t bytes = segment_bytes(slot_count);
    shm_.truncate(static_cast<bip::offset_t>(bytes));
    map();
    auto& h = table().header();
    h.layout_version = layout_version;
    h.slot_count = slot_count;
    h.scopes_per_slot = scopes_per_slot;
    h.slot_bytes = sizeof(slot);
    h.owner_uid = ::geteuid();
    h.total_bytes = bytes;
    h.default_signal.store(SIGKILL, std::memory_order_relaxed);
    h.next_wake_ns.store(0, std::memory_order_relaxed);
    for (std::uint32_t i = 0; i < slot_count; ++i) table().at(i).head.rank.store(-1, std::memory_order_relaxed);
    h.magic.store(segment_magic, std::memory_order_release);
  }

  void validate() const { validate_segment(table().header(), name_, file_size(), region_.get_size()); }

  /// " (pid N)" when the header names the serving watchdog, for messages.
  [[nodiscard]] std::string peek_watchdog_pid() {
    try {
      if (file_size() < sizeof(segment_header)) return {};
      map();
      int pid = table().header().watchdog_pid.load(std::memory_order_acquire);
      return pid > 0 ? " (pid " + std::to_string(pid) + ")" : std::string();
    } catch (...) {
      return {};
    }
  }

  bip::shared_memory_object shm_;
  bip::mapped_region region_;
  std::string name_;
  bool created_ = false;
  bool adopted_ = false;
  std::vector<std::string> swept_;
  std::vector<std::string> planted_;
};

}  // namespace elastic::inline v1::timer::detail
