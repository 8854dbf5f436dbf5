// A libtorch optimizer in a checkpoint state: its param groups' options and its per-parameter
// state, including what libtorch creates lazily at the first step (SGD's momentum buffers,
// Adam's moments and step count).
//
//   torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
//   elastic::libtorch::add_optimizer(st, "optim", opt);
//
// One object entry, serialized when a snapshot is taken with libtorch's own archive: whatever
// state exists then is in it, whatever is created later is in the next one, so nothing has to
// be created ahead (which would change the first step's arithmetic). Restoring replaces the
// state wholesale (state the snapshot did not have is dropped, as the run that wrote it had none)
// and each group's options (a learning rate a schedule changed comes back too), matching
// parameters by position, as libtorch's own load does. The optimizer's tensors are copied to the
// host by the serialization, on the training thread: for a large model's Adam state this costs a
// copy per snapshot that the module's registered buffers do not.
#pragma once

#if !ELASTIC_WITH_TORCH
#error "elastic/torch/optimizer_state.hpp needs LibTorch: link elastic::torch (which sets ELASTIC_WITH_TORCH=1)"
#endif

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <elastic/checkpoint/state.hpp>
#include <elastic/error.hpp>
#include <elastic/torch/detail/tensor_memory.hpp>

namespace elastic::inline v1::libtorch {

namespace detail {

/// The optimizer as bytes: libtorch's archive of save() plus each group's options and size.
inline void save_optimizer(const torch::optim::Optimizer& opt, std::vector<std::byte>& out, const std::string& name) {
  guarded(errc::invalid_argument, fmt::format("checkpoint object '{}': saving the optimizer", name), [&] {
    torch::serialize::OutputArchive ar;
    opt.save(ar);
    const auto& groups = opt.param_groups();
    ar.write("elastic/groups", c10::IValue(static_cast<int64_t>(groups.size())));
    for (std::size_t i = 0; i < groups.size(); ++i) {
      torch::serialize::OutputArchive options(ar.compilation_unit());
      groups[i].options().serialize(options);
      ar.write(fmt::format("elastic/options/{}", i), options);
      ar.write(fmt::format("elastic/params/{}", i), c10::IValue(static_cast<int64_t>(groups[i].params().size())));
    }
    out.clear();
    ar.save_to([&out](const void* data, std::size_t n) {
      const auto* b = static_cast<const std::byte*>(data);
      out.insert(out.end(), b, b + n);
      return n;
    });
  });
}

/// Reads an integer the archive must hold, else the object is not one add_optimizer wrote.
inline std::int64_t read_int(torch::serialize::InputArchive& ar, const std::string& key, const std::string& name) {
  c10::IValue v;
  if (!ar.try_read(key, v) || !v.isInt()) {
    throw error(errc::corrupt, fmt::format("checkpoint object '{}' is not an optimizer saved by add_optimizer "
                                           "(it has no '{}')",
                                           name, key));
  }
  return v.toInt();
}

/// The inverse of save_optimizer, into `opt`. A snapshot of another optimizer's shape is refused
/// before anything changes; one that fails to load midway leaves the optimizer as it was.
inline void load_optimizer(torch::optim::Optimizer& opt, std::span<const std::byte> in, const std::string& name) {
  guarded(errc::corrupt, fmt::format("checkpoint object '{}' could not be loaded into the optimizer", name), [&] {
    torch::serialize::InputArchive ar;
    ar.load_from(reinterpret_cast<const char*>(in.data()), in.size());
    auto& groups = opt.param_groups();
    const auto saved_groups = read_int(ar, "elastic/groups", name);
    if (saved_groups != static_cast<std::int64_t>(groups.size())) {
      throw error(errc::mismatch, fmt::format("checkpoint object '{}' holds an optimizer of {} param groups; this one "
                                              "has {}: register the optimizer the run was started with",
                                              name, saved_groups, groups.size()));
    }
    for (std::size_t i = 0; i < groups.size(); ++i) {
      const auto n = read_int(ar, fmt::format("elastic/params/{}", i), name);
      if (n != static_cast<std::int64_t>(groups[i].params().size())) {
        throw error(errc::mismatch, fmt::format("checkpoint object '{}': param group {} held {} parameters; this "
                                                "optimizer's has {}: register the model the run was started with",
                                                name, i, n, groups[i].params().size()));
      }
    }
    // What to put back if loading fails midway.
    std::vector<std::pair<std::string, std::unique_ptr<torch::optim::OptimizerParamState>>> old_state;
    for (const auto& [key, s] : opt.state()) old_state.emplace_back(key, s->clone());
    std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> old_options;
    for (const auto& g : groups) old_options.push_back(g.options().clone());
    try {
      opt.state().clear();  // state the snapshot did not have must not survive it: libtorch's load only adds
      opt.load(ar);
      for (std::size_t i = 0; i < groups.size(); ++i) {
        torch::serialize::InputArchive options;
        ar.read(fmt::format("elastic/options/{}", i), options);
        groups[i].options().serialize(options);
      }
    } catch (...) {
      opt.state().clear();
      for (auto& [key, s] : old_state) opt.state()[key] = std::move(s);
      for (std::size_t i = 0; i < groups.size(); ++i) groups[i].set_options(std::move(old_options[i]));
      throw;
    }
  });
}

}  // namespace detail

/// Registers `optimizer` as the object entry `name`. The optimizer must outlive the state's use.
inline void add_optimizer(checkpoint::state& st, const std::string& name, torch::optim::Optimizer& optimizer) {
  st.add_object(
      name, [&optimizer, name](std::vector<std::byte>& out) { detail::save_optimizer(optimizer, out, name); },
      [&optimizer, name](std::span<const std::byte> in) { detail::load_optimizer(optimizer, in, name); });
}

}  // namespace elastic::inline v1::libtorch
