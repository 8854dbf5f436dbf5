// Writing, committing, finding, loading and retiring checkpoint steps (the layout is in
// format.hpp). Loading is here; finding is detail/step_files.hpp, writing and committing
// detail/step_commit.hpp, retiring detail/retention.hpp (all in namespace storage).
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

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <vector>

#include <elastic/checkpoint/detail/retention.hpp>
#include <elastic/checkpoint/detail/step_commit.hpp>
#include <elastic/checkpoint/detail/step_files.hpp>
#include <elastic/checkpoint/detail/step_loading.hpp>
#include <elastic/checkpoint/format.hpp>
#include <elastic/checkpoint/state.hpp>
#include <elastic/error.hpp>
#include <elastic/events.hpp>

namespace elastic::inline v1::checkpoint {

namespace fs = std::filesystem;

namespace storage {

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
}  // namespace elastic::inline v1::checkpoint
