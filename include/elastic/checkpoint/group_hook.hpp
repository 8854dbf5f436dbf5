// How a training loop meets an elastic group without depending on communicators: the loop
// calls the hook at each safe point (between steps) and after each step; the group behind it
// (elastic::comm::elastic_group) rebuilds itself and resyncs the state there.
#pragma once

#include <cstdint>

#include <elastic/checkpoint/state.hpp>

namespace elastic::inline v1::checkpoint {

/// The loop's view of a data-parallel group whose membership can change.
///
/// The state registered with the loop is replicated: every rank holds the same copy, so the
/// group's rank 0 alone writes checkpoints (as a world of one) and, after a rebuild, sends its
/// copy to the others. Sharded state (add_shard) is refused by elastic_group (errc::not_supported)
/// rather than overwritten with rank 0's slice.
class group_hook {
 public:
  virtual ~group_hook() = default;

  /// Before every step, `step` being the loop's next step index. When the group changed (a
  /// collective failed, a member departed, a newcomer waits) the group forms its next round,
  /// rebuilds its communicator and makes every rank agree on rank 0's step and `st`; it
  /// returns the step the loop goes on from. Throws elastic::error when no group can form (the
  /// world stayed below min_ranks past the join timeout, other bounds than the run's, ...), and
  /// errc::interrupted when a preemption notice (preemption_handler::requested()) came while it
  /// waited: the loop then ends as preempted (exit 75) without a new checkpoint.
  virtual std::uint64_t safe_point(std::uint64_t step, checkpoint::state& st) = 0;

  /// After the body of a step: true when a collective of this step failed, so its update was
  /// not (or not everywhere) applied; the loop then runs the step again after the next
  /// safe_point instead of counting it.
  [[nodiscard]] virtual bool step_failed() const noexcept = 0;

  /// Whether this rank writes the group's checkpoints now (rank 0 of the current round).
  [[nodiscard]] virtual bool writes_checkpoints() const noexcept = 0;

 protected:
  group_hook() = default;
  group_hook(const group_hook&) = default;
  group_hook& operator=(const group_hook&) = default;
};

}  // namespace elastic::inline v1::checkpoint

namespace elastic::inline v1 {
// Re-exported at elastic:: (the common entry points, STYLE.md): users write elastic::group_hook.
using checkpoint::group_hook;
}  // namespace elastic::inline v1
