// How a training loop meets an elastic group without depending on communicators: the loop
// calls the hook at each safe point (between steps) and after each step; the group behind it
// (elastic::comm::elastic_group) rebuilds itself and resyncs the state there.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <vector>
#include <functional>
#include <optional>
#include <string>

#include <elastic/checkpoint/staged_snapshot.hpp>
#include <elastic/checkpoint/state.hpp>
#include <elastic/error.hpp>

namespace elastic::inline v1::checkpoint {

/// Loads committed step `step` (nothing: the newest that verifies) of the loop's checkpoint
/// directory into the state as rank `rank`, and returns the step it loaded (nothing: no step).
using restore_fn = std::function<std::optional<std::uint64_t>(std::optional<std::uint64_t> step, int rank)>;

/// What a training loop lends its group for sharded state.
struct loop_link {
  restore_fn restore;            ///< reloads the state from a committed checkpoint
  std::function<void()> settle;  ///< waits until no snapshot copy still reads the state
  /// Around each collective that has a deadline of its own (true on entry, false on return):
  /// the loop's automatic step deadline does not run while this rank waits for its peers, so a
  /// rank that never enters is the one killed, not the ranks waiting for it (whose wait the
  /// communicator's timeout bounds, and the collective's deadline after it). Empty: nothing.
  std::function<void(bool inside)> collective;
};

/// How a finished run ended: its last step (durable) of the steps the loop was asked for.
struct run_end {
  std::uint64_t step = 0;
  std::uint64_t steps = 0;
};

/// A fixed slice (add_shard) cannot follow a group whose size changes: errc::not_supported
/// naming the first one (the loop checks at its start, the group at a resync).
inline void refuse_fixed_slices(const state& st) {
  for (const auto& e : st.entries()) {
    if (e.shard && !e.partition) {
      throw error(errc::not_supported, "state entry '" + e.name +
                                           "' is a fixed slice (add_shard), which cannot follow a group when its "
                                           "size changes: register it with add_partitioned");
    }
  }
}

/// The loop's view of a data-parallel group whose membership can change.
///
/// Replicated state (add, add_value, add_object) is the same on every rank: after a rebuild the
/// group sends rank 0's copy to the others. Partitioned state (add_partitioned) is split: after
/// a rebuild the group moves every rank's new slice to it from the ranks that hold it, or, when
/// a slice was lost with its rank, has every rank load the newest committed checkpoint (through
/// the loop's restore_fn). Without sharded state the group's rank 0 alone writes checkpoints (as
/// a world of one); with it every rank writes its part as rank rank() of size().
class group_hook {
 public:
  virtual ~group_hook() = default;

  /// This rank and the number of ranks now (after the last safe point); a group that carries
  /// no sharded state may keep the defaults.
  [[nodiscard]] virtual int rank() const noexcept { return 0; }
  [[nodiscard]] virtual int size() const noexcept { return 1; }
  /// Changes whenever the group was rebuilt: checkpoint steps begun before belong to another world.
  [[nodiscard]] virtual std::uint64_t generation() const noexcept { return 0; }
  /// The same on every rank of the current round, another after each rebuild (the checkpoint
  /// parts of a round carry it: checkpointer::set_world). 0: none.
  [[nodiscard]] virtual std::uint64_t epoch() const noexcept { return 0; }
  /// What the loop lends the group (it calls this once, at its start).
  virtual void attach(loop_link /*link*/) {}
  /// A snapshot's staging copy is complete (the checkpointer's copier thread calls this, before
  /// the write): a group with peer replicas keeps a copy of it and sends the slices on. It must
  /// not keep the spans, and should return quickly (a memcpy, not a network transfer).
  virtual void snapshot_copied(const staged_snapshot& /*s*/) {}

  /// Before every step, `step` being the loop's next step index. When the group changed (a
  /// collective failed, a member departed, a newcomer waits) the group forms its next round,
  /// rebuilds its communicator and makes every rank agree on rank 0's step and `st`; it
  /// returns the step the loop goes on from. Throws elastic::error when no group can form (the
  /// world stayed below min_ranks past the join timeout, other bounds than the run's, a slice
  /// lost with no checkpoint to reload it from, ...),
  /// errc::interrupted when a preemption notice (preemption_handler::requested()) came while it
  /// waited: the loop then ends as preempted (exit 75) without a new checkpoint, and
  /// errc::run_finished when the run ended without this rank (finish(), run_ended()): the loop
  /// then loads the newest checkpoint and ends as finished (exit 0).
  virtual std::uint64_t safe_point(std::uint64_t step, checkpoint::state& st) = 0;

  /// After the body of a step: true when a collective of this step failed, so its update was
  /// not (or not everywhere) applied; the loop then runs the step again after the next
  /// safe_point instead of counting it.
  [[nodiscard]] virtual bool step_failed() const noexcept = 0;

  /// Whether this rank writes the group's checkpoints now (rank 0 of the current round).
  [[nodiscard]] virtual bool writes_checkpoints() const noexcept = 0;

  /// The loop reached its last step and made it durable (rank 0 of the round calls this, once,
  /// at the loop's end): the group records that the run is over, so that a participant still
  /// waiting to join it (a restarted rank no round admitted before the end) stops waiting for
  /// members that have left: its safe_point() throws errc::run_finished. May throw
  /// elastic::error (a store that does not answer); the loop's end does not depend on it.
  virtual void finish(run_end /*end*/) {}
  /// How the run ended, once safe_point() threw errc::run_finished (what finish() recorded).
  [[nodiscard]] virtual std::optional<run_end> run_ended() const { return std::nullopt; }

  /// Every rank of the round calls this at the same step with as many `values`; each gets every
  /// rank's, rank after rank (size() x values.size()): the loop's step pace agrees on its
  /// deadlines and compares the ranks' compute times so. Nothing when the collective failed
  /// (the group then rebuilds at the next safe point).
  virtual std::optional<std::vector<double>> gather(std::span<const double> values) {
    return std::vector<double>(values.begin(), values.end());
  }


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
