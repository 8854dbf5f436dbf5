#!/usr/bin/env bash
# The libtorch example under elastic-run against the same trainer in Python under torchrun
# (examples/torch_mnist_torchrun.py: DDP, a checkpoint every 25 steps), 4 workers on this host,
# 300 steps of batch 64, one worker SIGKILLed in step 150 (just after a checkpoint, so neither
# loses steps to it), TRIALS times each. Prints, per trial and the median: the time from the kill
# to the job training again (elastic: elastic-run's "time lost", the death to the group's next
# step; torchrun: the trainer's trace, the kill to rank 0's first step after the restart), and
# each run's wall time. elastic runs twice: with all 4 ranks required (the group waits for the
# killed rank's restart, as torchrun's restart does) and with --min-ranks 3 (it does not).
#   benchmarks/torch_mnist_compare.sh BUILD_DIR [TRIALS]      (python3-torch and libtorch-dev)
set -euo pipefail
build="$(cd "$1" && pwd)"
trials="${2:-3}"
src="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
"$build/examples/torch_mnist" --steps 1 --ckpt warm >/dev/null 2>&1  # writes the MNIST-format files
export OMP_NUM_THREADS=1
port=29600
kill=(--kill-rank 2 --kill-at 150)
elastic() {  # elastic NAME: the seconds from the kill to training again; all 4 ranks needed
  "$build/tools/elastic-run" --nproc-per-node 4 --max-restarts 3 --quiet --log-dir logs --run-id "$1" -- \
    "$build/examples/torch_mnist" --data mnist --ckpt "$1" --steps 300 --every 25 "${kill[@]}" >/dev/null 2>"$1.err"
  awk '/time lost/ {print $3}' "$1.err"
}
elastic_min3() {  # the same with --min-ranks 3: the survivors go on while the killed rank restarts
  "$build/tools/elastic-run" --nproc-per-node 4 --min-ranks 3 --max-restarts 3 --quiet --log-dir logs --run-id "$1" -- \
    "$build/examples/torch_mnist" --data mnist --ckpt "$1" --steps 300 --every 25 "${kill[@]}" >/dev/null 2>"$1.err"
  awk '/time lost/ {print $3}' "$1.err"
}
torchrun() {  # torchrun NAME: the same
  port=$((port + 1))
  /usr/bin/python3 -m torch.distributed.run --nnodes 1 --nproc_per_node 4 --max_restarts 3 --rdzv_backend c10d \
    --rdzv_endpoint "127.0.0.1:$port" --redirects 1 --tee 2 --log_dir "logs-$1" \
    "$src/examples/torch_mnist_torchrun.py" --data mnist --ckpt "$1" --steps 300 --every 25 "${kill[@]}" \
    --trace "$1.trace" >/dev/null 2>&1
  # The first step rank 0 ends in the restarted workers (restart count 1).
  awk '/^kill/ {k = $2} /^step/ && $4 >= 1 && !done {printf "%.2f\n", $3 - k; done = 1}' "$1.trace"
}
declare -A took
for t in $(seq 1 "$trials"); do
  for tool in elastic elastic_min3 torchrun; do
    t0=$(date +%s.%N)
    s=$("$tool" "$tool-$t")
    wall=$(echo "$(date +%s.%N) - $t0" | bc)
    echo "trial $t $tool: kill -> training again ${s} s (the run: ${wall} s)"
    took[$tool]+="$s "
  done
done
for tool in elastic elastic_min3 torchrun; do
  read -r -a runs <<<"${took[$tool]}"
  echo "$tool: kill -> training again $(printf '%s\n' "${runs[@]}" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}') s (median of $trials)"
done
