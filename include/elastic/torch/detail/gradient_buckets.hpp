// The gradients of a list of parameters laid out in buckets (one dtype and device each, up to a
// byte budget), packed into and unpacked from flat tensors that one collective reduces. Shared by
// gradient_reducer (one flat per bucket) and fixed_order_reducer (one per micro-batch).
#pragma once

#if !ELASTIC_WITH_TORCH
#error "elastic/torch/detail/gradient_buckets.hpp needs LibTorch: link elastic::torch (which sets ELASTIC_WITH_TORCH=1)"
#endif

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <torch/nn/module.h>

#include <elastic/comm/communicator.hpp>
#include <elastic/comm/elastic_group.hpp>
#include <elastic/error.hpp>
#include <elastic/torch/detail/tensor_memory.hpp>

namespace elastic::inline v1::libtorch::detail {

/// Whether a communicator reduces device memory (NCCL: it has host-staged variants besides).
template <class Comm>
inline constexpr bool reduces_device_memory =
    requires(Comm& c, std::span<double> s) { c.allreduce_host(s, comm::reduce_op::sum); };

/// The parameters of `m` that require a gradient.
inline std::vector<at::Tensor> trainable(const torch::nn::Module& m) {
  std::vector<at::Tensor> out;
  for (const auto& p : m.parameters(/*recurse=*/true))
    if (p.requires_grad()) out.push_back(p);
  return out;
}

class gradient_buckets {
 public:
  struct slot {
    at::Tensor param;
    const void* data;     // where the parameter was when laid out
    std::int64_t offset;  // in the bucket's flat layout
    std::int64_t numel;
    std::size_t index;    // in the caller's list, for messages
  };
  /// A flat layout is the gradients, then one "had a gradient" count per slot.
  struct bucket {
    at::ScalarType type;
    at::Device device;
    std::vector<slot> slots;
    std::int64_t elements = 0;
    [[nodiscard]] std::int64_t flat_size() const noexcept {
      return elements + static_cast<std::int64_t>(slots.size());
    }
  };

  /// `who` names the user in messages; `device_flats`: the flats live on the parameters' device
  /// (a device communicator), else on the host.
  gradient_buckets(const std::vector<at::Tensor>& params, std::size_t bucket_bytes, bool device_flats, std::string who)
      : who_(std::move(who)), device_flats_(device_flats) {
    if (bucket_bytes == 0) throw error(errc::invalid_argument, who_ + ": bucket_bytes must be > 0");
    // Reverse order, as DDP: backward() finishes the last layers' gradients first.
    for (std::size_t i = params.size(); i-- > 0;) place(params[i], i, bucket_bytes);
  }

  [[nodiscard]] const std::vector<bucket>& buckets() const noexcept { return buckets_; }

  /// A zeroed flat tensor for `b`, `copies` layouts long, where the collective runs.
  [[nodiscard]] at::Tensor make_flat(const bucket& b, std::int64_t copies = 1) const {
    const auto where = device_flats_ ? b.device : at::Device(at::kCPU);
    return at::zeros({copies * b.flat_size()}, at::TensorOptions().dtype(b.type).device(where));
  }

  /// The parameters' current gradients into `flat` (one layout of `b`): zeros and a count of 0
  /// where a parameter has none.
  void pack(const bucket& b, at::Tensor flat) const {
    const auto n = static_cast<std::int64_t>(b.slots.size());
    auto counts = flat.narrow(0, b.elements, n);
    for (std::int64_t i = 0; i < n; ++i) {
      const auto& s = b.slots[static_cast<std::size_t>(i)];
      check_in_place(s);
      auto part = flat.narrow(0, s.offset, s.numel);
      const auto& g = s.param.grad();
      if (g.defined()) {
        part.copy_(g.reshape({-1}));
        counts[i].fill_(1);
      } else {
        part.zero_();
        counts[i].fill_(0);
      }
    }
  }

  /// `flat` (one reduced layout of `b`) into the gradients; a parameter no rank had a gradient
  /// for keeps none, as libtorch leaves it.
  static void unpack(const bucket& b, const at::Tensor& flat) {
    const auto n = static_cast<std::int64_t>(b.slots.size());
    // One host copy of the counts, read as doubles: not a tensor op per parameter per step.
    const auto had = flat.narrow(0, b.elements, n).to(at::kCPU, at::kDouble).contiguous();
    const double* counts = had.data_ptr<double>();
    for (std::int64_t i = 0; i < n; ++i) {
      const auto& s = b.slots[static_cast<std::size_t>(i)];
      if (counts[i] == 0) continue;
      auto part = flat.narrow(0, s.offset, s.numel).view(s.param.sizes());
      auto& g = s.param.mutable_grad();
      if (g.defined()) {
        g.copy_(part);
      } else {
        g = part.to(s.param.device(), /*non_blocking=*/false, /*copy=*/true);
      }
    }
  }

  /// Sums `flat` over `group`, in place: false when the collective failed.
  template <class Comm>
  static bool allreduce(comm::elastic_group<Comm>& group, at::Tensor& flat) {
    return with_element_type(flat, "gradient bucket", [&]<class T>(T) {
      if constexpr (comm::reducible<T>) {
        return group.allreduce(std::span<T>(static_cast<T*>(flat.data_ptr()), static_cast<std::size_t>(flat.numel())),
                               comm::reduce_op::sum);
      } else {
        return false;  // not reached: only floating point parameters are laid out
      }
    });
  }

 private:
  std::string name_of(std::size_t index) const { return fmt::format("{}: parameter {}", who_, index); }

  void check_in_place(const slot& s) const {
    if (s.param.data_ptr() != s.data) {
      throw error(errc::invalid_argument,
                  fmt::format("{} is no longer where it was when the reducer was made (module->to() or a reassigned "
                              "parameter since): make the reducer, and register the module, after moving it",
                              name_of(s.index)));
    }
  }

  void place(const at::Tensor& p, std::size_t index, std::size_t bucket_bytes) {
    const auto what = name_of(index);
    check_addressable(p, what);
    if (!at::isFloatingType(p.scalar_type())) {
      throw error(errc::invalid_argument,
                  fmt::format("{} is {}: only floating point parameters have gradients", what, scalar_name(p)));
    }
    if (device_flats_ && !p.is_cuda()) {
      throw error(errc::invalid_argument, fmt::format("{} is on {}, but the group's communicator reduces device "
                                                      "memory: move the module to its GPU first",
                                                      what, p.device().str()));
    }
    const auto bytes = static_cast<std::size_t>(p.numel()) * p.element_size();
    bucket* b = nullptr;
    for (auto& c : buckets_) {  // the last bucket of this dtype and device with room for it
      if (c.type == p.scalar_type() && c.device == p.device() &&
          static_cast<std::size_t>(c.elements) * p.element_size() + bytes <= bucket_bytes)
        b = &c;
    }
    if (!b) b = &buckets_.emplace_back(bucket{p.scalar_type(), p.device(), {}, 0});
    b->slots.push_back(slot{p, p.data_ptr(), b->elements, p.numel(), index});
    b->elements += p.numel();
  }

  std::string who_;
  bool device_flats_;
  std::vector<bucket> buckets_;
};

}  // namespace elastic::inline v1::libtorch::detail
