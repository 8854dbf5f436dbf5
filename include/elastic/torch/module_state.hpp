// A libtorch module in a checkpoint state: every parameter and buffer, in place.
//
//   elastic::checkpoint::state st;
//   elastic::libtorch::add_module(st, "model", *model);   // "model/param/fc1.weight", ...
//
// Each tensor's memory is an entry of its own, copied by the snapshot engine like any buffer
// (CUDA tensors through the device snapshot path of an elastic::cuda build) and written back in
// place on restore, so the module needs no load step. The module must keep those tensors where
// they are while the state is used: register it after moving it to its device and dtype
// (module->to() after add_module gives the parameters new memory: the next snapshot or restore
// says so, naming the tensor, and the memory registered is kept alive until then).
#pragma once

#if !ELASTIC_WITH_TORCH
#error "elastic/torch/module_state.hpp needs LibTorch: link elastic::torch (which sets ELASTIC_WITH_TORCH=1)"
#endif

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <torch/nn/module.h>

#include <elastic/checkpoint/device_span.hpp>
#include <elastic/checkpoint/state.hpp>
#include <elastic/error.hpp>
#include <elastic/torch/detail/tensor_memory.hpp>

namespace elastic::inline v1::libtorch {

/// Registers `t` as the buffer entry `name`, with its shape.
inline void add_tensor(checkpoint::state& st, const std::string& name, const at::Tensor& t) {
  detail::check_addressable(t, "checkpoint entry '" + name + "'");
  std::vector<std::uint64_t> shape;
  for (const auto d : t.sizes()) shape.push_back(static_cast<std::uint64_t>(d));
  if (shape.empty()) shape = {1};  // a 0-dimensional tensor holds one element
  detail::with_element_type(t, "checkpoint entry '" + name + "'", [&]<class T>(T) {
    auto* data = static_cast<T*>(t.data_ptr());
    const auto n = static_cast<std::size_t>(t.numel());
    if (t.is_cuda()) {
      st.add(name, checkpoint::device_span<T>(data, n), shape);
    } else {
      st.add(name, std::span<T>(data, n), shape);
    }
  });
}

namespace detail {

/// What add_module's guard holds: each registered tensor, the memory it had, and that memory kept
/// alive (so an entry never points at freed memory, even after module->to()).
struct registered_tensor {
  std::string name;
  at::Tensor tensor;
  const void* data;
  c10::Storage storage;
};

/// Throws errc::invalid_argument naming the first tensor that no longer has the memory it was
/// registered with.
inline void check_in_place(const std::vector<registered_tensor>& ts, const std::string& prefix) {
  for (const auto& t : ts) {
    if (t.tensor.data_ptr() != t.data) {
      throw error(errc::invalid_argument,
                  fmt::format("checkpoint entry '{}' of module '{}' is no longer where add_module found it "
                              "(module->to() or a reassigned tensor since): register the module after moving it "
                              "to its device and dtype",
                              t.name, prefix));
    }
  }
}

}  // namespace detail

/// Registers every parameter and every defined buffer of `module` and its submodules, as
/// "PREFIX/param/NAME" and "PREFIX/buffer/NAME" (NAME as named_parameters() and named_buffers()
/// give it: "fc1.weight", "bn.running_mean"), after a guard entry, "PREFIX/.in_place" (no bytes),
/// which every snapshot and restore meets first: a tensor that moved since (module->to()) is then
/// an error naming it, not a copy of memory the module no longer uses. Returns how many tensors
/// it registered.
inline std::size_t add_module(checkpoint::state& st, const std::string& prefix, const torch::nn::Module& module) {
  std::vector<detail::registered_tensor> ts;
  for (const auto& p : module.named_parameters(/*recurse=*/true)) {
    ts.push_back({prefix + "/param/" + p.key(), p.value(), nullptr, {}});
  }
  for (const auto& b : module.named_buffers(/*recurse=*/true)) {
    if (!b.value().defined()) continue;  // a buffer the module does not use (track_running_stats off)
    ts.push_back({prefix + "/buffer/" + b.key(), b.value(), nullptr, {}});
  }
  for (auto& t : ts) {
    detail::check_addressable(t.tensor, "checkpoint entry '" + t.name + "'");
    t.data = t.tensor.data_ptr();
    t.storage = t.tensor.storage();
  }
  auto guard = std::make_shared<const std::vector<detail::registered_tensor>>(ts);
  st.add_object(
      prefix + "/.in_place",
      [guard, prefix](std::vector<std::byte>& out) {
        detail::check_in_place(*guard, prefix);
        out.clear();
      },
      [guard, prefix](std::span<const std::byte>) { detail::check_in_place(*guard, prefix); });
  for (const auto& t : ts) add_tensor(st, t.name, t.tensor);
  return ts.size();
}

}  // namespace elastic::inline v1::libtorch
