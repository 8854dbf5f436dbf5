// Gradients as DistributedDataParallel does them, over an elastic group of any backend: after
// backward(), each parameter's gradient is summed over the group in buckets (one collective per
// ~25 MiB of one dtype, not one per tensor) and divided by the number of ranks in the group at
// that moment, so a rebuilt group of another size averages over its own world.
//
//   elastic::libtorch::gradient_reducer grads(group, *model);
//   for (auto& step : loop) {
//     model->zero_grad();
//     loss_of(my_share_of(step)).backward();
//     if (!grads.allreduce()) continue;   // a peer failed: the loop rebuilds and redoes the step
//     step.before_update();
//     opt.step();
//   }
//
// A parameter without a gradient on some ranks (a branch they did not take) counts as zeros
// there; one without a gradient on every rank keeps none, as libtorch leaves it. Where the
// collectives run: a host communicator (Gloo) reduces host buffers, CUDA gradients are staged
// through one; a device communicator (NCCL) reduces on the parameters' device, ordered after
// libtorch's work by the legacy default stream, libtorch's default (see comm/nccl.hpp).
// A float sum depends on how many ranks add and in what order: for results that do not depend on
// the world size, see fixed_order_reducer (torch/fixed_order.hpp).
#pragma once

#if !ELASTIC_WITH_TORCH
#error "elastic/torch/gradients.hpp needs LibTorch: link elastic::torch (which sets ELASTIC_WITH_TORCH=1)"
#endif

#include <cstddef>
#include <vector>

#include <torch/nn/module.h>

#include <elastic/comm/elastic_group.hpp>
#include <elastic/torch/detail/gradient_buckets.hpp>
#include <elastic/torch/detail/tensor_memory.hpp>

namespace elastic::inline v1::libtorch {

struct gradient_options {
  /// Bytes of gradients per collective (DDP's bucket_cap_mb, 25 MiB). Smaller buckets cost more
  /// collectives; a bucket never splits a tensor, so one larger than this is a bucket alone.
  std::size_t bucket_bytes = std::size_t{25} << 20;
  /// Divide the sums by the world size (DDP's mean); false leaves them summed.
  bool average = true;
};

template <class Comm>
class gradient_reducer {
 public:
  /// Reduces the gradients of `params` (floating point, on the CPU or a CUDA device).
  gradient_reducer(comm::elastic_group<Comm>& group, const std::vector<at::Tensor>& params, gradient_options o = {})
      : group_(group),
        opts_(o),
        layout_(params, o.bucket_bytes, detail::reduces_device_memory<Comm>, "gradient_reducer") {
    for (const auto& b : layout_.buckets()) flats_.push_back(layout_.make_flat(b));
  }
  /// Reduces the gradients of every parameter of `module` that requires one.
  gradient_reducer(comm::elastic_group<Comm>& group, const torch::nn::Module& module, gradient_options o = {})
      : gradient_reducer(group, detail::trainable(module), o) {}

  gradient_reducer(const gradient_reducer&) = delete;
  gradient_reducer& operator=(const gradient_reducer&) = delete;

  /// Sums every gradient over the group (then averages, by default): true when done; false when
  /// a collective failed, with the gradients left as they were (the loop's next safe point
  /// rebuilds the group; redo the step).
  [[nodiscard]] bool allreduce() {
    return detail::guarded(errc::invalid_argument, "gradient_reducer", [&] {
      const auto& buckets = layout_.buckets();
      for (std::size_t i = 0; i < buckets.size(); ++i) {
        layout_.pack(buckets[i], flats_[i]);
        if (!detail::gradient_buckets::allreduce(group_, flats_[i])) return false;
      }
      for (std::size_t i = 0; i < buckets.size(); ++i) {
        if (opts_.average) flats_[i].narrow(0, 0, buckets[i].elements).div_(static_cast<double>(group_.size()));
        detail::gradient_buckets::unpack(buckets[i], flats_[i]);
      }
      return true;
    });
  }

  /// Collectives per allreduce().
  [[nodiscard]] std::size_t buckets() const noexcept { return layout_.buckets().size(); }

 private:
  comm::elastic_group<Comm>& group_;
  gradient_options opts_;
  detail::gradient_buckets layout_;
  std::vector<at::Tensor> flats_;
};

}  // namespace elastic::inline v1::libtorch
