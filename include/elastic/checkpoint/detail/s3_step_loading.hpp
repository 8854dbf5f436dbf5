// Reading checkpoint steps from object storage (the layout in format.hpp, the writing in
// s3_steps.hpp): a step's manifest and parts fetched and verified, its data read by ranged GETs
// of whole chunks, several at a time, each checked against its CRC-32C before the caller's state
// changes. Needs libcurl (elastic::s3).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <elastic/checkpoint/detail/s3_steps.hpp>
#include <elastic/checkpoint/detail/step_loading.hpp>
#include <elastic/checkpoint/format.hpp>
#include <elastic/checkpoint/state.hpp>
#include <elastic/error.hpp>
#include <elastic/events.hpp>
#include <elastic/internal/crc32c.hpp>

namespace elastic::inline v1::checkpoint::detail::objects {

/// A committed step's manifest and its ranks' parts, read and verified.
struct opened_step {
  format::step_manifest manifest;
  std::vector<format::rank_manifest> parts;
  std::string folder;  ///< step-N/PARTS/
};

inline opened_step open_step(object_dir& dir, std::uint64_t step) {
  auto& c = dir.client();
  const std::string name = object_dir::manifest_name(step);
  const auto text = c.get(name);
  if (!text) throw error(errc::not_found, dir.url_of(name) + " is not there");
  opened_step o;
  o.manifest = format::decode_step(*text, dir.url_of(name));
  if (o.manifest.step != step) {
    throw error(errc::corrupt, fmt::format("{} is the manifest of step {}", dir.url_of(name), o.manifest.step));
  }
  if (o.manifest.parts.empty() || o.manifest.parts.find('/') != std::string::npos) {
    throw error(errc::corrupt, fmt::format("{} names no parts folder", dir.url_of(name)));
  }
  o.folder = format::step_dir_name(step) + "/" + o.manifest.parts + "/";
  o.parts.resize(static_cast<std::size_t>(o.manifest.world_size));
  parallel_for(o.parts.size(), dir.transfer().connections, [&](std::size_t r) {
    const std::string part = o.folder + format::rank_manifest_name(static_cast<int>(r));
    const auto t = c.get(part);
    if (!t) throw error(errc::corrupt, fmt::format("{} is missing: rank {}'s part is not there", dir.url_of(part), r));
    o.parts[r] = format::decode_rank(*t, dir.url_of(part));
    const auto& m = o.parts[r];
    if (m.step != step || m.rank != static_cast<int>(r) || m.run_id != o.manifest.run_id ||
        m.world_size != o.manifest.world_size) {
      throw error(errc::corrupt, fmt::format("{} is not rank {}'s part of step {} of run '{}'", dir.url_of(part), r, step,
                                             o.manifest.run_id));
    }
  });
  return o;
}

/// Reads verified byte ranges of a step's data objects: whole chunks by ranged GETs,
/// `connections` at a time, each checked against its CRC-32C.
class object_step_reader {
 public:
  object_step_reader(object_dir& dir, const opened_step& step) : dir_(dir), step_(step), checked_(step.parts.size()) {}

  void read_range(int r, const format::entry_record& rec, std::uint64_t from, std::uint64_t to, std::byte* out) {
    const auto& part = step_.parts[static_cast<std::size_t>(r)];
    const std::string name = step_.folder + format::rank_data_name(r);
    check_size(r, name, part);
    const std::uint64_t cb = part.chunk_bytes;
    // One GET per run of whole chunks of about a part's size: fewer, larger requests stream
    // better than one per chunk; each chunk in it is still verified on its own.
    const std::uint64_t per = std::max<std::uint64_t>(1, dir_.transfer().part_bytes / cb);
    struct job {
      std::uint64_t first, end;  // chunks [first, end)
      std::uint64_t b0, b1;      // their bytes in the entry
      std::vector<std::byte> partial;  // when the run reaches outside [from, to): fetched whole here
    };
    std::vector<job> jobs;
    for (std::uint64_t c = from / cb; c * cb < to; c += per) {
      job j{c, 0, c * cb, 0, {}};
      j.end = std::min(c + per, (to + cb - 1) / cb);
      j.b1 = std::min(j.end * cb, rec.bytes);
      if (j.b0 < from || j.b1 > to) j.partial.resize(static_cast<std::size_t>(j.b1 - j.b0));
      jobs.push_back(std::move(j));
    }
    parallel_for(jobs.size(), dir_.transfer().connections, [&](std::size_t i) {
      auto& j = jobs[i];
      std::byte* buf = j.partial.empty() ? out + (j.b0 - from) : j.partial.data();
      dir_.client().get_range(name, rec.offset + j.b0, {buf, static_cast<std::size_t>(j.b1 - j.b0)});
      for (std::uint64_t c = j.first; c < j.end; ++c) {
        const std::uint64_t c0 = c * cb, c1 = std::min(c0 + cb, rec.bytes);
        const std::uint32_t crc = internal::crc32c(buf + (c0 - j.b0), static_cast<std::size_t>(c1 - c0));
        if (crc != rec.crc[static_cast<std::size_t>(c)]) {
          throw error(errc::corrupt, fmt::format("{}: entry '{}' bytes {}..{} fail their checksum (stored {:08x}, read "
                                                 "{:08x})",
                                                 dir_.url_of(name), rec.name, c0, c1, rec.crc[static_cast<std::size_t>(c)],
                                                 crc));
        }
      }
    });
    for (auto& j : jobs) {
      if (j.partial.empty()) continue;
      const std::uint64_t a = std::max(from, j.b0), b = std::min(to, j.b1);
      std::memcpy(out + (a - from), j.partial.data() + (a - j.b0), static_cast<std::size_t>(b - a));
    }
  }

 private:
  /// Rank `r`'s data object, checked against its manifest's size once.
  void check_size(int r, const std::string& name, const format::rank_manifest& part) {
    if (checked_[static_cast<std::size_t>(r)]) return;
    const auto size = dir_.client().size_of(name);
    if (!size) throw error(errc::corrupt, fmt::format("{} is missing: rank {}'s data is not there", dir_.url_of(name), r));
    if (*size < part.data_bytes) {
      throw error(errc::corrupt, fmt::format("{} is {} bytes, shorter than the {} its manifest describes (truncated)",
                                             dir_.url_of(name), *size, part.data_bytes));
    }
    checked_[static_cast<std::size_t>(r)] = true;
  }

  object_dir& dir_;
  const opened_step& step_;
  std::vector<bool> checked_;
};

/// Loads committed step `step` into `st` as rank `rank`; storage::load_step_at's contract.
inline format::step_manifest load_step(object_dir& dir, std::uint64_t step, const state& st, int rank,
                                       std::span<std::byte> scratch = {}) {
  const auto opened = open_step(dir, step);
  const int home_rank = rank < opened.manifest.world_size ? rank : 0;
  const std::filesystem::path shown = dir.url_of(format::step_dir_name(step));
  check_fits_state(st, opened.parts[static_cast<std::size_t>(home_rank)], shown);
  object_step_reader reader(dir, opened);
  const auto staged = stage_entries(st, reader, opened.parts, home_rank, shown, scratch);
  apply_staged(st, staged.entries);  // everything verified: now the caller's state changes
  return opened.manifest;
}

/// storage::restore_newest_at for object storage.
inline std::optional<format::step_manifest> restore_newest(object_dir& dir, const state& st, int rank,
                                                           const event_log& events, std::span<std::byte> scratch,
                                                           std::vector<std::pair<std::uint64_t, error>>* skipped) {
  for (const auto step : list_steps(dir)) {
    try {
      return load_step(dir, step, st, rank, scratch);
    } catch (const error& e) {
      if (e.code() == errc::mismatch || e.code() == errc::unavailable || e.code() == errc::invalid_argument) throw;
      events.emit("checkpoint_skipped", {{"step", step},
                                         {"dir", dir.url_of(format::step_dir_name(step))},
                                         {"code", to_string(e.code())},
                                         {"reason", e.what()}});
      if (skipped) skipped->emplace_back(step, e);
    }
  }
  return std::nullopt;
}

}  // namespace elastic::inline v1::checkpoint::detail::objects
