// The communicator part: the concept, and the backends the build enabled (Gloo with elastic::gloo).
#pragma once

#include <elastic/comm/communicator.hpp>
#include <elastic/config.hpp>
#if ELASTIC_WITH_GLOO
#include <elastic/comm/gloo.hpp>
#endif
