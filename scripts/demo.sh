#!/usr/bin/env bash
# The main job: elastic-run trains an MLP on the UCI handwritten digits with 4 worker processes on
# this machine (CPU, Gloo over loopback), and the run is disturbed on purpose:
#   - worker 2 is SIGKILLed inside an allreduce: the 3 survivors rebuild their group and go on;
#     elastic-run restarts worker 2, which restores the checkpoint and rejoins;
#   - workers 2 and 3 are SIGKILLed together: the 2 survivors go on, both come back;
#   - worker 1 hangs in a step: the watchdog elastic-run hosts kills it after the step timeout;
#     the others go on, it is restarted and rejoins;
#   - the launcher gets SIGTERM (a preemption notice): every worker stops, rank 0 writes a final
#     checkpoint (with --zero1 every worker its part, at one agreed step), all exit 75
#     ("retry me") and so does elastic-run;
#   - the same command again resumes from that checkpoint and finishes.
# The final weights are compared with an undisturbed run's: they must be identical, bit for bit.
#   scripts/demo.sh [--zero1]
# --zero1: the momentum is sharded across the workers ZeRO-1 style (state::add_partitioned): each
# worker holds its slice only, every worker writes its part of each checkpoint and sends its
# slices to its successor's memory, and after a death the group moves the slices to the new ranks
# from memory (a dead worker's from its successor's replica), or from the newest checkpoint when a
# worker and its successor died together. The weights are the same bits either way.
set -euo pipefail
zero1=()
case "${1:-}" in
  "") ;;
  --zero1) zero1=(--zero1 1) ;;
  *) echo "usage: scripts/demo.sh [--zero1]" >&2; exit 2 ;;
esac
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$root/scripts/lib.sh"
ensure_packages "${ELASTIC_BUILD_PACKAGES[@]}" libgloo-dev

build="$root/build-demo"
echo "=== building elastic-run and the digits trainer ($build) ==="
build_release "$build" elastic-run digits_train

data="$build/data/digits.csv"
if ! "$root/scripts/fetch_digits.sh" "$data"; then
  echo "(could not fetch the digits from Debian's python3-sklearn package: training on synthetic digits)"
  data=""
fi

work="$build/demo-run"
rm -rf "$work"
mkdir -p "$work"
launcher=("$build/tools/elastic-run" --nproc-per-node 4 --min-ranks 2 --max-restarts 5 --step-timeout 3 --grace 15
          --log-dir "$work/logs")
trainer=("$build/examples/digits_train" ${data:+--data "$data"} --steps 600 --every 25 --step-sleep-ms 15 "${zero1[@]}")

final_crc() {  # the weights checksum of the run that finished (not a preempted life's)
  grep -h "^finished at step .* weights crc32c" "$work/logs/$1"/rank-*.log | tail -1 | awk '{print $NF}'
}

echo
echo "=== 1/3: an undisturbed run, for reference ==="
"${launcher[@]}" --run-id reference -- "${trainer[@]}" --ckpt "$work/ckpt-reference"
reference="$(final_crc reference)"

echo
echo "=== 2/3: the same job, disturbed: worker 2 killed at step 150, workers 2 and 3 killed together"
echo "         at step 220, worker 1 hung at step 300, then a preemption notice (SIGTERM to"
echo "         elastic-run) after step 400 ==="
console="$work/disturbed.console"
"${launcher[@]}" --run-id disturbed -- "${trainer[@]}" --ckpt "$work/ckpt" \
  --kill-rank 2 --kill-at 150 --kill-together 2,3 --kill-together-at 220 --hang-rank 1 --hang-at 300 \
  > >(tee "$console") 2>&1 &
pid=$!
for _ in $(seq 1 1200); do
  grep -q "step  400/" "$console" 2>/dev/null && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
echo ">>> demo: sending SIGTERM to elastic-run (pid $pid), as a spot VM's preemption notice would"
kill -TERM "$pid" 2>/dev/null || true
set +e
wait "$pid"
code=$?
set -e
echo ">>> demo: elastic-run exited $code (75: preempted, state saved, retry me)"
[ "$code" -eq 75 ] || { echo "demo: expected exit 75 after the preemption notice" >&2; exit 1; }

if [ ${#zero1[@]} -gt 0 ]; then
  echo ">>> demo: where the momentum slices came from after each rebuild (group_resharded):"
  grep -ho '"round":[0-9]*,"step":[0-9]*,"world_before":[0-9]*,"world_after":[0-9]*,"bytes":[0-9]*,"from":"[a-z]*","sources":"[^"]*"' \
    "$work/logs/disturbed/events.jsonl" | sort -u | sort -t: -k2,2n | sed 's/^/    /'
fi

echo
echo "=== 3/3: the orchestrator retries the same command: it resumes from the checkpoint ==="
"${launcher[@]}" --run-id disturbed -- "${trainer[@]}" --ckpt "$work/ckpt"
disturbed="$(final_crc disturbed)"

echo
echo "final weights: undisturbed $reference, disturbed $disturbed"
if [ -n "$reference" ] && [ "$reference" = "$disturbed" ]; then
  echo "identical, bit for bit: no step was lost or applied twice"
else
  echo "demo: the weights differ" >&2
  exit 1
fi
echo "logs of every worker, killed ones included: $work/logs"
