// elastic-run: starts a training job's workers on this host and keeps them going. The logic is
// in include/elastic/agent/; this is its command line.
//
//   elastic-run [--nproc-per-node N] [--nnodes MIN[:MAX]] [--rdzv URL] [--run-id ID]
//               [--max-restarts K] [--step-timeout S] [--grace S] [--log-dir DIR] -- PROGRAM ARGS...
#include <cstdio>
#include <string_view>
#include <vector>

#include <elastic/agent/launcher.hpp>
#include <elastic/agent/options.hpp>
#include <elastic/config.hpp>

int main(int argc, char** argv) {
  std::vector<std::string_view> args(argv + 1, argv + argc);
  elastic::agent::launch_options opts;
  try {
    opts = elastic::agent::parse_command_line(args);
  } catch (const elastic::error& e) {
    std::fprintf(stderr, "elastic-run: %s\n\n%s", e.what(), elastic::agent::usage_text.data());
    return 2;
  }
  if (opts.command.front() == "--help" || opts.command.front() == "-h") {
    std::fputs(elastic::agent::usage_text.data(), stdout);
    return 0;
  }
  if (opts.command.front() == "--version") {
    std::printf("elastic-run %s\n", ELASTIC_VERSION_STRING);
    return 0;
  }
  try {
    elastic::agent::launcher launcher(std::move(opts));
    return launcher.run();
  } catch (const elastic::error& e) {
    std::fprintf(stderr, "elastic-run: %s\n", e.what());
    return 1;
  }
}
