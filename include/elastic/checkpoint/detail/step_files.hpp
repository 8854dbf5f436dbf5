// Finding and opening committed checkpoint steps (storage.hpp): listing a checkpoint directory,
// reading a step's manifests, checking that a step is valid. Reads open each step and file by
// name with O_NOFOLLOW and read regular files only.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include <fmt/format.h>

#include <elastic/checkpoint/format.hpp>
#include <elastic/internal/file.hpp>
#include <elastic/internal/private_dir.hpp>
#include <elastic/error.hpp>

namespace elastic::inline v1::checkpoint {

namespace fs = std::filesystem;

namespace storage {

/// The error for a checkpoint directory whose names cannot be read: not a fresh start, since
/// starting from step 0 would train over (and later overwrite) the steps it cannot see.
inline error unreadable_dir(const fs::path& dir, int err) {
  std::string advice;
  if (err == EACCES || err == EPERM) {
    advice = fmt::format("give this process's user (uid {}) read and search permission on it", ::geteuid());
  } else if (err == ENOTDIR) {
    advice = "it (or a part of its path) is not a directory: point at a directory";
  } else {
    advice = "check the file system";
  }
  return error(errc::os_error,
               fmt::format("checkpoint directory {} cannot be read, so the steps in it cannot be seen, and a run "
                           "starting from step 0 would overwrite them: {}, or choose another directory",
                           dir.string(), advice),
               std::error_code(err, std::generic_category()));
}

/// Opens `dir` for reading: nothing when it does not exist (a fresh start), an error naming it
/// for any other failure.
inline std::optional<internal::unique_fd> open_for_reading(const fs::path& dir) {
  int fd;
  do {
    fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    if (errno == ENOENT) return std::nullopt;
    throw unreadable_dir(dir, errno);
  }
  return internal::unique_fd(fd);
}

/// Committed steps in the directory `dirfd` (shown as `dir`), newest first. Pending, corrupt
/// and foreign names are ignored.
inline std::vector<std::uint64_t> list_steps_at(int dirfd, const fs::path& dir) {
  std::vector<std::string> names;
  try {
    names = internal::list_dir_at(dirfd, dir);
  } catch (const error& e) {
    throw unreadable_dir(dir, e.os_code() ? e.os_code().value() : EIO);
  }
  std::vector<std::uint64_t> steps;
  for (const auto& n : names)
    if (auto s = format::parse_step_dir(n)) steps.push_back(*s);
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

/// Committed steps in `dir`, newest first; empty when `dir` does not exist. A directory that
/// exists but cannot be read is an error (errc::os_error naming it), never an empty list.
inline std::vector<std::uint64_t> list_steps(const fs::path& dir) {
  const auto fd = open_for_reading(dir);
  if (!fd) return {};
  return list_steps_at(fd->get(), dir);
}

/// Reads and verifies the rank manifest of `rank` in the step directory `sdir` (shown as `shown`).
inline format::rank_manifest read_rank_manifest_at(int sdir, const fs::path& shown, int rank) {
  const std::string name = format::rank_manifest_name(rank);
  const fs::path p = shown / name;
  std::string text;
  try {
    text = internal::read_small_file_at(sdir, name, p);
  } catch (const error& e) {
    if (e.os_code() == std::errc::no_such_file_or_directory) {
      throw error(errc::corrupt, p.string() + " is missing: rank " + std::to_string(rank) + "'s part of the step is not there");
    }
    throw;
  }
  auto m = format::decode_rank(text, p.string());
  if (m.rank != rank) throw error(errc::corrupt, fmt::format("{} says it is rank {}'s part", p.string(), m.rank));
  return m;
}

/// Reads and verifies a rank manifest.
inline format::rank_manifest read_rank_manifest(const fs::path& step_dir, int rank) {
  const auto fd = open_for_reading(step_dir);
  if (!fd) throw error(errc::not_found, "checkpoint step " + step_dir.string() + " does not exist");
  return read_rank_manifest_at(fd->get(), step_dir, rank);
}

/// A committed step's directory, opened, with its manifests read and checked against each other.
struct step_files {
  internal::unique_fd dir;
  fs::path path;
  format::step_manifest manifest;
  std::vector<format::rank_manifest> parts;
};

/// Opens step `step` in the directory `dirfd` (shown as `dir`) and reads its manifests.
/// Throws errc::not_found when the step is not there (it went away), errc::corrupt,
/// errc::version_mismatch, errc::unsafe_path (a symbolic link where a file should be) or an
/// os_error (it cannot be read) when it is not valid.
inline step_files open_step_at(int dirfd, const fs::path& dir, std::uint64_t step) {
  step_files f;
  const std::string name = format::step_dir_name(step);
  f.path = dir / name;
  try {
    f.dir = internal::open_dir_at(dirfd, name, f.path);
  } catch (const error& e) {
    if (e.os_code() == std::errc::no_such_file_or_directory) {
      throw error(errc::not_found, "checkpoint step " + f.path.string() + " does not exist (removed meanwhile?)");
    }
    throw;
  }
  const std::string mname(format::step_manifest_name);
  const fs::path mpath = f.path / mname;
  std::string text;
  try {
    text = internal::read_small_file_at(f.dir.get(), mname, mpath);
  } catch (const error& e) {
    if (e.os_code() == std::errc::no_such_file_or_directory) {
      throw error(errc::corrupt, mpath.string() + " is missing: the step was never committed whole");
    }
    throw;
  }
  f.manifest = format::decode_step(text, mpath.string());
  if (f.manifest.step != step) throw error(errc::corrupt, fmt::format("{} is of step {}", mpath.string(), f.manifest.step));
  for (int r = 0; r < f.manifest.world_size; ++r) {
    f.parts.push_back(read_rank_manifest_at(f.dir.get(), f.path, r));
    if (f.parts.back().step != step || f.parts.back().world_size != f.manifest.world_size) {
      throw error(errc::corrupt, fmt::format("{}: rank {}'s part belongs to another step or world size", f.path.string(), r));
    }
  }
  return f;
}

/// The manifest of committed step `step` of `dir` when the step is valid: its manifest and
/// every rank's manifest read and decode (data checksums are verified by load_step). Throws
/// as open_step_at does otherwise.
inline format::step_manifest check_step(const fs::path& dir, std::uint64_t step) {
  const auto fd = open_for_reading(dir);
  if (!fd) throw error(errc::not_found, "checkpoint directory " + dir.string() + " does not exist");
  return open_step_at(fd->get(), dir, step).manifest;
}

}  // namespace storage
}  // namespace elastic::inline v1::checkpoint
