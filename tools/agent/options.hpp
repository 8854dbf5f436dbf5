// elastic-run's command line: what to start, how many, where they meet, and how failures and
// preemptions are handled.
#pragma once

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "exit_codes.hpp"
#include <elastic/error.hpp>
#include <elastic/rendezvous/store_url.hpp>

namespace elastic::agent {

struct launch_options {
  std::size_t nproc_per_node = 0;   ///< 0: one per GPU, else one per CPU core
  std::size_t min_nodes = 1;        ///< hosts, as torchrun counts them
  std::size_t max_nodes = 1;
  std::size_t min_ranks = 0;        ///< the group's lower bound; 0: min_nodes * nproc_per_node
  std::string rdzv;                 ///< store URL; empty: shm://elastic-<run id>
  std::string host_addr;            ///< what peers reach this host's workers at; empty: worked out
  std::string run_id;               ///< empty: ELASTIC_RUN_ID, else a random one
  std::size_t max_restarts = 3;     ///< failures restarted, across all workers
  std::chrono::milliseconds step_timeout{0};  ///< exported as ELASTIC_STEP_TIMEOUT (0: not set)
  std::chrono::milliseconds grace{std::chrono::seconds(25)};  ///< SIGTERM to SIGKILL
  std::filesystem::path log_dir = "elastic-logs";
  std::filesystem::path events;     ///< empty: <log_dir>/<run id>/events.jsonl
  bool quiet = false;               ///< no worker output on the console (the logs keep it)
  std::vector<int> preempt_signals;  ///< more signals that mean "preemption notice"
  std::vector<std::string> command;  ///< the program and its arguments
};

inline constexpr std::string_view usage_text =
    "usage: elastic-run [options] -- PROGRAM [ARGS...]\n"
    "\n"
    "Starts PROGRAM once per worker slot on this host, hosts the watchdog, restarts workers that\n"
    "fail (the others keep running and the group rebuilds around them), forwards a preemption\n"
    "notice (SIGTERM, SIGINT, SIGUSR1, ...) to the workers as SIGTERM and keeps every worker's log.\n"
    "\n"
    "  --nproc-per-node N    workers on this host (default: one per GPU, else one per CPU core)\n"
    "  --nnodes MIN[:MAX]    hosts in the job, as torchrun counts them (default 1)\n"
    "  --min-ranks N         fewest workers the group trains with (default MIN * nproc-per-node)\n"
    "  --rdzv URL            store: shm://NAME (one host) or etcd://HOST:PORT[,HOST:PORT]\n"
    "                        (default shm://elastic-RUN_ID, this launcher's own: a second\n"
    "                        elastic-run of the same run on this host is refused)\n"
    "  --host-addr ADDR      the address workers on other hosts reach this host's workers at,\n"
    "                        exported as ELASTIC_HOST_ADDR (default: $ELASTIC_HOST_ADDR, else\n"
    "                        loopback for shm://, else this host's address on the route to etcd)\n"
    "  --run-id ID           the job's name in the store, the logs and the events: 1 to 64 of\n"
    "                        A-Z a-z 0-9 . _ -, not starting with . or - (default\n"
    "                        $ELASTIC_RUN_ID, else random)\n"
    "  --max-restarts K      failed workers restarted before giving up (default 3); a worker\n"
    "                        that exits 75 after a preemption notice is restarted without\n"
    "                        counting; one that exits 75 on its own is restarted after a\n"
    "                        backoff (0.1 s doubling to 30 s), and more than K such exits of a\n"
    "                        slot in a row with no checkpoint committed end the run (exit 3)\n"
    "  --step-timeout S      a step longer than S seconds is killed by the watchdog (exported as\n"
    "                        ELASTIC_STEP_TIMEOUT; default: the trainer's own)\n"
    "  --grace S             after a notice, seconds the workers get to checkpoint and exit 75\n"
    "                        before SIGKILL (default 25)\n"
    "  --preempt-signal SIG  also treat SIG (a name such as USR2 or WINCH, or a number) as a\n"
    "                        preemption notice; repeat or separate with commas. Every signal\n"
    "                        that would end the launcher already is one; signals within 2 s of\n"
    "                        a notice are the same notice, a later one kills the workers now\n"
    "  --log-dir DIR         worker logs go to DIR/RUN_ID/rank-N.log (default ./elastic-logs);\n"
    "                        DIR/RUN_ID must be this user's (or root's) and writable by no other\n"
    "  --events FILE         JSON-lines events (default DIR/RUN_ID/events.jsonl)\n"
    "  --quiet               worker output to the logs only, not the console\n"
    "  --help, --version\n"
    "\n"
    "Exit: 0 every worker finished; 75 preempted (run the same command again: it resumes from the\n"
    "newest committed checkpoint); 1 failed (restarts used up, a worker could not start, this run\n"
    "already has a launcher on this host); 2 a bad command line or path; 3 a crash loop (workers\n"
    "kept exiting 75 with no notice and no progress: do not requeue).\n";

namespace detail {

inline std::size_t parse_count(std::string_view flag, std::string_view v, std::size_t lo, std::size_t hi) {
  std::size_t n = 0;
  const auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
  if (ec != std::errc() || p != v.data() + v.size() || n < lo || n > hi) {
    throw error(errc::invalid_argument,
                fmt::format("{} wants a whole number from {} to {}, got '{}'", flag, lo, hi, v));
  }
  return n;
}

inline std::chrono::milliseconds parse_seconds(std::string_view flag, std::string_view v) {
  const std::string s(v);
  char* end = nullptr;
  const double x = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || !(x >= 0) || x > 1e7) {
    throw error(errc::invalid_argument, fmt::format("{} wants a number of seconds (e.g. 30 or 2.5), got '{}'", flag, v));
  }
  return std::chrono::milliseconds(std::llround(x * 1000));
}

/// Throws errc::invalid_argument unless `id` is a plain name: 1 to 64 characters of
/// A-Z a-z 0-9 . _ -, not starting with '.' or '-' (so never ".", ".." or a path).
inline void check_run_id(std::string_view id, std::string_view where) {
  const bool chars_ok = std::all_of(id.begin(), id.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
  });
  if (id.empty() || id.size() > 64 || !chars_ok || id.front() == '.' || id.front() == '-') {
    std::string shown;
    for (char c : id) shown += (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) ? '?' : c;
    throw error(errc::invalid_argument,
                fmt::format("{} '{}' is not a run id: use 1 to 64 characters of A-Z a-z 0-9 . _ -, not starting "
                            "with '.' or '-' (it names a directory under --log-dir and the run's store)",
                            where, shown));
  }
}

/// Signal names without "SIG", for --preempt-signal and for messages.
inline constexpr std::pair<std::string_view, int> signal_names[] = {
    {"HUP", SIGHUP},       {"INT", SIGINT},     {"QUIT", SIGQUIT},   {"ILL", SIGILL},   {"TRAP", SIGTRAP},
    {"ABRT", SIGABRT},     {"BUS", SIGBUS},     {"FPE", SIGFPE},     {"KILL", SIGKILL}, {"USR1", SIGUSR1},
    {"SEGV", SIGSEGV},     {"USR2", SIGUSR2},   {"PIPE", SIGPIPE},   {"ALRM", SIGALRM}, {"TERM", SIGTERM},
    {"STKFLT", SIGSTKFLT}, {"CHLD", SIGCHLD},   {"CONT", SIGCONT},   {"STOP", SIGSTOP}, {"TSTP", SIGTSTP},
    {"TTIN", SIGTTIN},     {"TTOU", SIGTTOU},   {"URG", SIGURG},     {"XCPU", SIGXCPU}, {"XFSZ", SIGXFSZ},
    {"VTALRM", SIGVTALRM}, {"PROF", SIGPROF},   {"WINCH", SIGWINCH}, {"IO", SIGIO},     {"POLL", SIGPOLL},
    {"PWR", SIGPWR},       {"SYS", SIGSYS}};

/// "SIGUSR1", "SIGRTMIN+2", or "signal 99".
inline std::string signal_display_name(int sig) {
  for (const auto& [n, s] : signal_names)
    if (s == sig && n != "POLL") return "SIG" + std::string(n);
  if (sig >= SIGRTMIN && sig <= SIGRTMAX) return fmt::format("SIGRTMIN+{}", sig - SIGRTMIN);
  return fmt::format("signal {}", sig);
}

/// A signal by name ("USR1", "SIGUSR1", "usr1") or number, for --preempt-signal. Refuses the
/// ones a launcher cannot or must not take as a notice.
inline int parse_signal(std::string_view flag, std::string_view v) {
  std::string upper;
  for (char c : v) upper += (c >= 'a' && c <= 'z') ? static_cast<char>(c - 'a' + 'A') : c;
  std::string_view name = upper;
  if (name.rfind("SIG", 0) == 0) name.remove_prefix(3);
  int sig = 0;
  if (name.rfind("RTMIN+", 0) == 0 && name.size() > 6) {
    int n = -1;
    const auto [p, ec] = std::from_chars(name.data() + 6, name.data() + name.size(), n);
    sig = ec == std::errc() && p == name.data() + name.size() && n >= 0 && SIGRTMIN + n <= SIGRTMAX ? SIGRTMIN + n : 0;
  } else if (!name.empty() && name.front() >= '0' && name.front() <= '9') {
    const auto [p, ec] = std::from_chars(name.data(), name.data() + name.size(), sig);
    if (ec != std::errc() || p != name.data() + name.size()) sig = 0;
  } else {
    for (const auto& [n, s] : signal_names)
      if (n == name) sig = s;
  }
  if (sig <= 0 || sig >= NSIG || (sig > 31 && sig < SIGRTMIN)) {
    throw error(errc::invalid_argument,
                fmt::format("{} wants a signal name (USR1, SIGUSR2, WINCH, ...) or number, got '{}'", flag, v));
  }
  if (sig == SIGKILL || sig == SIGSTOP || sig == SIGCHLD || sig == SIGPIPE) {
    throw error(errc::invalid_argument,
                fmt::format("{} {}: the launcher cannot take this signal as a notice ({})", flag, v,
                            sig == SIGCHLD || sig == SIGPIPE ? "it needs it for its own work" : "it cannot be caught"));
  }
  return sig;
}

/// CUDA devices this host has (/dev/nvidia0, /dev/nvidia1, ...).
inline std::size_t gpu_count() {
  std::size_t n = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev", ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() > 6 && name.rfind("nvidia", 0) == 0 &&
        std::all_of(name.begin() + 6, name.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      ++n;
    }
  }
  return n;
}

}  // namespace detail

/// Parses elastic-run's arguments (argv without the program name). Throws errc::invalid_argument
/// with a message that names the flag; `--help`/`--version` come back as command {"--help"} etc.
inline launch_options parse_command_line(std::span<const std::string_view> args) {
  launch_options o;
  std::size_t i = 0;
  auto value = [&](std::string_view flag) -> std::string_view {
    if (i + 1 >= args.size()) throw error(errc::invalid_argument, fmt::format("{} needs a value", flag));
    return args[++i];
  };
  auto nonempty = [](std::string_view flag, std::string_view v) -> std::string_view {
    if (v.empty()) throw error(errc::invalid_argument, fmt::format("{} needs a value, got an empty one", flag));
    return v;
  };
  for (; i < args.size(); ++i) {
    std::string_view a = args[i];
    std::optional<std::string> inline_value;
    if (a == "--") {
      ++i;
      break;
    }
    if (a.rfind("--", 0) == 0) {
      if (const auto eq = a.find('='); eq != std::string_view::npos) {  // --flag=value
        inline_value = std::string(a.substr(eq + 1));
        a = a.substr(0, eq);
      }
    }
    auto val = [&](std::string_view flag) -> std::string_view {
      return nonempty(flag, inline_value ? std::string_view(*inline_value) : value(flag));
    };
    if (a == "--help" || a == "-h" || a == "--version") {
      o.command = {std::string(a)};
      return o;
    }
    // torchrun spells some flags with underscores; accept both.
    std::string flag(a);
    std::replace(flag.begin(), flag.end(), '_', '-');
    if (flag == "--nproc-per-node") {
      o.nproc_per_node = detail::parse_count(flag, val(flag), 1, 4096);
    } else if (flag == "--nnodes") {
      const std::string_view v = val(flag);
      const auto colon = v.find(':');
      o.min_nodes = detail::parse_count(flag, v.substr(0, colon), 1, 65536);
      o.max_nodes = colon == std::string_view::npos ? o.min_nodes : detail::parse_count(flag, v.substr(colon + 1), 1, 65536);
      if (o.max_nodes < o.min_nodes) {
        throw error(errc::invalid_argument, fmt::format("--nnodes {}: MAX must not be below MIN", v));
      }
    } else if (flag == "--min-ranks") {
      o.min_ranks = detail::parse_count(flag, val(flag), 1, 1 << 20);
    } else if (flag == "--rdzv" || flag == "--rdzv-endpoint") {
      o.rdzv = std::string(val(flag));
      (void)rendezvous::parse_store_url(o.rdzv);  // a bad URL is a bad command line
    } else if (flag == "--host-addr" || flag == "--local-addr") {
      o.host_addr = std::string(val(flag));
      if (o.host_addr.empty() || o.host_addr.find_first_of(" \t\n/") != std::string::npos) {
        throw error(errc::invalid_argument, fmt::format("{} wants an IP address or host name, got '{}'", flag, o.host_addr));
      }
    } else if (flag == "--run-id") {
      o.run_id = std::string(val(flag));
      detail::check_run_id(o.run_id, "--run-id");
    } else if (flag == "--max-restarts") {
      o.max_restarts = detail::parse_count(flag, val(flag), 0, 1'000'000);
    } else if (flag == "--step-timeout") {
      o.step_timeout = detail::parse_seconds(flag, val(flag));
    } else if (flag == "--grace") {
      o.grace = detail::parse_seconds(flag, val(flag));
    } else if (flag == "--log-dir") {
      o.log_dir = std::string(val(flag));
    } else if (flag == "--events") {
      o.events = std::string(val(flag));
    } else if (flag == "--preempt-signal") {
      const std::string_view v = val(flag);
      for (std::size_t start = 0; start <= v.size();) {
        const auto comma = std::min(v.find(',', start), v.size());
        o.preempt_signals.push_back(detail::parse_signal(flag, nonempty(flag, v.substr(start, comma - start))));
        start = comma + 1;
      }
    } else if (flag == "--quiet") {
      if (inline_value) throw error(errc::invalid_argument, "--quiet takes no value");
      o.quiet = true;
    } else if (a.rfind("-", 0) == 0) {
      throw error(errc::invalid_argument, fmt::format("unknown option '{}' (see --help)", a));
    } else {
      break;  // the program, without a "--" before it
    }
  }
  for (; i < args.size(); ++i) o.command.emplace_back(args[i]);
  if (o.command.empty()) throw error(errc::invalid_argument, "no program to run: elastic-run [options] -- PROGRAM [ARGS...]");
  if (o.nproc_per_node == 0) {
    const std::size_t gpus = detail::gpu_count();
    o.nproc_per_node = gpus > 0 ? gpus : std::max<std::size_t>(1, std::thread::hardware_concurrency());
  }
  const std::size_t max_ranks = o.max_nodes * o.nproc_per_node;
  if (o.min_ranks == 0) o.min_ranks = o.min_nodes * o.nproc_per_node;
  if (o.min_ranks > max_ranks) {
    throw error(errc::invalid_argument,
                fmt::format("--min-ranks {} is more than the {} workers --nnodes and --nproc-per-node allow", o.min_ranks,
                            max_ranks));
  }
  return o;
}

}  // namespace elastic::agent
