// Waiting, bounded, for what another thread or process brings about.
#pragma once

#include <chrono>
#include <thread>

namespace elastic::test {

/// Polls `done` every `every` until it holds or `limit` has passed; returns its last answer.
template <class F>
bool eventually(F&& done, std::chrono::milliseconds limit = std::chrono::seconds(10),
                std::chrono::milliseconds every = std::chrono::milliseconds(5)) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= until) return done();
    std::this_thread::sleep_for(every);
  }
  return true;
}

}  // namespace elastic::test
