// Uses the public API with no watchdog configured: scopes watch nothing, the program goes on.
#include <chrono>
#include <cstdio>

#include <elastic/elastic.hpp>

int main() {
  using namespace std::chrono_literals;
  {
    auto guard = elastic::expires(30s, "allreduce");
    guard.extend(10s);
    auto inner = elastic::expires(5s, "step");
    if (guard.watched() || inner.watched()) {
      std::fprintf(stderr, "a scope is watched although no watchdog is configured\n");
      return 1;
    }
  }
  std::printf("elastic %s\n", elastic::version.string);
  return 0;
}
