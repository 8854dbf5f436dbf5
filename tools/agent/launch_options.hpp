// What one elastic-run is asked to do (filled by options.hpp's parse_command_line, read by the
// launcher). Vocabulary: a node is a host (a machine), as torchrun counts them; a rank is one
// worker process. The group's bounds are in ranks: min_ranks, and max_nodes * nproc_per_node.
#pragma once

#include <chrono>
#include <cstddef>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace elastic::agent {

/// What a failed worker costs the others.
enum class restart_mode {
  /// The survivors rebuild their group in place and only the failed worker restarts: workers
  /// built on elastic's group (comm::elastic_group).
  in_place,
  /// Every worker of the round is stopped and the round starts again with fresh ranks and a fresh
  /// MASTER_PORT, as torchrun does: workers whose process group cannot rebuild (a torch DDP
  /// script). A membership change on another host (a failure there, a host gone or joining)
  /// restarts this host's workers too.
  whole_round,
};

struct launch_options {
  std::size_t nproc_per_node = 0;   ///< workers (ranks) on this host; 0: one per GPU, else one per CPU core
  std::size_t min_nodes = 1;        ///< hosts, as torchrun counts them
  std::size_t max_nodes = 1;        ///< hosts
  std::size_t min_ranks = 0;        ///< the group's lower bound, in workers; 0: min_nodes * nproc_per_node
  std::string rdzv;                 ///< store URL; empty: shm://elastic-<run id>
  std::string host_addr;            ///< what peers reach this host's workers at; empty: worked out
  /// With an etcd store the workers reach it through this launcher's relay (one lease and one
  /// watch per host, store_relay.hpp) unless --no-store-relay.
  bool store_relay = true;
  std::string relay;                ///< the relay's URL the workers get as ELASTIC_RDZV; empty: none
  std::string run_id;               ///< empty: ELASTIC_RUN_ID, else a random one
  std::size_t max_restarts = 3;     ///< failures restarted, across all workers
  std::chrono::milliseconds step_timeout{0};  ///< exported as ELASTIC_STEP_TIMEOUT (0: not set)
  /// --step-timeout was given (0 included): otherwise the workers' loops set their own deadlines
  /// from observed step times (ELASTIC_AUTO_TIMEOUT=1).
  bool step_timeout_given = false;
  /// The least an automatic step deadline gives a step before the kill (exported as
  /// ELASTIC_AUTO_KILL_FLOOR); nothing: the library's default (5 minutes).
  std::optional<std::chrono::milliseconds> auto_kill_floor{};
  bool evict_stragglers = false;  ///< exported as ELASTIC_EVICT_STRAGGLERS=1
  std::chrono::milliseconds grace{std::chrono::seconds(25)};  ///< SIGTERM to SIGKILL
  bool stack_dump = true;           ///< the stacks of a hung worker into its log before the watchdog kills it
  std::chrono::milliseconds stack_dump_limit{2000};  ///< the most a stack dump delays that kill
  std::filesystem::path log_dir = "elastic-logs";
  std::filesystem::path events;     ///< empty: <log_dir>/<run id>/events.jsonl
  std::filesystem::path timeline;   ///< the run's HTML timeline; empty: beside the events file
  bool no_timeline = false;         ///< write no timeline at the end
  bool quiet = false;               ///< no worker output on the console (the logs keep it)
  std::vector<int> preempt_signals;  ///< more signals that mean "preemption notice"
  std::vector<std::string> command;  ///< the program and its arguments (a Python one with its interpreter)
  restart_mode restarts = restart_mode::in_place;  ///< --restart-mode (auto: whole_round for Python)
  bool python_program = false;      ///< the command runs a Python script or module (-m)
  /// The interface holding host_addr, for GLOO_SOCKET_IFNAME with several hosts (whole rounds).
  std::string host_interface;

  /// The group's upper bound, in workers (ranks): every host's workers.
  [[nodiscard]] std::size_t max_ranks() const noexcept { return max_nodes * nproc_per_node; }
};

}  // namespace elastic::agent
