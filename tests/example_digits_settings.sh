#!/usr/bin/env bash
# digits_train refuses a malformed or out-of-range ELASTIC_* setting, naming it and what it
# takes, instead of running with a default.
#   tests/example_digits_settings.sh DIGITS_TRAIN
set -euo pipefail
train="$1"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
alone=(env -u ELASTIC_RDZV -u ELASTIC_RUN_ID -u ELASTIC_RANK -u ELASTIC_WORLD_SIZE -u ELASTIC_MIN_NODES
       -u ELASTIC_MAX_NODES -u ELASTIC_MIN_RANKS -u ELASTIC_MAX_RANKS -u ELASTIC_WATCHDOG -u ELASTIC_STEP_TIMEOUT -u ELASTIC_GRACE -u ELASTIC_LOCAL_RANK
       -u ELASTIC_RESTART_COUNT -u ELASTIC_HOST_ADDR)
n=0
refused() {  # refused EXPECTED-TEXT VAR=VALUE...
  local want="$1"
  shift
  n=$((n + 1))
  if "${alone[@]}" "$@" "$train" --steps 3 --ckpt "$work/c$n" >"$work/out" 2>&1; then
    echo "FAIL: digits_train ran with $* ($(tail -3 "$work/out"))" >&2
    exit 1
  fi
  grep -qF -- "$want" "$work/out" || { echo "FAIL: with $*, no '$want' in: $(cat "$work/out")" >&2; exit 1; }
}
refused "ELASTIC_MIN_NODES='abc' is not an integer" ELASTIC_MIN_NODES=abc
refused "ELASTIC_MAX_NODES='0' is out of range: it takes an integer from 1 to 65536" ELASTIC_MAX_NODES=0
refused "ELASTIC_MIN_NODES=3 is above ELASTIC_MAX_NODES=2" ELASTIC_MIN_NODES=3 ELASTIC_MAX_NODES=2
refused "ELASTIC_MIN_NODES=2 needs ELASTIC_RDZV" ELASTIC_MIN_NODES=2
refused "ELASTIC_MIN_RANKS=3 is above ELASTIC_MAX_RANKS=2" ELASTIC_MIN_RANKS=3 ELASTIC_MAX_RANKS=2
refused "ELASTIC_MIN_RANKS=2 needs ELASTIC_RDZV" ELASTIC_MIN_RANKS=2 ELASTIC_MIN_NODES=1
refused "ELASTIC_STEP_TIMEOUT='0.0001' is out of range" ELASTIC_STEP_TIMEOUT=0.0001
refused "ELASTIC_LOCAL_RANK='first' is not an integer" ELASTIC_LOCAL_RANK=first
refused "ELASTIC_RESTART_COUNT='-1' is out of range" ELASTIC_RESTART_COUNT=-1
refused "ELASTIC_HOST_ADDR='host name' is not a host name or an IP address" "ELASTIC_HOST_ADDR=host name"
echo "every malformed setting was refused"
