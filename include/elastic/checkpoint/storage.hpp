// Writing, committing, finding, loading and retiring checkpoint steps (the layout is in
// format.hpp).
//
// Durability order for one step: each rank writes its data file and its manifest into the
// pending directory and fsyncs them; rank 0 waits until every rank's manifest is there, writes
// manifest.json, fsyncs it and the pending directory, renames the pending directory to its
// final name and fsyncs the parent. A crash at any point leaves the previous step untouched and
// at most a pending directory that readers ignore.
//
// Every write goes through a private_dir of the checkpoint directory: the pending directory is
// opened by name under it, files are created by name with O_EXCL and renamed with renameat, so
// no name another user planted (a symbolic link, a directory of theirs) is written through.
// Reads open each step and file by name with O_NOFOLLOW and read regular files only.
//
// A step is valid when its manifest and every rank's manifest read and decode (data checksums
// are checked when it is loaded). Retention counts valid steps only; a step that cannot be
// read is moved aside as corrupt-step-... instead of shadowing the real ones, and nothing at or
// after the step a run resumed from or committed is ever deleted.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include <elastic/detail/cuda.hpp>
#include <elastic/checkpoint/detail/host_memory.hpp>
#include <elastic/checkpoint/detail/step_loading.hpp>
#include <elastic/checkpoint/format.hpp>
#include <elastic/checkpoint/state.hpp>
#include <elastic/detail/crc32c.hpp>
#include <elastic/detail/file.hpp>
#include <elastic/detail/private_dir.hpp>
#include <elastic/error.hpp>
#include <elastic/events.hpp>

namespace elastic::checkpoint {

namespace fs = std::filesystem;

/// One entry's bytes as captured by a snapshot, ready to be written.
struct staged_entry {
  const entry* source = nullptr;
  std::span<const std::byte> bytes;
};

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
inline std::optional<elastic::detail::unique_fd> open_for_reading(const fs::path& dir) {
  int fd;
  do {
    fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    if (errno == ENOENT) return std::nullopt;
    throw unreadable_dir(dir, errno);
  }
  return elastic::detail::unique_fd(fd);
}

/// Committed steps in the directory `dirfd` (shown as `dir`), newest first. Pending, corrupt
/// and foreign names are ignored.
inline std::vector<std::uint64_t> list_steps_at(int dirfd, const fs::path& dir) {
  std::vector<std::string> names;
  try {
    names = elastic::detail::list_dir_at(dirfd, dir);
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

/// Writes this rank's part of `step` into the pending directory under `root`; durable when it
/// returns. Returns the number of bytes of the data file.
inline std::uint64_t write_rank_part(const elastic::detail::private_dir& root, std::uint64_t step, int rank,
                                     int world_size, const std::string& run_id, std::span<const staged_entry> entries,
                                     std::uint64_t chunk_bytes = default_chunk_bytes) {
  const auto pending = root.subdir(format::pending_dir_name(step));

  format::rank_manifest m;
  m.step = step;
  m.rank = rank;
  m.world_size = world_size;
  m.run_id = run_id;
  m.chunk_bytes = chunk_bytes;
  const std::string data_name = format::rank_data_name(rank);
  const fs::path data_path = pending / data_name;
  {
    auto fd = pending.create_file(data_name);
    std::uint64_t offset = 0;
    for (const auto& s : entries) {
      const entry& e = *s.source;
      format::entry_record r;
      r.name = e.name;
      r.kind = e.kind;
      r.type = e.type;
      r.element_bytes = e.element_bytes;
      r.shape = e.kind == entry_kind::object ? std::vector<std::uint64_t>{s.bytes.size()} : e.shape;
      r.where = e.where;
      r.bytes = s.bytes.size();
      r.offset = offset;
      r.shard = e.shard;
      for (std::uint64_t at = 0; at < r.bytes; at += chunk_bytes) {
        const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(chunk_bytes, r.bytes - at));
        const std::byte* p = s.bytes.data() + at;
        r.crc.push_back(elastic::detail::crc32c(p, n));
        elastic::detail::pwrite_all(fd.get(), p, n, offset + at, data_path);
      }
      offset += (r.bytes + data_alignment - 1) / data_alignment * data_alignment;
      m.entries.push_back(std::move(r));
    }
    m.data_bytes = offset;
    // Holes at the end would leave the file shorter than the manifest says.
    if (::ftruncate(fd.get(), static_cast<off_t>(offset)) != 0) throw os_error("cannot size " + data_path.string());
    elastic::detail::fsync_fd(fd.get(), data_path);
  }
  pending.write_atomic(format::rank_manifest_name(rank), format::encode(m));
  return m.data_bytes;
}

/// Reads and verifies the rank manifest of `rank` in the step directory `sdir` (shown as `shown`).
inline format::rank_manifest read_rank_manifest_at(int sdir, const fs::path& shown, int rank) {
  const std::string name = format::rank_manifest_name(rank);
  const fs::path p = shown / name;
  std::string text;
  try {
    text = elastic::detail::read_small_file_at(sdir, name, p);
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
  elastic::detail::unique_fd dir;
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
    f.dir = elastic::detail::open_dir_at(dirfd, name, f.path);
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
    text = elastic::detail::read_small_file_at(f.dir.get(), mname, mpath);
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

/// Whether a failure to read a step means the step is damaged (moved aside), rather than that
/// it went away or that this process ran short of something (left alone, tried again later).
inline bool is_damage(const error& e) noexcept {
  switch (e.code()) {
    case errc::corrupt:
    case errc::version_mismatch:
    case errc::unsafe_path:
      return true;
    case errc::os_error: {
      const int v = e.os_code().value();
      return v != EMFILE && v != ENFILE && v != ENOMEM && v != EINTR && v != EAGAIN && v != ENOENT;
    }
    default:
      return false;
  }
}

/// Moves step `step` aside as corrupt-step-<12 digits> (or -2, -3... when taken) so that it no
/// longer shadows the valid ones, and says so with a checkpoint_quarantined event. Returns
/// where it went, or nothing when the step was no longer there (another process moved it).
inline std::optional<fs::path> quarantine_step(const elastic::detail::private_dir& root, std::uint64_t step,
                                               std::string_view reason, const event_log& events = {}) {
  const std::string from = format::step_dir_name(step);
  for (int attempt = 1; attempt <= 1000; ++attempt) {
    const std::string to = format::quarantine_dir_name(step, attempt);
    int rc = ::renameat2(root.fd(), from.c_str(), root.fd(), to.c_str(), RENAME_NOREPLACE);
    if (rc != 0 && (errno == EINVAL || errno == ENOSYS)) {
      // A file system without RENAME_NOREPLACE: look first (only this user writes here).
      struct stat st {};
      if (::fstatat(root.fd(), to.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) continue;
      rc = ::renameat(root.fd(), from.c_str(), root.fd(), to.c_str());
    }
    if (rc == 0) {
      events.emit("checkpoint_quarantined", {{"step", step},
                                             {"dir", (root / from).string()},
                                             {"moved_to", (root / to).string()},
                                             {"reason", reason}});
      root.sync();
      return root / to;
    }
    if (errno == ENOENT) return std::nullopt;
    if (errno != EEXIST && errno != ENOTEMPTY) {
      throw os_error("cannot move the unreadable step " + (root / from).string() + " aside to " + (root / to).string());
    }
  }
  throw error(errc::capacity_exhausted, "cannot move the unreadable step " + (root / from).string() +
                                            " aside: corrupt-step-... names 1 to 1000 are taken; clean them up");
}

/// Removes the directory `name` under `root` (best effort: a failure is reported as an event,
/// since the step it held is no longer in anyone's way).
inline void remove_quietly(const elastic::detail::private_dir& root, const std::string& name, const event_log& events) {
  try {
    elastic::detail::remove_tree_at(root.fd(), name, root / name);
  } catch (const error& e) {
    events.emit("checkpoint_retention_failed", {{"dir", (root / name).string()}, {"reason", e.what()}});
  }
}

/// Rank 0: once every rank's part of `step` is durable in the pending directory, writes the
/// step manifest and makes the step visible. Waits at most `timeout` for the other ranks.
inline void commit_step(const elastic::detail::private_dir& root, const format::step_manifest& manifest,
                        std::chrono::milliseconds timeout, const event_log& events = {}) {
  const std::string pending_name = format::pending_dir_name(manifest.step);
  const auto pending = root.subdir(pending_name);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::milliseconds(1);
  for (int r = 0; r < manifest.world_size; ++r) {
    const std::string part = format::rank_manifest_name(r);
    for (;;) {
      struct stat st {};
      if (::fstatat(pending.fd(), part.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) break;
      if (errno != ENOENT) throw os_error("cannot look for " + (pending / part).string());
      if (std::chrono::steady_clock::now() >= deadline) {
        throw error(errc::timeout, fmt::format("checkpoint step {}: rank {} did not write its part within {} ms; "
                                               "the step stays uncommitted and the previous one is kept",
                                               manifest.step, r, timeout.count()));
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::milliseconds(50));
    }
    const auto m = read_rank_manifest_at(pending.fd(), pending.path(), r);  // verified: a torn part must not commit
    if (m.step != manifest.step || m.world_size != manifest.world_size || m.run_id != manifest.run_id) {
      throw error(errc::mismatch, fmt::format("checkpoint step {}: rank {}'s part is of step {}, world size {}, run "
                                              "'{}'; expected step {}, world size {}, run '{}'",
                                              manifest.step, r, m.step, m.world_size, m.run_id, manifest.step,
                                              manifest.world_size, manifest.run_id));
    }
  }
  pending.write_atomic(std::string(format::step_manifest_name), format::encode(manifest));
  const std::string final_name = format::step_dir_name(manifest.step);
  struct stat st {};
  if (::fstatat(root.fd(), final_name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
    // Only a step we could not load (or chose not to) can be in the way: we resumed before it.
    // Swap the two in one step, so that the step is never missing; the old one then sits under
    // the pending name, which the next retention sweeps if removing it now fails.
    events.emit("checkpoint_replaced", {{"step", manifest.step}, {"dir", (root / final_name).string()}});
    if (::renameat2(root.fd(), pending_name.c_str(), root.fd(), final_name.c_str(), RENAME_EXCHANGE) == 0) {
      root.sync();
      remove_quietly(root, pending_name, events);
      return;
    }
    if (errno != EINVAL && errno != ENOSYS) {
      throw os_error("cannot exchange " + pending.path().string() + " with " + (root / final_name).string());
    }
    // No RENAME_EXCHANGE here: move the old step out of the way first.
    const std::string trash = format::removing_dir_name(manifest.step);
    elastic::detail::remove_tree_at(root.fd(), trash, root / trash);
    if (::renameat(root.fd(), final_name.c_str(), root.fd(), trash.c_str()) != 0 && errno != ENOENT) {
      throw os_error("cannot move " + (root / final_name).string() + " out of the way");
    }
    if (::renameat(root.fd(), pending_name.c_str(), root.fd(), final_name.c_str()) != 0) {
      throw os_error("cannot rename " + pending.path().string() + " to " + (root / final_name).string());
    }
    root.sync();
    remove_quietly(root, trash, events);
    return;
  }
  if (::renameat(root.fd(), pending_name.c_str(), root.fd(), final_name.c_str()) != 0) {
    throw os_error("cannot rename " + pending.path().string() + " to " + (root / final_name).string());
  }
  root.sync();
}

/// Deletes committed step `step`: renamed to .removing-step-... first, so that a crash half-way
/// leaves a name retention sweeps, never a half-deleted step that reads as corrupt.
inline void remove_step(const elastic::detail::private_dir& root, std::uint64_t step, const event_log& events = {}) {
  const std::string name = format::step_dir_name(step), trash = format::removing_dir_name(step);
  elastic::detail::remove_tree_at(root.fd(), trash, root / trash);  // a leftover of a crash
  if (::renameat(root.fd(), name.c_str(), root.fd(), trash.c_str()) != 0) {
    if (errno == ENOENT) return;  // someone else removed it
    throw os_error("cannot move " + (root / name).string() + " to " + (root / trash).string() + " to remove it");
  }
  root.sync();
  events.emit("checkpoint_removed", {{"step", step}});
  elastic::detail::remove_tree_at(root.fd(), trash, root / trash);
}

/// Keeps the newest `keep_last` valid steps (at least one) and never deletes a step at or after
/// `floor` (the step the run resumed from or last committed); moves unreadable steps aside
/// (quarantine_step); sweeps pending directories of steps at or below the newest step kept and
/// the leftovers of interrupted removals. Quarantined steps are never deleted. Everything that
/// can be done is done; the first failure is thrown at the end.
inline void retain(const elastic::detail::private_dir& root, std::size_t keep_last, std::optional<std::uint64_t> floor,
                   const event_log& events = {}) {
  keep_last = std::max<std::size_t>(keep_last, 1);
  std::optional<error> first;
  auto attempt = [&](auto&& f) {
    try {
      f();
    } catch (const error& e) {
      if (!first) first = e;
    }
  };
  std::vector<std::uint64_t> valid;
  for (const auto step : list_steps_at(root.fd(), root.path())) {
    try {
      (void)open_step_at(root.fd(), root.path(), step);
      valid.push_back(step);
    } catch (const error& e) {
      // Unreadable: move it aside. Gone or not checkable now: neither counted nor deleted.
      if (is_damage(e)) attempt([&] { quarantine_step(root, step, e.what(), events); });
    }
  }
  for (std::size_t i = keep_last; i < valid.size(); ++i) {
    if (floor && valid[i] >= *floor) continue;
    attempt([&] { remove_step(root, valid[i], events); });
  }
  std::optional<std::uint64_t> newest = floor;
  if (!valid.empty() && (!newest || valid.front() > *newest)) newest = valid.front();
  attempt([&] {
    for (const auto& n : elastic::detail::list_dir_at(root.fd(), root.path())) {
      const auto pending = format::parse_step_dir(n, true);
      const bool stale_pending = pending && newest && *pending <= *newest;
      if (stale_pending || n.starts_with(format::removing_prefix) || n.starts_with(format::probe_prefix)) {
        attempt([&] { elastic::detail::remove_tree_at(root.fd(), n, root / n); });
      }
    }
  });
  if (first) throw *first;
}

/// Loads committed step `step` of the directory `dirfd` (shown as `dir`) into `st` as rank
/// `rank` (of any world size). Everything is read into staging and verified before the first
/// byte of `st` changes, so a corrupt step leaves the caller's state as it was.
///
/// Throws errc::corrupt (checksum, truncation, missing part), errc::version_mismatch (a newer
/// format), errc::unsafe_path (a symbolic link in the step) or os_error: the step cannot be
/// used; errc::not_found: it is not there; errc::mismatch: the step is fine but does not
/// fit `st` (an entry missing, renamed or resized), which no older step will fix either.
///
/// `scratch` is staging memory to use when it is large enough (the checkpointer lends one of
/// its snapshot slots, so a restore allocates nothing); otherwise staging is allocated here.
inline format::step_manifest load_step_at(int dirfd, const fs::path& dir, std::uint64_t step, const state& st, int rank,
                                          std::span<std::byte> scratch = {}) {
  const auto opened = open_step_at(dirfd, dir, step);
  // Replicated entries come from our own rank's part when it exists, else rank 0's.
  const int home_rank = rank < opened.manifest.world_size ? rank : 0;
  detail::check_fits_state(st, opened.parts[static_cast<std::size_t>(home_rank)], opened.path);
  detail::step_reader reader(opened.dir.get(), opened.path, opened.parts);
  const auto staged = detail::stage_entries(st, reader, opened.parts, home_rank, opened.path, scratch);
  detail::apply_staged(st, staged.entries);  // everything verified: now the caller's state changes
  return opened.manifest;
}

/// load_step_at for the directory `dir`.
inline format::step_manifest load_step(const fs::path& dir, std::uint64_t step, const state& st, int rank,
                                       std::span<std::byte> scratch = {}) {
  const auto fd = open_for_reading(dir);
  if (!fd) throw error(errc::not_found, "checkpoint directory " + dir.string() + " does not exist");
  return load_step_at(fd->get(), dir, step, st, rank, scratch);
}

/// A step restore_newest passed over, and why.
struct skipped_step {
  std::uint64_t step;
  error why;
};

/// Loads the newest committed step that verifies, logging each step it has to skip and why
/// (and listing them in `skipped` when given). Returns nothing when the directory holds no
/// usable step or does not exist (a fresh start); one that cannot be read is an error. A step
/// that does not fit the registered state is the caller's error, not damage: it is thrown,
/// not skipped.
inline std::optional<format::step_manifest> restore_newest_at(int dirfd, const fs::path& dir, const state& st, int rank,
                                                              const event_log& events = {},
                                                              std::span<std::byte> scratch = {},
                                                              std::vector<skipped_step>* skipped = nullptr) {
  for (auto step : list_steps_at(dirfd, dir)) {
    try {
      return load_step_at(dirfd, dir, step, st, rank, scratch);
    } catch (const error& e) {
      if (e.code() == errc::mismatch) throw;
      events.emit("checkpoint_skipped",
                  {{"step", step}, {"dir", (dir / format::step_dir_name(step)).string()}, {"code", to_string(e.code())},
                   {"reason", e.what()}});
      if (skipped) skipped->push_back({step, e});
    }
  }
  return std::nullopt;
}

/// restore_newest_at for the directory `dir`.
inline std::optional<format::step_manifest> restore_newest(const fs::path& dir, const state& st, int rank,
                                                           const event_log& events = {},
                                                           std::span<std::byte> scratch = {},
                                                           std::vector<skipped_step>* skipped = nullptr) {
  const auto fd = open_for_reading(dir);
  if (!fd) return std::nullopt;
  return restore_newest_at(fd->get(), dir, st, rank, events, scratch, skipped);
}

}  // namespace storage
}  // namespace elastic::checkpoint
