// Opening a checkpoint directory for writing: created if missing, ours (private_dir), and
// proven writable up front.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>

#include <fmt/format.h>

#include <elastic/checkpoint/format.hpp>
#include <elastic/checkpoint/storage.hpp>
#include <elastic/internal/host_name.hpp>
#include <elastic/internal/private_dir.hpp>
#include <elastic/error.hpp>

namespace elastic::inline v1::checkpoint::detail {

/// Opens (creating) the checkpoint directory and proves that this process can write into it,
/// so that a run never trains for hours before learning that no checkpoint can be saved.
inline internal::private_dir open_checkpoint_dir(const std::filesystem::path& dir) {
  const auto uid = std::to_string(::geteuid());
  internal::private_dir d;
  try {
    d = internal::private_dir::open(dir, true);
  } catch (const error& e) {
    if (e.code() == errc::unsafe_path) throw;  // says which path and why
    struct stat st {};
    if (e.os_code() && ::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
      throw storage::unreadable_dir(dir, e.os_code().value());  // there, but we may not open it
    }
    throw error(e.code(),
                fmt::format("checkpoint directory {} cannot be made or opened by this process (uid {}): {}; "
                            "create it with read, write and search permission for this user, or choose another "
                            "directory",
                            dir.string(), uid, e.message()),
                e.os_code());
  }
  // Unique among the processes that may probe at once (every rank of a group, on any host).
  const std::string probe = fmt::format("{}{}-{}-{}", format::probe_prefix, internal::host_name_for_ids(), ::getpid(),
                                        std::chrono::steady_clock::now().time_since_epoch().count());
  try {
    (void)d.create_file(probe);
    d.remove_file(probe);
  } catch (const error& e) {
    if (e.code() == errc::unsafe_path) throw;
    throw error(e.code(),
                fmt::format("checkpoint directory {} is not writable by this process (uid {}), so no checkpoint "
                            "could be saved: {}; give this user write permission on it, make room, or choose "
                            "another directory",
                            dir.string(), uid, e.message()),
                e.os_code());
  }
  return d;
}

}  // namespace elastic::inline v1::checkpoint::detail
