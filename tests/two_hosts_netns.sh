#!/usr/bin/env bash
# Two hosts on one machine: two network namespaces joined by a veth pair, each with its own
# addresses and loopback, an etcd listening in the first. An elastic-run in each namespace
# meets the other through etcd and their workers train as one Gloo group over the veth link,
# which works only if each host's workers listen on, and publish, an address the other host
# routes to (ELASTIC_HOST_ADDR), not loopback. Exits 77 (skipped) where namespaces cannot be
# made: that needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN) and iproute2.
#   tests/two_hosts_netns.sh ELASTIC_RUN GROUP_WORKER ETCD_SERVER
set -euo pipefail
run="$1" worker="$2" etcd="$3"

tag="elx$$" net="10.231.$(( $$ % 250 ))"
. "$(dirname "${BASH_SOURCE[0]}")/support/two_netns.sh"
. "$(dirname "${BASH_SOURCE[0]}")/support/wait_launcher.sh"

for ns in "$a" "$b"; do
  # The checkpoint directory is shared, as /shared/ckpt would be on two real hosts.
  ip netns exec "$ns" "$run" --run-id twonets --nproc-per-node 1 --nnodes 2:2 --rdzv "$url" --quiet \
    --log-dir "$work/logs-$ns" -- "$worker" --run-id twonets --min 2 --max 2 --steps 30 \
    --dir "$work/ckpt" --dim 4096 >"$work/launcher-$ns.log" 2>&1 &
  pids+=($!)
done
status=0
for i in 1 2; do
  wait_launcher "${pids[$i]}" 120 "elastic-run $i" || status=1
done

log() { cat "$work/logs-$1/twonets/rank-0.log" 2>/dev/null || true; }
for ns in "$a" "$b"; do
  echo "--- host $ns"
  grep -E "^(store|joined|final)|HOST_ADDR" <(log "$ns") || true
done
if [ "$status" != 0 ]; then
  for ns in "$a" "$b"; do echo "--- launcher $ns"; tail -20 "$work/launcher-$ns.log"; echo "--- rank log $ns"; log "$ns" | tail -20; done
  exit 1
fi
field() { grep -m1 "^$2" <(log "$1") | grep -o "$3=[^ ]*" | cut -d= -f2; }
ra=$(field "$a" joined rank) rb=$(field "$b" joined rank)
wa=$(field "$a" joined world) wb=$(field "$b" joined world)
ca=$(field "$a" final crc) cb=$(field "$b" final crc)
sa=$(field "$a" store scheme) sb=$(field "$b" store scheme)
[ "$sa" = relay ] && [ "$sb" = relay ] || { echo "the workers reached the store as '$sa' and '$sb', not through their launcher's relay"; exit 1; }
[ "$wa" = 2 ] && [ "$wb" = 2 ] || { echo "world sizes $wa and $wb, not 2"; exit 1; }
[ -n "$ra" ] && [ "$ra" != "$rb" ] || { echo "ranks '$ra' and '$rb' are not distinct"; exit 1; }
[ -n "$ca" ] && [ "$ca" = "$cb" ] || { echo "final weights differ: $ca vs $cb"; exit 1; }
echo "two hosts ($addr_a, $addr_b) trained as one group, each through its launcher's store relay: ranks $ra and $rb, final crc $ca on both"
