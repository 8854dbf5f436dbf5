#!/usr/bin/env bash
# digits_train without elastic-run is a world of one with a store of its own (shm). That store
# must not outlive the process in /dev/shm: not after a run to the end, not after a SIGKILL.
#   tests/example_digits_alone.sh DIGITS_TRAIN
set -euo pipefail
train="$1"
work="$(mktemp -d)"
# Only a pid we started: `kill 0` would kill our whole process group (ctest with it).
trap 'if [ -n "${pid:-}" ]; then kill -KILL "$pid" 2>/dev/null || true; fi; rm -rf "$work"' EXIT
# Not under elastic-run, whatever runs this test.
alone=(env -u ELASTIC_RDZV -u ELASTIC_RUN_ID -u ELASTIC_RANK -u ELASTIC_WORLD_SIZE -u ELASTIC_MIN_NODES
       -u ELASTIC_MAX_NODES -u ELASTIC_MIN_RANKS -u ELASTIC_MAX_RANKS -u ELASTIC_WATCHDOG -u ELASTIC_STEP_TIMEOUT -u ELASTIC_GRACE)
left_by() { ls /dev/shm | grep -E -- "-$1\$" || true; }
fail() { echo "FAIL: $*" >&2; exit 1; }

"${alone[@]}" "$train" --steps 30 --every 10 --ckpt "$work/a" >"$work/a.out" 2>&1 &
pid=$!
wait "$pid" || fail "digits_train exited $? ($(cat "$work/a.out"))"
[ -z "$(left_by "$pid")" ] || fail "a finished run left $(left_by "$pid") in /dev/shm"

"${alone[@]}" "$train" --steps 1000000 --every 10 --step-sleep-ms 5 --ckpt "$work/b" >"$work/b.out" 2>&1 &
pid=$!
for _ in $(seq 1 600); do
  compgen -G "$work/b/step-*" >/dev/null && break  # training, so the store is open
  kill -0 "$pid" 2>/dev/null || fail "digits_train ended early: $(cat "$work/b.out")"
  sleep 0.1
done
compgen -G "$work/b/step-*" >/dev/null || fail "digits_train committed no checkpoint in 60 s"
kill -KILL "$pid"
wait "$pid" 2>/dev/null || true
[ -z "$(left_by "$pid")" ] || fail "a SIGKILLed run left $(left_by "$pid") in /dev/shm"
echo "nothing left in /dev/shm"
