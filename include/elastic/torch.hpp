// The LibTorch adapters (link elastic::torch; it needs Torch's CMake package, Debian's
// libtorch-dev): a module and an optimizer in the checkpoint state in one call each, gradients
// reduced as DDP does, or in a fixed order whose bits do not depend on the world size, and
// libtorch datasets read at an elastic data position. Namespace elastic::libtorch (elastic::torch
// would hide ::torch inside the library's own namespace).
#pragma once

#if !ELASTIC_WITH_TORCH
#error "elastic/torch.hpp needs LibTorch: link elastic::torch (which sets ELASTIC_WITH_TORCH=1)"
#endif

#include <elastic/checkpoint/data_position.hpp>
#include <elastic/torch/data.hpp>
#include <elastic/torch/fixed_order.hpp>
#include <elastic/torch/gradients.hpp>
#include <elastic/torch/module_state.hpp>
#include <elastic/torch/optimizer_state.hpp>
