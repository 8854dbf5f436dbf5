// An elastic group over NCCL: every round's leader makes a fresh unique id, every rank joins a
// new communicator with it on its own GPU. Link elastic::nccl.
//
//   elastic::comm::nccl_group group(store, {.rendezvous = {.min_ranks = 2, .max_ranks = 8}},
//                                   elastic::comm::nccl_factory(local_rank, 30s, stream),
//                                   elastic::comm::nccl_bootstrap());
//
// A rebuild re-initialises NCCL from a new id (on an H100 this is tens of milliseconds for a few
// ranks; benchmarks/nccl_bench measures it): it is right after departures and after joins alike.
// nccl_communicator::shrink() is the faster path after departures only, for callers that drive
// recovery themselves; the group does not use it yet.
#pragma once

#include <chrono>
#include <memory>

#include <cuda_runtime_api.h>

#include <elastic/comm/elastic_group.hpp>
#include <elastic/comm/nccl.hpp>

namespace elastic::inline v1::comm {

using nccl_group = elastic_group<nccl_communicator>;

/// The round leader's bootstrap blob: a fresh NCCL unique id (128 bytes).
inline rendezvous::bootstrap_fn nccl_bootstrap() {
  return [](const rendezvous::round_info&) { return nccl_unique_id(); };
}

/// Each round's communicator on CUDA device `device`, its collectives on `stream` (nullptr: a
/// stream of its own) and bounded by `timeout`.
inline communicator_factory<nccl_communicator> nccl_factory(int device, std::chrono::milliseconds timeout,
                                                            cudaStream_t stream = nullptr, nccl_options options = {}) {
  return [=](rendezvous::store&, const rendezvous::round_info& r) {
    return std::make_unique<nccl_communicator>(r.bootstrap, r.rank, r.world_size,
                                               device, timeout, stream, options);
  };
}

}  // namespace elastic::inline v1::comm
