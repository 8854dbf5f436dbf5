// What a run came to: the figures the launcher keeps (run_report) and the summary it prints to
// stderr at the end. The figures are filled by the launcher from its own counts and from the
// workers' events (run_events.hpp); this header only holds them and writes them out.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "exit_codes.hpp"

namespace elastic::agent {

/// What a run came to, for the summary and for tests.
struct run_report {
  int exit_code = 0;
  std::string outcome;               ///< "finished", "preempted", "failed: ...", "crash loop: ..."
  double seconds = 0;
  std::size_t workers = 0;
  std::size_t failures = 0;          ///< worker deaths counted against --max-restarts
  std::size_t restarts = 0;          ///< workers started again (failures and preemptions)
  std::size_t preempted_restarts = 0;
  std::size_t backoff_restarts = 0;  ///< exits 75 with no notice, restarted after a backoff
  std::size_t watchdog_kills = 0;
  std::size_t stragglers_killed = 0;  ///< SIGKILLed after the grace
  std::int64_t rounds = 0;           ///< rendezvous rounds the workers formed
  std::size_t rebuilds = 0;          ///< group rebuilds after the first round
  /// --restart-mode all: rounds this host's workers were started in (0: workers restarted in place).
  std::size_t whole_rounds = 0;
  std::size_t checkpoints = 0;       ///< checkpoint commits
  std::int64_t newest_checkpoint = -1;
  bool final_checkpoint_saved = false;  ///< a loop_preempted said "final_checkpoint":true
  std::size_t console_lines_dropped = 0;
  double seconds_lost = 0;           ///< from each failure to the group training again
  std::vector<std::string> culprits;  ///< the ranks that held the group back (culprit_finder.hpp)
  /// What torch's @record said of the workers that failed (TORCHELASTIC_ERROR_FILE), the last few.
  std::vector<std::string> worker_errors;
  std::vector<std::string> stragglers;  ///< ranks persistently slower than the group (straggler events)
  std::size_t stragglers_evicted = 0;
};

/// What the summary names beside the report: the run and where its records are.
struct summary_context {
  std::string run_id;
  std::size_t max_restarts = 0;
  std::filesystem::path log_dir;  ///< the run's own directory, DIR/RUN_ID
  std::filesystem::path events;
  std::string timeline;  ///< the run's timeline page, or why there is none; "" with --no-timeline
};

namespace detail {

/// Seconds from each failure (seconds since the epoch) to the first time the group trained
/// again after it (`resumed`, sorted); a failure the group never recovered from costs nothing
/// here: the run ended with it.
inline double seconds_lost(const std::vector<double>& failures, const std::vector<double>& resumed) {
  double lost = 0;
  for (double t : failures) {
    const auto it = std::upper_bound(resumed.begin(), resumed.end(), t);
    if (it != resumed.end()) lost += *it - t;
  }
  return lost;
}

/// What the exit code means for whoever runs the command next ("" for the plain ones).
inline std::string exit_code_note(const run_report& r) {
  if (r.exit_code == exit_crash_loop) return " (crash loop: no progress; do not requeue)";
  if (r.exit_code != exit_preempted) return {};
  // "State saved" only when a worker said its final checkpoint committed.
  if (r.final_checkpoint_saved) return " (preempted: state saved, run the same command again)";
  if (r.newest_checkpoint >= 0) {
    return fmt::format(" (preempted: the final checkpoint was not confirmed; the newest committed step is {}: "
                       "run the same command again to resume from it)",
                       r.newest_checkpoint);
  }
  return " (preempted: the final checkpoint was not confirmed and no checkpoint was committed in this run: "
         "run the same command again to resume from the newest one on disk, if any)";
}

/// The summary's lines about failures and restarts.
inline std::string failure_lines(const run_report& r, std::size_t max_restarts) {
  std::string text = fmt::format("  failures         {} (--max-restarts {}); workers restarted: {}, of which {} after a "
                                 "preemption{}\n",
                                 r.failures, max_restarts, r.restarts, r.preempted_restarts,
                                 r.backoff_restarts > 0
                                     ? fmt::format(" and {} after an exit 75 with no notice", r.backoff_restarts)
                                     : std::string());
  text += fmt::format("  watchdog kills   {}\n", r.watchdog_kills);
  return text;
}

/// The summary's lines about the group's progress: rounds, checkpoints, time lost.
inline std::string progress_lines(const run_report& r) {
  std::string text =
      r.whole_rounds > 0
          ? fmt::format("  rounds           {} on this host: every worker restarted together {} times\n", r.whole_rounds,
                        r.whole_rounds - 1)
          : fmt::format("  rendezvous       round {} reached, the group rebuilt {} times\n", r.rounds, r.rebuilds);
  text += r.newest_checkpoint >= 0
              ? fmt::format("  checkpoints      {} committed, newest step {}\n", r.checkpoints, r.newest_checkpoint)
              : fmt::format("  checkpoints      none committed in this run\n");
  text += r.whole_rounds > 0 ? fmt::format("  time lost        {:.2f} s to failures (each from the death, or the hang, to "
                                           "the next round's workers starting)\n",
                                           r.seconds_lost)
                             : fmt::format("  time lost        {:.2f} s to failures (each from the death, or the hang, to "
                                           "the group training again)\n",
                                           r.seconds_lost);
  return text;
}

/// The summary's lines that appear only when something was cut short: killed workers, lost
/// console lines.
inline std::string shortfall_lines(const run_report& r) {
  std::string text;
  if (r.stragglers_killed > 0) text += fmt::format("  killed at grace  {} workers\n", r.stragglers_killed);
  for (const auto& c : r.culprits) text += fmt::format("  culprit          {}\n", c);
  for (const auto& e : r.worker_errors) text += fmt::format("  worker error     {}\n", e);
  for (const auto& s : r.stragglers) text += fmt::format("  straggler        {}\n", s);
  if (r.stragglers_evicted > 0) {
    text += fmt::format("  evicted          {} straggler(s) left their group and were restarted\n", r.stragglers_evicted);
  }
  if (r.console_lines_dropped > 0) {
    text += fmt::format("  console          {} lines not shown (the console did not keep up or went away); the logs "
                        "have them\n",
                        r.console_lines_dropped);
  }
  return text;
}

}  // namespace detail

/// The summary elastic-run prints at the end of a run, every line ending in '\n'.
inline std::string summary_text(const run_report& r, const summary_context& c) {
  std::string text = fmt::format("elastic-run: run '{}' {}\n", c.run_id, r.outcome);
  text += fmt::format("  exit code        {}{}\n", r.exit_code, detail::exit_code_note(r));
  text += fmt::format("  run time         {:.1f} s, {} workers\n", r.seconds, r.workers);
  text += detail::failure_lines(r, c.max_restarts);
  text += detail::progress_lines(r);
  text += detail::shortfall_lines(r);
  text += fmt::format("  logs             {}/rank-*.log, events {}\n", c.log_dir.string(), c.events.string());
  if (!c.timeline.empty()) text += fmt::format("  timeline         {}\n", c.timeline);
  return text;
}

}  // namespace elastic::agent
