// Writing one rank's part of a step and committing the step (storage.hpp has the durability
// order). Every write goes through a private_dir of the checkpoint directory: files are created
// by name with O_EXCL and renamed with renameat, so no name another user planted is written
// through.
#pragma once

#include <stdio.h>
#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include <elastic/checkpoint/detail/retention.hpp>
#include <elastic/checkpoint/detail/step_files.hpp>
#include <elastic/checkpoint/format.hpp>
#include <elastic/checkpoint/staged_snapshot.hpp>
#include <elastic/checkpoint/state.hpp>
#include <elastic/internal/crc32c.hpp>
#include <elastic/internal/file.hpp>
#include <elastic/internal/private_dir.hpp>
#include <elastic/error.hpp>
#include <elastic/events.hpp>

namespace elastic::inline v1::checkpoint {

namespace fs = std::filesystem;

namespace storage {

/// Lays out `entries` as one rank's part of `step`: each entry at a multiple of data_alignment,
/// a CRC-32C per chunk of `chunk_bytes`; `write(bytes, n, offset)` is called with each chunk
/// right after its checksum (while it is in cache). Returns the part's manifest.
template <class Write>
format::rank_manifest lay_out_part(std::uint64_t step, int rank, int world_size, const std::string& run_id,
                                   std::span<const staged_entry> entries, std::uint64_t chunk_bytes, std::uint64_t epoch,
                                   Write&& write) {
  format::rank_manifest m;
  m.step = step;
  m.rank = rank;
  m.world_size = world_size;
  m.run_id = run_id;
  m.chunk_bytes = chunk_bytes;
  m.epoch = epoch;
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
      r.crc.push_back(internal::crc32c(p, n));
      write(p, n, offset + at);
    }
    offset += (r.bytes + data_alignment - 1) / data_alignment * data_alignment;
    m.entries.push_back(std::move(r));
  }
  m.data_bytes = offset;
  return m;
}

/// Writes this rank's part of `step` into the pending directory under `root`; durable when it
/// returns. Returns the number of bytes of the data file.
inline std::uint64_t write_rank_part(const internal::private_dir& root, std::uint64_t step, int rank,
                                     int world_size, const std::string& run_id, std::span<const staged_entry> entries,
                                     std::uint64_t chunk_bytes = default_chunk_bytes, std::uint64_t epoch = 0) {
  const auto pending = root.subdir(format::pending_dir_name(step));
  const std::string data_name = format::rank_data_name(rank);
  const fs::path data_path = pending / data_name;
  format::rank_manifest m;
  {
    auto fd = pending.create_file(data_name);
    m = lay_out_part(step, rank, world_size, run_id, entries, chunk_bytes, epoch,
                     [&](const std::byte* p, std::size_t n, std::uint64_t at) {
                       internal::pwrite_all(fd.get(), p, n, at, data_path);
                     });
    // Holes at the end would leave the file shorter than the manifest says.
    if (::ftruncate(fd.get(), static_cast<off_t>(m.data_bytes)) != 0) throw os_error("cannot size " + data_path.string());
    internal::fsync_fd(fd.get(), data_path);
  }
  pending.write_atomic(format::rank_manifest_name(rank), format::encode(m));
  return m.data_bytes;
}

/// Rank 0: once every rank's part of `step` is durable in the pending directory, writes the
/// step manifest and makes the step visible, and returns true. Waits at most `timeout` for the
/// other ranks, and not at all once `abandon` is raised (the group changed: a rank of the old
/// world may be gone): a part still missing then ends the wait at once and it returns false,
/// the step uncommitted and its pending directory left for retention to sweep. A part of
/// another world size or `epoch` (nonzero) is one an earlier world left for this step (a group
/// that went back to an older step writes it again): it is waited on as if missing.
inline bool commit_step(const internal::private_dir& root, const format::step_manifest& manifest,
                        std::chrono::milliseconds timeout, const event_log& events = {},
                        const std::atomic<bool>* abandon = nullptr, std::uint64_t epoch = 0) {
  const std::string pending_name = format::pending_dir_name(manifest.step);
  const auto pending = root.subdir(pending_name);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::milliseconds(1);
  for (int r = 0; r < manifest.world_size; ++r) {
    const std::string part = format::rank_manifest_name(r);
    std::string stale;  // what the part in the way is, when it is an earlier world's
    for (;;) {
      struct stat st {};
      if (::fstatat(pending.fd(), part.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
        const auto m = read_rank_manifest_at(pending.fd(), pending.path(), r);  // verified: a torn part must not commit
        if (m.step != manifest.step || m.run_id != manifest.run_id) {
          throw error(errc::mismatch, fmt::format("checkpoint step {}: rank {}'s part is of step {}, run '{}'; "
                                                  "expected step {}, run '{}'",
                                                  manifest.step, r, m.step, m.run_id, manifest.step, manifest.run_id));
        }
        if (m.world_size == manifest.world_size && (epoch == 0 || m.epoch == epoch)) break;
        stale = fmt::format(" (the part there is an earlier world's: world size {}, epoch {}; this one is {}, "
                            "epoch {})",
                            m.world_size, m.epoch, manifest.world_size, epoch);
      } else if (errno != ENOENT) {
        throw os_error("cannot look for " + (pending / part).string());
      }
      if (abandon && abandon->load(std::memory_order_acquire)) return false;
      if (std::chrono::steady_clock::now() >= deadline) {
        throw error(errc::timeout, fmt::format("checkpoint step {}: rank {} did not write its part within {} ms{}; "
                                               "the step stays uncommitted and the previous one is kept",
                                               manifest.step, r, timeout.count(), stale));
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::milliseconds(50));
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
      return true;
    }
    if (errno != EINVAL && errno != ENOSYS) {
      throw os_error("cannot exchange " + pending.path().string() + " with " + (root / final_name).string());
    }
    // No RENAME_EXCHANGE here: move the old step out of the way first.
    const std::string trash = format::removing_dir_name(manifest.step);
    internal::remove_tree_at(root.fd(), trash, root / trash);
    if (::renameat(root.fd(), final_name.c_str(), root.fd(), trash.c_str()) != 0 && errno != ENOENT) {
      throw os_error("cannot move " + (root / final_name).string() + " out of the way");
    }
    if (::renameat(root.fd(), pending_name.c_str(), root.fd(), final_name.c_str()) != 0) {
      throw os_error("cannot rename " + pending.path().string() + " to " + (root / final_name).string());
    }
    root.sync();
    remove_quietly(root, trash, events);
    return true;
  }
  if (::renameat(root.fd(), pending_name.c_str(), root.fd(), final_name.c_str()) != 0) {
    throw os_error("cannot rename " + pending.path().string() + " to " + (root / final_name).string());
  }
  root.sync();
  return true;
}

}  // namespace storage
}  // namespace elastic::inline v1::checkpoint
