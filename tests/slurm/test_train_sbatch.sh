#!/usr/bin/env bash
# examples/deploy/slurm/train.sbatch on a real one-node Slurm cluster (cluster.sh), training
# digits_train under elastic-run with a private etcd, as a user would submit it:
#   1. --time=1 --signal=B:USR1@55: every start is told its time is up; the final checkpoint is
#      committed before the job ends, the job is requeued, resumes from that checkpoint, and
#      finishes with the weights of an undisturbed run.
#   2. scancel --signal=TERM JOBID from outside: the same.
#   3. starts that make no progress (a second node that never comes): not requeued forever.
#   4. a requeue Slurm refuses (--no-requeue): the job ends FAILED with 75, not COMPLETED.
#   tests/slurm/test_train_sbatch.sh ELASTIC_RUN DIGITS_TRAIN
# Exit 77 (skipped) where a cluster cannot run: not root, Slurm not installed.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
script=$here/../../examples/deploy/slurm/train.sbatch
run=$(realpath "$1")
train=$(realpath "$2")
. "$here/cluster.sh"

work=$(mktemp -d /tmp/elastic-slurm.XXXXXX)
chmod 755 "$work"
# ELASTIC_TEST_KEEP=1 keeps the jobs' logs and checkpoints (as the C++ tests keep their temp_dir).
cleanup() {
  slurm_cluster_stop
  if [ -n "${ELASTIC_TEST_KEEP:-}" ]; then echo "kept $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
slurm_cluster_start "$work/cluster"
rc=$?
[ "$rc" -eq 0 ] || exit "$rc"

# The reason first, then the job's output: CI keeps a failing test's first and last lines only.
current=
fail() {
  echo "FAIL: $*" >&2
  if [ -n "$current" ]; then show "$current" >&2; fi
  exit 1
}
field() { scontrol -o show job "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p"; }
state() { field "$1" JobState; }
# Whether a job state is final. Anything else (PENDING, RUNNING, REQUEUED, SIGNALING, COMPLETING,
# ...) may still change: a job passes through short-lived states while it is signalled or requeued.
ended() { case $1 in COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|BOOT_FAIL|DEADLINE|OUT_OF_MEMORY) return 0 ;; esac; return 1; }
# wait_done JOB SECONDS: until the job has ended.
wait_done() {
  local job=$1 t=$(( $2 * 5 ))
  while [ "$t" -gt 0 ]; do
    ended "$(state "$job")" && return 0
    sleep 0.2
    t=$((t - 1))
  done
  fail "job $job still $(state "$job") after $2 s; $(tail -n 20 "$work/out-$job.txt" 2>/dev/null)"
}
# The weights digits_train printed when it finished, in every log of a run directory.
crc() { grep -rh "^finished at step .* weights crc32c" "$1" | tail -n 1 | awk '{print $NF}'; }
summary() { scontrol -o show job "$1" | grep -o 'JobState=[^ ]*\|Restarts=[^ ]*\|ExitCode=[^ ]*' | tr '\n' ' '; }
show() { echo "--- job $1: $(summary "$1")"; cat "$work/out-$1.txt"; }

# submit NAME SBATCH-OPTIONS... -- TRAINER-ARGS...: prints the job id. Runs in $work/NAME.
submit() {
  local name=$1 opts=()
  shift
  while [ "$1" != "--" ]; do opts+=("$1"); shift; done
  shift
  mkdir -p "$work/$name"
  (cd "$work/$name" &&
     ELASTIC_RUN=$run TRAINER=$train ELASTIC_CKPT=$work/$name/ckpt ELASTIC_LOGS=$work/$name/logs \
     ELASTIC_ETCD_HOST=127.0.0.1 ELASTIC_NPROC_PER_NODE=2 ELASTIC_GRACE=15 \
     sbatch --parsable --nodes=1 --gpus-per-node=0 --cpus-per-task=1 --output="$work/out-%j.txt" \
       "${opts[@]}" "$script" "$@")
}

# The undisturbed weights (timing does not change them: step-sleep-ms is left out).
long=(--steps 3000 --every 200)
short=(--steps 1000 --every 100)
"$run" --nproc-per-node 2 --run-id ref-long --quiet --log-dir "$work/ref" -- "$train" "${long[@]}" --ckpt "$work/ref/long" >/dev/null 2>&1 ||
  fail "the undisturbed long run failed"
"$run" --nproc-per-node 2 --run-id ref-short --quiet --log-dir "$work/ref" -- "$train" "${short[@]}" --ckpt "$work/ref/short" >/dev/null 2>&1 ||
  fail "the undisturbed short run failed"
ref_long=$(crc "$work/ref/ref-long")
ref_short=$(crc "$work/ref/ref-short")
if [ -z "$ref_long" ] || [ -z "$ref_short" ]; then fail "no weights from the undisturbed runs"; fi

# Every stop wrote a final checkpoint at the step it stopped, and the next start resumed there.
check_resumes() {
  local job=$1 logs=$2 stops starts
  stops=$(grep -rh "^preempted (checkpoint written) at step" "$logs" | awk '{print $6}' | tr -d ':' | sort -n | uniq)
  starts=$(grep -rh "^training an MLP .* from step" "$logs" | sed 's/.* from step \([0-9]*\) of.*/\1/' | sort -n | uniq)
  [ -n "$stops" ] || fail "job $job: no worker wrote a final checkpoint"
  local s
  for s in $stops; do
    grep -qx "$s" <<<"$starts" || fail "job $job: stopped at step $s but no start resumed from it (starts: $starts)"
    grep -q "stopped, checkpoint step-$(printf '%012d' "$s") saved; requeueing" "$work/out-$job.txt" ||
      fail "job $job: step $s was not the newest committed checkpoint when the job stopped"
  done
  echo "job $job: stopped at steps $(tr "\n" " " <<<"$stops"), resumed from $(tr "\n" " " <<<"$starts")"
}

# 1. The time-limit notice, at every start, until training is done.
job=$(submit limit --time=1 --signal=B:USR1@55 -- "${long[@]}" --step-sleep-ms 25) || fail "sbatch refused the job"
current=$job
wait_done "$job" 600
echo "job $job: $(summary "$job")"
[ "$(state "$job")" = COMPLETED ] || fail "job $job ended $(state "$job"), want COMPLETED"
[ "$(field "$job" Restarts)" -ge 1 ] || fail "job $job was never requeued: the notice did not stop it"
grep -q "time limit near (SIGUSR1)" "$work/out-$job.txt" || fail "job $job: the batch shell saw no SIGUSR1"
check_resumes "$job" "$work/limit/logs"
[ "$(crc "$work/limit/logs")" = "$ref_long" ] || fail "job $job finished with weights $(crc "$work/limit/logs"), undisturbed $ref_long"

# 2. scancel --signal=TERM once a checkpoint exists.
job=$(submit cancel --time=10 -- "${short[@]}" --step-sleep-ms 20) || fail "sbatch refused the job"
current=$job
for _ in $(seq 1 600); do
  compgen -G "$work/cancel/ckpt/step-*" >/dev/null && break
  sleep 0.1
done
compgen -G "$work/cancel/ckpt/step-*" >/dev/null || fail "job $job committed no checkpoint in 60 s"
scancel --signal=TERM "$job"
wait_done "$job" 300
echo "job $job: $(summary "$job")"
[ "$(state "$job")" = COMPLETED ] || fail "job $job ended $(state "$job"), want COMPLETED"
[ "$(field "$job" Restarts)" -eq 1 ] || fail "job $job: $(field "$job" Restarts) requeues, want 1"
check_resumes "$job" "$work/cancel/logs"
[ "$(crc "$work/cancel/logs")" = "$ref_short" ] || fail "job $job finished with weights $(crc "$work/cancel/logs"), undisturbed $ref_short"

# 3. No progress: --nnodes 2:2 on one node waits for a host that never comes; each start is
#    stopped after a few seconds. Two stalled starts in a row end the job.
job=$(ELASTIC_NNODES=2:2 ELASTIC_MAX_STALLED_REQUEUES=2 submit stall --time=10 -- "${short[@]}") || fail "sbatch refused the job"
current=$job
signalled=-1
for _ in $(seq 1 1200); do
  s=$(state "$job")
  r=$(field "$job" Restarts)
  ended "$s" && break
  if [ "$s" = RUNNING ] && [ "$r" != "$signalled" ] && grep -q "start $((r + 1))," "$work/out-$job.txt" 2>/dev/null; then
    sleep 3
    scancel --signal=TERM "$job" && signalled=$r
  fi
  sleep 0.1
done
wait_done "$job" 60
echo "job $job: $(summary "$job")"
[ "$(state "$job")" = FAILED ] || fail "job $job ended $(state "$job"), want FAILED"
[ "$(field "$job" ExitCode)" = "3:0" ] || fail "job $job exit code $(field "$job" ExitCode), want 3:0"
[ "$(field "$job" Restarts)" -eq 1 ] || fail "job $job: $(field "$job" Restarts) requeues, want 1 (then given up)"
grep -q "stopped 2 times in a row with no newer checkpoint" "$work/out-$job.txt" || fail "job $job: no word of the stall"

# 4. A requeue Slurm refuses.
job=$(submit norequeue --time=10 --no-requeue -- "${short[@]}" --step-sleep-ms 20) || fail "sbatch refused the job"
current=$job
for _ in $(seq 1 600); do
  compgen -G "$work/norequeue/ckpt/step-*" >/dev/null && break
  sleep 0.1
done
scancel --signal=TERM "$job"
wait_done "$job" 120
echo "job $job: $(summary "$job")"
[ "$(state "$job")" = FAILED ] || fail "job $job ended $(state "$job"), want FAILED (its requeue was refused)"
[ "$(field "$job" ExitCode)" = "75:0" ] || fail "job $job exit code $(field "$job" ExitCode), want 75:0"
grep -q "scontrol requeue refused" "$work/out-$job.txt" || fail "job $job: no word of the refused requeue"
echo "PASS"
