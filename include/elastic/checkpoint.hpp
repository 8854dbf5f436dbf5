// The checkpoint part: state registry, snapshot engine, storage and the training loop.
#pragma once

#include <elastic/checkpoint/archive.hpp>
#include <elastic/checkpoint/checkpointer.hpp>
#include <elastic/checkpoint/data_position.hpp>
#include <elastic/checkpoint/device_span.hpp>
#include <elastic/checkpoint/dtype.hpp>
#include <elastic/checkpoint/format.hpp>
#include <elastic/checkpoint/group_hook.hpp>
#include <elastic/checkpoint/loop_options.hpp>
#include <elastic/checkpoint/preemption.hpp>
#include <elastic/checkpoint/state.hpp>
#include <elastic/checkpoint/storage.hpp>
#include <elastic/checkpoint/training_loop.hpp>
