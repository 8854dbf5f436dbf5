// Where a run is in its data, as training state: the epoch and how many of its samples the global
// batches so far took. Batches are cut from a permutation of the dataset that depends on the seed
// and the epoch only, so the global batch of a step is the same set in the same order whatever
// the number of ranks; each rank takes its share of it. A rebuild from 4 ranks to 3 changes the
// shares, not the batches: each sample of an epoch is still seen once, and a resumed run goes on
// from the checkpoint's position.
//
//   elastic::data_position data({.samples = train.size(), .global_batch = 256, .seed = 7});
//   data.add_to(st);                                  // checkpointed with the rest
//   for (auto& step : loop) {
//     for (auto i : data.share(group.rank(), group.size())) ...   // this rank's samples
//     ... allreduce; if it failed: continue (the position has not moved) ...
//     step.before_update();
//     ...update...
//     data.advance();                                 // after the update, with the weights
//   }
//
// The last batch of an epoch is the shorter remainder (no sample dropped). A position restored
// from a run with another dataset size, batch or seed is refused (errc::mismatch): its offsets
// would mean other samples.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <elastic/checkpoint/state.hpp>
#include <elastic/error.hpp>

namespace elastic::inline v1::checkpoint {

class data_position {
 public:
  struct options {
    std::uint64_t samples = 0;       ///< in the dataset
    std::uint64_t global_batch = 0;  ///< samples per step, all ranks together
    std::uint64_t seed = 0;          ///< of the per-epoch shuffle
    bool shuffle = true;             ///< false: every epoch in index order
  };

  explicit data_position(options o) : opts_(o) {
    if (o.samples == 0) throw error(errc::invalid_argument, "data_position: the dataset has no samples");
    if (o.global_batch == 0) throw error(errc::invalid_argument, "data_position: global_batch must be > 0");
    rec_ = record{o.samples, o.global_batch, o.seed, o.shuffle ? 1u : 0u, 0, 0};
  }

  /// Registers the position with `st` (a value entry; a restore brings back the epoch and offset).
  void add_to(state& st, std::string name = "data_position") { st.add_value(std::move(name), rec_); }

  [[nodiscard]] std::uint64_t epoch() const { return checked().epoch; }
  /// Samples of this epoch the batches so far took.
  [[nodiscard]] std::uint64_t offset() const { return checked().offset; }
  [[nodiscard]] const options& settings() const noexcept { return opts_; }

  /// The current global batch: sample indices in the epoch's order.
  [[nodiscard]] std::vector<std::uint64_t> batch() const {
    const auto& r = checked();
    const auto& order = order_of(r.epoch);
    const std::uint64_t n = std::min(opts_.global_batch, opts_.samples - r.offset);
    return {order.begin() + static_cast<std::ptrdiff_t>(r.offset),
            order.begin() + static_cast<std::ptrdiff_t>(r.offset + n)};
  }

  /// Rank `rank` of `world`'s share of the current batch: its places j with j % world == rank.
  [[nodiscard]] std::vector<std::uint64_t> share(int rank, int world) const {
    check_rank(rank, world);
    const auto all = batch();
    std::vector<std::uint64_t> mine;
    for (std::size_t j = static_cast<std::size_t>(rank); j < all.size(); j += static_cast<std::size_t>(world))
      mine.push_back(all[j]);
    return mine;
  }

  /// Micro-batch `m` of `count`: a contiguous part of the current batch, sizes differing by at
  /// most one (the first ones larger), the same whatever the number of ranks.
  [[nodiscard]] std::vector<std::uint64_t> micro_batch(std::size_t m, std::size_t count) const {
    if (count == 0 || m >= count) {
      throw error(errc::invalid_argument, fmt::format("data_position: micro-batch {} of {}", m, count));
    }
    const auto all = batch();
    const std::size_t base = all.size() / count, extra = all.size() % count;
    const std::size_t from = m * base + std::min(m, extra), n = base + (m < extra ? 1 : 0);
    return {all.begin() + static_cast<std::ptrdiff_t>(from), all.begin() + static_cast<std::ptrdiff_t>(from + n)};
  }

  /// Moves past the current batch, into the next epoch after the last.
  void advance() {
    checked();
    rec_.offset += std::min(opts_.global_batch, opts_.samples - rec_.offset);
    if (rec_.offset >= opts_.samples) {
      ++rec_.epoch;
      rec_.offset = 0;
    }
  }

 private:
  /// What the state holds: the settings (checked on restore) and the position.
  struct record {
    std::uint64_t samples, global_batch, seed;
    std::uint64_t shuffle;
    std::uint64_t epoch, offset;
  };

  const record& checked() const {
    if (rec_.samples != opts_.samples || rec_.global_batch != opts_.global_batch || rec_.seed != opts_.seed ||
        rec_.shuffle != (opts_.shuffle ? 1u : 0u)) {
      throw error(errc::mismatch,
                  fmt::format("data_position: the restored position is of {} samples in batches of {} (seed {}, "
                              "shuffle {}); this run has {} in batches of {} (seed {}, shuffle {}): resume with the "
                              "dataset and batch the run was started with, or start a new run",
                              rec_.samples, rec_.global_batch, rec_.seed, rec_.shuffle, opts_.samples,
                              opts_.global_batch, opts_.seed, opts_.shuffle ? 1 : 0));
    }
    if (rec_.offset >= opts_.samples) {
      throw error(errc::corrupt, fmt::format("data_position: the restored offset {} is past the {} samples",
                                             rec_.offset, opts_.samples));
    }
    return rec_;
  }

  static void check_rank(int rank, int world) {
    if (world <= 0 || rank < 0 || rank >= world) {
      throw error(errc::invalid_argument, fmt::format("data_position: rank {} is not in a world of {}", rank, world));
    }
  }

  /// The epoch's order: a Fisher-Yates shuffle driven by splitmix64 of (seed, epoch), written out
  /// here so it is the same on every standard library (std::shuffle's is not specified).
  const std::vector<std::uint64_t>& order_of(std::uint64_t epoch) const {
    if (order_epoch_ == epoch && !order_.empty()) return order_;
    order_.resize(static_cast<std::size_t>(opts_.samples));
    for (std::uint64_t i = 0; i < opts_.samples; ++i) order_[static_cast<std::size_t>(i)] = i;
    if (opts_.shuffle) {
      std::uint64_t s = opts_.seed ^ (0x9e3779b97f4a7c15ULL * (epoch + 1));
      auto next = [&s] {
        std::uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        return z ^ (z >> 31);
      };
      for (std::uint64_t i = opts_.samples - 1; i > 0; --i) {
        const std::uint64_t bound = i + 1;  // uniform in [0, i], without modulo bias
        const std::uint64_t limit = std::numeric_limits<std::uint64_t>::max() -
                                    std::numeric_limits<std::uint64_t>::max() % bound;
        std::uint64_t x = next();
        while (x >= limit) x = next();
        std::swap(order_[static_cast<std::size_t>(i)], order_[static_cast<std::size_t>(x % bound)]);
      }
    }
    order_epoch_ = epoch;
    return order_;
  }

  options opts_;
  record rec_{};
  mutable std::vector<std::uint64_t> order_;
  mutable std::uint64_t order_epoch_ = 0;
};

}  // namespace elastic::inline v1::checkpoint

namespace elastic::inline v1 {
using checkpoint::data_position;
}  // namespace elastic::inline v1
