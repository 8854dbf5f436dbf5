// The steps of loading one committed checkpoint step (storage::load_step_at): check that the
// step fits the registered state, read and verify every entry's bytes into staging, then copy
// the staged bytes into the state. Nothing touches the caller's state before everything has
// been read and verified, so a corrupt step leaves it as it was.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include <fmt/format.h>

#include <elastic/checkpoint/detail/host_memory.hpp>
#include <elastic/checkpoint/format.hpp>
#include <elastic/checkpoint/state.hpp>
#include <elastic/internal/crc32c.hpp>
#include <elastic/internal/cuda.hpp>
#include <elastic/internal/file.hpp>
#include <elastic/error.hpp>

namespace elastic::inline v1::checkpoint::detail {

/// Throws errc::mismatch listing every way step `sdir` (its part `home`) does not fit `st`: an
/// entry missing, renamed, retyped or resized. All at once, so one fix-and-retry suffices.
inline void check_fits_state(const state& st, const format::rank_manifest& home, const std::filesystem::path& sdir) {
  std::vector<std::string> problems;
  for (const auto& e : st.entries()) {
    const auto* r = home.find(e.name);
    if (!r) {
      problems.push_back(fmt::format("'{}' is registered but not in the checkpoint", e.name));
    } else if (r->kind != e.kind) {
      problems.push_back(fmt::format("'{}' is a {} here but a {} in the checkpoint", e.name, format::to_string(e.kind),
                                     format::to_string(r->kind)));
    } else if (e.kind != entry_kind::object && (r->type != e.type || r->element_bytes != e.element_bytes)) {
      problems.push_back(fmt::format("'{}' holds {} ({} bytes) here but {} ({} bytes) in the checkpoint", e.name,
                                     to_string(e.type), e.element_bytes, to_string(r->type), r->element_bytes));
    } else if (e.shard.has_value() != r->shard.has_value()) {
      problems.push_back(fmt::format("'{}' is {} here but {} in the checkpoint", e.name, e.shard ? "sharded" : "replicated",
                                     r->shard ? "sharded" : "replicated"));
    } else if (e.shard && e.shard->global_count != r->shard->global_count) {
      problems.push_back(fmt::format("'{}' has {} global elements here but {} in the checkpoint", e.name,
                                     e.shard->global_count, r->shard->global_count));
    } else if (!e.shard && e.kind != entry_kind::object && r->bytes != e.bytes) {
      problems.push_back(fmt::format("'{}' is {} bytes here but {} in the checkpoint", e.name, e.bytes, r->bytes));
    }
  }
  for (const auto& r : home.entries) {
    if (!st.find(r.name)) problems.push_back(fmt::format("'{}' is in the checkpoint but not registered", r.name));
  }
  if (!problems.empty()) {
    std::string msg = fmt::format("checkpoint {} does not match the registered state:", sdir.string());
    for (const auto& p : problems) msg += "\n  " + p;
    msg += "\nregister the same entries as the run that wrote it, or start from another directory";
    throw error(errc::mismatch, msg);
  }
}

/// Reads verified byte ranges of a step's rank data files, opening each file once, on first use.
class step_reader {
 public:
  /// `stepfd`: the opened step directory (shown as `sdir`); `parts`: its rank manifests.
  step_reader(int stepfd, const std::filesystem::path& sdir, const std::vector<format::rank_manifest>& parts)
      : stepfd_(stepfd), sdir_(sdir), parts_(parts), files_(parts.size()) {}

  /// Reads are done at once (flush() has nothing left to do).
  void flush() noexcept {}

  /// Reads bytes [from, to) of record `rec` of rank `r` into `out`, verifying every chunk it
  /// touches. One reader in file order: the kernel's readahead (asked for in file()) keeps the
  /// disk streaming while we verify. (Two reader threads measured slower here, 0.42-0.77 of a
  /// plain read against 0.77-0.80: they interleave offsets on one file and defeat readahead.)
  void read_range(int r, const format::entry_record& rec, std::uint64_t from, std::uint64_t to, std::byte* out) {
    const std::uint64_t cb = parts_[static_cast<std::size_t>(r)].chunk_bytes;
    const std::filesystem::path p = sdir_ / format::rank_data_name(r);
    for (std::uint64_t c = from / cb; c * cb < to; ++c) {
      const std::uint64_t c0 = c * cb, c1 = std::min(c0 + cb, rec.bytes);
      const std::uint64_t a = std::max(from, c0), b = std::min(to, c1);
      const bool whole = a == c0 && b == c1;
      std::byte* dst = out + (a - from);
      if (!whole) {
        partial_.resize(static_cast<std::size_t>(c1 - c0));
        dst = partial_.data();
      }
      internal::pread_all(file(r), dst, static_cast<std::size_t>(c1 - c0), rec.offset + c0, p);
      const std::uint32_t crc = internal::crc32c(dst, static_cast<std::size_t>(c1 - c0));
      if (crc != rec.crc[static_cast<std::size_t>(c)]) {
        throw error(errc::corrupt, fmt::format("{}: entry '{}' bytes {}..{} fail their checksum (stored {:08x}, read {:08x})",
                                               p.string(), rec.name, c0, c1, rec.crc[static_cast<std::size_t>(c)], crc));
      }
      if (!whole) std::memcpy(out + (a - from), partial_.data() + (a - c0), static_cast<std::size_t>(b - a));
    }
  }

 private:
  /// Rank `r`'s data file, opened and checked against its manifest's size on first use.
  int file(int r) {
    auto& f = files_[static_cast<std::size_t>(r)];
    if (f) return f.get();
    const std::filesystem::path p = sdir_ / format::rank_data_name(r);
    try {
      f = internal::open_regular_at(stepfd_, format::rank_data_name(r), p);
    } catch (const error& e) {
      if (e.os_code() == std::errc::no_such_file_or_directory) {
        throw error(errc::corrupt, p.string() + " is missing: rank " + std::to_string(r) + "'s data is not there");
      }
      throw;
    }
    struct stat sb {};
    if (::fstat(f.get(), &sb) != 0) throw os_error("cannot stat " + p.string());
    if (static_cast<std::uint64_t>(sb.st_size) < parts_[static_cast<std::size_t>(r)].data_bytes) {
      throw error(errc::corrupt, fmt::format("{} is {} bytes, shorter than the {} its manifest describes (truncated)",
                                             p.string(), sb.st_size, parts_[static_cast<std::size_t>(r)].data_bytes));
    }
    // Let the disk stream ahead while we verify and copy what has arrived.
    ::posix_fadvise(f.get(), 0, 0, POSIX_FADV_SEQUENTIAL);
    ::posix_fadvise(f.get(), 0, 0, POSIX_FADV_WILLNEED);
    return f.get();
  }

  int stepfd_;
  const std::filesystem::path& sdir_;
  const std::vector<format::rank_manifest>& parts_;
  std::vector<internal::unique_fd> files_;
  std::vector<std::byte> partial_;  // a chunk only partly wanted is verified whole here
};

/// Reassembles sharded entry `e`'s elements [offset, offset + count) into `out` from the slices
/// of every old rank that overlaps them; throws errc::corrupt when they do not cover it.
/// `Reader`: step_reader, or any reader with its read_range (object storage's).
template <class Reader>
void read_shard(Reader& reader, const entry& e, const std::vector<format::rank_manifest>& parts,
                       const std::filesystem::path& sdir, std::byte* out) {
  const std::uint64_t eb = e.element_bytes, lo = e.shard->offset, hi = lo + e.bytes / eb;
  std::uint64_t covered = 0;
  for (int r = 0; r < static_cast<int>(parts.size()); ++r) {
    const auto* src = parts[static_cast<std::size_t>(r)].find(e.name);
    if (!src || !src->shard) throw error(errc::corrupt, fmt::format("{}: rank {} has no slice of '{}'", sdir.string(), r, e.name));
    const std::uint64_t so = src->shard->offset, sn = src->bytes / eb;
    const std::uint64_t a = std::max(lo, so), b = std::min(hi, so + sn);
    if (a >= b) continue;
    reader.read_range(r, *src, (a - so) * eb, (b - so) * eb, out + (a - lo) * eb);
    covered += b - a;
  }
  if (covered != hi - lo) {
    throw error(errc::corrupt, fmt::format("{}: the slices of '{}' cover {} of the {} elements [{}, {})", sdir.string(),
                                           e.name, covered, hi - lo, lo, hi));
  }
}

/// Every entry's bytes, read and verified, in registration order; `memory` owns them unless
/// the caller's scratch was large enough.
struct staged_state {
  host_memory memory;
  std::vector<std::span<const std::byte>> entries;
};

/// Reads and verifies every entry of `st` from the step: replicated ones from part `home_rank`,
/// sharded ones reassembled from every part. Uses `scratch` when it is large enough.
template <class Reader>
staged_state stage_entries(const state& st, Reader& reader, const std::vector<format::rank_manifest>& parts,
                                  int home_rank, const std::filesystem::path& sdir, std::span<std::byte> scratch) {
  const auto& home = parts[static_cast<std::size_t>(home_rank)];
  std::uint64_t total = 0;
  for (const auto& e : st.entries()) total += e.kind == entry_kind::object ? home.find(e.name)->bytes : e.bytes;
  staged_state staged;
  std::byte* at = scratch.data();
  if (scratch.size() < total) {
    staged.memory = host_memory(static_cast<std::size_t>(total), st.has_device_entries());
    at = staged.memory.data();
  }
  for (const auto& e : st.entries()) {
    const auto* rec = home.find(e.name);
    const std::uint64_t n = e.kind == entry_kind::object ? rec->bytes : e.bytes;
    if (!e.shard) {
      reader.read_range(home_rank, *rec, 0, n, at);
    } else {
      read_shard(reader, e, parts, sdir, at);
    }
    staged.entries.emplace_back(at, static_cast<std::size_t>(n));
    at += n;
  }
  reader.flush();  // a reader that gathers its reads (object storage's) does them now
  return staged;
}

/// Copies verified staged bytes into the caller's state: the only step that changes it.
inline void apply_staged(const state& st, const std::vector<std::span<const std::byte>>& staged) {
  for (std::size_t i = 0; i < st.entries().size(); ++i) {
    const auto& e = st.entries()[i];
    if (e.kind == entry_kind::object) {
      e.load(staged[i]);
    } else if (e.where == location::device) {
      internal::cuda::copy_to_device(e.data, staged[i].data(), staged[i].size());
    } else if (!staged[i].empty()) {
      std::memcpy(e.data, staged[i].data(), staged[i].size());
    }
  }
}

}  // namespace elastic::inline v1::checkpoint::detail
