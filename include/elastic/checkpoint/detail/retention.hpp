// Retiring checkpoint steps (storage.hpp): retention of the newest valid steps, moving damaged
// ones aside as corrupt-step-..., deleting by renaming to .removing-... first so that a crash
// half-way leaves a name the next sweep removes, never a half-deleted step.
#pragma once

#include <stdio.h>
#include <fcntl.h>

#include <cerrno>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <elastic/checkpoint/detail/step_files.hpp>
#include <elastic/checkpoint/format.hpp>
#include <elastic/internal/private_dir.hpp>
#include <elastic/error.hpp>
#include <elastic/events.hpp>

namespace elastic::inline v1::checkpoint {

namespace fs = std::filesystem;

namespace storage {

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
inline std::optional<fs::path> quarantine_step(const internal::private_dir& root, std::uint64_t step,
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
inline void remove_quietly(const internal::private_dir& root, const std::string& name, const event_log& events) {
  try {
    internal::remove_tree_at(root.fd(), name, root / name);
  } catch (const error& e) {
    events.emit("checkpoint_retention_failed", {{"dir", (root / name).string()}, {"reason", e.what()}});
  }
}

/// Deletes committed step `step`: renamed to .removing-step-... first, so that a crash half-way
/// leaves a name retention sweeps, never a half-deleted step that reads as corrupt.
inline void remove_step(const internal::private_dir& root, std::uint64_t step, const event_log& events = {}) {
  const std::string name = format::step_dir_name(step), trash = format::removing_dir_name(step);
  internal::remove_tree_at(root.fd(), trash, root / trash);  // a leftover of a crash
  if (::renameat(root.fd(), name.c_str(), root.fd(), trash.c_str()) != 0) {
    if (errno == ENOENT) return;  // someone else removed it
    throw os_error("cannot move " + (root / name).string() + " to " + (root / trash).string() + " to remove it");
  }
  root.sync();
  events.emit("checkpoint_removed", {{"step", step}});
  internal::remove_tree_at(root.fd(), trash, root / trash);
}

/// Housekeeping whose parts should all be tried: attempt() runs one and keeps its failure,
/// finish() throws the first failure once everything has been tried.
class every_step {
 public:
  template <class F>
  void attempt(F&& f) {
    try {
      f();
    } catch (const error& e) {
      if (!first_) first_ = e;
    }
  }
  void finish() const {
    if (first_) throw *first_;
  }

 private:
  std::optional<error> first_;
};

/// Keeps the newest `keep_last` valid steps (at least one) and never deletes a step at or after
/// `floor` (the step the run resumed from or last committed); moves unreadable steps aside
/// (quarantine_step); sweeps pending directories of steps at or below the newest step kept and
/// the leftovers of interrupted removals. Quarantined steps are never deleted. Everything that
/// can be done is done; the first failure is thrown at the end.
inline void retain(const internal::private_dir& root, std::size_t keep_last, std::optional<std::uint64_t> floor,
                   const event_log& events = {}) {
  keep_last = std::max<std::size_t>(keep_last, 1);
  every_step steps;
  auto attempt = [&](auto&& f) { steps.attempt(f); };
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
    for (const auto& n : internal::list_dir_at(root.fd(), root.path())) {
      const auto pending = format::parse_step_dir(n, true);
      const bool stale_pending = pending && newest && *pending <= *newest;
      if (stale_pending || n.starts_with(format::removing_prefix) || n.starts_with(format::probe_prefix)) {
        attempt([&] { internal::remove_tree_at(root.fd(), n, root / n); });
      }
    }
  });
  steps.finish();
}

}  // namespace storage
}  // namespace elastic::inline v1::checkpoint
