// Fault injection, read once per process from the environment (README.md lists them):
//   ELASTIC_NCCL_MODEL_FAIL_OP=N        the Nth collective of this process (1-based) sets the sticky
//                                       proxy error ncclSystemError and its kernel never ends
//   ELASTIC_NCCL_MODEL_HANG_OP=N        the Nth collective's kernel hangs, no error, until abort/revoke
//   ELASTIC_NCCL_MODEL_INIT_DELAY_MS=ms every init/shrink/grow completes no sooner than this
//   ELASTIC_NCCL_MODEL_FAIL_SHRINK=1    ncclCommShrink fails asynchronously: the parent reports a
//                                       sticky ncclSystemError and *newcomm stays NULL
//                                       (=publish: the half-made child is stored into *newcomm, as
//                                       NCCL's ncclCommInitRankFunc does on failure)
//   ELASTIC_NCCL_MODEL_FAIL_REVOKE=1    ncclCommRevoke returns ncclInternalError and does nothing
#pragma once

#include <chrono>
#include <string>

#include "util.hpp"

namespace nccl_model {

struct faults {
  long long fail_op = 0;
  long long hang_op = 0;
  std::chrono::milliseconds init_delay{0};
  enum class shrink_failure { none, leave_null, publish } fail_shrink = shrink_failure::none;
  bool fail_revoke = false;

  static const faults& get() {
    static const faults* f = new faults();
    return *f;
  }

 private:
  faults() {
    fail_op = env_integer("ELASTIC_NCCL_MODEL_FAIL_OP").value_or(0);
    hang_op = env_integer("ELASTIC_NCCL_MODEL_HANG_OP").value_or(0);
    init_delay = std::chrono::milliseconds(env_integer("ELASTIC_NCCL_MODEL_INIT_DELAY_MS").value_or(0));
    const std::string s = env_text("ELASTIC_NCCL_MODEL_FAIL_SHRINK");
    if (s == "publish") {
      fail_shrink = shrink_failure::publish;
    } else if (!s.empty() && s != "0") {
      fail_shrink = shrink_failure::leave_null;
    }
    fail_revoke = env_integer("ELASTIC_NCCL_MODEL_FAIL_REVOKE").value_or(0) != 0;
  }
};

}  // namespace nccl_model
