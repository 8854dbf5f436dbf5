#!/usr/bin/env bash
# The main job in small, as a test: elastic-run trains an example trainer (digits_train or
# torch_mnist, on synthetic data, so no network is needed) undisturbed, then with a worker
# SIGKILLed, two workers SIGKILLed together (digits_train --zero1: a rank and the successor
# holding its replica), a worker hung until the watchdog kills it, and a SIGTERM to the launcher
# followed by a resume; the final weights must match bit for bit.
#   tests/example_disrupted.sh ELASTIC_RUN TRAINER [TRAINER ARGS...]   (e.g. --zero1 1)
# CKPT_BASE=URL: the checkpoints under URL (an s3:// prefix: tests/example_disrupted_s3.sh) instead
# of the work directory.
# WORKERS=N in the environment: N workers instead of 3 (4: the group goes 4 -> 3 -> 4 at the kill);
# STEP_TIMEOUT=S: the step deadline, 2 s by default (a heavier trainer on a loaded machine needs
# more, or healthy ranks are killed too and the run runs out of restarts).
set -euo pipefail
run="$1"
train="$2"
shift 2
work="$(mktemp -d)"
# Only a pid we started: `kill 0` would kill our whole process group (ctest with it).
trap 'if [ -n "${pid:-}" ]; then kill -KILL "$pid" 2>/dev/null || true; fi; rm -rf "$work"' EXIT
launcher=("$run" --nproc-per-node "${WORKERS:-3}" --min-ranks 2 --max-restarts 5 --step-timeout "${STEP_TIMEOUT:-2}" --grace 10 --quiet
          --log-dir "$work/logs")
# 600 steps: the hung worker is killed at its deadline while the others go on without it,
# and the SIGTERM must still find the run going after that (300 steps were done first at times).
trainer=("$train" --steps 600 --every 20 --step-sleep-ms 5 --fault-marks "$work/marks" "$@")
ckpt="${CKPT_BASE:-$work}"
# The weights of the run that finished (logs are appended across runs, and the rank that was the
# group's rank 0 at a preemption may be any slot: its "preempted" line can come later in file order).
crc() { grep -h "^finished at step .* weights crc32c" "$work/logs/$1"/rank-*.log | tail -1 | awk '{print $NF}'; }
# Run ids of our own: elastic-run refuses a second launcher of one run on a host, and the same
# example may run beside this one (with other trainer arguments).
ref=ref-$$
hit=hit-$$

"${launcher[@]}" --run-id "$ref" -- "${trainer[@]}" --ckpt "$ckpt/ref" 2>/dev/null

"${launcher[@]}" --run-id "$hit" -- "${trainer[@]}" --ckpt "$ckpt/hit" \
  --kill-rank 2 --kill-at 60 --kill-together 0,1 --kill-together-at 100 --hang-rank 1 --hang-at 150 \
  2>"$work/hit.err" &
pid=$!
for _ in $(seq 1 600); do
  # the hung worker killed and started again (its second restart): every failure is behind us
  grep -qs "worker 1 started: pid [0-9]*, restart 2" "$work/logs/$hit/rank-1.log" && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
if ! kill -TERM "$pid" 2>/dev/null; then
  # It ended before the notice: say how, with what it printed.
  set +e
  wait "$pid"
  code=$?
  set -e
  cat "$work/hit.err" >&2
  tail -n 20 "$work/logs/$hit"/rank-*.log >&2 || true
  echo "FAIL: elastic-run ended (exit $code) before its SIGTERM: every failure should have been recovered" >&2
  exit 1
fi
set +e
wait "$pid"
code=$?
set -e
cat "$work/hit.err" >&2
[ "$code" -eq 75 ] || { echo "FAIL: elastic-run exited $code after SIGTERM, want 75" >&2; exit 1; }
grep -q "watchdog kills   1" "$work/hit.err" || { echo "FAIL: the hang was not killed by the watchdog" >&2; exit 1; }
grep -q "failures         4" "$work/hit.err" ||
  { echo "FAIL: want 4 failures (a kill, two together, a hang)" >&2; exit 1; }

"${launcher[@]}" --run-id "$hit" -- "${trainer[@]}" --ckpt "$ckpt/hit" 2>/dev/null
if [[ " $* " == *" --zero1 1 "* ]]; then
  # The momentum slices followed the group: a dead rank's from its successor's replica, and
  # from the checkpoint when a rank and that successor died together.
  events="$work/logs/$hit/events.jsonl"
  grep -q '"event":"group_resharded".*"from":"memory","sources":"[^"]*replica@' "$events" ||
    { echo "FAIL: no slice came back from a peer's replica after a rank died" >&2; exit 1; }
  grep -q '"event":"group_resharded".*"from":"disk"' "$events" ||
    { echo "FAIL: no slice was reloaded from disk after a rank and its successor died together" >&2; exit 1; }
fi
ref_crc="$(crc "$ref")"
hit_crc="$(crc "$hit")"
echo "undisturbed $ref_crc, disturbed $hit_crc"
[ -n "$ref_crc" ] && [ "$ref_crc" = "$hit_crc" ]
