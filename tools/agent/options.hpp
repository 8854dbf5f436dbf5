// elastic-run's command line: what to start, how many, where they meet, and how failures and
// preemptions are handled.
#pragma once

#include <sched.h>
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

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "../command_line.hpp"
#include "exit_codes.hpp"
#include <elastic/error.hpp>
#include <elastic/detail/names.hpp>
#include <elastic/rendezvous/rendezvous.hpp>
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

namespace internal {

using elastic::tools::any_text;
using elastic::tools::check;
using elastic::tools::seconds;
using elastic::tools::to_count;
using elastic::tools::to_seconds;
using elastic::tools::whole_number;

/// Why `id` is not a run id, or "" when it is one: 1 to 64 characters of A-Z a-z 0-9 . _ -,
/// not starting with '.' or '-' (so never ".", ".." or a path: it names a directory).
inline std::string run_id_problem(std::string_view id) {
  const bool chars_ok = std::all_of(id.begin(), id.end(), rendezvous::detail::run_id_char);
  if (!id.empty() && id.size() <= 64 && chars_ok && id.front() != '.' && id.front() != '-') return {};
  return fmt::format("'{}' is not a run id: use 1 to 64 characters of A-Z a-z 0-9 . _ -, not starting with '.' or "
                     "'-' (it names a directory under --log-dir and the run's store)",
                     elastic::detail::printable(id));
}

/// Throws errc::invalid_argument unless `id` is a plain name (see run_id_problem); `where` says
/// where it came from ("ELASTIC_RUN_ID").
inline void check_run_id(std::string_view id, std::string_view where) {
  if (auto why = run_id_problem(id); !why.empty()) throw error(errc::invalid_argument, fmt::format("{} {}", where, why));
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

/// A signal by name ("USR1", "SIGUSR1", "usr1") or number, for --preempt-signal, into `sig`;
/// returns why it is refused ("" when it is not): a launcher cannot or must not take every
/// signal as a notice.
inline std::string signal_problem(std::string_view v, int& sig) {
  std::string upper;
  for (char c : v) upper += (c >= 'a' && c <= 'z') ? static_cast<char>(c - 'a' + 'A') : c;
  std::string_view name = upper;
  if (name.rfind("SIG", 0) == 0) name.remove_prefix(3);
  sig = 0;
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
    return fmt::format("wants a signal name (USR1, SIGUSR2, WINCH, ...) or number, got '{}'", v);
  }
  if (sig == SIGKILL || sig == SIGSTOP || sig == SIGCHLD || sig == SIGPIPE) {
    return fmt::format("{}: the launcher cannot take this signal as a notice ({})", v,
                       sig == SIGCHLD || sig == SIGPIPE ? "it needs it for its own work" : "it cannot be caught");
  }
  return {};
}

/// CUDA devices this process may use, as torchrun's `--nproc-per-node gpu` counts them: the
/// entries of CUDA_VISIBLE_DEVICES when it is set (up to the first that cannot be a device, as
/// CUDA reads it: "" or "-1" hides them all), at most the GPUs the driver lists in
/// /proc/driver/nvidia/gpus (else the /dev/nvidiaN nodes).
inline std::size_t visible_gpu_count() {
  std::size_t installed = 0;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/proc/driver/nvidia/gpus", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++installed;
  }
  if (installed == 0) {
    for (auto it = std::filesystem::directory_iterator("/dev", ec); !ec && it != std::filesystem::directory_iterator();
         it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (name.size() > 6 && name.rfind("nvidia", 0) == 0 &&
          std::all_of(name.begin() + 6, name.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        ++installed;
      }
    }
  }
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  if (visible == nullptr || installed == 0) return installed;
  std::size_t listed = 0;
  for (std::string_view rest = visible; !rest.empty();) {
    const auto comma = std::min(rest.find(','), rest.size());
    const std::string_view entry = rest.substr(0, comma);
    if (entry.empty() || entry.front() == '-') break;
    ++listed;
    rest.remove_prefix(std::min(comma + 1, rest.size()));
  }
  return std::min(listed, installed);
}

/// The CPU cores this process may run on (its affinity mask), at least 1.
inline std::size_t cpu_count() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  return std::max<std::size_t>(1, std::thread::hardware_concurrency());
}

/// CLI11's usage line names the program part, which is not an option.
class help_formatter : public CLI::Formatter {
 public:
  std::string make_usage(const CLI::App*, std::string) const override {
    return "usage: elastic-run [options] [--] PROGRAM [ARGS...]\n";
  }
};

inline constexpr std::size_t max_nodes_allowed = 65536;

}  // namespace internal

/// What a command line asks for: a run (then `options` hold it), or the help or the version.
struct command_line {
  enum class request { run, help, version };
  request asks = request::run;
  launch_options options;
  std::string help;                ///< the generated help text, for --help
  std::vector<std::string> notes;  ///< torchrun flags accepted that change nothing here, said why
};

/// Parses elastic-run's arguments (argv without the program name) with CLI11. Everything after
/// `--`, or from the first argument that is not an option, is the program and its arguments:
/// `elastic-run -- --help` runs a program named --help. torchrun's spellings are accepted (see
/// README: "torchrun's command line"). Throws errc::invalid_argument with the reason, naming
/// the flag.
inline command_line parse_command_line(std::span<const std::string_view> args) {
  command_line out;
  launch_options& o = out.options;
  std::string nproc, nnodes, rdzv, rdzv_backend, rdzv_endpoint, host_addr, monitor_interval, redirects, tee;
  std::vector<std::string> signals;
  bool standalone = false, no_python = false, version = false;

  CLI::App app(
      "Starts PROGRAM once per worker slot on this host, hosts the watchdog, restarts workers that fail (the others "
      "keep running and the group rebuilds around them), forwards a preemption notice (SIGTERM, SIGINT, SIGUSR1, ...) "
      "to the workers as SIGTERM and keeps every worker's log. torchrun's spellings of the flags are accepted too.",
      "elastic-run");
  app.formatter(std::make_shared<internal::help_formatter>());
  app.get_formatter()->column_width(40);
  app.prefix_command();  // the first positional starts the program: the rest is its arguments
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.set_help_flag("-h,--help", "print this help and exit");
  app.add_flag("--version", version, "print the version and exit");

  app.add_option("--nproc-per-node,--nproc_per_node", nproc,
                 "workers on this host: a number from 1 to 4096, gpu (one per visible GPU), cpu (one per CPU "
                 "core) or auto (default: one per GPU, else one per CPU core)")
      ->check(internal::check("N|gpu|cpu|auto", [](std::string_view v) {
        return v == "gpu" || v == "cpu" || v == "auto" || internal::to_count(v, 1, 4096)
                   ? std::string()
                   : fmt::format("wants a whole number from 1 to 4096, gpu, cpu or auto, got '{}'", v);
      }));
  app.add_option("--nnodes", nnodes, "hosts in the job, as torchrun counts them (default 1)")
      ->check(internal::check("MIN[:MAX]", [](std::string_view v) {
        const auto colon = v.find(':');
        const auto lo = internal::to_count(v.substr(0, colon), 1, internal::max_nodes_allowed);
        const auto hi = colon == std::string_view::npos ? lo : internal::to_count(v.substr(colon + 1), 1, internal::max_nodes_allowed);
        if (!lo || !hi) return fmt::format("wants MIN or MIN:MAX, whole numbers from 1 to {}, got '{}'", internal::max_nodes_allowed, v);
        if (*hi < *lo) return fmt::format("{}: MAX must not be below MIN", v);
        return std::string();
      }));
  app.add_option("--min-ranks", o.min_ranks, "fewest workers the group trains with (default MIN * nproc-per-node)")
      ->check(internal::whole_number(1, 1 << 20));
  app.add_option("--rdzv", rdzv,
                 "store: shm://NAME (one host) or etcd://HOST:PORT[,HOST:PORT] (default shm://elastic-RUN_ID, this "
                 "launcher's own: a second elastic-run of the same run on this host is refused)")
      ->check(internal::check("URL", [](std::string_view v) {
        try {
          (void)rendezvous::parse_store_url(v);
          return std::string();
        } catch (const error& e) {
          return e.message();
        }
      }));
  app.add_option("--rdzv-backend,--rdzv_backend", rdzv_backend,
                 "torchrun's: c10d or static (this host's own store, as --rdzv shm://), etcd or etcd-v2 (with "
                 "--rdzv-endpoint)")
      ->check(internal::check("BACKEND", [](std::string_view v) {
        return v == "c10d" || v == "static" || v == "etcd" || v == "etcd-v2"
                   ? std::string()
                   : fmt::format("'{}' is not a backend elastic-run has: c10d or static (one host), etcd or etcd-v2", v);
      }));
  app.add_option("--rdzv-endpoint,--rdzv_endpoint", rdzv_endpoint,
                 "torchrun's: HOST:PORT[,HOST:PORT] of the etcd for --rdzv-backend etcd (a URL is taken as --rdzv)")
      ->check(internal::any_text("HOST:PORT"));
  app.add_flag("--standalone", standalone, "torchrun's: one host, this launcher's own store (the default)");
  app.add_option("--host-addr,--local-addr,--local_addr", host_addr,
                 "the address workers on other hosts reach this host's workers at, exported as ELASTIC_HOST_ADDR "
                 "(default: $ELASTIC_HOST_ADDR, else loopback for shm://, else this host's address on the route to "
                 "etcd)")
      ->check(internal::check("ADDR", [](std::string_view v) {
        return v.find_first_of(" \t\n/") == std::string_view::npos
                   ? std::string()
                   : fmt::format("wants an IP address or host name, got '{}'", v);
      }));
  app.add_option("--run-id,--run_id,--rdzv-id,--rdzv_id", o.run_id,
                 "the job's name in the store, the logs and the events: 1 to 64 of A-Z a-z 0-9 . _ -, not starting "
                 "with . or - (default $ELASTIC_RUN_ID, else random)")
      ->check(internal::check("ID", internal::run_id_problem));
  app.add_option("--max-restarts,--max_restarts", o.max_restarts,
                 "failed workers restarted before giving up (default 3); a worker that exits 75 after a preemption "
                 "notice is restarted without counting; one that exits 75 on its own is restarted after a backoff "
                 "(0.1 s doubling to 30 s), and more than K such exits of a slot in a row with no checkpoint committed "
                 "end the run (exit 3)")
      ->check(internal::whole_number(0, 1'000'000));
  app.add_option("--step-timeout", "a step longer than S seconds is killed by the watchdog (exported as "
                                   "ELASTIC_STEP_TIMEOUT; default: the trainer's own)")
      ->check(internal::seconds())
      ->each([&](const std::string& v) { o.step_timeout = *internal::to_seconds(v); });
  app.add_option("--grace", "after a notice, seconds the workers get to checkpoint and exit 75 before SIGKILL (default 25)")
      ->check(internal::seconds())
      ->each([&](const std::string& v) { o.grace = *internal::to_seconds(v); });
  app.add_option("--preempt-signal", signals,
                 "also treat SIG (a name such as USR2 or WINCH, or a number) as a preemption notice; repeat or "
                 "separate with commas. Every signal that would end the launcher already is one; signals within 2 s "
                 "of a notice are the same notice, a later one kills the workers now")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->check(internal::check("SIG[,SIG]", [](std::string_view v) {
        for (std::size_t start = 0; start <= v.size();) {
          const auto comma = std::min(v.find(',', start), v.size());
          int sig = 0;
          if (comma == start) return std::string("needs a value, got an empty one");
          if (auto why = internal::signal_problem(v.substr(start, comma - start), sig); !why.empty()) return why;
          start = comma + 1;
        }
        return std::string();
      }));
  app.add_option("--log-dir,--log_dir", "worker logs go to DIR/RUN_ID/rank-N.log (default ./elastic-logs); DIR/RUN_ID "
                                         "must be this user's (or root's) and writable by no other")
      ->check(internal::any_text("DIR"))
      ->each([&](const std::string& v) { o.log_dir = v; });
  app.add_option("--events", "JSON-lines events (default DIR/RUN_ID/events.jsonl)")
      ->check(internal::any_text("FILE"))
      ->each([&](const std::string& v) { o.events = v; });
  app.add_flag("--quiet", o.quiet, "worker output to the logs only, not the console");
  app.add_option("--monitor-interval,--monitor_interval", monitor_interval,
                 "torchrun's; accepted and unused: elastic-run learns of a worker's end at once")
      ->check(internal::seconds());
  app.add_flag("--no-python,--no_python", no_python, "torchrun's; accepted: elastic-run always runs PROGRAM itself");
  app.add_option("-r,--redirects", redirects,
                 "torchrun's: 3 (every rank's output to its log only) is --quiet; other values are accepted and "
                 "unused: the output always goes to the console and to the per-rank logs")
      ->check(internal::any_text("0-3|RANK:0-3,..."));
  app.add_option("-t,--tee", tee, "torchrun's; accepted: the output always goes to the console and to the logs")
      ->check(internal::any_text("0-3|RANK:0-3,..."));
  app.footer(
      "Exit: 0 every worker finished; 75 preempted (run the same command again: it resumes from the newest committed "
      "checkpoint); 1 failed (restarts used up, a worker could not start, this run already has a launcher on this "
      "host); 2 a bad command line or path; 3 a crash loop (workers kept exiting 75 with no notice and no progress: "
      "do not requeue).");
  tools::name_values_in_help(app);
  out.help = app.help();

  // The options part first, with the app's own options: an empty `--flag=` must not take the
  // next argument as its value, and an unknown option must not pass as the program.
  const auto scan = tools::scan_options(app, args);
  if (scan.asked != nullptr) {
    out.asks = scan.asked == app.get_help_ptr() ? command_line::request::help : command_line::request::version;
    return out;
  }
  if (!scan.problem.empty()) throw error(errc::invalid_argument, scan.problem);

  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 takes them last first
  try {
    app.parse(std::move(reversed));
  } catch (const CLI::CallForHelp&) {
    out.asks = command_line::request::help;
    return out;
  } catch (const CLI::ParseError& e) {
    throw error(errc::invalid_argument, e.what());
  }
  if (version) {
    out.asks = command_line::request::version;
    return out;
  }
  o.command = app.remaining();
  if (!o.command.empty() && o.command.front() == "--") o.command.erase(o.command.begin());
  if (o.command.empty()) throw error(errc::invalid_argument, "no program to run: elastic-run [options] -- PROGRAM [ARGS...]");

  // Workers per host, as torchrun reads --nproc-per-node.
  if (nproc == "gpu") {
    o.nproc_per_node = internal::visible_gpu_count();
    if (o.nproc_per_node == 0) {
      throw error(errc::invalid_argument,
                  "--nproc-per-node gpu: no GPU is visible (CUDA_VISIBLE_DEVICES, /proc/driver/nvidia/gpus): give a "
                  "number, or cpu");
    }
  } else if (nproc == "cpu") {
    o.nproc_per_node = internal::cpu_count();
  } else if (nproc.empty() || nproc == "auto") {
    const std::size_t gpus = internal::visible_gpu_count();
    o.nproc_per_node = gpus > 0 ? gpus : internal::cpu_count();
  } else {
    o.nproc_per_node = *internal::to_count(nproc, 1, 4096);
  }
  if (!nnodes.empty()) {
    const auto colon = nnodes.find(':');
    o.min_nodes = *internal::to_count(std::string_view(nnodes).substr(0, colon), 1, internal::max_nodes_allowed);
    o.max_nodes = colon == std::string::npos
                      ? o.min_nodes
                      : *internal::to_count(std::string_view(nnodes).substr(colon + 1), 1, internal::max_nodes_allowed);
  }
  if (!host_addr.empty()) o.host_addr = host_addr;
  for (const auto& list : signals) {
    for (std::size_t start = 0; start <= list.size();) {
      const auto comma = std::min(list.find(',', start), list.size());
      int sig = 0;
      (void)internal::signal_problem(std::string_view(list).substr(start, comma - start), sig);
      o.preempt_signals.push_back(sig);
      start = comma + 1;
    }
  }

  // Where the hosts meet: --rdzv, or torchrun's backend and endpoint.
  const bool torchrun_rdzv = !rdzv_backend.empty() || !rdzv_endpoint.empty();
  if (!rdzv.empty() && torchrun_rdzv) {
    throw error(errc::invalid_argument,
                "--rdzv and --rdzv-backend/--rdzv-endpoint both name the store: give one (--rdzv etcd://HOST:PORT is "
                "--rdzv-backend etcd --rdzv-endpoint HOST:PORT)");
  }
  if (rdzv_backend == "etcd" || rdzv_backend == "etcd-v2") {
    if (rdzv_endpoint.empty()) {
      throw error(errc::invalid_argument, fmt::format("--rdzv-backend {} needs --rdzv-endpoint HOST:PORT", rdzv_backend));
    }
    rdzv = rdzv_endpoint.find("://") == std::string::npos ? "etcd://" + rdzv_endpoint : rdzv_endpoint;
  } else if (rdzv_backend.empty() && rdzv_endpoint.find("://") != std::string::npos) {
    rdzv = rdzv_endpoint;  // elastic-run's own spelling: --rdzv-endpoint URL
  } else if (!rdzv_endpoint.empty()) {
    out.notes.push_back(fmt::format(
        "--rdzv-endpoint {} is not used: with --rdzv-backend {} the workers meet in this launcher's own store on this "
        "host (for several hosts: --rdzv-backend etcd --rdzv-endpoint HOST:PORT)",
        rdzv_endpoint, rdzv_backend.empty() ? "static" : rdzv_backend));
  }
  if (!rdzv.empty()) {
    try {
      (void)rendezvous::parse_store_url(rdzv);
    } catch (const error& e) {
      throw error(errc::invalid_argument, fmt::format("--rdzv-endpoint: {}", e.message()));
    }
  }
  const bool one_host_store = rdzv.empty() || rendezvous::parse_store_url(rdzv).scheme == rendezvous::store_url::kind::shm;
  if (standalone && !one_host_store) {
    throw error(errc::invalid_argument, fmt::format("--standalone is one host with its own store, but the store is {}", rdzv));
  }
  if (o.max_nodes > 1 && one_host_store) {
    throw error(errc::invalid_argument,
                fmt::format("--nnodes {}: more than one host cannot meet in {}, a store on this host alone; give an "
                            "etcd store: --rdzv etcd://HOST:PORT (torchrun's --rdzv-backend etcd --rdzv-endpoint "
                            "HOST:PORT)",
                            nnodes, rdzv.empty() ? "this launcher's own shm:// store" : rdzv));
  }
  o.rdzv = rdzv;

  // torchrun's flags that change nothing here: said, so nobody wonders.
  if (!monitor_interval.empty()) {
    out.notes.push_back(fmt::format("--monitor-interval {} is not used: elastic-run learns of a worker's end at once",
                                    monitor_interval));
  }
  if (redirects == "3") {
    o.quiet = true;
  } else if (!redirects.empty()) {
    out.notes.push_back(fmt::format("--redirects {} is not used: every worker's output goes to the console and to its "
                                    "log (--quiet, or --redirects 3: to the logs only)",
                                    redirects));
  }
  if (!tee.empty()) {
    out.notes.push_back(fmt::format("--tee {} is not needed: every worker's output already goes to the console and to "
                                    "its log",
                                    tee));
  }

  const std::size_t max_ranks = o.max_nodes * o.nproc_per_node;
  if (o.min_ranks == 0) o.min_ranks = o.min_nodes * o.nproc_per_node;
  if (o.min_ranks > max_ranks) {
    throw error(errc::invalid_argument,
                fmt::format("--min-ranks {} is more than the {} workers --nnodes and --nproc-per-node allow", o.min_ranks,
                            max_ranks));
  }
  return out;
}

}  // namespace elastic::agent
