// The on-disk format of docs/design.md: names, manifests and their JSON.
//
//   DIR/step-000000000100/         a committed step: visible only once complete and durable
//       manifest.json              step, world size, run id, user metadata, the ranks' parts
//       rank-00000.json            one rank's entries: name, dtype, shape, offset, crc32c per chunk
//       rank-00000.data            that rank's bytes, each entry at a 4 KiB-aligned offset
//   DIR/.pending-step-000000000200/  a step being written; ignored by readers, swept later
//   DIR/.removing-step-000000000050/ a step being deleted by retention; swept later
//   DIR/corrupt-step-000000000300/   a step that could not be read, moved aside (never deleted)
//
// In object storage (s3://BUCKET/PREFIX, gs://...; detail/s3_steps.hpp) nothing is renamed:
//
//   PREFIX/step-000000000100/manifest.json          the commit: written last, only if absent
//   PREFIX/step-000000000100/job7-5f3a09c1-w4-e7/rank-00000.json  the parts of run job7 (and
//   PREFIX/step-000000000100/job7-5f3a09c1-w4-e7/rank-00000.data  its CRC-32C) in a world of 4,
//                                                   epoch 7; the manifest's "parts" names them
//   PREFIX/corrupt-step-000000000300/manifest.json  an unreadable step's manifest, moved aside
//                                                   (its parts are then never deleted)
//
// Every manifest ends with a "crc32c" field over the bytes before it, so a flipped byte in a
// manifest is caught like one in the data. Checksum: CRC-32C (Castagnoli), because x86-64 has
// an instruction for it (SSE4.2 crc32, > 10 GB/s, faster than any disk here) and it is the
// checksum ext4, iSCSI and most storage stacks use for the same job.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include <elastic/checkpoint/detail/sealed_json.hpp>
#include <elastic/checkpoint/dtype.hpp>
#include <elastic/checkpoint/state.hpp>
#include <elastic/internal/json.hpp>
#include <elastic/error.hpp>

namespace elastic::inline v1::checkpoint {

/// The format this build writes; it reads this one and older.
inline constexpr std::int64_t format_version = 1;
/// Checksummed unit of a data file: small enough to verify a resharded read without reading
/// whole buffers, large enough that the list of checksums stays short.
inline constexpr std::uint64_t default_chunk_bytes = 4u << 20;
/// Entries start at multiples of this in a data file (page-aligned reads and writes).
inline constexpr std::uint64_t data_alignment = 4096;

namespace format {

inline std::string step_dir_name(std::uint64_t step) { return fmt::format("step-{:012}", step); }
inline std::string pending_dir_name(std::uint64_t step) { return fmt::format(".pending-step-{:012}", step); }
inline std::string rank_manifest_name(int rank) { return fmt::format("rank-{:05}.json", rank); }
inline std::string rank_data_name(int rank) { return fmt::format("rank-{:05}.data", rank); }
inline constexpr std::string_view step_manifest_name = "manifest.json";
/// Where retention moves a step before deleting its files: a crash half-way leaves this name
/// (swept later), never a half-deleted step that a reader would take for a corrupt one.
inline std::string removing_dir_name(std::uint64_t step) { return fmt::format(".removing-step-{:012}", step); }
inline constexpr std::string_view removing_prefix = ".removing-";
/// Files that show a checkpoint directory is writable (made and removed at once; swept).
inline constexpr std::string_view probe_prefix = ".elastic-probe-";
/// Where an unreadable step is moved aside; `attempt` > 1 when that name is taken.
inline std::string quarantine_dir_name(std::uint64_t step, int attempt = 1) {
  return attempt <= 1 ? fmt::format("corrupt-step-{:012}", step) : fmt::format("corrupt-step-{:012}-{}", step, attempt);
}

/// The step number of a directory name `step-<12 digits>` (or `.pending-step-...` with
/// `pending`), or nothing for any other name.
inline std::optional<std::uint64_t> parse_step_dir(std::string_view name, bool pending = false) {
  const std::string_view prefix = pending ? ".pending-step-" : "step-";
  if (name.size() != prefix.size() + 12 || name.substr(0, prefix.size()) != prefix) return std::nullopt;
  std::uint64_t v = 0;
  for (char c : name.substr(prefix.size())) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + static_cast<std::uint64_t>(c - '0');
  }
  return v;
}

/// One entry of one rank's part.
struct entry_record {
  std::string name;
  entry_kind kind = entry_kind::buffer;
  dtype type = dtype::bytes;
  std::uint64_t element_bytes = 1;
  std::vector<std::uint64_t> shape;
  location where = location::host;
  std::uint64_t bytes = 0;
  std::uint64_t offset = 0;  ///< in the data file
  std::optional<shard_range> shard;
  std::vector<std::uint32_t> crc;  ///< one per chunk of chunk_bytes (the last may be short)
};

/// One rank's part of a step.
struct rank_manifest {
  std::int64_t version = format_version;
  std::uint64_t step = 0;
  int rank = 0;
  int world_size = 1;
  std::string run_id;
  std::uint64_t data_bytes = 0;
  std::uint64_t chunk_bytes = default_chunk_bytes;
  /// Which incarnation of the world wrote it (an elastic group's round; 0: none said): a step
  /// is committed only from parts of one incarnation, never from one an earlier world left.
  std::uint64_t epoch = 0;
  std::vector<entry_record> entries;

  [[nodiscard]] const entry_record* find(std::string_view name) const noexcept {
    for (const auto& e : entries)
      if (e.name == name) return &e;
    return nullptr;
  }
};

/// The step as a whole, written by rank 0 once every rank's part is durable.
struct step_manifest {
  std::int64_t version = format_version;
  std::uint64_t step = 0;
  int world_size = 1;
  std::string run_id;
  std::string time;  ///< RFC 3339, UTC
  std::map<std::string, std::string> metadata;
  /// Object storage: the folder of the step that holds the parts committed (empty in a POSIX
  /// directory, where the parts sit beside the manifest).
  std::string parts;
};

inline std::string_view to_string(entry_kind k) noexcept {
  return k == entry_kind::buffer ? "buffer" : k == entry_kind::value ? "value" : "object";
}
inline entry_kind kind_from_string(std::string_view s) {
  if (s == "buffer") return entry_kind::buffer;
  if (s == "value") return entry_kind::value;
  if (s == "object") return entry_kind::object;
  throw error(errc::corrupt, "unknown entry kind '" + std::string(s) + "' in checkpoint manifest");
}


/// Refuses a manifest written by a newer format than this build reads.
inline void check_version(std::int64_t v, const std::string& what) {
  if (v > format_version || v < 1) {
    throw error(errc::version_mismatch,
                fmt::format("{} has format version {}; this build of elastic {} reads versions 1 to {}: "
                            "{}",
                            what, v, ELASTIC_VERSION_STRING, format_version,
                            v > format_version ? "upgrade elastic to read it" : "the file is damaged"));
  }
}

inline std::string encode(const rank_manifest& m) {
  using internal::json;
  json doc;
  doc["format"] = "elastic-checkpoint-rank";
  doc["version"] = m.version;
  doc["step"] = m.step;
  doc["rank"] = m.rank;
  doc["world_size"] = m.world_size;
  doc["run_id"] = m.run_id;
  doc["data_file"] = rank_data_name(m.rank);
  doc["data_bytes"] = m.data_bytes;
  doc["chunk_bytes"] = m.chunk_bytes;
  if (m.epoch != 0) doc["epoch"] = m.epoch;
  json entries = json::array();
  for (const auto& e : m.entries) {
    json j;
    j["name"] = e.name;
    j["kind"] = std::string(to_string(e.kind));
    j["dtype"] = std::string(to_string(e.type));
    j["element_bytes"] = e.element_bytes;
    json shape = json::array();
    for (auto d : e.shape) shape.push_back(d);
    j["shape"] = std::move(shape);
    j["location"] = e.where == location::device ? "device" : "host";
    j["bytes"] = e.bytes;
    j["offset"] = e.offset;
    if (e.shard) {
      json s;
      s["offset"] = e.shard->offset;
      s["global_count"] = e.shard->global_count;
      j["shard"] = std::move(s);
    }
    json crc = json::array();
    for (auto c : e.crc) crc.push_back(c);
    j["crc32c"] = std::move(crc);
    entries.push_back(std::move(j));
  }
  doc["entries"] = std::move(entries);
  return detail::seal(doc);
}

/// Runs `decode`; an error that does not name `what` (a JSON error deep inside) is given its name.
template <class F>
auto naming_errors(const std::string& what, F&& decode) {
  try {
    return decode();
  } catch (const error& e) {
    if (e.message().find(what) != std::string::npos) throw;
    throw error(e.code(), what + ": " + e.message(), e.os_code());
  }
}

inline rank_manifest decode_rank(std::string_view text, const std::string& what) {
  return naming_errors(what, [&] {
    const auto doc = detail::unseal(text, what);
    rank_manifest m;
    if (doc.at("format").as_string() != "elastic-checkpoint-rank") {
      throw error(errc::corrupt, what + " is not a rank manifest of an elastic checkpoint");
    }
    m.version = doc.at("version").as_int64();
    check_version(m.version, what);
    m.step = doc.at("step").as_uint64();
    m.rank = static_cast<int>(doc.at("rank").as_int64());
    m.world_size = static_cast<int>(doc.at("world_size").as_int64());
    m.run_id = doc.at("run_id").as_string();
    m.data_bytes = doc.at("data_bytes").as_uint64();
    m.chunk_bytes = doc.at("chunk_bytes").as_uint64();
    if (m.chunk_bytes == 0) throw error(errc::corrupt, what + " has a chunk size of 0");
    if (const auto* e = doc.find("epoch")) m.epoch = e->as_uint64();
    for (const auto& j : doc.at("entries").elements()) {
      entry_record e;
      e.name = j.at("name").as_string();
      e.kind = kind_from_string(j.at("kind").as_string());
      e.type = dtype_from_string(j.at("dtype").as_string());
      e.element_bytes = j.at("element_bytes").as_uint64();
      for (const auto& d : j.at("shape").elements()) e.shape.push_back(d.as_uint64());
      e.where = j.at("location").as_string() == "device" ? location::device : location::host;
      e.bytes = j.at("bytes").as_uint64();
      e.offset = j.at("offset").as_uint64();
      if (const auto* s = j.find("shard")) e.shard = shard_range{s->at("offset").as_uint64(), s->at("global_count").as_uint64()};
      for (const auto& c : j.at("crc32c").elements()) e.crc.push_back(static_cast<std::uint32_t>(c.as_uint64()));
      const std::uint64_t chunks = (e.bytes + m.chunk_bytes - 1) / m.chunk_bytes;
      if (e.crc.size() != chunks || e.offset > m.data_bytes || e.bytes > m.data_bytes - e.offset) {
        throw error(errc::corrupt, fmt::format("{}: entry '{}' does not fit its data file ({} bytes at {}, {} checksums)",
                                               what, e.name, e.bytes, e.offset, e.crc.size()));
      }
      m.entries.push_back(std::move(e));
    }
    return m;
  });
}

inline std::string encode(const step_manifest& m) {
  using internal::json;
  json doc;
  doc["format"] = "elastic-checkpoint";
  doc["version"] = m.version;
  doc["step"] = m.step;
  doc["world_size"] = m.world_size;
  doc["run_id"] = m.run_id;
  doc["time"] = m.time;
  json meta = json::object();
  for (const auto& [k, v] : m.metadata) meta[k] = v;
  doc["metadata"] = std::move(meta);
  if (!m.parts.empty()) doc["parts"] = m.parts;
  return detail::seal(doc);
}

inline step_manifest decode_step(std::string_view text, const std::string& what) {
  return naming_errors(what, [&] {
    const auto doc = detail::unseal(text, what);
    step_manifest m;
    if (doc.at("format").as_string() != "elastic-checkpoint") {
      throw error(errc::corrupt, what + " is not the manifest of an elastic checkpoint");
    }
    m.version = doc.at("version").as_int64();
    check_version(m.version, what);
    m.step = doc.at("step").as_uint64();
    m.world_size = static_cast<int>(doc.at("world_size").as_int64());
    if (m.world_size < 1 || m.world_size > (1 << 20)) throw error(errc::corrupt, what + " has an impossible world size");
    m.run_id = doc.at("run_id").as_string();
    m.time = doc.at("time").as_string();
    for (const auto& [k, v] : doc.at("metadata").items()) m.metadata[k] = v.as_string();
    if (const auto* p = doc.find("parts")) m.parts = p->as_string();
    return m;
  });
}

}  // namespace format
}  // namespace elastic::inline v1::checkpoint
