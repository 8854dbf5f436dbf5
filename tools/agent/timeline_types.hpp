// What a run timeline shows, before it is drawn: rows (elastic-run, the group, checkpoints, one
// lane per worker slot), spans on them (a worker's life, a launcher's, the group's rounds and the
// phases of each rebuild), marks (exits, kills, stack dumps, failures, culprits, stragglers,
// checkpoints, ...) and the lists below the picture (kills with their stacks, rebuilds, lives,
// notes). Times are seconds since the epoch. Built by timeline_model.hpp, drawn by
// timeline_page.hpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <elastic/internal/json.hpp>

namespace elastic::agent::timeline {

/// Rows top to bottom in this order of kinds.
enum class row_kind { launcher, group, checkpoints, lane, rank_lane, other };

struct row {
  row_kind kind = row_kind::lane;
  std::string label;   ///< "vm · slot 0"
  std::string detail;  ///< the tooltip: host, launcher, slot, ranks held
  std::size_t group = 0;   ///< host group (or run) order, for sorting
  std::int64_t index = 0;  ///< slot or rank, for sorting
};

/// How a span is coloured. A life's colour says how it ended.
enum class span_kind {
  life_ok, life_failed, life_killed, life_watchdog, life_preempted, life_unknown,
  launcher, rendezvous, connect, resync, training
};

/// Something with a start and an end on a row.
struct span {
  double t0 = 0, t1 = 0;
  std::size_t row = 0;
  span_kind kind = span_kind::life_unknown;
  std::string label;          ///< drawn inside when it fits
  std::string title;          ///< the tooltip
  std::ptrdiff_t event = -1;  ///< index into model::data (-1: none)
  std::string ref;            ///< id of the entry below that tells more
  double height = 1;          ///< fraction of the row (a round's: its world against the largest)
};

/// The symbol of a mark.
enum class mark_kind {
  restart, exit_ok, exit_failed, exit_killed, exit_watchdog, exit_preempted, kill, watchdog, stack,
  failure, rebuild, culprit, straggler, timeouts, checkpoint, restore, checkpoint_failed, signal,
  preempted, warning, other
};

/// Something at one time on a row.
struct mark {
  double t = 0;
  std::size_t row = 0;
  mark_kind kind = mark_kind::other;
  std::string label;  ///< drawn beside it when there is room
  std::string title;
  std::ptrdiff_t event = -1;
  std::string ref;
  std::size_t count = 1;   ///< marks merged into this one (crowded runs)
  std::int64_t step = -1;  ///< a checkpoint's step
};

/// A watchdog kill and the stack dump taken before it; either may be missing.
struct kill_entry {
  std::string id;
  double t = 0;
  std::string where;  ///< the lane's label
  std::string summary;
  std::string stack_heading;  ///< "" when no stack dump was recorded
  std::string stack_text;
};

/// A round of the group: how it formed (phases), and the world it trained with.
struct round_entry {
  std::string id, run_id, members, cause, failures, resharded;
  std::int64_t round = 0;
  std::int64_t world = 0, world_before = 0;
  std::optional<double> noticed, closed, connected, resynced;
  double rendezvous_ms = 0, connect_ms = 0, resync_ms = 0, recovery_ms = 0;
  std::optional<std::int64_t> step;
  std::optional<std::int64_t> bytes;
  bool first_of_run = false;  ///< the group's first round after a (re)start: a formation
};

/// One life of a worker slot: started (or first seen) to its exit.
struct life_entry {
  std::size_t row = 0;
  std::int64_t pid = -1;
  double t0 = 0;
  std::optional<double> t1;
  std::string how;  ///< how it ended, in words
  span_kind kind = span_kind::life_unknown;
  std::int64_t restart_count = 0;
  std::vector<std::int64_t> ranks;  ///< the group ranks it held, in order
  bool inferred = false;            ///< no worker_start: drawn from its events
};

/// A straggler, a culprit or new deadlines: listed below the picture.
struct note_entry {
  std::string id;
  double t = 0;
  std::string what, where, text;
};

/// A checkpoint commit.
struct checkpoint_entry {
  double t = 0;
  std::int64_t step = 0;
  std::string text;
};

/// The page's heading figures.
struct run_facts {
  std::vector<std::string> run_ids, hosts, outcomes;
  std::optional<std::int64_t> exit_code;
  std::size_t slots = 0, lives = 0, restarts = 0, failures = 0, watchdog_kills = 0, rounds = 0, rebuilds = 0;
  std::size_t checkpoints = 0, stragglers = 0, culprits = 0, deadline_updates = 0, launchers = 0;
  std::int64_t newest_checkpoint = -1;
};

/// Everything the page shows.
struct model {
  double t_first = 0, t_last = 0;
  std::vector<row> rows;
  std::vector<span> spans;
  std::vector<mark> marks;
  std::vector<kill_entry> kills;
  std::vector<round_entry> rounds;
  std::vector<life_entry> lives;
  std::vector<note_entry> notes;
  std::vector<checkpoint_entry> checkpoints;
  std::vector<elastic::internal::json> data;  ///< the events marks and spans point at (embedded)
  run_facts facts;
  std::vector<std::string> caps;  ///< what was left out of the picture or the lists, and why
};

}  // namespace elastic::agent::timeline
