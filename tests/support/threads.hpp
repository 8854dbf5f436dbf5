// Runs a piece of a test on several threads that start together, collecting what they threw.
#pragma once

#include <exception>
#include <functional>
#include <latch>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace elastic::test {

/// Runs `f(i)` for each of `indices` on a thread of its own, all released together once every
/// thread is up; returns the messages of what they threw.
inline std::vector<std::string> on_threads(const std::vector<int>& indices, const std::function<void(int)>& f) {
  std::latch go(static_cast<std::ptrdiff_t>(indices.size()));
  std::mutex m;
  std::vector<std::string> errors;
  {
    std::vector<std::jthread> ts;
    for (int i : indices) {
      ts.emplace_back([&, i] {
        go.arrive_and_wait();
        try {
          f(i);
        } catch (const std::exception& e) {
          std::lock_guard lk(m);
          errors.push_back(e.what());
        }
      });
    }
  }
  return errors;
}

/// on_threads for the indices 0 .. n-1.
inline std::vector<std::string> on_threads(int n, const std::function<void(int)>& f) {
  std::vector<int> indices(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) indices[static_cast<std::size_t>(i)] = i;
  return on_threads(indices, f);
}

}  // namespace elastic::test
