// Gradients whose bits do not depend on the number of ranks: the global batch is cut into a fixed
// number of micro-batches, each rank computes the gradients of the micro-batches the current
// world gives it, and the sum over micro-batches is taken in micro-batch order on every rank, so
// the same global batch gives the same bits with 4 ranks, 3 or 1. A float allreduce cannot: its
// additions are grouped by how many ranks there are (a rebuild from 4 to 3 changes the weights'
// last bits, and a disturbed run then ends elsewhere than an undisturbed one).
//
//   elastic::libtorch::fixed_order_reducer grads(group, *model, /*micro_batches=*/8);
//   for (auto& step : loop) {
//     for (std::size_t m : grads.micro_batches()) {   // this rank's share; forgets older ones
//       model->zero_grad();
//       loss_of(micro_batch(step, m)).backward();     // a mean over the micro-batch's samples
//       grads.keep(m);
//     }
//     if (!grads.allreduce()) continue;   // gradients = the mean over the micro-batches
//     step.before_update();
//     opt.step();
//   }
//
// How: each micro-batch's gradients sit in a slot of their own, zeros elsewhere, so the
// allreduce adds each value to zeros only (exact, whatever the order), and every rank then adds
// the slots 0, 1, ... in order. The cost is the collective's size: micro_batches times the
// gradients (benchmarks/torch_bench.cpp measures it), and micro_batches times their memory.
// It also needs each micro-batch's gradient to be the same bits on whichever rank computes it:
// the same program, libtorch build and thread count (torch::set_num_threads) on every rank.
#pragma once

#if !ELASTIC_WITH_TORCH
#error "elastic/torch/fixed_order.hpp needs LibTorch: link elastic::torch (which sets ELASTIC_WITH_TORCH=1)"
#endif

#include <cstddef>
#include <cstdint>
#include <vector>

#include <fmt/format.h>
#include <torch/nn/module.h>

#include <elastic/comm/elastic_group.hpp>
#include <elastic/error.hpp>
#include <elastic/torch/detail/gradient_buckets.hpp>
#include <elastic/torch/detail/tensor_memory.hpp>
#include <elastic/torch/gradients.hpp>

namespace elastic::inline v1::libtorch {

template <class Comm>
class fixed_order_reducer {
 public:
  /// `micro_batches` fixed for the run (the most ranks that can ever share a step's work); the
  /// gradients of `params` (floating point). `o.average`: the mean over micro-batches (each a
  /// mean over its samples: the mean over the global batch when they are of one size).
  fixed_order_reducer(comm::elastic_group<Comm>& group, const std::vector<at::Tensor>& params,
                      std::size_t micro_batches, gradient_options o = {})
      : group_(group),
        opts_(o),
        micro_(micro_batches),
        layout_(params, o.bucket_bytes, detail::reduces_device_memory<Comm>, "fixed_order_reducer") {
    if (micro_ == 0) throw error(errc::invalid_argument, "fixed_order_reducer: micro_batches must be > 0");
    for (const auto& b : layout_.buckets()) flats_.push_back(layout_.make_flat(b, static_cast<std::int64_t>(micro_)));
    kept_.assign(micro_, false);
  }
  fixed_order_reducer(comm::elastic_group<Comm>& group, const torch::nn::Module& module, std::size_t micro_batches,
                      gradient_options o = {})
      : fixed_order_reducer(group, detail::trainable(module), micro_batches, o) {}

  fixed_order_reducer(const fixed_order_reducer&) = delete;
  fixed_order_reducer& operator=(const fixed_order_reducer&) = delete;

  /// The micro-batches this rank computes in the current world (m with m % world == rank), which
  /// starts a step: what keep() took before is forgotten.
  [[nodiscard]] std::vector<std::size_t> micro_batches() {
    forget();
    std::vector<std::size_t> mine;
    const auto world = static_cast<std::size_t>(group_.size()), rank = static_cast<std::size_t>(group_.rank());
    for (std::size_t m = rank; m < micro_; m += world) mine.push_back(m);
    return mine;
  }
  [[nodiscard]] std::size_t count() const noexcept { return micro_; }

  /// Takes the parameters' gradients now as micro-batch `m`'s (after its backward(); zero the
  /// gradients before the next one's).
  void keep(std::size_t m) {
    if (m >= micro_) {
      throw error(errc::invalid_argument,
                  fmt::format("fixed_order_reducer: micro-batch {} of {} (they are 0 .. {})", m, micro_, micro_ - 1));
    }
    detail::guarded(errc::invalid_argument, "fixed_order_reducer", [&] {
      const auto& buckets = layout_.buckets();
      for (std::size_t i = 0; i < buckets.size(); ++i) layout_.pack(buckets[i], slot(i, m));
    });
    kept_[m] = true;
  }

  /// Sums every micro-batch's gradients over the group and adds them in micro-batch order into
  /// the parameters' gradients: true when done; false when a collective failed (redo the step).
  /// Throws errc::invalid_argument when this rank kept micro-batches other than its own.
  [[nodiscard]] bool allreduce() {
    const auto world = static_cast<std::size_t>(group_.size()), rank = static_cast<std::size_t>(group_.rank());
    for (std::size_t m = 0; m < micro_; ++m) {
      if (kept_[m] != (m % world == rank)) {
        throw error(errc::invalid_argument,
                    fmt::format("fixed_order_reducer: rank {} of {} {} micro-batch {}: keep exactly the ones "
                                "micro_batches() gives, after calling it in this step",
                                rank, world, kept_[m] ? "kept" : "did not keep", m));
      }
    }
    const bool ok = detail::guarded(errc::invalid_argument, "fixed_order_reducer", [&] {
      const auto& buckets = layout_.buckets();
      for (std::size_t i = 0; i < buckets.size(); ++i) {
        if (!detail::gradient_buckets::allreduce(group_, flats_[i])) return false;
      }
      for (std::size_t i = 0; i < buckets.size(); ++i) {
        // x + 0 is x, but -0 + 0 is +0: one addition of zero makes a value the same bits
        // whether the allreduce added zeros to it (several ranks) or did not (one).
        auto sum = slot(i, 0).add(0.0);
        for (std::size_t m = 1; m < micro_; ++m) sum.add_(slot(i, m));
        if (opts_.average) sum.narrow(0, 0, buckets[i].elements).div_(static_cast<double>(micro_));
        detail::gradient_buckets::unpack(buckets[i], sum);
      }
      return true;
    });
    forget();
    return ok;
  }

 private:
  at::Tensor slot(std::size_t bucket, std::size_t m) {
    const auto n = layout_.buckets()[bucket].flat_size();
    return flats_[bucket].narrow(0, static_cast<std::int64_t>(m) * n, n);
  }
  void forget() {
    for (auto& f : flats_) f.zero_();
    kept_.assign(micro_, false);
  }

  comm::elastic_group<Comm>& group_;
  gradient_options opts_;
  std::size_t micro_;
  detail::gradient_buckets layout_;
  std::vector<at::Tensor> flats_;
  std::vector<bool> kept_;
};

}  // namespace elastic::inline v1::libtorch
