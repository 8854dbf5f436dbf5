// The contract checker's core: the rules, whether each is on, and the report that ends the
// process. The checks themselves sit where the rules are enforced (cuda_state.cpp for the CUDA
// rules, nccl_calls.cpp and the communicator for NCCL's).
//
// ELASTIC_NCCL_MODEL_CONTRACT: unset or 1: every rule on (the default); 0: every rule off;
// otherwise a comma-separated list such as "no-abort-alone,no-in-progress" turning rules off.
#pragma once

#include <string_view>

#include "util.hpp"

namespace nccl_model::contract {

enum class rule : int {
  in_progress,            // a call on a communicator whose state is ncclInProgress
  one_thread,             // two threads inside calls on one communicator
  abort_alone,            // ncclCommAbort beside another thread's call on the same communicator
  shrink_outstanding,     // NCCL_SHRINK_DEFAULT with operations outstanding
  finalize_after_revoke,  // ncclCommFinalize after ncclCommRevoke
  dead_handle,            // a communicator, stream or event used after it was freed
  cuda_no_device,         // a CUDA call needing a context from a thread that never set its device
  cuda_in_host_function,  // a CUDA call from inside a cudaLaunchHostFunc callback
  count
};

/// The rule's name as ELASTIC_NCCL_MODEL_CONTRACT spells it ("abort-alone").
NCCL_MODEL_EXPORT std::string_view name(rule r) noexcept;

/// Whether rule `r` is checked in this process (read once from the environment).
NCCL_MODEL_EXPORT bool enabled(rule r) noexcept;

/// Writes "nccl-model: contract violation: <what>, <who>, <why>" to stderr and aborts.
[[noreturn]] NCCL_MODEL_EXPORT void violation(rule r, std::string_view what, std::string_view who,
                                              std::string_view why) noexcept;

}  // namespace nccl_model::contract
