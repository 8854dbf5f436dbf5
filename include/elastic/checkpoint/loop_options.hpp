// What a training_loop is told (loop_options) and why it ended (loop_reason); the loop itself
// is training_loop.hpp. Unset options are filled in from the environment elastic-run sets
// (ELASTIC_RANK, ELASTIC_WORLD_SIZE, ELASTIC_STEP_TIMEOUT, ELASTIC_GRACE, ...).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include <elastic/checkpoint/checkpointer.hpp>
#include <elastic/checkpoint/group_hook.hpp>
#include <elastic/events.hpp>

namespace elastic::inline v1::checkpoint {

/// Why a loop ended.
enum class loop_reason { running, finished, preempted, stopped };

constexpr std::string_view to_string(loop_reason r) noexcept {
  switch (r) {
    case loop_reason::running: return "running";
    case loop_reason::finished: return "finished";
    case loop_reason::preempted: return "preempted";
    case loop_reason::stopped: return "stopped";
  }
  return "running";
}

/// Step deadlines derived from observed step times (detail/step_deadlines.hpp has the rule).
/// A guess can be wrong, so it has two expiries: past the first (the warning) the watchdog only
/// warns; it kills at the second, many times later and never before `kill_floor`.
struct auto_timeout_options {
  /// Nothing: on when ELASTIC_AUTO_TIMEOUT=1, which elastic-run sets when --step-timeout is not
  /// given. Never with a step_timeout (or ELASTIC_STEP_TIMEOUT): a number given wins.
  std::optional<bool> enabled{};
  std::uint32_t warmup_steps = 10;  ///< steps of a life not observed nor warned of (compilation, caches, connects)
  std::uint32_t rebuild_steps = 3;  ///< the same after each rebuild of the group (loaders re-shard, caches refill)
  std::uint32_t min_samples = 20;   ///< ordinary steps observed before there is a deadline
  std::uint32_t window = 200;       ///< newest steps of each kind the rule looks at
  std::uint32_t update_every = 25;  ///< steps between recomputations (agreed by a group's ranks)
  double multiple = 5;              ///< warning = max(multiple x p99, 2 x max) of the window
  std::chrono::milliseconds floor{std::chrono::milliseconds(100)};  ///< of the warning
  std::chrono::milliseconds ceiling{std::chrono::minutes(30)};      ///< of the warning
  /// kill = max(kill_multiple x warning, kill_floor): a step is killed only that much later.
  double kill_multiple = 10;
  /// The least time an automatic deadline gives a step before the kill. Nothing:
  /// ELASTIC_AUTO_KILL_FLOOR (seconds, elastic-run --auto-kill-floor), else 5 minutes: shorter
  /// than the 10-30 minutes PyTorch's process groups wait, long enough for an evaluation pass, a
  /// save or a data stall that nobody marked (README, "Step deadlines that set themselves").
  std::optional<std::chrono::milliseconds> kill_floor{};
};

struct loop_options {
  std::filesystem::path dir{};               ///< checkpoint directory
  std::uint64_t steps = 0;                   ///< total steps; 0: until preempted or stopped
  std::uint64_t every_steps = 0;             ///< checkpoint every N steps (0: not by count)
  std::chrono::seconds every_seconds{0};     ///< and/or every S seconds (0: not by time)
  std::size_t keep_last = 3;                 ///< committed checkpoints kept
  /// Each step runs in a timer scope of this (in a group: this rank's own work; its waits in
  /// collectives are bounded by the communicator's timeout instead); 0: ELASTIC_STEP_TIMEOUT (seconds, set by
  /// elastic-run --step-timeout: 0 for none, or 0.001 to 1e6), else none. With a step timeout
  /// and ELASTIC_WATCHDOG set, the constructor attaches to that watchdog and throws if it cannot
  /// (a timeout that nobody enforces is a silent hang); ELASTIC_WATCHDOG unset: unwatched.
  std::chrono::milliseconds step_timeout{0};
  /// Without a step timeout: deadlines that set themselves from observed step times, agreed
  /// across a group's ranks and logged as `timeouts_updated` (on under elastic-run by default).
  auto_timeout_options auto_timeout{};
  /// In a group: every auto_timeout.update_every steps the ranks' compute times (step time less
  /// waits in collectives) are compared; a rank at least this many times the median, two
  /// comparisons in a row, is a straggler (`straggler` event). 0: not compared.
  double straggler_threshold = 1.5;
  /// A straggler leaves: its loop throws errc::aborted (`straggler_evicted`), its process ends
  /// and its launcher restarts it, the group going on without it meanwhile. Nothing:
  /// ELASTIC_EVICT_STRAGGLERS=1 (elastic-run --evict-stragglers).
  std::optional<bool> evict_stragglers{};
  /// > 0: pick the checkpoint interval so that the time the loop is blocked by checkpoints
  /// stays under this fraction of training time (CheckFreq); every_steps is the first guess.
  double max_overhead = 0;
  /// Final checkpoint budget after a notice; nothing: ELASTIC_GRACE (seconds, set by elastic-run
  /// --grace: 0 to 86400), else 25 s.
  std::optional<std::chrono::milliseconds> grace{};
  bool checkpoint_at_end = true;             ///< a durable checkpoint of the last step
  bool handle_signals = true;                ///< SIGTERM/SIGINT mean preemption
  checkpoint::stream_handle stream = nullptr;  ///< the compute stream snapshots follow (CUDA)
  std::size_t staging_budget = 0;            ///< see checkpointer_options
  int rank = -1;                             ///< -1: ELASTIC_RANK (0 to world size - 1), else 0
  int world_size = -1;                       ///< -1: ELASTIC_WORLD_SIZE (1 to 65536), else 1
  std::string run_id{};                      ///< empty: ELASTIC_RUN_ID
  std::chrono::milliseconds commit_timeout{std::chrono::minutes(2)};
  std::optional<event_log> events{};         ///< nothing: event_log::from_env()
  /// An elastic group the loop resyncs with at each safe point. The state is then replicated:
  /// only the group's rank 0 writes checkpoints, as a world of one (rank/world_size are ignored).
  group_hook* group = nullptr;
};

}  // namespace elastic::inline v1::checkpoint

namespace elastic::inline v1 {
// Re-exported at elastic:: (the common entry points, STYLE.md): users write elastic::loop_options.
using checkpoint::loop_options;
using checkpoint::loop_reason;
using checkpoint::to_string;
}  // namespace elastic::inline v1
