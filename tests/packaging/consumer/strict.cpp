// Every public header, and code that runs through them, built the way a careful consumer builds
// (Release, -Wall -Wextra -Werror -pedantic): warnings such as GCC's -Wmaybe-uninitialized
// appear only in code that is emitted and optimised, so including the headers is not enough.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "all_headers.hpp"

int main() {
  using namespace std::chrono_literals;
  namespace format = elastic::checkpoint::format;

  // A checkpoint manifest written and read back: the JSON writer and parser, inlined.
  format::rank_manifest m{};
  m.rank = 0;
  m.step = 7;
  const std::string text = format::encode(m);
  const format::rank_manifest back = format::decode_rank(text, "rank-00000.json");
  if (back.step != m.step || format::encode(back) != text) {
    std::fprintf(stderr, "the manifest did not read back as written:\n%s\n", text.c_str());
    return EXIT_FAILURE;
  }
  format::step_manifest s{};
  s.step = 7;
  const std::string step_text = format::encode(s);
  if (format::decode_step(step_text, "manifest.json").step != 7) {
    std::fprintf(stderr, "the step manifest did not read back as written:\n%s\n", step_text.c_str());
    return EXIT_FAILURE;
  }

  // A timer scope with no watchdog: it watches nothing.
  {
    auto guard = elastic::expires(30s, "strict");
    guard.extend(10s);
    if (guard.watched()) return EXIT_FAILURE;
  }
  std::printf("elastic %s strict consumer: cuda=%d nccl=%d gloo=%d etcd=%d\n", elastic::version.string,
              ELASTIC_WITH_CUDA, ELASTIC_WITH_NCCL, ELASTIC_WITH_GLOO, ELASTIC_WITH_ETCD);
  return EXIT_SUCCESS;
}
