// Uses the public API with no watchdog configured: scopes are no-ops, training goes on.
#include <chrono>
#include <cstdio>

#include <elastic/elastic.hpp>

int main() {
  using namespace std::chrono_literals;
  {
    auto guard = elastic::expires(30s, "allreduce");
    guard.extend(10s);
  }
  std::printf("elastic %s\n", elastic::version.string);
  return 0;
}
