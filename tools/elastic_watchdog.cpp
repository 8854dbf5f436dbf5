// elastic-watchdog: serves one watchdog segment until a signal tells it to stop.
//
//   elastic-watchdog --name job7 [--events FILE] [--poll MS] [--capacity N]
//                    [--signal SIG] [--escalate-after MS] [--keep]
//                    [--no-stack-dump] [--stack-dump-limit MS]
//
// Workers started with ELASTIC_WATCHDOG=job7 are killed when a timer scope of theirs expires.
// elastic-run hosts the same watchdog in-process; this tool is for jobs started by other means.
// Before each kill it captures the stack of every thread of the hung process with ptrace
// (watchdog_stack event, and the dump as text on stdout), unless --no-stack-dump. It is not the
// workers' parent, so where kernel.yama.ptrace_scope is 1 (Ubuntu's default) only root or
// CAP_SYS_PTRACE may do that; otherwise each dump lists the threads and says why it has no stacks.
//
// It never ends through std::terminate and never leaves its segment behind on an orderly exit:
// every signal whose default action would end it (SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1,
// SIGALRM, the real-time signals, ... and the fault signals when another process sends them) is
// blocked in every thread and taken by sigwait() in main, which stops the watchdog and removes
// the segment; SIGPIPE is ignored (a closed stdout is not a reason to stop enforcing deadlines).
// Only SIGKILL, or a real fault, ends it without cleanup: then the segment stays, so that a new
// watchdog can adopt it while workers run, and the next watchdog to start removes it once no
// worker maps it any more.
//
// The command line is parsed with CLI11 (--help is generated from it).
//
// Exit status: 0 stopped by a signal; 1 the watchdog could not start or failed (the segment is
// served by another watchdog, belongs to another user, is corrupt, an OS error); 2 bad arguments
// or environment (an unknown option, a bad segment name, an events file that is refused or
// cannot be opened).
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <elastic/config.hpp>
#include <elastic/internal/env.hpp>
#include <elastic/events.hpp>
#include <elastic/timer/watchdog.hpp>

#include "command_line.hpp"
#include "signal_names.hpp"

namespace {

/// A mistake in the command line or environment: reported with exit code 2.
struct usage_error {
  std::string message;
};

using elastic::tools::any_text;
using elastic::tools::to_count;
using elastic::tools::whole_number;

using elastic::tools::to_signal;

/// CLI11 validators, their reasons as before CLI11 (CLI11 puts the option's name first).
CLI::Validator signal_name() {
  return CLI::Validator(
      [](std::string& v) { return to_signal(v) != 0 ? std::string() : fmt::format("unknown signal '{}'", v); }, "SIG");
}

/// The command line, parsed with CLI11 into `opts` and `events_file`; throws usage_error.
/// Returns false when it asked for the help or the version, printed here.
bool parse_command_line(int argc, char** argv, elastic::timer::watchdog_options& opts, std::string& name_from,
                        std::string& events_file) {
  CLI::App app(
      "Serves the watchdog segment NAME: workers with ELASTIC_WATCHDOG=NAME are signalled when a timer scope of "
      "theirs expires. Runs until a signal (SIGTERM, SIGINT, SIGHUP, ...) stops it, then removes the segment (unless "
      "--keep).",
      "elastic-watchdog");
  app.set_help_flag("-h,--help", "print this help and exit");
  bool version = false;  // answered by scan_options() below, before CLI11 parses
  app.add_flag("--version", version, "print the version and exit");
  app.add_option("--name", "segment name (default: $ELASTIC_WATCHDOG)")
      ->check(any_text("NAME"))
      ->each([&](const std::string& v) {
        opts.name = v;
        name_from = "--name";
      });
  app.add_option("--events", events_file, "append JSON-lines events to FILE (default: $ELASTIC_EVENTS, else stderr)")
      ->check(any_text("FILE"));
  app.add_option("--poll", "longest sleep between scans, in ms (default 20)")
      ->check(whole_number(1, 60'000))
      ->each([&](const std::string& v) { opts.poll = std::chrono::milliseconds(*to_count(v, 1, 60'000)); });
  app.add_option("--capacity", "threads watched at once, for a new segment (default 4096)")
      ->check(whole_number(1, 1 << 20))
      ->each([&](const std::string& v) { opts.capacity = static_cast<std::uint32_t>(*to_count(v, 1, 1 << 20)); });
  app.add_option("--signal", "signal for scopes that name none: KILL, ABRT, TERM, ... or a number (default KILL)")
      ->check(signal_name())
      ->each([&](const std::string& v) { opts.signal = to_signal(v); });
  app.add_option("--escalate-after", "SIGKILL a process still alive this long (ms) after a softer signal (default 5000)")
      ->check(whole_number(0, 3'600'000))
      ->each([&](const std::string& v) { opts.escalate_after = std::chrono::milliseconds(*to_count(v, 0, 3'600'000)); });
  app.add_flag_callback("--no-stack-dump", [&] { opts.stack_dump = false; },
                        "signal a hung process at once: no stack dump first (by default the stack of each of its "
                        "threads is captured with ptrace, logged as a watchdog_stack event and printed on stdout)");
  app.add_option("--stack-dump-limit", "the most a stack dump may delay a hung process's signal, in ms (default 2000)")
      ->check(whole_number(1, 60'000))
      ->each([&](const std::string& v) { opts.stack_dump_limit = std::chrono::milliseconds(*to_count(v, 1, 60'000)); });
  app.add_flag_callback("--keep", [&] { opts.remove_on_stop = false; },
                        "leave the segment in /dev/shm on exit (a new watchdog can adopt it)");
  app.footer(
      "Exit status: 0 stopped by a signal; 1 the watchdog could not start or failed; 2 bad arguments, segment name or "
      "events file.");
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  elastic::tools::name_values_in_help(app);

  const std::vector<std::string_view> args(argv + 1, argv + argc);
  const auto scan = elastic::tools::scan_options(app, args);
  if (scan.asked == app.get_help_ptr()) {
    std::fputs(app.help().c_str(), stdout);
    return false;
  }
  if (scan.asked != nullptr) {
    std::printf("elastic-watchdog %s\n", elastic::version.string);
    return false;
  }
  const std::string hint = "\n(elastic-watchdog --help lists the options)";
  if (!scan.problem.empty()) throw usage_error{scan.problem + hint};
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // A positional (the watchdog takes none) is an ExtrasError: "The following argument was not expected: x".
    throw usage_error{std::string(e.what()) + hint};
  }
  return true;
}

/// Every signal whose default action ends the process and that a process may catch (all but
/// SIGKILL and SIGSTOP; SIGPIPE is ignored instead). Blocked, they wait for sigwait().
sigset_t stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGHUP, SIGINT, SIGQUIT, SIGILL, SIGTRAP, SIGABRT, SIGBUS, SIGFPE, SIGUSR1, SIGSEGV, SIGUSR2,
                  SIGALRM, SIGTERM, SIGSTKFLT, SIGXCPU, SIGXFSZ, SIGVTALRM, SIGPROF, SIGIO, SIGPWR, SIGSYS}) {
    sigaddset(&set, sig);
  }
  for (int sig = SIGRTMIN; sig <= SIGRTMAX; ++sig) sigaddset(&set, sig);
  return set;
}

/// Writes a stack dump's text on stdout, in one piece where it fits one write.
void print_stack(const elastic::timer::stack_dump& d) {
  const std::string text = elastic::timer::to_text(d);
  for (std::size_t done = 0; done < text.size();) {
    const ssize_t n = ::write(STDOUT_FILENO, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // a closed stdout: the event has it
    done += static_cast<std::size_t>(n);
  }
}

int serve(int argc, char** argv) {
  elastic::timer::watchdog_options opts;
  opts.stack_dump = true;  // this tool reaps no child: a tracee's stops bother nobody here
  opts.on_stack = print_stack;
  std::string name_from = "--name";
  if (auto env = elastic::internal::env_string("ELASTIC_WATCHDOG")) {
    opts.name = *env;
    name_from = "ELASTIC_WATCHDOG";
  }
  std::string events_file;
  if (!parse_command_line(argc, argv, opts, name_from, events_file)) return 0;
  if (opts.name.empty()) throw usage_error{"--name is required (or set ELASTIC_WATCHDOG); elastic-watchdog --help lists the options"};

  // What the caller got wrong is checked before anything is created, and exits 2.
  try {
    elastic::timer::detail::validate_segment_name(opts.name);
  } catch (const elastic::error& e) {
    throw usage_error{name_from + ": " + e.what()};
  }
  try {
    opts.events = events_file.empty() ? elastic::event_log::from_env(/*everything_to_stderr=*/true)
                                       : elastic::event_log::to_file(events_file);
  } catch (const elastic::error& e) {
    throw usage_error{e.what()};  // names the file, and ELASTIC_EVENTS when it came from there
  }

  // Block the stop signals before any thread starts, so only sigwait below receives them.
  const sigset_t stops = stop_signals();
  pthread_sigmask(SIG_BLOCK, &stops, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  elastic::timer::watchdog wd(opts);
  std::printf("elastic-watchdog: serving '%s' (%u slots, poll %lld ms) as pid %d\n", opts.name.c_str(),
              wd.table().slot_count(), static_cast<long long>(opts.poll.count()), static_cast<int>(::getpid()));
  std::fflush(stdout);
  int sig = 0;
  while (sigwait(&stops, &sig) != 0) {
  }
  wd.stop();
  const auto s = wd.stats();
  std::printf("elastic-watchdog: stopped by %s after %llu scans, %llu signals, %llu slots reclaimed\n",
              elastic::tools::signal_display_name(sig).c_str(), static_cast<unsigned long long>(s.scans),
              static_cast<unsigned long long>(s.signals), static_cast<unsigned long long>(s.reclaimed));
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Nothing may escape to std::terminate: every failure is a message and an exit code.
  try {
    return serve(argc, argv);
  } catch (const usage_error& e) {
    std::fprintf(stderr, "elastic-watchdog: %s\n", e.message.c_str());
    return 2;
  } catch (const elastic::error& e) {
    std::fprintf(stderr, "elastic-watchdog: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "elastic-watchdog: %s\n", e.what());
    return 1;
  } catch (...) {
    std::fprintf(stderr, "elastic-watchdog: failed with an unknown exception\n");
    return 1;
  }
}
