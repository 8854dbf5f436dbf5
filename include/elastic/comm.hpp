// The communicator part: the concept, the 16-bit element types, the elastic group, and the
// backends the build enabled with their groups (gloo_communicator, gloo_group, gloo_factory with
// elastic::gloo; nccl_communicator, nccl_group, nccl_factory with elastic::nccl).
#pragma once

#include <elastic/comm/communicator.hpp>
#include <elastic/comm/elastic_group.hpp>
#include <elastic/comm/half.hpp>
#include <elastic/comm/worker.hpp>
#include <elastic/config.hpp>
#if ELASTIC_WITH_GLOO
#include <elastic/comm/gloo.hpp>
#include <elastic/comm/gloo_group.hpp>
#include <elastic/comm/gloo_worker.hpp>
#endif
#if ELASTIC_WITH_NCCL
#include <elastic/comm/nccl.hpp>
#include <elastic/comm/nccl_group.hpp>
#endif
