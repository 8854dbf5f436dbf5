// A libtorch module in a checkpoint state: every parameter and buffer, in place.
//
//   elastic::checkpoint::state st;
//   elastic::libtorch::add_module(st, "model", *model);   // "model/param/fc1.weight", ...
//
// Each tensor's memory is an entry of its own, copied by the snapshot engine like any buffer
// (CUDA tensors through the device snapshot path of an elastic::cuda build) and written back in
// place on restore, so the module needs no load step. The module must keep those tensors where
// they are while the state is used: register it after moving it to its device and dtype
// (module->to() after add_module gives the parameters new memory; gradient_reducer notices).
#pragma once

#if !ELASTIC_WITH_TORCH
#error "elastic/torch/module_state.hpp needs LibTorch: link elastic::torch (which sets ELASTIC_WITH_TORCH=1)"
#endif

#include <cstdint>
#include <string>
#include <vector>

#include <torch/nn/module.h>

#include <elastic/checkpoint/device_span.hpp>
#include <elastic/checkpoint/state.hpp>
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

/// Registers every parameter and every defined buffer of `module` and its submodules, as
/// "PREFIX/param/NAME" and "PREFIX/buffer/NAME" (NAME as named_parameters() and named_buffers()
/// give it: "fc1.weight", "bn.running_mean"). Returns how many tensors it registered.
inline std::size_t add_module(checkpoint::state& st, const std::string& prefix, const torch::nn::Module& module) {
  std::size_t n = 0;
  for (const auto& p : module.named_parameters(/*recurse=*/true)) {
    add_tensor(st, prefix + "/param/" + p.key(), p.value());
    ++n;
  }
  for (const auto& b : module.named_buffers(/*recurse=*/true)) {
    if (!b.value().defined()) continue;  // a buffer the module does not use (track_running_stats off)
    add_tensor(st, prefix + "/buffer/" + b.key(), b.value());
    ++n;
  }
  return n;
}

}  // namespace elastic::inline v1::libtorch
