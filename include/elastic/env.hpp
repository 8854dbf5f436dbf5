// Reading settings from the environment as the library reads its own: a variable that is set
// but malformed or out of range is an elastic::error that names the variable, its value and
// what is accepted, never a silent default. For trainers that take their own settings the same
// way (the examples do).
//
//   const auto workers = elastic::env_int("TRAIN_WORKERS", 1, 64).value_or(4);
#pragma once

#include <elastic/internal/env.hpp>

namespace elastic::inline v1 {

using internal::env_int;         ///< an integer in [lo, hi]; nullopt when unset or empty
using internal::env_seconds_in;  ///< a duration in seconds within a range; nullopt when unset
using internal::env_string;      ///< the value; nullopt when unset or empty

}  // namespace elastic::inline v1
