// libtorch datasets read at the samples a data_position gives (checkpoint/data_position.hpp):
//
//   auto train = torch::data::datasets::MNIST(dir);
//   auto [x, y] = elastic::libtorch::batch_of(train, data.share(group.rank(), group.size()));
//
// The dataset is read by index (get(i)) and the examples stacked, so libtorch's own samplers and
// data loaders, whose positions nothing checkpoints, are not involved.
#pragma once

#if !ELASTIC_WITH_TORCH
#error "elastic/torch/data.hpp needs LibTorch: link elastic::torch (which sets ELASTIC_WITH_TORCH=1)"
#endif

#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <torch/data/example.h>

#include <elastic/error.hpp>
#include <elastic/torch/detail/tensor_memory.hpp>

namespace elastic::inline v1::libtorch {

/// The examples of `dataset` at `indices`, their data and targets each stacked along a new first
/// dimension. Empty `indices` give undefined tensors (a rank without a share this step).
/// Throws errc::invalid_argument for an index past the dataset's size.
template <class Dataset>
torch::data::Example<> batch_of(Dataset& dataset, const std::vector<std::uint64_t>& indices) {
  return detail::guarded(errc::invalid_argument, "batch_of", [&] {
    torch::data::Example<> out;
    if (indices.empty()) return out;
    const auto size = dataset.size();
    std::vector<at::Tensor> data, target;
    data.reserve(indices.size());
    target.reserve(indices.size());
    for (const auto i : indices) {
      if (size && i >= *size) {
        throw error(errc::invalid_argument,
                    fmt::format("batch_of: sample {} is past the dataset's {} samples", i, *size));
      }
      auto ex = dataset.get(static_cast<std::size_t>(i));
      data.push_back(std::move(ex.data));
      target.push_back(std::move(ex.target));
    }
    out.data = at::stack(data);
    out.target = at::stack(target);
    return out;
  });
}

}  // namespace elastic::inline v1::libtorch
