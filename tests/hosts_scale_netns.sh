#!/usr/bin/env bash
# Many hosts on one machine: H network namespaces on a bridge, etcd on the bridge's address, an
# elastic-run in each with W workers, all H x W one Gloo group training. Once every rank has
# joined, etcd's own count of requests (/metrics, grpc_server_started_total) is read over a
# window of training with nothing changing: the store load of a formed group must not grow with
# its ranks (issue 28). It fails above 1 request/s per host; each rank polling the store, or
# holding a lease of its own, would ask several per rank. The workers use the examples' short
# heartbeat (every 200 ms, dead after 2 s): it must not cost the store more per host than the
# library's default (a host's lease lives at least 15 s, the peer heartbeats noticing a vanished
# host first). Prints the rate and how long the group took to form from the launch. Exits 77
# (skipped) without root or iproute2.
#   tests/hosts_scale_netns.sh ELASTIC_RUN GROUP_WORKER ETCD_SERVER [HOSTS [WORKERS_PER_HOST]]
#   (KEEP_LOGS=DIR keeps the logs; WINDOW_S=5 the idle window.)
set -euo pipefail
run="$1" worker="$2" etcd="$3" nhosts="${4:-8}" per="${5:-8}"
window="${WINDOW_S:-5}"
world=$((nhosts * per))

tag="esc$(( $$ % 100000 ))"
net="10.233.$(( $$ % 250 ))"
hosts=()
for i in $(seq 1 "$nhosts"); do hosts+=("h$i"); done
. "$(dirname "${BASH_SOURCE[0]}")/support/bridge_netns.sh"
. "$(dirname "${BASH_SOURCE[0]}")/support/wait_launcher.sh"

# Enough steps that the group still trains through the window (100 ms of sleep each).
steps=$(( (window + 8) * 10 ))
started=$EPOCHREALTIME
declare -A launcher
for h in "${hosts[@]}"; do
  ip netns exec "$tag$h" "$run" --run-id scale --nproc-per-node "$per" --nnodes "$nhosts:$nhosts" --rdzv "$url" \
    --quiet --log-dir "$work/logs-$h" -- "$worker" --run-id scale --min "$world" --max "$world" --steps "$steps" \
    --step-sleep-ms 100 --hb-interval-ms 200 --hb-timeout-ms 2000 --dir "$work/ckpt" --dim 64 \
    >"$work/launcher-$h.log" 2>&1 &
  pids+=($!)
  launcher[$h]=$!
done

rank_logs() { cat "$work"/logs-*/scale/rank-*.log 2>/dev/null || true; }
show_failure() {
  for h in "${hosts[@]}"; do echo "--- launcher $h"; tail -5 "$work/launcher-$h.log"; done
  echo "--- rank logs (last lines)"; for f in "$work"/logs-*/scale/rank-*.log; do echo "$f: $(tail -1 "$f")"; done | head -20
}
joined=0
for _ in $(seq 1 1800); do
  joined=$(rank_logs | grep -c "^joined .* world=$world " || true)
  [ "$joined" -ge "$world" ] && break
  sleep 0.1
done
if [ "$joined" -lt "$world" ]; then
  echo "only $joined of $world ranks joined a round of $world within 180 s"; show_failure; exit 1
fi
calc() { awk "BEGIN { printf \"$1\", ($2) }"; }  # bc is not everywhere
formed=$(calc %.2f "$EPOCHREALTIME - $started")

# etcd's gRPC calls by method ("Range 12"), and their sum.
etcd_methods() {
  curl -fsS -m 5 "http://$net.1:2379/metrics" |
    awk '/^grpc_server_started_total/ { match($0, /grpc_method="[^"]*"/); n[substr($0, RSTART + 13, RLENGTH - 14)] += $2 }
         END { for (m in n) print m, n[m] }' | sort
}
sum() { awk '{ n += $2 } END { printf "%d", n }' "$1"; }
sleep 1  # the group's first steps: its communicator's last bootstrap keys
etcd_methods >"$work/calls-before"; t0=$EPOCHREALTIME
sleep "$window"
etcd_methods >"$work/calls-after"; t1=$EPOCHREALTIME
before=$(sum "$work/calls-before") after=$(sum "$work/calls-after")
# The window counts only if every rank was still training through it.
if rank_logs | grep -q "^final "; then
  echo "a rank finished inside the idle window: the steps are too few for this machine"; exit 1
fi
rate=$(calc %.2f "($after - $before) / ($t1 - $t0)")

status=0
for h in "${hosts[@]}"; do
  wait_launcher "${launcher[$h]}" 180 "elastic-run on host $h" || status=1
done
[ "$status" = 0 ] || { show_failure; exit 1; }
finished=$(rank_logs | grep -c "^final .*reason=finished" || true)
relayed=$(rank_logs | grep -c "^store scheme=relay" || true)
echo "$nhosts hosts x $per workers: $world ranks formed one group $formed s after the launch; idle, etcd" \
     "served $((after - before)) requests in $(calc %.1f "$t1 - $t0") s: $rate/s in all" \
     "($(calc %.3f "$rate / $nhosts") per host, $(calc %.4f "$rate / $world") per rank)"
[ "$finished" -ge "$world" ] || { echo "only $finished of $world ranks finished"; show_failure; exit 1; }
[ "$relayed" -ge "$world" ] || { echo "only $relayed of $world ranks reached the store through their host's relay"; exit 1; }
if [ "$(calc %d "$rate > $nhosts")" = 1 ]; then
  echo "idle store load $rate requests/s is more than 1 per host ($nhosts hosts): it grows with the ranks again"
  echo "etcd's calls in the window, by method:"
  join -a 2 "$work/calls-before" "$work/calls-after" | awk 'NF == 3 { print "  " $1, $3 - $2 } NF == 2 { print "  " $1, $2 }'
  exit 1
fi
