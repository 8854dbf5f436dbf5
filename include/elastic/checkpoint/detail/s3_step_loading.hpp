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

/// Reads verified byte ranges of a step's data objects. read_range() only notes what is wanted;
/// flush() (stage_entries calls it) fetches it all: neighbouring ranges of a rank's object
/// joined into one ranged GET of up to a part's size (a model of many small tensors costs a few
/// requests, not one per tensor), a large range split into runs of that size, `connections` GETs
/// at a time, every chunk checked against its CRC-32C before it is copied where it was wanted.
class object_step_reader {
 public:
  object_step_reader(object_dir& dir, const opened_step& step) : dir_(dir), step_(step), checked_(step.parts.size()) {}

  void read_range(int r, const format::entry_record& rec, std::uint64_t from, std::uint64_t to, std::byte* out) {
    if (from < to) wants_.push_back({r, &rec, from, to, out});
  }

  void flush() {
    // Each want as runs of whole chunks (a chunk is the unit a checksum covers), each run at
    // most a part's size; then runs of one object that follow each other (across the
    // alignment gap between entries) joined while the whole stays within a part.
    const std::uint64_t part = dir_.transfer().part_bytes;
    std::vector<run> runs;
    for (const auto& w : wants_) {
      const std::uint64_t cb = step_.parts[static_cast<std::size_t>(w.rank)].chunk_bytes;
      const std::uint64_t per = std::max<std::uint64_t>(1, part / cb);
      for (std::uint64_t c = w.from / cb; c * cb < w.to; c += per) {
        const std::uint64_t end = std::min(c + per, (w.to + cb - 1) / cb);
        runs.push_back({&w, c, end, w.rec->offset + c * cb, w.rec->offset + std::min(end * cb, w.rec->bytes)});
      }
    }
    std::sort(runs.begin(), runs.end(), [](const run& a, const run& b) {
      return std::pair(a.of->rank, a.start) < std::pair(b.of->rank, b.start);
    });
    std::vector<std::pair<std::size_t, std::size_t>> fetches;  // [first, last) of `runs`
    for (std::size_t i = 0; i < runs.size(); ++i) {
      if (!fetches.empty()) {
        const auto& head = runs[fetches.back().first];
        const auto& prev = runs[i - 1];
        if (runs[i].of->rank == head.of->rank && runs[i].start >= prev.stop &&
            runs[i].start - prev.stop <= data_alignment && runs[i].stop - head.start <= part) {
          fetches.back().second = i + 1;
          continue;
        }
      }
      fetches.emplace_back(i, i + 1);
    }
    for (const auto& w : wants_) check_size(w.rank);
    parallel_for(fetches.size(), dir_.transfer().connections,
                 [&](std::size_t f) { fetch({runs.data() + fetches[f].first, runs.data() + fetches[f].second}); });
    wants_.clear();
  }

 private:
  struct want {
    int rank;
    const format::entry_record* rec;
    std::uint64_t from, to;  // bytes of the entry
    std::byte* out;
  };
  struct run {
    const want* of;
    std::uint64_t first, end;  // chunks [first, end) of the entry
    std::uint64_t start, stop;  // their bytes in the rank's data object
  };

  std::string data_name(int r) const { return step_.folder + format::rank_data_name(r); }

  /// One ranged GET for `runs` (of one object, in order): straight into the wanted place when
  /// it is one run of exactly the bytes wanted, else into a buffer they are copied from.
  void fetch(std::span<const run> runs) {
    const run& head = runs.front();
    const want& w = *head.of;
    const std::string name = data_name(w.rank);
    const std::uint64_t start = head.start, stop = runs.back().stop;
    const std::uint64_t cb = step_.parts[static_cast<std::size_t>(w.rank)].chunk_bytes;
    const bool direct = runs.size() == 1 && head.first * cb >= w.from && head.stop - w.rec->offset <= w.to;
    std::vector<std::byte> buffer;
    std::byte* got = direct ? w.out + (head.first * cb - w.from) : nullptr;
    if (!direct) {
      buffer.resize(static_cast<std::size_t>(stop - start));
      got = buffer.data();
    }
    dir_.client().get_range(name, start, {got, static_cast<std::size_t>(stop - start)});
    for (const auto& rn : runs) {
      const auto& rec = *rn.of->rec;
      const std::byte* at = got + (rn.start - start);  // the run's first chunk
      for (std::uint64_t c = rn.first; c < rn.end; ++c) {
        const std::uint64_t c0 = c * cb, c1 = std::min(c0 + cb, rec.bytes);
        const std::uint32_t crc = internal::crc32c(at + (c0 - rn.first * cb), static_cast<std::size_t>(c1 - c0));
        if (crc != rec.crc[static_cast<std::size_t>(c)]) {
          throw error(errc::corrupt, fmt::format("{}: entry '{}' bytes {}..{} fail their checksum (stored {:08x}, read "
                                                 "{:08x})",
                                                 dir_.url_of(name), rec.name, c0, c1,
                                                 rec.crc[static_cast<std::size_t>(c)], crc));
        }
      }
      if (direct) continue;
      const std::uint64_t a = std::max(rn.of->from, rn.first * cb), b = std::min(rn.of->to, rn.stop - rec.offset);
      std::memcpy(rn.of->out + (a - rn.of->from), at + (a - rn.first * cb), static_cast<std::size_t>(b - a));
    }
  }

  /// Rank `r`'s data object, checked against its manifest's size once.
  void check_size(int r) {
    if (checked_[static_cast<std::size_t>(r)]) return;
    const auto& part = step_.parts[static_cast<std::size_t>(r)];
    const std::string name = data_name(r);
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
  std::vector<want> wants_;
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
