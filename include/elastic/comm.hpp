// The communicator part: the concept, the 16-bit element types, and the backends the build
// enabled (Gloo with elastic::gloo, NCCL with elastic::nccl).
#pragma once

#include <elastic/comm/communicator.hpp>
#include <elastic/comm/half.hpp>
#include <elastic/config.hpp>
#if ELASTIC_WITH_GLOO
#include <elastic/comm/gloo.hpp>
#endif
#if ELASTIC_WITH_NCCL
#include <elastic/comm/nccl.hpp>
#endif
