// elastic-run: starts a training job's workers on this host and keeps them going. The logic is
// in agent/ beside it (the tool's own headers, not installed); this is its command line.
//
//   elastic-run [--nproc-per-node N] [--nnodes MIN[:MAX]] [--rdzv URL] [--run-id ID]
//               [--max-restarts K] [--step-timeout S] [--grace S] [--preempt-signal SIG]
//               [--log-dir DIR] -- PROGRAM ARGS...
//
// The command line is parsed with CLI11 (agent/options.hpp), torchrun's spellings included.
//
// Exit codes (agent/exit_codes.hpp): 0 done, 1 failed, 2 bad command line or
// path, 3 crash loop, 75 preempted. Nothing ends it with std::terminate: every error is caught.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string_view>
#include <vector>

#include <elastic/config.hpp>

#include "agent/exit_codes.hpp"
#include "agent/launcher.hpp"
#include "agent/options.hpp"

namespace {

/// Errors that mean "fix the command": a bad value, a name we refuse, a path we may not use, a
/// store this build cannot speak (an etcd:// URL without elastic::etcd).
bool usage_error(const elastic::error& e) {
  return e.code() == elastic::errc::invalid_argument || e.code() == elastic::errc::bad_name ||
         e.code() == elastic::errc::unsafe_path || e.code() == elastic::errc::not_supported;
}

int run(int argc, char** argv) {
  std::vector<std::string_view> args(argv + 1, argv + argc);
  elastic::agent::command_line cl;
  try {
    cl = elastic::agent::parse_command_line(args);
  } catch (const elastic::error& e) {
    std::fprintf(stderr, "elastic-run: %s\n(elastic-run --help lists the options)\n", e.message().c_str());
    return elastic::agent::exit_usage;
  }
  if (cl.asks == elastic::agent::command_line::request::help) {
    std::fputs(cl.help.c_str(), stdout);
    return elastic::agent::exit_done;
  }
  if (cl.asks == elastic::agent::command_line::request::version) {
    std::printf("elastic-run %s\n", ELASTIC_VERSION_STRING);
    return elastic::agent::exit_done;
  }
  for (const auto& note : cl.notes) std::fprintf(stderr, "elastic-run: note: %s\n", note.c_str());
  auto opts = std::move(cl.options);
  try {
    elastic::agent::launcher launcher(std::move(opts));
    return launcher.run();
  } catch (const elastic::error& e) {
    std::fprintf(stderr, "elastic-run: %s\n", e.what());
    return usage_error(e) ? elastic::agent::exit_usage : elastic::agent::exit_failed;
  }
}

}  // namespace

int main(int argc, char** argv) {
  int code = elastic::agent::exit_failed;
  try {
    code = run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "elastic-run: %s\n", e.what());
    code = elastic::agent::exit_failed;
  } catch (...) {
    std::fprintf(stderr, "elastic-run: an unexpected error\n");
    code = elastic::agent::exit_failed;
  }
  if (elastic::agent::detail::store_thread_abandoned.load()) {
    // A store call is still stuck in the network on its thread: do not run static destructors
    // under it.
    std::fflush(nullptr);
    std::_Exit(code);
  }
  return code;
}
