// What the watchdog (which creates a segment) and a worker (which attaches to one) check alike:
// the segment's name, the shared-memory object behind it, why opening it failed, and whether its
// header is one this build can use. Both sides refuse the same things with the same words.
#pragma once

#include <cerrno>
#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>

#include <unistd.h>

#include <elastic/internal/names.hpp>
#include <elastic/error.hpp>
#include <elastic/timer/detail/table.hpp>

namespace elastic::inline v1::timer::detail {

/// Longest segment name accepted (the shm name adds a prefix; NAME_MAX is 255).
inline constexpr std::size_t max_segment_name = internal::max_shm_name;

/// Throws errc::bad_name unless `name` is a valid shared-memory name (see detail/names.hpp).
inline void validate_segment_name(std::string_view name) { internal::validate_shm_name("watchdog segment", name); }

/// What every segment's shared-memory object name starts with.
inline constexpr std::string_view shm_object_prefix = "elastic-timer.";

/// The POSIX shared-memory object behind a segment name (/dev/shm/elastic-timer.NAME).
inline std::string shm_object_name(std::string_view name) {
  return std::string(shm_object_prefix) + std::string(name);
}

/// The error for a segment that could not be opened with errno `err`; `what` is the system's
/// own account of it, for the errors that have no better words.
inline error segment_open_error(std::string_view name, int err, std::string_view what) {
  const std::string n(name);
  if (err == ENOENT) {
    return error(errc::not_found, "no watchdog segment '" + n + "': start `elastic-watchdog --name " + n +
                                      "` (or run under elastic-run), or unset ELASTIC_WATCHDOG");
  }
  if (err == EACCES || err == EPERM) {
    return error(errc::owner_mismatch,
                 "watchdog segment '" + n + "' belongs to another user (mode 0600): run as that "
                 "user or choose another --name",
                 std::error_code(err, std::generic_category()));
  }
  return error(errc::os_error, "cannot open watchdog segment '" + n + "': " + std::string(what),
               std::error_code(err, std::generic_category()));
}

/// Checks a published header against this build; throws without writing anything. `file_size`
/// is the object's size, `mapped` how much of it is mapped.
inline void validate_segment(const segment_header& h, std::string_view name, std::uint64_t file_size,
                             std::uint64_t mapped) {
  const std::string n(name);
  const std::string path = "/dev/shm/" + shm_object_name(name);
  const std::uint64_t magic = h.magic.load(std::memory_order_acquire);
  if (magic != segment_magic) {
    throw error(errc::corrupt, "'" + path + "' is not an elastic watchdog segment (bad magic): "
                               "remove it if it is stale, or choose another --name");
  }
  if (h.layout_version != layout_version) {
    throw error(errc::version_mismatch,
                "watchdog segment '" + n + "' was created by layout v" + std::to_string(h.layout_version) +
                    ", this build reads v" + std::to_string(layout_version) +
                    ": stop the old watchdog and workers, or choose another --name");
  }
  if (h.owner_uid != ::geteuid()) {
    throw error(errc::owner_mismatch, "watchdog segment '" + n + "' records owner uid " +
                                          std::to_string(h.owner_uid) + ", this process runs as uid " +
                                          std::to_string(::geteuid()) + ": choose another --name");
  }
  if (h.scopes_per_slot != scopes_per_slot || h.slot_bytes != sizeof(slot) || h.slot_count == 0 ||
      h.total_bytes != segment_bytes(h.slot_count) || file_size < h.total_bytes || mapped < h.total_bytes) {
    throw error(errc::corrupt, "watchdog segment '" + n + "' has an inconsistent header (" +
                                   std::to_string(file_size) + " bytes for " + std::to_string(h.slot_count) +
                                   " slots): remove " + path + " if it is stale, or choose another --name");
  }
}

}  // namespace elastic::inline v1::timer::detail
