// Where a checkpointer's steps live: a POSIX directory (storage.hpp) or, for a `dir` of
// s3://BUCKET/PREFIX or gs://BUCKET/PREFIX, object storage (detail/s3_steps.hpp, in a program
// built with elastic::s3; without it such a `dir` is refused with what to link). One interface,
// so the checkpointer and the training loop do not care which.
#pragma once

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <elastic/config.hpp>
#include <elastic/checkpoint/detail/checkpoint_dir.hpp>
#include <elastic/checkpoint/detail/object_location.hpp>
#include <elastic/checkpoint/format.hpp>
#include <elastic/checkpoint/staged_snapshot.hpp>
#include <elastic/checkpoint/state.hpp>
#include <elastic/checkpoint/storage.hpp>
#include <elastic/error.hpp>
#include <elastic/events.hpp>
#include <elastic/internal/host_name.hpp>
#include <elastic/internal/private_dir.hpp>
#if ELASTIC_WITH_S3
#include <elastic/checkpoint/detail/s3_retention.hpp>
#include <elastic/checkpoint/detail/s3_step_loading.hpp>
#include <elastic/checkpoint/detail/s3_steps.hpp>
#endif

namespace elastic::inline v1::checkpoint::detail {

namespace objects {
class object_dir;
}

class step_store {
 public:
  step_store() = default;

  /// Opens `dir` for writing (a POSIX directory is created if missing) and proves that this
  /// process can write there, so that a run never trains for hours before learning otherwise.
  static step_store open(const std::filesystem::path& dir) {
    step_store s;
    s.name_ = dir;
    if (!objects::is_object_url(dir.native())) {
      s.posix_ = open_checkpoint_dir(dir);
      return s;
    }
#if ELASTIC_WITH_S3
    s.objects_ = std::make_shared<objects::object_dir>(dir.native());
    const std::string probe = fmt::format("{}{}-{}-{}", format::probe_prefix, internal::host_name_for_ids(), ::getpid(),
                                          std::chrono::steady_clock::now().time_since_epoch().count());
    try {
      s.objects_->client().put(probe, std::string_view());
      s.objects_->client().erase(probe);
    } catch (const error& e) {
      throw error(e.code(), fmt::format("checkpoint directory {} cannot be written by this process, so no checkpoint "
                                        "could be saved: {}",
                                        dir.native(), e.message()),
                  e.os_code());
    }
    return s;
#else
    throw error(errc::not_supported, fmt::format("checkpoint directory {} is in object storage, which this program was "
                                                 "built without: link elastic::s3 (libcurl)",
                                                 dir.native()));
#endif
  }

  [[nodiscard]] bool in_object_storage() const noexcept { return !posix_; }
  /// The POSIX directory (nothing in object storage).
  [[nodiscard]] const internal::private_dir* posix() const noexcept { return posix_ ? &*posix_ : nullptr; }
  /// Where step `step` is, for messages and events.
  [[nodiscard]] std::string step_location(std::uint64_t step) const {
    return (name_ / format::step_dir_name(step)).string();
  }

  std::uint64_t write_rank_part(std::uint64_t step, int rank, int world_size, const std::string& run_id,
                                std::span<const staged_entry> entries, std::uint64_t chunk_bytes, std::uint64_t epoch) {
#if ELASTIC_WITH_S3
    if (objects_) return objects::write_rank_part(*objects_, step, rank, world_size, run_id, entries, chunk_bytes, epoch);
#endif
    return storage::write_rank_part(*posix_, step, rank, world_size, run_id, entries, chunk_bytes, epoch);
  }

  /// storage::commit_step; `started` (RFC 3339) is when this writer started: in object storage
  /// a manifest of the same step written before it is an earlier incarnation's, replaced.
  bool commit_step(const format::step_manifest& m, std::chrono::milliseconds timeout, const event_log& events,
                   const std::atomic<bool>* abandon, std::uint64_t epoch, [[maybe_unused]] const std::string& started) {
#if ELASTIC_WITH_S3
    if (objects_) return objects::commit_step(*objects_, m, timeout, events, abandon, epoch, started);
#endif
    return storage::commit_step(*posix_, m, timeout, events, abandon, epoch);
  }

  void retain(std::size_t keep_last, std::optional<std::uint64_t> floor, const event_log& events) {
#if ELASTIC_WITH_S3
    if (objects_) return objects::retain(*objects_, keep_last, floor, events);
#endif
    storage::retain(*posix_, keep_last, floor, events);
  }

  format::step_manifest load_step(std::uint64_t step, const state& st, int rank, std::span<std::byte> scratch = {}) {
#if ELASTIC_WITH_S3
    if (objects_) return objects::load_step(*objects_, step, st, rank, scratch);
#endif
    return storage::load_step_at(posix_->fd(), name_, step, st, rank, scratch);
  }

  std::optional<format::step_manifest> restore_newest(const state& st, int rank, const event_log& events,
                                                      std::span<std::byte> scratch = {},
                                                      std::vector<storage::skipped_step>* skipped = nullptr) {
#if ELASTIC_WITH_S3
    if (objects_) {
      std::vector<std::pair<std::uint64_t, error>> s;
      auto m = objects::restore_newest(*objects_, st, rank, events, scratch, &s);
      if (skipped) {
        for (auto& [step, why] : s) skipped->push_back({step, std::move(why)});
      }
      return m;
    }
#endif
    return storage::restore_newest_at(posix_->fd(), name_, st, rank, events, scratch, skipped);
  }

  void quarantine_step(std::uint64_t step, const std::string& why, const event_log& events) {
#if ELASTIC_WITH_S3
    if (objects_) return objects::quarantine_step(*objects_, step, why, events);
#endif
    (void)storage::quarantine_step(*posix_, step, why, events);
  }

 private:
  std::filesystem::path name_;
  std::optional<internal::private_dir> posix_;
  // Declared whatever ELASTIC_WITH_S3 is, so that the layout of a checkpointer is the same in
  // every translation unit of a program (a shared_ptr destroys a type it does not see).
  std::shared_ptr<objects::object_dir> objects_;
};

}  // namespace elastic::inline v1::checkpoint::detail
