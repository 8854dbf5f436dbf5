// elastic-run's command line: what to start, how many, where they meet, and how failures and
// preemptions are handled.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>

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
  std::vector<std::string> command;  ///< the program and its arguments
};

inline constexpr std::string_view usage_text =
    "usage: elastic-run [options] -- PROGRAM [ARGS...]\n"
    "\n"
    "Starts PROGRAM once per worker slot on this host, hosts the watchdog, restarts workers that\n"
    "fail (the others keep running and the group rebuilds around them), forwards SIGTERM/SIGINT\n"
    "as a preemption notice and keeps every worker's log.\n"
    "\n"
    "  --nproc-per-node N    workers on this host (default: one per GPU, else one per CPU core)\n"
    "  --nnodes MIN[:MAX]    hosts in the job, as torchrun counts them (default 1)\n"
    "  --min-ranks N         fewest workers the group trains with (default MIN * nproc-per-node)\n"
    "  --rdzv URL            store: shm://NAME (one host) or etcd://HOST:PORT[,HOST:PORT]\n"
    "                        (default shm://elastic-RUN_ID)\n"
    "  --host-addr ADDR      the address workers on other hosts reach this host's workers at,\n"
    "                        exported as ELASTIC_HOST_ADDR (default: $ELASTIC_HOST_ADDR, else\n"
    "                        loopback for shm://, else this host's address on the route to etcd)\n"
    "  --run-id ID           the job's name in the store, the logs and the events (default\n"
    "                        $ELASTIC_RUN_ID, else random)\n"
    "  --max-restarts K      failed workers restarted before giving up (default 3); a worker\n"
    "                        that exits 75 (preempted) is restarted without counting\n"
    "  --step-timeout S      a step longer than S seconds is killed by the watchdog (exported as\n"
    "                        ELASTIC_STEP_TIMEOUT; default: the trainer's own)\n"
    "  --grace S             after SIGTERM, seconds the workers get to checkpoint and exit 75\n"
    "                        before SIGKILL (default 25)\n"
    "  --log-dir DIR         worker logs go to DIR/RUN_ID/rank-N.log (default ./elastic-logs)\n"
    "  --events FILE         JSON-lines events (default DIR/RUN_ID/events.jsonl)\n"
    "  --quiet               worker output to the logs only, not the console\n"
    "  --help, --version\n"
    "\n"
    "Exit: 0 every worker finished; 75 preempted (state saved: run the same command again);\n"
    "1 restarts exhausted or a worker could not start; 2 a bad command line.\n";

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
  for (; i < args.size(); ++i) {
    std::string_view a = args[i];
    std::string inline_value;
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
      return inline_value.empty() ? value(flag) : std::string_view(inline_value);
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
    } else if (flag == "--quiet") {
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
