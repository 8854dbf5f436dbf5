#!/usr/bin/env bash
# Three hosts on one machine (network namespaces on a bridge, etcd on the bridge's address), an
# elastic-run in each, their workers one Gloo group. Host c freezes, launcher and worker
# (SIGSTOP, sockets left open), the way a hung or cut-off host does. The library's default lease
# (30 s) and a 60 s Gloo timeout are left as they are: the survivors must notice it through the
# members' peer heartbeats (rendezvous_peer_gone in their events), revoke the allreduce it holds
# and finish training as two. Prints how long after the freeze they noticed and trained again.
# Exits 77 (skipped) without root or iproute2.
#   tests/frozen_host_netns.sh ELASTIC_RUN GROUP_WORKER ETCD_SERVER
#   (GLOO_TIMEOUT_MS=15000 for a shorter Gloo timeout; KEEP_LOGS=DIR keeps the logs.)
set -euo pipefail
run="$1" worker="$2" etcd="$3"

tag="efz$(( $$ % 100000 ))"
net="10.232.$(( $$ % 250 ))"
hosts=(a b c)
. "$(dirname "${BASH_SOURCE[0]}")/support/bridge_netns.sh"
. "$(dirname "${BASH_SOURCE[0]}")/support/wait_launcher.sh"
declare -A launcher
for h in "${hosts[@]}"; do
  extra=()
  [ "$h" = c ] && extra=(--stop-self-at 40)
  ip netns exec "$tag$h" "$run" --run-id frozen --nproc-per-node 1 --nnodes 2:3 --rdzv "$url" --quiet \
    --log-dir "$work/logs-$h" -- "$worker" --run-id frozen --min 2 --max 3 --steps 150 \
    --step-sleep-ms 20 --timeout-ms ${GLOO_TIMEOUT_MS:-60000} --dir "$work/ckpt" --dim 4096 "${extra[@]}" \
    >"$work/launcher-$h.log" 2>&1 &
  pids+=($!)
  launcher[$h]=$!
done

rank_log() { cat "$work/logs-$1/frozen/rank-0.log" 2>/dev/null || true; }
# The worker of host c stops itself inside its step 40; then its launcher is stopped too.
for n in $(seq 1 1200); do rank_log c | grep -q "^stopping" && break; sleep 0.1; done
rank_log c | grep -q "^stopping" || { echo "host c's worker never reached step 40"; rank_log c | tail; exit 1; }
kill -STOP "${launcher[c]}"
stopped=$(rank_log c | grep -m1 "^stopping" | grep -o "t=[0-9]*" | cut -d= -f2)

status=0
for h in a b; do
  wait_launcher "${launcher[$h]}" 90 "elastic-run on host $h (frozen host c)" || status=1
done
for h in a b; do
  echo "--- host $h"
  rank_log "$h" | grep -E "^(joined|rebuilt|final)" || true
done
if [ "$status" != 0 ]; then
  for h in a b c; do echo "--- launcher $h"; tail -20 "$work/launcher-$h.log"; echo "--- rank log $h"; rank_log "$h" | tail -20; done
  exit 1
fi
for h in a b; do
  rank_log "$h" | grep -q "^final .*reason=finished" || { echo "host $h did not finish"; exit 1; }
  line=$(rank_log "$h" | grep -m1 "^rebuilt .*world=2") || { echo "host $h never trained as two"; exit 1; }
  case "$line" in *timed\ out*|*did\ not\ answer*) echo "host $h rebuilt on a timeout, not a departure: $line"; exit 1 ;; esac
  if ! grep -rqs '"event":"rendezvous_peer_gone"' "$work/logs-a" "$work/logs-b"; then
    echo "no rendezvous_peer_gone event: the freeze was not noticed by the peer heartbeats"
    # What did notice it (CI's TSan run, 2026-12-07, failed here once with both survivors
    # rebuilt on "departure of" host c within ~3 s, and nothing else on record).
    for g in a b c; do
      echo "--- events of host $g"
      grep -hs -E '"event":"(rendezvous_|group_failure|worker_|watchdog_kill|launcher_)' "$work/logs-$g"/*/events.jsonl |
        cut -c1-400 || true
    done
    exit 1
  fi
  noticed=$(echo "$line" | grep -o "noticed=[0-9]*" | cut -d= -f2)
  resumed=$(rank_log "$h" | grep -m1 "^step=.* world=2" | grep -o "t=[0-9]*" | cut -d= -f2)
  echo "host $h: noticed the freeze $(( (noticed - stopped) / 1000000 )) ms after it, trained as two" \
       "$(( (resumed - stopped) / 1000000 )) ms after it (lease 30 s, Gloo timeout $(( ${GLOO_TIMEOUT_MS:-60000} / 1000 )) s)"
done
