// elastic-watchdog: serves one watchdog segment until SIGTERM/SIGINT.
//
//   elastic-watchdog --name job7 [--events FILE] [--poll MS] [--capacity N]
//                    [--signal SIG] [--escalate-after MS] [--keep]
//
// Workers started with ELASTIC_WATCHDOG=job7 are killed when a timer scope of theirs expires.
// elastic-run hosts the same watchdog in-process; this tool is for jobs started by other means.
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
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
    "timer scope of theirs expires. Runs until SIGTERM or SIGINT.\n"
    "\n"
    "  --name NAME           segment name (default: $ELASTIC_WATCHDOG)\n"
    "  --events FILE         append JSON-lines events to FILE (default: $ELASTIC_EVENTS, else stderr)\n"
    "  --poll MS             longest sleep between scans (default 20)\n"
    "  --capacity N          threads watched at once, for a new segment (default 4096)\n"
    "  --signal SIG          signal for scopes that name none: KILL, ABRT, TERM, ... or a number (default KILL)\n"
    "  --escalate-after MS   SIGKILL a process still alive this long after a softer signal (default 5000)\n"
    "  --keep                leave the segment in /dev/shm on exit (a new watchdog can adopt it)\n"
    "  --version             print the version\n";

[[noreturn]] void fail(const std::string& msg) {
  std::fprintf(stderr, "elastic-watchdog: %s\n%s", msg.c_str(), usage);
  std::exit(2);
}

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

}  // namespace

int main(int argc, char** argv) {
  elastic::timer::watchdog_options opts;
  opts.name = elastic::detail::env_string("ELASTIC_WATCHDOG").value_or("");
  std::string events_file;
  for (int i = 1; i < argc; ++i) {
    std::string_view a(argv[i]);
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) fail(std::string(a) + " needs a value");
      return argv[++i];
    };
    if (a == "--name") {
      opts.name = value();
    } else if (a == "--events") {
      events_file = value();
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

  // Block the stop signals before any thread starts, so only sigwait below receives them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  try {
    opts.events = events_file.empty() ? elastic::event_log::from_env() : elastic::event_log::to_file(events_file);
    elastic::timer::watchdog wd(opts);
    std::printf("elastic-watchdog: serving '%s' (%u slots, poll %lld ms) as pid %d\n", opts.name.c_str(),
                wd.table().slot_count(), static_cast<long long>(opts.poll.count()), static_cast<int>(::getpid()));
    std::fflush(stdout);
    int sig = 0;
    sigwait(&stop_signals, &sig);
    wd.stop();
    const auto s = wd.stats();
    std::printf("elastic-watchdog: stopped by %s after %llu scans, %llu signals, %llu slots reclaimed\n",
                elastic::detail::signal_name(sig).data(), static_cast<unsigned long long>(s.scans),
                static_cast<unsigned long long>(s.signals), static_cast<unsigned long long>(s.reclaimed));
  } catch (const elastic::error& e) {
    std::fprintf(stderr, "elastic-watchdog: %s\n", e.what());
    return 1;
  }
  return 0;
}
