// The environment a worker starts with: the launcher's own, less every variable of the worker
// contract it may have inherited (a launcher started from inside a worker), plus this worker's
// values of that contract. The contract (README: "The worker environment"):
//   ELASTIC_RUN_ID, ELASTIC_RANK, ELASTIC_WORLD_SIZE, ELASTIC_LOCAL_RANK, ELASTIC_LOCAL_WORLD_SIZE,
//   ELASTIC_RESTART_COUNT, ELASTIC_WATCHDOG, ELASTIC_RDZV, ELASTIC_EVENTS,
//   ELASTIC_MIN_RANKS / ELASTIC_MAX_RANKS (the group's bounds, in workers; also under their old
//   names ELASTIC_MIN_NODES / ELASTIC_MAX_NODES for workers built before the rename, which also
//   counted workers, not hosts), ELASTIC_PARTICIPANT_ID, ELASTIC_HOST_ADDR, ELASTIC_STEP_TIMEOUT
//   (only when set; else ELASTIC_AUTO_TIMEOUT=1), ELASTIC_GRACE, ELASTIC_FLIGHT_RECORDER (1: this
//   launcher reads the workers' flight records, so groups keep them), ELASTIC_EVICT_STRAGGLERS
//   (with --evict-stragglers), and torchrun's RANK,
//   WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE.
// In place (--restart-mode in-place) MASTER_ADDR and MASTER_PORT are removed and not set: the
// group finds its own, and RANK / WORLD_SIZE are first guesses. With every worker restarted
// together (--restart-mode all) the round is decided before the workers start, and they get
// torchrun's variables with torchrun's meaning (README: "From a torchrun command line"): RANK,
// WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE, ROLE_RANK, ROLE_WORLD_SIZE, ROLE_NAME, MASTER_ADDR,
// MASTER_PORT (fresh each round), TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS,
// TORCHELASTIC_RUN_ID, TORCHELASTIC_USE_AGENT_STORE, TORCHELASTIC_ERROR_FILE,
// NCCL_ASYNC_ERROR_HANDLING and TORCH_NCCL_ASYNC_ERROR_HANDLING (1 unless set), OMP_NUM_THREADS
// (1 unless set, with several workers per host), GLOO_SOCKET_IFNAME (with several hosts, unless
// set: the interface holding ELASTIC_HOST_ADDR).
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "launch_options.hpp"

extern char** environ;

namespace elastic::agent {

/// Where a worker stands in a round decided before it starts (--restart-mode all).
struct round_placement {
  std::size_t group_rank = 0;      ///< this host's rank in the round
  std::size_t group_world = 1;     ///< hosts in the round
  std::string master_addr;         ///< where the round's rank 0 serves torch's store
  std::uint16_t master_port = 0;   ///< fresh for each round
  std::size_t restart_count = 0;   ///< rounds this host's workers were restarted in
  std::string error_file;          ///< TORCHELASTIC_ERROR_FILE
};

/// Which worker an environment is for.
struct worker_identity {
  std::size_t index = 0;       ///< the slot: local rank, and the first guess of the rank
  std::size_t starts = 0;      ///< lives before this one (ELASTIC_RESTART_COUNT)
  std::size_t evictions = 0;   ///< of those, ended as evicted stragglers (ELASTIC_SLOT_EVICTIONS)
  std::string participant;     ///< launcher_identity::participant(): also the guardian's mark
  std::string watchdog;        ///< the segment name of the launcher's watchdog
  const round_placement* round = nullptr;  ///< with --restart-mode all
};

namespace detail {

/// Variables of the worker contract (and torchrun's) a worker never inherits from the launcher.
inline constexpr std::string_view contract_prefixes[] = {
    "ELASTIC_RUN_ID=",       "ELASTIC_RANK=",          "ELASTIC_WORLD_SIZE=",    "ELASTIC_LOCAL_RANK=",
    "ELASTIC_LOCAL_WORLD_SIZE=", "ELASTIC_RESTART_COUNT=", "ELASTIC_WATCHDOG=",  "ELASTIC_RDZV=",
    "ELASTIC_EVENTS=",       "ELASTIC_MIN_RANKS=",     "ELASTIC_MAX_RANKS=",     "ELASTIC_MIN_NODES=",
    "ELASTIC_MAX_NODES=",    "ELASTIC_PARTICIPANT_ID=", "ELASTIC_STEP_TIMEOUT=", "ELASTIC_GRACE=",
    "RANK=",                 "WORLD_SIZE=",            "LOCAL_RANK=",            "LOCAL_WORLD_SIZE=",
    "MASTER_ADDR=",          "MASTER_PORT=",           "ELASTIC_HOST_ADDR=",     "ELASTIC_FLIGHT_RECORDER=",
    "ELASTIC_AUTO_TIMEOUT=",    "ELASTIC_EVICT_STRAGGLERS=", "ELASTIC_AUTO_KILL_FLOOR=", "ELASTIC_SLOT_EVICTIONS=",
    "GROUP_RANK=",           "GROUP_WORLD_SIZE=",      "ROLE_RANK=",             "ROLE_WORLD_SIZE=",
    "ROLE_NAME=",            "TORCHELASTIC_RESTART_COUNT=", "TORCHELASTIC_MAX_RESTARTS=", "TORCHELASTIC_RUN_ID=",
    "TORCHELASTIC_USE_AGENT_STORE=", "TORCHELASTIC_ERROR_FILE="};

/// Whether the launcher's environment has `name` (set, even empty).
inline bool inherits(const std::vector<std::string>& env, std::string_view name) {
  return std::any_of(env.begin(), env.end(), [&](const std::string& kv) {
    return kv.size() > name.size() && kv.compare(0, name.size(), name) == 0 && kv[name.size()] == '=';
  });
}

/// The launcher's environment without the contract's variables.
inline std::vector<std::string> inherited_environment() {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view kv(*e);
    if (std::none_of(std::begin(contract_prefixes), std::end(contract_prefixes),
                     [&](std::string_view p) { return kv.rfind(p, 0) == 0; })) {
      env.emplace_back(kv);
    }
  }
  return env;
}

}  // namespace detail

/// The environment of worker `w` of the run `o` describes.
inline std::vector<std::string> worker_environment(const launch_options& o, const worker_identity& w) {
  std::vector<std::string> env = detail::inherited_environment();
  // In place, first guesses (the group decides); in a decided round, every host has
  // nproc_per_node workers, ranks in host order.
  const std::size_t rank = w.round ? w.round->group_rank * o.nproc_per_node + w.index : w.index;
  const std::size_t world = (w.round ? w.round->group_world : o.min_nodes) * o.nproc_per_node;
  auto set = [&](std::string_view k, const std::string& v) { env.push_back(fmt::format("{}={}", k, v)); };
  set("ELASTIC_RUN_ID", o.run_id);
  set("ELASTIC_RANK", std::to_string(rank));
  set("ELASTIC_WORLD_SIZE", std::to_string(world));
  set("ELASTIC_LOCAL_RANK", std::to_string(w.index));
  set("ELASTIC_LOCAL_WORLD_SIZE", std::to_string(o.nproc_per_node));
  set("ELASTIC_RESTART_COUNT", std::to_string(w.starts));
  set("ELASTIC_WATCHDOG", w.watchdog);
  set("ELASTIC_RDZV", o.relay.empty() ? o.rdzv : o.relay);
  set("ELASTIC_EVENTS", o.events.string());
  set("ELASTIC_MIN_RANKS", std::to_string(o.min_ranks));
  set("ELASTIC_MAX_RANKS", std::to_string(o.max_ranks()));
  // The old names of the same two bounds (they always counted workers): for older workers.
  set("ELASTIC_MIN_NODES", std::to_string(o.min_ranks));
  set("ELASTIC_MAX_NODES", std::to_string(o.max_ranks()));
  set("ELASTIC_PARTICIPANT_ID", w.participant);
  set("ELASTIC_HOST_ADDR", o.host_addr);
  set("ELASTIC_FLIGHT_RECORDER", "1");
  if (o.step_timeout.count() > 0) set("ELASTIC_STEP_TIMEOUT", fmt::format("{:.3f}", o.step_timeout.count() / 1e3));
  if (!o.step_timeout_given) set("ELASTIC_AUTO_TIMEOUT", "1");
  if (o.auto_kill_floor) set("ELASTIC_AUTO_KILL_FLOOR", fmt::format("{:.3f}", o.auto_kill_floor->count() / 1e3));
  if (o.evict_stragglers) set("ELASTIC_EVICT_STRAGGLERS", "1");
  set("ELASTIC_SLOT_EVICTIONS", std::to_string(w.evictions));
  set("ELASTIC_GRACE", fmt::format("{:.3f}", o.grace.count() / 1e3));
  set("RANK", std::to_string(rank));
  set("WORLD_SIZE", std::to_string(world));
  set("LOCAL_RANK", std::to_string(w.index));
  set("LOCAL_WORLD_SIZE", std::to_string(o.nproc_per_node));
  if (w.round == nullptr) return env;
  const round_placement& r = *w.round;
  set("ROLE_RANK", std::to_string(rank));
  set("ROLE_WORLD_SIZE", std::to_string(world));
  set("GROUP_RANK", std::to_string(r.group_rank));
  set("GROUP_WORLD_SIZE", std::to_string(r.group_world));
  set("ROLE_NAME", "default");
  set("MASTER_ADDR", r.master_addr);
  set("MASTER_PORT", std::to_string(r.master_port));
  set("TORCHELASTIC_RESTART_COUNT", std::to_string(r.restart_count));
  set("TORCHELASTIC_MAX_RESTARTS", std::to_string(o.max_restarts));
  set("TORCHELASTIC_RUN_ID", o.run_id);
  // The workers' rank 0 serves torch's store at MASTER_ADDR:MASTER_PORT (the launcher has none).
  set("TORCHELASTIC_USE_AGENT_STORE", "False");
  set("TORCHELASTIC_ERROR_FILE", r.error_file);
  for (const char* k : {"NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_ASYNC_ERROR_HANDLING"}) {
    if (!detail::inherits(env, k)) set(k, "1");  // a hung collective fails instead of hanging
  }
  if (o.nproc_per_node > 1 && !detail::inherits(env, "OMP_NUM_THREADS")) set("OMP_NUM_THREADS", "1");
  // With several hosts, torch's Gloo listens on the interface the other hosts reach this one at
  // (--host-addr's), not where the host name resolves; the user's own choice stands.
  if (o.max_nodes > 1 && !o.host_interface.empty() && !detail::inherits(env, "GLOO_SOCKET_IFNAME")) {
    set("GLOO_SOCKET_IFNAME", o.host_interface);
  }
  return env;
}

}  // namespace elastic::agent
