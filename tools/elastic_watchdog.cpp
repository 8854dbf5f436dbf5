// elastic-watchdog: serves one watchdog segment until a signal tells it to stop.
//
//   elastic-watchdog --name job7 [--events FILE] [--poll MS] [--capacity N]
//                    [--signal SIG] [--escalate-after MS] [--keep]
//
// Workers started with ELASTIC_WATCHDOG=job7 are killed when a timer scope of theirs expires.
// elastic-run hosts the same watchdog in-process; this tool is for jobs started by other means.
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
// Exit status: 0 stopped by a signal; 1 the watchdog could not start or failed (the segment is
// served by another watchdog, belongs to another user, is corrupt, an OS error); 2 bad arguments
// or environment (an unknown option, a bad segment name, an events file that is refused or
// cannot be opened).
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <string_view>

#include <elastic/config.hpp>
#include <elastic/detail/env.hpp>
#include <elastic/events.hpp>
#include <elastic/timer/watchdog.hpp>

namespace {

constexpr const char* usage =
    "usage: elastic-watchdog --name NAME [options]\n"
    "\n"
    "Serves the watchdog segment NAME: workers with ELASTIC_WATCHDOG=NAME are signalled when a\n"
    "timer scope of theirs expires. Runs until a signal (SIGTERM, SIGINT, SIGHUP, ...) stops it,\n"
    "then removes the segment (unless --keep).\n"
    "\n"
    "  --name NAME           segment name (default: $ELASTIC_WATCHDOG)\n"
    "  --events FILE         append JSON-lines events to FILE (default: $ELASTIC_EVENTS, else stderr)\n"
    "  --poll MS             longest sleep between scans (default 20)\n"
    "  --capacity N          threads watched at once, for a new segment (default 4096)\n"
    "  --signal SIG          signal for scopes that name none: KILL, ABRT, TERM, ... or a number (default KILL)\n"
    "  --escalate-after MS   SIGKILL a process still alive this long after a softer signal (default 5000)\n"
    "  --keep                leave the segment in /dev/shm on exit (a new watchdog can adopt it)\n"
    "  --version             print the version\n"
    "\n"
    "Exit status: 0 stopped by a signal; 1 the watchdog could not start or failed; 2 bad arguments,\n"
    "segment name or events file.\n";

/// A mistake in the command line or environment: reported with exit code 2.
struct usage_error {
  std::string message;
  bool show_usage = true;  ///< false when the message alone says what to fix
};

[[noreturn]] void fail(const std::string& msg) { throw usage_error{msg}; }

long parse_number(std::string_view flag, const char* value, long lo, long hi) {
  char* end = nullptr;
  errno = 0;
  long v = std::strtol(value, &end, 10);
  if (errno != 0 || end == value || *end != '\0' || v < lo || v > hi) {
    fail(std::string(flag) + " wants a whole number from " + std::to_string(lo) + " to " + std::to_string(hi) +
         ", got '" + value + "'");
  }
  return v;
}

int parse_signal(const char* value) {
  std::string_view s(value);
  if (!s.empty() && s.front() >= '0' && s.front() <= '9') return static_cast<int>(parse_number("--signal", value, 1, NSIG - 1));
  if (s.substr(0, 3) == "SIG") s.remove_prefix(3);
  for (int sig = 1; sig < NSIG; ++sig) {
    const char* abbrev = ::sigabbrev_np(sig);
    if (abbrev != nullptr && s == abbrev) return sig;
  }
  fail("unknown signal '" + std::string(value) + "'");
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

/// A name for `sig` in messages: "SIGTERM", "SIGRTMIN+3".
std::string describe_signal(int sig) {
  if (sig >= SIGRTMIN && sig <= SIGRTMAX) return "SIGRTMIN+" + std::to_string(sig - SIGRTMIN);
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev != nullptr ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

int serve(int argc, char** argv) {
  elastic::timer::watchdog_options opts;
  std::string name_from = "--name";
  if (auto env = elastic::detail::env_string("ELASTIC_WATCHDOG")) {
    opts.name = *env;
    name_from = "ELASTIC_WATCHDOG";
  }
  std::string events_file;
  for (int i = 1; i < argc; ++i) {
    std::string_view a(argv[i]);
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) fail(std::string(a) + " needs a value");
      return argv[++i];
    };
    if (a == "--name") {
      opts.name = value();
      name_from = "--name";
    } else if (a == "--events") {
      events_file = value();
      if (events_file.empty()) fail("--events needs a file name");
    } else if (a == "--poll") {
      opts.poll = std::chrono::milliseconds(parse_number(a, value(), 1, 60'000));
    } else if (a == "--capacity") {
      opts.capacity = static_cast<std::uint32_t>(parse_number(a, value(), 1, 1 << 20));
    } else if (a == "--signal") {
      opts.signal = parse_signal(value());
    } else if (a == "--escalate-after") {
      opts.escalate_after = std::chrono::milliseconds(parse_number(a, value(), 0, 3'600'000));
    } else if (a == "--keep") {
      opts.remove_on_stop = false;
    } else if (a == "--version") {
      std::printf("elastic-watchdog %s\n", elastic::version.string);
      return 0;
    } else if (a == "-h" || a == "--help") {
      std::fputs(usage, stdout);
      return 0;
    } else {
      fail("unknown argument '" + std::string(a) + "'");
    }
  }
  if (opts.name.empty()) fail("--name is required (or set ELASTIC_WATCHDOG)");

  // What the caller got wrong is checked before anything is created, and exits 2.
  try {
    elastic::timer::detail::validate_segment_name(opts.name);
  } catch (const elastic::error& e) {
    throw usage_error{name_from + ": " + e.what(), false};
  }
  try {
    opts.events = events_file.empty() ? elastic::event_log::from_env() : elastic::event_log::to_file(events_file);
  } catch (const elastic::error& e) {
    throw usage_error{e.what(), false};  // names the file, and ELASTIC_EVENTS when it came from there
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
              describe_signal(sig).c_str(), static_cast<unsigned long long>(s.scans),
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
    std::fprintf(stderr, "elastic-watchdog: %s\n%s", e.message.c_str(), e.show_usage ? usage : "");
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
