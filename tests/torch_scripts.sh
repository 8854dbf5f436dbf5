#!/usr/bin/env bash
# An unmodified-style PyTorch DDP script (examples/python/ddp_train.py: Gloo on CPU, torch.save
# checkpoints, torch's expiration timer through elastic_timer) under elastic-run, with Debian's
# python3-torch: the worker variables are torchrun's; a SIGKILLed worker restarts every worker
# and the run ends with the undisturbed weights; a hang is killed by the watchdog through the
# Python client, with the Python stack in the log; a notice ends it with 75 and the same command
# resumes; -m runs a module; torch's @record message is in the restart line. Then the same kill
# under torchrun, for the times side by side (printed, never asserted).
#   tests/torch_scripts.sh ELASTIC_RUN SOURCE_DIR
# Exit 77 (skipped) without Debian's python3-torch.
set -euo pipefail
run="$1"
src="$2"
py=/usr/bin/python3
"$py" -c "import torch, torch.distributed" 2>/dev/null || { echo "no python3-torch under $py: skipped"; exit 77; }
work="$(mktemp -d)"
trap 'for p in ${pids:-}; do kill -KILL "$p" 2>/dev/null || true; done; rm -rf "$work"' EXIT
# elastic_timer as a user installs it: pip, from the repository, offline (a copy: pip builds in place).
cp -r "$src/python" "$work/python-src"
"$py" -m pip install --quiet --no-build-isolation --no-deps --no-index --target "$work/site" "$work/python-src" \
  2>"$work/pip.err" || { cat "$work/pip.err"; echo "FAIL: pip could not install python/"; exit 1; }
export PYTHONPATH="$work/site${PYTHONPATH:+:$PYTHONPATH}"
script="$src/examples/python/ddp_train.py"
launcher=("$run" --nproc-per-node 2 --python "$py" --max-restarts 3 --quiet --log-dir "$work/logs")
train=(--steps 40 --every 5 --step-time 0.05 --step-timeout 4)
fail() { echo "FAIL: $*"; for f in "$work"/logs/*/rank-*.log; do echo "--- $f"; tail -n 30 "$f"; done; exit 1; }
weights() { grep -h "done at step .*, weights" "$work/logs/$1"/rank-*.log | tail -1 | awk '{print $NF}'; }
now() { date +%s.%N; }
# Waits (at most 60 s) for a line matching $2 in the logs of run $1.
wait_for() {
  for _ in $(seq 1 600); do
    grep -qs -- "$2" "$work/logs/$1"/rank-*.log && return 0
    sleep 0.1
  done
  fail "no '$2' in run $1's logs within 60 s"
}

echo "== the worker variables are torchrun's"
cat > "$work/envdump.py" <<'EOF'
import json, os, sys
keys = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
        "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
        "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE",
        "TORCHELASTIC_ERROR_FILE", "NCCL_ASYNC_ERROR_HANDLING", "OMP_NUM_THREADS"]
with open(os.path.join(sys.argv[1], "env-" + os.environ["LOCAL_RANK"] + ".json"), "w") as f:
    json.dump({k: os.environ.get(k) for k in keys}, f)
EOF
mkdir -p "$work/ours" "$work/theirs"
"${launcher[@]}" --run-id env-$$ "$work/envdump.py" "$work/ours" 2>/dev/null
(cd "$work" && "$py" -m torch.distributed.run --nproc_per_node 2 --max_restarts 3 --redirects 1 --tee 2 \
   --log_dir "$work/torchrun-logs" envdump.py "$work/theirs" >/dev/null 2>&1)
"$py" - "$work" <<'EOF'
import json, sys, os
w = sys.argv[1]
for r in ("0", "1"):
    ours = json.load(open(os.path.join(w, "ours", f"env-{r}.json")))
    theirs = json.load(open(os.path.join(w, "theirs", f"env-{r}.json")))
    for k, v in theirs.items():
        if v is None:
            continue
        assert ours.get(k) is not None, f"rank {r}: torchrun sets {k}={v}, elastic-run does not"
        # The port, the run id, the error file's path and the master's name are each launcher's
        # own; TORCHELASTIC_USE_AGENT_STORE is True only where the agent serves torch's store
        # (torchrun's static backend): elastic-run serves none, so rank 0 does.
        if k not in ("MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE", "MASTER_ADDR",
                     "TORCHELASTIC_USE_AGENT_STORE"):
            assert ours[k] == v, f"rank {r}: {k} is {ours[k]!r} under elastic-run, {v!r} under torchrun"
print("same variables as torchrun:", ", ".join(sorted(k for k, v in theirs.items() if v is not None)))
EOF

echo "== -m runs a module"
mkdir -p "$work/mod/envpkg"
cp "$work/envdump.py" "$work/mod/envpkg/dump.py"
touch "$work/mod/envpkg/__init__.py"
mkdir -p "$work/bymodule"
PYTHONPATH="$work/mod:$PYTHONPATH" "${launcher[@]}" --run-id mod-$$ -m envpkg.dump "$work/bymodule" 2>/dev/null
[ -s "$work/bymodule/env-1.json" ] || fail "-m envpkg.dump did not run"

echo "== undisturbed"
"${launcher[@]}" --run-id ref-$$ "$script" "${train[@]}" --ckpt "$work/ref.pt" 2>/dev/null
ref=$(weights ref-$$)
[ -n "$ref" ] || fail "the undisturbed run printed no weights"

echo "== a worker SIGKILLed: every worker restarts from the newest checkpoint"
"${launcher[@]}" --run-id kill-$$ "$script" "${train[@]}" --ckpt "$work/kill.pt" 2>"$work/kill.err" &
pids=$!
wait_for kill-$$ "step 15: loss"
victim=$(grep -h "worker 1 started: pid" "$work/logs/kill-$$/rank-1.log" | head -1 | sed 's/.*pid \([0-9]*\).*/\1/')
killed_at=$(now)
kill -KILL "$victim"
wait_for kill-$$ "restart 1: resuming at step"
ours_s=$(echo "$(now) - $killed_at" | bc)
wait "$pids" || fail "elastic-run exited $? after a SIGKILLed worker"
pids=""
grep -q "restarting every worker (1 of 3 restarts)" "$work/kill.err" || fail "no whole-round restart said: $(cat "$work/kill.err")"
[ "$(weights kill-$$)" = "$ref" ] || fail "weights after the kill $(weights kill-$$) != undisturbed $ref"

echo "== a hang: the watchdog kills it through elastic_timer, with the Python stack in the log"
HANG_AT_STEP=12 HANG_RANK=1 "${launcher[@]}" --run-id hang-$$ "$script" "${train[@]}" --ckpt "$work/hang.pt" \
  2>"$work/hang.err" || fail "elastic-run exited $? after a hang"
grep -q "killed by SIGABRT (the watchdog: a timer scope expired)" "$work/logs/hang-$$/rank-1.log" || fail "the hang was not killed by the watchdog"
grep -q "Fatal Python error: Aborted" "$work/logs/hang-$$/rank-1.log" || fail "no Python stack dump in rank 1's log"
grep -q "ddp_train.py\", line [0-9]* in main" "$work/logs/hang-$$/rank-1.log" || fail "the Python stack does not name the script's frame"
[ "$(weights hang-$$)" = "$ref" ] || fail "weights after the hang $(weights hang-$$) != undisturbed $ref"

echo "== a notice: exit 75, and the same command resumes"
"${launcher[@]}" --run-id notice-$$ "$script" "${train[@]}" --ckpt "$work/notice.pt" 2>/dev/null &
pids=$!
wait_for notice-$$ "step 10: loss"
kill -TERM "$pids"
rc=0
wait "$pids" || rc=$?
pids=""
[ "$rc" = 75 ] || fail "a notice ended elastic-run with $rc, not 75"
"${launcher[@]}" --run-id notice-$$ "$script" "${train[@]}" --ckpt "$work/notice.pt" 2>/dev/null || fail "the resumed run failed"
grep -q "resuming at step [1-9]" "$work/logs/notice-$$/rank-0.log" || fail "the resumed run started from scratch"
[ "$(weights notice-$$)" = "$ref" ] || fail "weights after the notice $(weights notice-$$) != undisturbed $ref"

echo "== torch's @record message in the restart line"
cat > "$work/boom.py" <<'EOF'
import os
from torch.distributed.elastic.multiprocessing.errors import record
@record
def main():
    if os.environ["RANK"] == "1" and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
        raise ValueError("the data shard is missing on purpose")
main()
EOF
"${launcher[@]}" --run-id boom-$$ "$work/boom.py" 2>"$work/boom.err" || fail "the run with one exception did not recover"
grep -q "worker 1 exited with code 1: ValueError: the data shard is missing on purpose: restarting every worker" "$work/boom.err" ||
  fail "the exception's message is not in the restart line: $(cat "$work/boom.err")"
grep -q '"event":"worker_error".*the data shard is missing' "$work/logs/boom-$$/events.jsonl" || fail "no worker_error event"
grep -q "worker error     worker 1 (pid [0-9]*): ValueError: the data shard is missing on purpose" "$work/boom.err" ||
  fail "the summary does not quote the exception: $(tail -12 "$work/boom.err")"
grep -q "worker_error: ValueError: the data shard is missing" "$work/logs/boom-$$/timeline.html" ||
  fail "the timeline does not show the worker's exception"
grep -q "every worker restarts together" "$work/logs/boom-$$/timeline.html" || fail "the timeline does not show the round's restart"

echo "== restarts used up: exit 1 naming the exception; exits 75 without a notice: the crash-loop exit 3"
cat > "$work/always.py" <<'EOF'
import os, sys
from torch.distributed.elastic.multiprocessing.errors import record
@record
def main():
    if os.environ["LOCAL_RANK"] == "0":
        if os.environ.get("CODE"):
            sys.exit(int(os.environ["CODE"]))
        raise KeyError("no shard 7")
main()
EOF
rc=0
"${launcher[@]}" --run-id always-$$ "$work/always.py" 2>"$work/always.err" || rc=$?
[ "$rc" = 1 ] || fail "restarts used up: exit $rc, not 1"
grep -q "KeyError: 'no shard 7'; 3 restarts used up" "$work/always.err" || fail "the last failure is not named: $(tail -5 "$work/always.err")"
rc=0
CODE=75 "${launcher[@]}" --run-id loop-$$ "$work/always.py" 2>"$work/loop.err" || rc=$?
[ "$rc" = 3 ] || fail "exits 75 with no notice and no progress: exit $rc, not the crash loop's 3"

echo "== the same kill under torchrun"
(cd "$work" && "$py" -m torch.distributed.run --nproc_per_node 2 --max_restarts 3 --redirects 1 --tee 2 \
   --log_dir "$work/torchrun-logs" "$script" "${train[@]}" --ckpt "$work/torchrun.pt" >"$work/torchrun.out" 2>&1) &
pids=$!
# torch 1.13 on Python 3.11 fails at --redirects 3 / --tee 3: stdout goes to its per-attempt logs.
for _ in $(seq 1 600); do grep -rqs "step 15: loss" "$work/torchrun-logs" && break; sleep 0.1; done
victim=$(pgrep -f "ddp_train.py .*torchrun.pt" | while read -r p; do
  if grep -qz "^LOCAL_RANK=1$" "/proc/$p/environ" 2>/dev/null; then echo "$p"; fi; done | head -1 || true)
theirs_s="n/a"
if [ -n "$victim" ]; then
  killed_at=$(now)
  kill -KILL "$victim"
  for _ in $(seq 1 1200); do grep -rqs "restart 1: resuming at step" "$work/torchrun-logs" && break; sleep 0.1; done
  if grep -rqs "restart 1: resuming at step" "$work/torchrun-logs"; then theirs_s=$(echo "$(now) - $killed_at" | bc); fi
fi
wait "$pids" || true
pids=""
echo "kill -> every worker training again: elastic-run ${ours_s} s, torchrun ${theirs_s} s (2 workers, Gloo, CPU)"
echo "torch scripts: all passed"
