#!/usr/bin/env bash
# The GPU demo: elastic-run trains examples/cuda_train.cpp (linear regression with cuBLAS, NCCL
# allreduce, device snapshots) with 4 workers sharing GPU 0 (each its own NCCL_HOSTID, so NCCL
# accepts four ranks on one GPU and talks NET/Socket over loopback), and disturbs it:
#   - worker 2 is SIGKILLed mid-run: the 3 survivors rebuild their NCCL communicator and go on;
#     elastic-run restarts worker 2, which restores the newest checkpoint and is taken back in;
#   - elastic-run gets SIGTERM (a preemption notice): the workers write a checkpoint, exit 75;
#   - the same command again resumes from that checkpoint and finishes.
# The final weights' CRC-32C is compared with an undisturbed run's: identical, bit for bit
# (cuda_train sums its gradients in a fixed order whatever the world size).
#
#   scripts/demo_gpu.sh                         builds elastic-run and cuda_train (build-demo-gpu/)
#   scripts/demo_gpu.sh --bin .gpu              uses carried binaries (scripts/gpu_build.sh): no build
#   scripts/demo_gpu.sh --elastic-run P --cuda-train P   the two binaries by path
#   --dry-run     fewer steps: for cuda_train built on the NCCL model (the suite's CTest)
#   --work DIR    where the checkpoints and logs go (default: BUILD/demo-gpu-run or a temp dir)
# Exit 0: identical weights; 1: a failure (said on stderr). Every wait is bounded.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="" run_tool="" train_tool="" work="" dry=0
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin="$2"; shift 2 ;;
    --elastic-run) run_tool="$2"; shift 2 ;;
    --cuda-train) train_tool="$2"; shift 2 ;;
    --work) work="$2"; shift 2 ;;
    --dry-run) dry=1; shift ;;
    *) echo "usage: scripts/demo_gpu.sh [--bin DIR | --elastic-run PATH --cuda-train PATH] [--dry-run] [--work DIR]" >&2
       exit 2 ;;
  esac
done
[ "${ELASTIC_GPU_DRY_RUN:-0}" = 1 ] && dry=1

if [ -n "$bin" ]; then
  run_tool="${run_tool:-$bin/elastic-run}"
  train_tool="${train_tool:-$bin/cuda_train}"
elif [ -z "$run_tool" ] || [ -z "$train_tool" ]; then
  . "$root/scripts/lib.sh"
  build="$root/build-demo-gpu"
  echo "=== building elastic-run and cuda_train ($build) ==="
  build_release "$build" elastic-run cuda_train
  run_tool="${run_tool:-$build/tools/elastic-run}"
  train_tool="${train_tool:-$build/examples/cuda_train}"
  work="${work:-$build/demo-gpu-run}"
fi
for f in "$run_tool" "$train_tool"; do
  [ -x "$f" ] || { echo "demo_gpu: no program $f (build it, or pass --bin/--elastic-run/--cuda-train)" >&2; exit 1; }
done
work="${work:-$(mktemp -d "${TMPDIR:-/tmp}/demo-gpu.XXXXXX")}"
rm -rf "$work"
mkdir -p "$work"

if [ "$dry" = 1 ]; then
  steps=500 kill_after=100 preempt_after=300 sleep_ms=5 wait_s=150
else
  # ~30 ms a step with four ranks on one H200: a 3000-step run outlasted the check's two minutes.
  # Rank 0 reports every 100 steps, so the disturbances come at multiples of 100.
  steps=600 kill_after=200 preempt_after=400 sleep_ms=2 wait_s=100
fi
# Four ranks on one GPU, as four hosts to NCCL; loopback sockets, no InfiniBand.
export NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-lo}" NCCL_IB_DISABLE="${NCCL_IB_DISABLE:-1}"
launcher=("$run_tool" --nproc-per-node 4 --min-ranks 2 --max-restarts 3 --step-timeout 20 --grace 20
          --log-dir "$work/logs")
# Each worker names its NCCL host after its slot (exec: the worker keeps the pid elastic-run knows).
trainer=(sh -c 'NCCL_HOSTID="demo-gpu-host${ELASTIC_LOCAL_RANK:-0}" exec "$0" "$@"' "$train_tool"
         --steps "$steps" --step-sleep-ms "$sleep_ms")

final_crc() {  # the weights checksum of the run that finished (not a preempted life's)
  grep -h "^finished at step .* weights crc32c" "$work/logs/$1"/rank-*.log 2>/dev/null | tail -1 | awk '{print $NF}'
}
# wait_for_line FILE PATTERN PID SECONDS: until FILE holds PATTERN (0), PID ended (1) or time ran out (2).
wait_for_line() {
  local _
  for _ in $(seq 1 $(($4 * 10))); do
    grep -q -- "$2" "$1" 2>/dev/null && return 0
    kill -0 "$3" 2>/dev/null || return 1
    sleep 0.1
  done
  return 2
}
# worker_of PID SLOT: the pid of elastic-run PID's worker with ELASTIC_LOCAL_RANK=SLOT.
worker_of() {
  local p
  for p in /proc/[0-9]*; do
    [ "$(awk '/^PPid:/{print $2}' "$p/status" 2>/dev/null)" = "$1" ] || continue
    tr '\0' '\n' < "$p/environ" 2>/dev/null | grep -qx "ELASTIC_LOCAL_RANK=$2" && { echo "${p#/proc/}"; return 0; }
  done
  return 1
}
stop_launcher() {  # leaves nothing behind on a failure: the launcher and, after its grace, its workers
  kill -TERM "$1" 2>/dev/null || true
  for _ in $(seq 1 300); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done
  kill -KILL "$1" 2>/dev/null || true
}
fail() { echo "demo_gpu: $*" >&2; exit 1; }

echo "=== 1/3: an undisturbed run of $steps steps, for reference ($work) ==="
timeout -k 5 "$((wait_s + 30))" "${launcher[@]}" --run-id reference -- "${trainer[@]}" --ckpt "$work/ckpt-reference" \
  || fail "the undisturbed run failed (exit $?); logs: $work/logs/reference"
reference="$(final_crc reference)"
[ -n "$reference" ] || fail "the undisturbed run printed no final weights; logs: $work/logs/reference"

echo
echo "=== 2/3: the same job, disturbed: worker 2 SIGKILLed after step $kill_after, then a preemption"
echo "         notice (SIGTERM to elastic-run) after step $preempt_after ==="
console="$work/disturbed.console"
: > "$console"
"${launcher[@]}" --run-id disturbed -- "${trainer[@]}" --ckpt "$work/ckpt" > >(tee "$console") 2>&1 &
pid=$!
trap 'stop_launcher "$pid"' EXIT
wait_for_line "$console" "step $kill_after/" "$pid" "$wait_s" || fail "no step $kill_after within ${wait_s} s"
victim="$(worker_of "$pid" 2)" || fail "cannot find worker 2 of elastic-run (pid $pid)"
echo ">>> demo_gpu: SIGKILL to worker 2 (pid $victim)"
kill -KILL "$victim"
wait_for_line "$console" "step $preempt_after/" "$pid" "$wait_s" || fail "no step $preempt_after within ${wait_s} s after the kill"
echo ">>> demo_gpu: sending SIGTERM to elastic-run (pid $pid), as a spot VM's preemption notice would"
kill -TERM "$pid" 2>/dev/null || true
set +e
for _ in $(seq 1 $((wait_s * 10))); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$pid" 2>/dev/null && fail "elastic-run still running ${wait_s} s after SIGTERM"
wait "$pid"
code=$?
set -e
trap - EXIT
echo ">>> demo_gpu: elastic-run exited $code (75: preempted, state saved, retry me)"
[ "$code" -eq 75 ] || fail "expected exit 75 after the preemption notice, got $code; logs: $work/logs/disturbed"
echo ">>> demo_gpu: what elastic-run said of the restart:"
grep -i "restart" "$console" | grep -v '^\[rank' | head -3 | sed 's/^/    /' || true

echo
echo "=== 3/3: the orchestrator retries the same command: it resumes from the checkpoint ==="
timeout -k 5 "$((wait_s + 30))" "${launcher[@]}" --run-id disturbed -- "${trainer[@]}" --ckpt "$work/ckpt" \
  || fail "the resumed run failed (exit $?); logs: $work/logs/disturbed"
disturbed="$(final_crc disturbed)"

echo
echo "final weights: undisturbed $reference, disturbed $disturbed"
[ -n "$disturbed" ] && [ "$reference" = "$disturbed" ] || fail "the weights differ; logs: $work/logs"
echo "identical, bit for bit: no step was lost or applied twice"
echo "logs of every worker, the killed one included: $work/logs"
