// elastic-run's command line: what to start, how many, where they meet, and how failures and
// preemptions are handled; torchrun's spellings of the flags included. parse_command_line() is
// the parser: it defines the options (each group in its own step, in the order --help lists
// them), lets CLI11 read them, then turns what was given into launch_options, one step per
// decision (workers per host, hosts, the store, torchrun's flags that change nothing, the
// group's bounds). Vocabulary: nodes are hosts, ranks are worker processes.
#pragma once

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "../command_line.hpp"
#include "../signal_names.hpp"
#include "exit_codes.hpp"
#include "launch_options.hpp"
#include "run_id.hpp"
#include "worker_count.hpp"
#include <elastic/error.hpp>
#include <elastic/internal/env.hpp>
#include <elastic/internal/names.hpp>
#include <elastic/rendezvous/rendezvous.hpp>
#include <elastic/rendezvous/store_url.hpp>

namespace elastic::agent {

namespace detail {

using elastic::tools::any_text;
using elastic::tools::check;
using elastic::tools::seconds;
using elastic::tools::signal_display_name;
using elastic::tools::to_count;
using elastic::tools::to_seconds;
using elastic::tools::to_signal;
using elastic::tools::whole_number;

/// A signal by name ("USR1", "SIGUSR1", "usr1") or number, for --preempt-signal, into `sig`;
/// returns why it is refused ("" when it is not): a launcher cannot or must not take every
/// signal as a notice.
inline std::string signal_problem(std::string_view v, int& sig) {
  sig = to_signal(v);
  if (sig == 0) {
    return fmt::format("wants a signal name (USR1, SIGUSR2, WINCH, ...) or number, got '{}'", v);
  }
  if (sig == SIGKILL || sig == SIGSTOP || sig == SIGCHLD || sig == SIGPIPE) {
    return fmt::format("{}: the launcher cannot take this signal as a notice ({})", v,
                       sig == SIGCHLD || sig == SIGPIPE ? "it needs it for its own work" : "it cannot be caught");
  }
  return {};
}

/// CLI11's usage line names the program part, which is not an option.
class help_formatter : public CLI::Formatter {
 public:
  std::string make_usage(const CLI::App*, std::string) const override {
    return "usage: elastic-run [options] [--] PROGRAM [ARGS...]\n";
  }
};

inline constexpr std::size_t max_nodes_allowed = 65536;

/// The flags as given, before they become launch_options (the ones that need more than a copy).
struct raw_flags {
  std::string nproc, nnodes, rdzv, rdzv_backend, rdzv_endpoint, host_addr, monitor_interval, redirects, tee;
  std::string python, restart_mode;
  std::vector<std::string> signals;
  bool standalone = false, no_python = false, module = false, version = false;
};

/// How many workers, on how many hosts, the group trains with.
inline void add_worker_options(CLI::App& app, raw_flags& f, launch_options& o) {
  app.add_option("--nproc-per-node,--nproc_per_node", f.nproc,
                 "workers on this host: a number from 1 to 4096, gpu (one per visible GPU), cpu (one per CPU "
                 "core) or auto (default: one per GPU, else one per CPU core)")
      ->check(detail::check("N|gpu|cpu|auto", [](std::string_view v) {
        return v == "gpu" || v == "cpu" || v == "auto" || detail::to_count(v, 1, 4096)
                   ? std::string()
                   : fmt::format("wants a whole number from 1 to 4096, gpu, cpu or auto, got '{}'", v);
      }));
  app.add_option("--nnodes", f.nnodes, "hosts in the job, as torchrun counts them (default 1)")
      ->check(detail::check("MIN[:MAX]", [](std::string_view v) {
        const auto colon = v.find(':');
        const auto lo = detail::to_count(v.substr(0, colon), 1, detail::max_nodes_allowed);
        const auto hi = colon == std::string_view::npos ? lo : detail::to_count(v.substr(colon + 1), 1, detail::max_nodes_allowed);
        if (!lo || !hi) return fmt::format("wants MIN or MIN:MAX, whole numbers from 1 to {}, got '{}'", detail::max_nodes_allowed, v);
        if (*hi < *lo) return fmt::format("{}: MAX must not be below MIN", v);
        return std::string();
      }));
  app.add_option("--min-ranks", o.min_ranks, "fewest workers the group trains with (default MIN * nproc-per-node)")
      ->check(detail::whole_number(1, 1 << 20));
}

/// Where the workers meet, and what this host and the run are called there.
inline void add_store_options(CLI::App& app, raw_flags& f, launch_options& o) {
  app.add_option("--rdzv", f.rdzv,
                 "store: shm://NAME (one host) or etcd://HOST:PORT[,HOST:PORT] (default shm://elastic-RUN_ID, this "
                 "launcher's own: a second elastic-run of the same run on this host is refused)")
      ->check(detail::check("URL", [](std::string_view v) {
        try {
          (void)rendezvous::parse_store_url(v);
          return std::string();
        } catch (const error& e) {
          return e.message();
        }
      }));
  app.add_option("--rdzv-backend,--rdzv_backend", f.rdzv_backend,
                 "torchrun's: c10d or static (this host's own store, as --rdzv shm://), etcd or etcd-v2 (with "
                 "--rdzv-endpoint)")
      ->check(detail::check("BACKEND", [](std::string_view v) {
        return v == "c10d" || v == "static" || v == "etcd" || v == "etcd-v2"
                   ? std::string()
                   : fmt::format("'{}' is not a backend elastic-run has: c10d or static (one host), etcd or etcd-v2", v);
      }));
  app.add_option("--rdzv-endpoint,--rdzv_endpoint", f.rdzv_endpoint,
                 "torchrun's: HOST:PORT[,HOST:PORT] of the etcd for --rdzv-backend etcd (a URL is taken as --rdzv)")
      ->check(detail::any_text("HOST:PORT"));
  app.add_flag("--standalone", f.standalone, "torchrun's: one host, this launcher's own store (the default)");
  app.add_flag_callback("--no-store-relay", [&] { o.store_relay = false; },
                        "with an etcd store, each worker speaks to etcd itself (its own lease, watches and "
                        "connections) instead of through this launcher's relay (one of each per host)");
  app.add_option("--host-addr,--local-addr,--local_addr", f.host_addr,
                 "the address workers on other hosts reach this host's workers at, exported as ELASTIC_HOST_ADDR "
                 "(default: $ELASTIC_HOST_ADDR, else loopback for shm://, else this host's address on the route to "
                 "etcd)")
      ->check(detail::check("ADDR", [](std::string_view v) {
        return v.find_first_of(" \t\n/") == std::string_view::npos
                   ? std::string()
                   : fmt::format("wants an IP address or host name, got '{}'", v);
      }));
  app.add_option("--run-id,--run_id,--rdzv-id,--rdzv_id", o.run_id,
                 "the job's name in the store, the logs and the events: 1 to 64 of A-Z a-z 0-9 . _ -, not starting "
                 "with . or - (default $ELASTIC_RUN_ID, else random)")
      ->check(detail::check("ID", detail::run_id_problem));
}

/// Restarts, timeouts and preemption notices.
inline void add_failure_options(CLI::App& app, raw_flags& f, launch_options& o) {
  app.add_option("--max-restarts,--max_restarts", o.max_restarts,
                 "failed workers restarted before giving up (default 3); a worker that exits 75 after a preemption "
                 "notice is restarted without counting; one that exits 75 on its own is restarted after a backoff "
                 "(0.1 s doubling to 30 s), and more than K such exits of a slot in a row with no checkpoint committed "
                 "end the run (exit 3)")
      ->check(detail::whole_number(0, 1'000'000));
  app.add_option("--step-timeout", "a step longer than S seconds is killed by the watchdog (exported as "
                                   "ELASTIC_STEP_TIMEOUT; 0: none). Not given: each training_loop derives its "
                                   "step deadlines from the step times it observes (ELASTIC_AUTO_TIMEOUT=1): a "
                                   "warning, and a kill no sooner than --auto-kill-floor; unless the trainer sets "
                                   "its own")
      ->check(detail::seconds())
      ->each([&](const std::string& v) {
        o.step_timeout = *detail::to_seconds(v);
        o.step_timeout_given = true;
      });
  app.add_option("--auto-kill-floor", "without --step-timeout: the least time a step is given before the watchdog "
                                      "kills it, in seconds (exported as ELASTIC_AUTO_KILL_FLOOR; default 300). A step "
                                      "past its automatic deadline is only warned of until max(10 x that deadline, S)")
      ->check(detail::seconds())
      ->each([&](const std::string& v) { o.auto_kill_floor = *detail::to_seconds(v); });
  app.add_flag("--evict-stragglers", o.evict_stragglers,
               "a worker whose own compute (its step less its waits in collectives) stays 1.5x the group's median, "
               "at two ranks in turn (its slowness followed it across a change of rank), is dropped from the group "
               "and restarted; evictions are not failures, and stop once an evicted slot comes back no faster (by "
               "default stragglers are only reported: straggler events and the summary)");
  app.add_flag_callback("--no-stack-dump", [&] { o.stack_dump = false; },
                        "kill a hung worker at once: no stack dump first (by default the watchdog stops it, writes the "
                        "stack of each of its threads into its log and a watchdog_stack event, then kills it)");
  app.add_option("--stack-dump-limit", "the most a stack dump may delay a hung worker's kill, in seconds, from 0.001 "
                                       "to 60 (default 2); the dump says what it did not get in that time")
      ->check(detail::check("SECONDS", [](std::string_view v) {
        const auto s = detail::to_seconds(v);
        return s && *s >= std::chrono::milliseconds(1) && *s <= std::chrono::seconds(60)
                   ? std::string()
                   : fmt::format("wants a number of seconds from 0.001 to 60, got '{}'", v);
      }))
      ->each([&](const std::string& v) { o.stack_dump_limit = *detail::to_seconds(v); });
  app.add_option("--grace", "after a notice, seconds the workers get to checkpoint and exit 75 before SIGKILL (default 25)")
      ->check(detail::seconds())
      ->each([&](const std::string& v) { o.grace = *detail::to_seconds(v); });
  app.add_option("--preempt-signal", f.signals,
                 "also treat SIG (a name such as USR2 or WINCH, or a number) as a preemption notice; repeat or "
                 "separate with commas. Every signal that would end the launcher already is one; signals within 2 s "
                 "of a notice are the same notice, a later one kills the workers now")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->check(detail::check("SIG[,SIG]", [](std::string_view v) {
        for (std::size_t start = 0; start <= v.size();) {
          const auto comma = std::min(v.find(',', start), v.size());
          int sig = 0;
          if (comma == start) return std::string("needs a value, got an empty one");
          if (auto why = detail::signal_problem(v.substr(start, comma - start), sig); !why.empty()) return why;
          start = comma + 1;
        }
        return std::string();
      }));
}

/// Where the output and the events go.
inline void add_output_options(CLI::App& app, launch_options& o) {
  app.add_option("--log-dir,--log_dir", "worker logs go to DIR/RUN_ID/rank-N.log (default ./elastic-logs); DIR/RUN_ID "
                                         "must be this user's (or root's) and writable by no other")
      ->check(detail::any_text("DIR"))
      ->each([&](const std::string& v) { o.log_dir = v; });
  app.add_option("--events", "JSON-lines events (default DIR/RUN_ID/events.jsonl)")
      ->check(detail::any_text("FILE"))
      ->each([&](const std::string& v) { o.events = v; });
  app.add_flag("--quiet", o.quiet, "worker output to the logs only, not the console");
  auto* timeline = app.add_option("--timeline", "the run's timeline, a self-contained HTML page written at the end of "
                                                "every run (default: beside the events file, DIR/RUN_ID/timeline.html)")
                       ->check(detail::any_text("FILE"))
                       ->each([&](const std::string& v) { o.timeline = v; });
  app.add_flag("--no-timeline", o.no_timeline, "write no timeline (elastic-report draws one from the events later)")
      ->excludes(timeline);
}

/// torchrun's flags that elastic-run takes and mostly does not need.
inline void add_torchrun_only_options(CLI::App& app, raw_flags& f) {
  app.add_option("--monitor-interval,--monitor_interval", f.monitor_interval,
                 "torchrun's; accepted and unused: elastic-run learns of a worker's end at once")
      ->check(detail::seconds());
}

/// How PROGRAM is run, and what a failed worker costs the others.
inline void add_program_options(CLI::App& app, raw_flags& f) {
  app.add_flag("-m,--module", f.module,
               "torchrun's: PROGRAM is a Python module, run as `python -u -m PROGRAM ARGS...`");
  app.add_flag("--no-python,--no_python", f.no_python,
               "torchrun's: run PROGRAM itself even when it ends in .py (by default a PROGRAM ending in .py is "
               "run as `python -u PROGRAM ARGS...`, as torchrun runs it)");
  app.add_option("--python", f.python,
                 "the interpreter for a .py PROGRAM or -m (default $ELASTIC_PYTHON, else python3 on the PATH)")
      ->check(detail::any_text("PATH"));
  app.add_option("--restart-mode", f.restart_mode,
                 "in-place: a failed worker is restarted alone and the others rebuild their group around it (workers "
                 "built on elastic's group); all: every worker is stopped and started again with new ranks and a new "
                 "MASTER_PORT, on every host, as torchrun does (torch DDP scripts, whose process group cannot "
                 "rebuild); auto (default): all for a Python program (a .py PROGRAM, -m, or PROGRAM python*), "
                 "in-place otherwise")
      ->check(detail::check("auto|in-place|all", [](std::string_view v) {
        return v == "auto" || v == "in-place" || v == "all"
                   ? std::string()
                   : fmt::format("wants auto, in-place or all, got '{}'", v);
      }));
  app.add_option("-r,--redirects", f.redirects,
                 "torchrun's: 3 (every rank's output to its log only) is --quiet; other values are accepted and "
                 "unused: the output always goes to the console and to the per-rank logs")
      ->check(detail::any_text("0-3|RANK:0-3,..."));
  app.add_option("-t,--tee", f.tee, "torchrun's; accepted: the output always goes to the console and to the logs")
      ->check(detail::any_text("0-3|RANK:0-3,..."));
}

/// The app with every option, in the order --help lists them.
inline void define_options(CLI::App& app, raw_flags& f, launch_options& o) {
  app.formatter(std::make_shared<detail::help_formatter>());
  app.get_formatter()->column_width(40);
  app.prefix_command();  // the first positional starts the program: the rest is its arguments
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.set_help_flag("-h,--help", "print this help and exit");
  app.add_flag("--version", f.version, "print the version and exit");
  add_worker_options(app, f, o);
  add_store_options(app, f, o);
  add_failure_options(app, f, o);
  add_output_options(app, o);
  add_program_options(app, f);
  add_torchrun_only_options(app, f);
  app.footer(
      "Exit: 0 every worker finished; 75 preempted (run the same command again: it resumes from the newest committed "
      "checkpoint); 1 failed (restarts used up, a worker could not start, this run already has a launcher on this "
      "host); 2 a bad command line or path; 3 a crash loop (workers kept exiting 75 with no notice and no progress: "
      "do not requeue).");
  tools::name_values_in_help(app);
}

/// Workers per host, as torchrun reads --nproc-per-node.
inline std::size_t workers_per_host(const std::string& nproc) {
  if (nproc == "gpu") {
    const std::size_t gpus = detail::visible_gpu_count();
    if (gpus == 0) {
      throw error(errc::invalid_argument,
                  "--nproc-per-node gpu: no GPU is visible (CUDA_VISIBLE_DEVICES, /proc/driver/nvidia/gpus): give a "
                  "number, or cpu");
    }
    return gpus;
  } else if (nproc == "cpu") {
    return detail::cpu_count();
  } else if (nproc.empty() || nproc == "auto") {
    const std::size_t gpus = detail::visible_gpu_count();
    return gpus > 0 ? gpus : detail::cpu_count();
  } else {
    return static_cast<std::size_t>(*detail::to_count(nproc, 1, 4096));
  }
}

/// Whether `program` is a Python interpreter (python, python3, python3.11, /usr/bin/python3).
inline bool is_python_interpreter(std::string_view program) {
  const auto slash = program.rfind('/');
  const std::string_view base = slash == std::string_view::npos ? program : program.substr(slash + 1);
  if (base.rfind("python", 0) != 0) return false;
  return base.substr(6).find_first_not_of("0123456789.") == std::string_view::npos;
}

/// The command as torchrun would run it: a .py script (unless --no-python) and a module (-m)
/// through the interpreter, unbuffered; and the restart mode it implies.
inline void resolve_program(const raw_flags& f, launch_options& o) {
  if (f.module && f.no_python) {
    throw error(errc::invalid_argument, "-m and --no-python cannot be used together (torchrun refuses them too)");
  }
  std::string python = f.python;
  if (python.empty()) python = elastic::internal::env_string("ELASTIC_PYTHON").value_or("");
  if (python.empty()) python = "python3";
  const std::string program = o.command.front();  // a copy: the insert below moves it
  const bool script = !f.no_python && program.size() > 3 && program.ends_with(".py");
  if (f.module || script) {
    std::vector<std::string> interpreter{python, "-u"};
    if (f.module) interpreter.emplace_back("-m");
    o.command.insert(o.command.begin(), interpreter.begin(), interpreter.end());
  } else if (!f.python.empty()) {
    throw error(errc::invalid_argument,
                fmt::format("--python {}: PROGRAM '{}' is neither a .py script nor a module (-m)", f.python, program));
  }
  o.python_program = f.module || script || is_python_interpreter(program);
  if (f.restart_mode == "all" || ((f.restart_mode.empty() || f.restart_mode == "auto") && o.python_program)) {
    o.restarts = restart_mode::whole_round;
  } else {
    o.restarts = restart_mode::in_place;
  }
}

/// --nnodes MIN[:MAX], hosts.
inline void read_hosts(const raw_flags& f, launch_options& o) {
  if (!f.nnodes.empty()) {
    const auto colon = f.nnodes.find(':');
    o.min_nodes = *detail::to_count(std::string_view(f.nnodes).substr(0, colon), 1, detail::max_nodes_allowed);
    o.max_nodes = colon == std::string::npos
                      ? o.min_nodes
                      : *detail::to_count(std::string_view(f.nnodes).substr(colon + 1), 1, detail::max_nodes_allowed);
  }
}

/// --preempt-signal's lists, each already checked.
inline void read_preempt_signals(const raw_flags& f, launch_options& o) {
  for (const auto& list : f.signals) {
    for (std::size_t start = 0; start <= list.size();) {
      const auto comma = std::min(list.find(',', start), list.size());
      int sig = 0;
      (void)detail::signal_problem(std::string_view(list).substr(start, comma - start), sig);
      o.preempt_signals.push_back(sig);
      start = comma + 1;
    }
  }

}

/// Where the hosts meet: --rdzv, or torchrun's backend and endpoint; notes what is not used.
inline void resolve_store(raw_flags& f, launch_options& o, std::vector<std::string>& notes) {
  const bool torchrun_rdzv = !f.rdzv_backend.empty() || !f.rdzv_endpoint.empty();
  if (!f.rdzv.empty() && torchrun_rdzv) {
    throw error(errc::invalid_argument,
                "--rdzv and --rdzv-backend/--rdzv-endpoint both name the store: give one (--rdzv etcd://HOST:PORT is "
                "--rdzv-backend etcd --rdzv-endpoint HOST:PORT)");
  }
  if (f.rdzv_backend == "etcd" || f.rdzv_backend == "etcd-v2") {
    if (f.rdzv_endpoint.empty()) {
      throw error(errc::invalid_argument, fmt::format("--rdzv-backend {} needs --rdzv-endpoint HOST:PORT", f.rdzv_backend));
    }
    f.rdzv = f.rdzv_endpoint.find("://") == std::string::npos ? "etcd://" + f.rdzv_endpoint : f.rdzv_endpoint;
  } else if (f.rdzv_backend.empty() && f.rdzv_endpoint.find("://") != std::string::npos) {
    f.rdzv = f.rdzv_endpoint;  // elastic-run's own spelling: --rdzv-endpoint URL
  } else if (!f.rdzv_endpoint.empty()) {
    notes.push_back(fmt::format(
        "--rdzv-endpoint {} is not used: with --rdzv-backend {} the workers meet in this launcher's own store on this "
        "host (for several hosts: --rdzv-backend etcd --rdzv-endpoint HOST:PORT)",
        f.rdzv_endpoint, f.rdzv_backend.empty() ? "static" : f.rdzv_backend));
  }
  if (!f.rdzv.empty()) {
    try {
      (void)rendezvous::parse_store_url(f.rdzv);
    } catch (const error& e) {
      throw error(errc::invalid_argument, fmt::format("--rdzv-endpoint: {}", e.message()));
    }
  }
  if (!f.rdzv.empty() && rendezvous::parse_store_url(f.rdzv).scheme == rendezvous::store_url::kind::relay) {
    throw error(errc::invalid_argument,
                fmt::format("--rdzv-endpoint {}: a relay is what elastic-run gives its own workers; give the store "
                            "itself (etcd://HOST:PORT)",
                            f.rdzv));
  }
  const bool one_host_store = f.rdzv.empty() || rendezvous::parse_store_url(f.rdzv).scheme == rendezvous::store_url::kind::shm;
  if (f.standalone && !one_host_store) {
    throw error(errc::invalid_argument, fmt::format("--standalone is one host with its own store, but the store is {}", f.rdzv));
  }
  if (o.max_nodes > 1 && one_host_store) {
    throw error(errc::invalid_argument,
                fmt::format("--nnodes {}: more than one host cannot meet in {}, a store on this host alone; give an "
                            "etcd store: --rdzv etcd://HOST:PORT (torchrun's --rdzv-backend etcd --rdzv-endpoint "
                            "HOST:PORT)",
                            f.nnodes, f.rdzv.empty() ? "this launcher's own shm:// store" : f.rdzv));
  }
  o.rdzv = f.rdzv;

}

/// torchrun's flags that change nothing here: said, so nobody wonders.
inline void note_unused_torchrun_flags(const raw_flags& f, launch_options& o, std::vector<std::string>& notes) {
  if (!f.monitor_interval.empty()) {
    notes.push_back(fmt::format("--monitor-interval {} is not used: elastic-run learns of a worker's end at once",
                                    f.monitor_interval));
  }
  if (f.redirects == "3") {
    o.quiet = true;
  } else if (!f.redirects.empty()) {
    notes.push_back(fmt::format("--redirects {} is not used: every worker's output goes to the console and to its "
                                    "log (--quiet, or --redirects 3: to the logs only)",
                                    f.redirects));
  }
  if (!f.tee.empty()) {
    notes.push_back(fmt::format("--tee {} is not needed: every worker's output already goes to the console and to "
                                    "its log",
                                    f.tee));
  }

}

/// The group's bounds, in workers: --min-ranks (default: every host's workers at MIN hosts), at
/// most every host's workers at MAX hosts.
inline void check_rank_bounds(launch_options& o) {
  const std::size_t max_ranks = o.max_ranks();
  if (o.min_ranks == 0) o.min_ranks = o.min_nodes * o.nproc_per_node;
  if (o.min_ranks > max_ranks) {
    throw error(errc::invalid_argument,
                fmt::format("--min-ranks {} is more than the {} workers --nnodes and --nproc-per-node allow", o.min_ranks,
                            max_ranks));
  }}

}  // namespace detail

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
  detail::raw_flags f;
  CLI::App app(
      "Starts PROGRAM once per worker slot on this host, hosts the watchdog, restarts workers that fail (the others "
      "keep running and the group rebuilds around them), forwards a preemption notice (SIGTERM, SIGINT, SIGUSR1, ...) "
      "to the workers as SIGTERM and keeps every worker's log. torchrun's spellings of the flags are accepted too.",
      "elastic-run");
  detail::define_options(app, f, o);
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
  if (f.version) {
    out.asks = command_line::request::version;
    return out;
  }
  o.command = app.remaining();
  if (!o.command.empty() && o.command.front() == "--") o.command.erase(o.command.begin());
  if (o.command.empty() && f.module) {
    throw error(errc::invalid_argument, "-m needs the module to run: elastic-run [options] -m MODULE [ARGS...]");
  }
  if (o.command.empty()) throw error(errc::invalid_argument, "no program to run: elastic-run [options] -- PROGRAM [ARGS...]");

  detail::resolve_program(f, o);
  o.nproc_per_node = detail::workers_per_host(f.nproc);
  detail::read_hosts(f, o);
  if (!f.host_addr.empty()) o.host_addr = f.host_addr;
  detail::read_preempt_signals(f, o);
  detail::resolve_store(f, o, out.notes);
  detail::note_unused_torchrun_flags(f, o, out.notes);
  if (o.restarts == restart_mode::whole_round && o.min_ranks != 0) {
    throw error(errc::invalid_argument,
                "--min-ranks is for --restart-mode in-place: with every worker restarted together (--restart-mode "
                "all, the default for a Python program) a round is every worker of MIN to MAX hosts (--nnodes)");
  }
  detail::check_rank_bounds(o);
  return out;
}

}  // namespace elastic::agent
