// Catching the library's errors in tests.
#pragma once

#include <optional>
#include <utility>

#include <elastic/error.hpp>

#include "support/catch.hpp"

namespace elastic::test {

/// The error a call throws, if it throws one.
template <class F>
std::optional<elastic::error> caught(F&& f) {
  try {
    f();
  } catch (const elastic::error& e) {
    return e;
  }
  return std::nullopt;
}

/// The error a call throws; fails the test when it throws nothing.
template <class F>
elastic::error error_of(F&& f) {
  if (auto e = caught(std::forward<F>(f))) return *e;
  FAIL("expected an elastic::error");
  return elastic::error(errc::invalid_argument, "unreachable");
}

}  // namespace elastic::test
