// What the NCCL model reads from the environment, once per process: NCCL's own variables that it
// models and the model's version override and trace switch. Fault injection is in faults.hpp.
#pragma once

#include <unistd.h>

#include <string>

#include "util.hpp"

#ifndef NCCL_MODEL_VERSION
#error "build the NCCL model with -DNCCL_MODEL_VERSION=<code> (23007 or 22707)"
#endif

namespace nccl_model {

struct settings {
  /// ncclGetVersion: the build's version (23007 or 22707) unless ELASTIC_NCCL_MODEL_VERSION says
  /// otherwise; the version gates below follow it, so one build can play several releases.
  int version = NCCL_MODEL_VERSION;
  /// NCCL_HOSTID, else the host name: ranks with the same value are "on the same host".
  std::string host;
  /// NCCL_COMM_BLOCKING: 0 or 1 overrides ncclConfig_t::blocking (src/init.cc envConfigOverride).
  int comm_blocking = -1;
  /// NCCL_MULTI_RANK_GPU_ENABLE (2.30.3 and later).
  bool multi_rank_gpu = false;
  /// NCCL_DEBUG set: every error the model records is also printed, as NCCL's WARN lines are.
  bool debug = false;
  /// ELASTIC_NCCL_MODEL_TRACE=1: one stderr line per NCCL API call.
  bool trace = false;
  /// A collective on a non-blocking communicator returns ncclInProgress and leaves the
  /// communicator in progress until ncclCommGetAsyncError reports it done, as NCCL's group launch
  /// thread does (src/group.cc ncclGroupEndInternal; seen on NCCL 2.28.3 on an H100).
  /// ELASTIC_NCCL_MODEL_ASYNC_LAUNCH=0: ncclSuccess at once instead (simpler, not NCCL).
  bool async_launch = true;

  static const settings& get() {
    static const settings* s = new settings();  // never destroyed: model threads may read it at exit
    return *s;
  }

 private:
  settings() {
    if (auto v = env_integer("ELASTIC_NCCL_MODEL_VERSION")) version = static_cast<int>(*v);
    host = env_text("NCCL_HOSTID");
    if (host.empty()) {
      char name[256] = {};
      ::gethostname(name, sizeof name - 1);
      host = name;
    }
    if (auto v = env_integer("NCCL_COMM_BLOCKING"); v && (*v == 0 || *v == 1)) comm_blocking = static_cast<int>(*v);
    multi_rank_gpu = env_integer("NCCL_MULTI_RANK_GPU_ENABLE").value_or(0) == 1;
    debug = !env_text("NCCL_DEBUG").empty();
    trace = env_integer("ELASTIC_NCCL_MODEL_TRACE").value_or(0) != 0;
    async_launch = env_integer("ELASTIC_NCCL_MODEL_ASYNC_LAUNCH").value_or(1) != 0;
  }
};

/// NCCL_VERSION(2, y, z) as the 2.9+ encoding (every version the model plays is one).
constexpr int version_code(int major, int minor, int patch) { return major * 10000 + minor * 100 + patch; }

}  // namespace nccl_model
