// Checkpoint steps in object storage (s3://BUCKET/PREFIX, gs://BUCKET/PREFIX; the layout is in
// format.hpp): what storage.hpp does for a POSIX directory, without rename, which object stores
// do not have. Needs libcurl (elastic::s3, ELASTIC_WITH_S3).
//
// The commit: each rank uploads its data (one object; a multipart upload of parallel parts
// when large), then its rank manifest, both under the step's parts folder (the run id, the
// world size and the epoch: RUN-CRC-w<world>-e<epoch>).
// Rank 0 lists that folder until every rank's manifest is there and verifies each, then writes
// step-N/manifest.json with If-None-Match: * (so of two writers only one commits) naming the
// folder it took. Readers see a step only once its manifest is there, and check every chunk's
// CRC-32C; the server checks each upload's CRC-32C too (AWS, GCS) before it stores it.
//
// Retention deletes a step's manifest first, then its parts, so a crash half-way leaves parts
// without a manifest: invisible, and swept (with multipart uploads left open) once a newer
// step is kept. An unreadable step's manifest is copied to corrupt-step-N/ and deleted; its
// parts are kept from then on.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include <elastic/checkpoint/detail/object_location.hpp>
#include <elastic/checkpoint/detail/s3_client.hpp>
#include <elastic/checkpoint/detail/s3_credentials.hpp>
#include <elastic/checkpoint/detail/step_commit.hpp>
#include <elastic/checkpoint/detail/step_loading.hpp>
#include <elastic/checkpoint/format.hpp>
#include <elastic/checkpoint/staged_snapshot.hpp>
#include <elastic/checkpoint/state.hpp>
#include <elastic/error.hpp>
#include <elastic/events.hpp>
#include <elastic/internal/crc32c.hpp>
#include <elastic/internal/env.hpp>

namespace elastic::inline v1::checkpoint::detail::objects {

/// How steps move: uploads larger than `part_bytes` go as multipart uploads of that part size,
/// `connections` parts (or download ranges) at a time.
struct transfer_options {
  std::uint64_t part_bytes = 16u << 20;
  int connections = 8;

  /// The defaults, or ELASTIC_S3_PART_BYTES (5 MiB, S3's least, to 5 GiB) and
  /// ELASTIC_S3_CONNECTIONS (1 to 64) where set; a malformed value is an error naming it.
  static transfer_options from_env() {
    transfer_options t;
    if (auto v = internal::env_int("ELASTIC_S3_PART_BYTES", 5ll << 20, 5ll << 30)) t.part_bytes = static_cast<std::uint64_t>(*v);
    if (auto v = internal::env_int("ELASTIC_S3_CONNECTIONS", 1, 64)) t.connections = static_cast<int>(*v);
    return t;
  }
};

/// A checkpoint directory in object storage: the client and the names of the layout.
class object_dir {
 public:
  /// Resolves `url`'s endpoint and region (object_location.hpp) and its keys (s3_credentials.hpp)
  /// from the environment.
  explicit object_dir(std::string_view url, client_options client = {},
                      transfer_options transfer = transfer_options::from_env())
      : object_dir(parse_location(url), nullptr, client, transfer) {}
  /// `where` with the given keys (tests, tools).
  object_dir(location where, sigv4::credentials keys, client_options client = {}, transfer_options transfer = {})
      : object_dir(std::move(where), std::make_shared<credential_source>(std::move(keys)), client, transfer) {}

  [[nodiscard]] s3_client& client() noexcept { return client_; }
  [[nodiscard]] const transfer_options& transfer() const noexcept { return transfer_; }
  /// scheme://BUCKET/PREFIX/name, for messages and events.
  [[nodiscard]] std::string url_of(std::string_view name) const { return client_.url_of(name); }

  static std::string manifest_name(std::uint64_t step) {
    return format::step_dir_name(step) + "/" + std::string(format::step_manifest_name);
  }
  /// The folder of a step's parts written by run `run_id` in a world of `world_size`, epoch
  /// `epoch`: another run (a second job given the same directory) or another world never
  /// writes over the parts a committed manifest names.
  static std::string parts_folder(std::string_view run_id, int world_size, std::uint64_t epoch) {
    std::string safe;
    for (const char c : run_id.substr(0, 48)) {
      const bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
                         c == '_' || c == '.';
      safe.push_back(plain ? c : '_');
    }
    if (safe.empty() || safe.front() == '.') safe.insert(0, "run");
    return fmt::format("{}-{:08x}-w{}-e{}", safe, internal::crc32c(run_id.data(), run_id.size()), world_size, epoch);
  }
  static std::string part_name(std::uint64_t step, std::string_view folder, std::string_view file) {
    return fmt::format("{}/{}/{}", format::step_dir_name(step), folder, file);
  }

 private:
  /// `keys`: nothing to resolve them from the environment.
  object_dir(location where, std::shared_ptr<credential_source> keys, client_options client, transfer_options transfer)
      : client_(where, keys ? std::move(keys) : std::make_shared<credential_source>(where), client),
        transfer_(transfer) {
    if (transfer_.part_bytes < (5u << 20) || transfer_.connections < 1) {
      throw error(errc::invalid_argument, "object storage: parts must be at least 5 MiB (S3's minimum), connections >= 1");
    }
  }

  s3_client client_;
  transfer_options transfer_;
};

/// Runs f(0) ... f(n - 1) on up to `threads` threads; the first exception is rethrown once all
/// have stopped (the others stop taking work when one fails).
template <class F>
void parallel_for(std::size_t n, int threads, F&& f) {
  if (n == 0) return;
  if (n == 1 || threads <= 1) {
    for (std::size_t i = 0; i < n; ++i) f(i);
    return;
  }
  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr first;
  std::mutex mu;
  auto work = [&] {
    for (std::size_t i; !failed.load() && (i = next.fetch_add(1)) < n;) {
      try {
        f(i);
      } catch (...) {
        std::lock_guard lk(mu);
        if (!first) first = std::current_exception();
        failed = true;
      }
    }
  };
  {
    std::vector<std::jthread> pool;
    const std::size_t k = std::min<std::size_t>(n, static_cast<std::size_t>(threads)) - 1;
    try {
      for (std::size_t t = 0; t < k; ++t) pool.emplace_back(work);
    } catch (const std::system_error&) {
      // No thread to be had: the ones started and this one do the work.
    }
    work();
  }
  if (first) std::rethrow_exception(first);
}

/// Uploads `body` as object `name`: one PUT up to part_bytes, else a multipart upload of
/// parallel parts (aborted if any part fails, so nothing is left half-made on the server).
inline void upload(object_dir& dir, const std::string& name, const gather& body) {
  auto& c = dir.client();
  const std::uint64_t size = body.size(), part = dir.transfer().part_bytes;
  if (size <= part) {
    c.put(name, body);
    return;
  }
  const std::string id = c.start_upload(name);
  const std::size_t parts = static_cast<std::size_t>((size + part - 1) / part);
  std::vector<s3_client::part_done> done(parts);
  try {
    parallel_for(parts, dir.transfer().connections, [&](std::size_t i) {
      const std::uint64_t from = i * part;
      done[i] = c.upload_part(name, id, static_cast<int>(i + 1), body, from, std::min(part, size - from));
    });
    c.complete_upload(name, id, std::move(done));
  } catch (...) {
    try {
      c.abort_upload(name, id);
    } catch (const error&) {
      // The server keeps it: retention's sweep aborts uploads left open.
    }
    throw;
  }
}

/// Writes this rank's part of `step`: the data object, then its manifest. Returns the bytes of
/// the data.
inline std::uint64_t write_rank_part(object_dir& dir, std::uint64_t step, int rank, int world_size,
                                     const std::string& run_id, std::span<const staged_entry> entries,
                                     std::uint64_t chunk_bytes = default_chunk_bytes, std::uint64_t epoch = 0) {
  const auto m = storage::lay_out_part(step, rank, world_size, run_id, entries, chunk_bytes, epoch,
                                       [](const std::byte*, std::size_t, std::uint64_t) {});
  gather body;
  std::uint64_t at = 0;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const auto& r = m.entries[i];
    if (r.offset > at) body.pieces.push_back({nullptr, r.offset - at});
    body.pieces.push_back({entries[i].bytes.data(), entries[i].bytes.size()});
    at = r.offset + r.bytes;
  }
  if (m.data_bytes > at) body.pieces.push_back({nullptr, m.data_bytes - at});
  const std::string folder = object_dir::parts_folder(run_id, world_size, epoch);
  upload(dir, object_dir::part_name(step, folder, format::rank_data_name(rank)), body);
  dir.client().put(object_dir::part_name(step, folder, format::rank_manifest_name(rank)), format::encode(m));
  return m.data_bytes;
}

/// Rank 0: once every rank's part of `manifest.step` is there (epoch `epoch`), writes the step's
/// manifest if none is, and returns true; false when `abandon` was raised first (the group
/// changed). Waits at most `timeout`. A manifest already there is taken as the commit when it
/// names the same run and parts (our own write whose answer was lost, or a peer's identical
/// commit); one written before `replace_before` (RFC 3339: a step of an earlier incarnation
/// that this one went back before) is replaced; any other is another live writer's: errc::mismatch.
inline bool commit_step(object_dir& dir, format::step_manifest manifest, std::chrono::milliseconds timeout,
                        const event_log& events = {}, const std::atomic<bool>* abandon = nullptr,
                        std::uint64_t epoch = 0, const std::string& replace_before = {}) {
  auto& c = dir.client();
  const std::uint64_t step = manifest.step;
  manifest.parts = object_dir::parts_folder(manifest.run_id, manifest.world_size, epoch);
  const std::string folder = format::step_dir_name(step) + "/" + manifest.parts + "/";
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<bool> verified(static_cast<std::size_t>(manifest.world_size), false);
  std::size_t missing = verified.size();
  auto pause = std::chrono::milliseconds(5);
  while (missing > 0) {
    std::set<std::string> present;
    for (const auto& o : c.list(folder)) present.insert(o.name.substr(folder.size()));
    for (int r = 0; r < manifest.world_size; ++r) {
      if (verified[static_cast<std::size_t>(r)] || !present.contains(format::rank_manifest_name(r))) continue;
      const std::string name = folder + format::rank_manifest_name(r);
      const auto text = c.get(name);
      if (!text) continue;  // listed, then gone: a retention of another writer; wait on
      const auto m = format::decode_rank(*text, dir.url_of(name));  // verified: a torn part must not commit
      if (m.step != step || m.run_id != manifest.run_id) {
        throw error(errc::mismatch, fmt::format("checkpoint step {}: rank {}'s part {} is of step {}, run '{}'; expected "
                                                "step {}, run '{}'",
                                                step, r, dir.url_of(name), m.step, m.run_id, step, manifest.run_id));
      }
      verified[static_cast<std::size_t>(r)] = true;
      --missing;
    }
    if (missing == 0) break;
    if (abandon && abandon->load(std::memory_order_acquire)) return false;
    if (std::chrono::steady_clock::now() >= deadline) {
      const auto r = std::find(verified.begin(), verified.end(), false) - verified.begin();
      throw error(errc::timeout, fmt::format("checkpoint step {}: rank {} did not write its part to {} within {} ms "
                                             "({} of {} missing); the step stays uncommitted and the previous one is kept",
                                             step, r, dir.url_of(folder), timeout.count(), missing, verified.size()));
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(100));
  }
  const std::string name = object_dir::manifest_name(step);
  const std::string text = format::encode(manifest);
  if (c.put_if_absent(name, text) == s3_client::put_result::written) return true;
  const auto there = c.get(name);
  if (!there) {  // deleted since (a retention elsewhere): ours is the only one now
    if (c.put_if_absent(name, text) == s3_client::put_result::written) return true;
    throw error(errc::mismatch, fmt::format("checkpoint step {}: {} keeps changing under us: another writer commits "
                                            "the same steps",
                                            step, dir.url_of(name)));
  }
  std::optional<format::step_manifest> other;
  try {
    other = format::decode_step(*there, dir.url_of(name));
  } catch (const error&) {
    // Unreadable: nothing to keep; replaced below.
  }
  if (other && other->run_id == manifest.run_id && other->parts == manifest.parts && other->world_size == manifest.world_size) {
    return true;  // the same parts, committed: ours (a retried write) or a peer's
  }
  if (other && (replace_before.empty() || other->time >= replace_before)) {
    throw error(errc::mismatch, fmt::format("checkpoint step {}: {} was committed by another writer (run '{}', parts "
                                            "{}, at {}) while this one ran; two jobs write the same directory",
                                            step, dir.url_of(name), other->run_id, other->parts, other->time));
  }
  events.emit("checkpoint_replaced", {{"step", step}, {"dir", dir.url_of(format::step_dir_name(step))}});
  c.put(name, text);
  return true;
}

/// The committed steps (those with a manifest), newest first.
inline std::vector<std::uint64_t> list_steps(const std::vector<object_info>& listing) {
  std::vector<std::uint64_t> out;
  const std::string tail = "/" + std::string(format::step_manifest_name);
  for (const auto& o : listing) {
    if (!o.name.ends_with(tail)) continue;
    const auto step = format::parse_step_dir(std::string_view(o.name).substr(0, o.name.size() - tail.size()));
    if (step) out.push_back(*step);
  }
  std::sort(out.rbegin(), out.rend());
  return out;
}
inline std::vector<std::uint64_t> list_steps(object_dir& dir) { return list_steps(dir.client().list()); }

}  // namespace elastic::inline v1::checkpoint::detail::objects
