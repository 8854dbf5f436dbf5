// An environment variable set for a scope and unset after. Tests set them before the code that
// reads them exists, while no other thread reads the environment.
#pragma once

#include <stdlib.h>

namespace elastic::test {

struct env_var {
  const char* name;
  env_var(const char* n, const char* v) : name(n) { ::setenv(n, v, 1); }
  ~env_var() { ::unsetenv(name); }
  env_var(const env_var&) = delete;
  env_var& operator=(const env_var&) = delete;
};

}  // namespace elastic::test
