// elastic-run's exit codes, the contract with whoever runs it (Slurm requeue rules, a Kubernetes
// podFailurePolicy, a shell loop): each code means one thing and says whether to run again.
#pragma once

#include <elastic/checkpoint/preemption.hpp>

namespace elastic::agent {

/// Every worker finished.
inline constexpr int exit_done = 0;
/// The run failed: restarts used up, a worker could not start, the launcher could not set up
/// (another launcher runs this run on this host, the store is unusable). Look at the logs.
inline constexpr int exit_failed = 1;
/// A bad command line or an unusable path given on it (--log-dir, --events): fix the command.
inline constexpr int exit_usage = 2;
/// A crash loop: a worker kept exiting 75 (EX_TEMPFAIL) with no preemption notice and no
/// checkpoint committed in between, more than --max-restarts times in a row. Running the same
/// command again would do the same: do not requeue.
inline constexpr int exit_crash_loop = 3;
/// Preempted (a notice came and the workers were stopped): run the same command again; it
/// resumes from the newest committed checkpoint. elastic::exit_preempted (EX_TEMPFAIL).
inline constexpr int exit_preempted = elastic::exit_preempted;

}  // namespace elastic::agent
