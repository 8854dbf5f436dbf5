#!/usr/bin/env bash
# A PyTorch DDP script on two hosts: two network namespaces joined by a veth pair, an etcd in the
# first, an elastic-run with one worker in each (--nnodes 2:2, every worker restarted together;
# one each: a sum of two ranks' gradients is exact in any order, so the weights can be compared).
# The launchers meet in their own rendezvous; the workers' torch store is served by rank 0 at
# the MASTER_ADDR:MASTER_PORT its host published, across the veth link. A worker SIGKILLed on the
# second host restarts every worker on both hosts (the first host says why), and the run ends with
# the undisturbed two-host run's weights. And a dead launcher's relay directory is swept. Exits 77 (skipped) without root, iproute2 or python3-torch.
#   tests/torch_two_hosts_netns.sh ELASTIC_RUN SOURCE_DIR ETCD_SERVER
set -euo pipefail
run="$1" src="$2" etcd="$3"
py=/usr/bin/python3
"$py" -c "import torch, torch.distributed" 2>/dev/null || { echo "skipped: no python3-torch under $py"; exit 77; }
export PYTHONPATH="$src/python${PYTHONPATH:+:$PYTHONPATH}"

tag="elt$$" net="10.232.$(( $$ % 250 ))"
. "$(dirname "${BASH_SOURCE[0]}")/support/two_netns.sh"
. "$(dirname "${BASH_SOURCE[0]}")/support/wait_launcher.sh"

script="$src/examples/python/ddp_train.py"
# start RUN_ID: one elastic-run per namespace, the checkpoint shared (as /shared/ckpt would be).
start() {
  hosts=()
  for ns in "$a" "$b"; do
    ip netns exec "$ns" "$run" --run-id "$1" --nproc-per-node 1 --nnodes 2:2 --rdzv "$url" --python "$py" --quiet \
      --max-restarts 3 --log-dir "$work/logs-$ns" "$script" --steps 40 --every 5 --step-time 0.05 \
      --ckpt "$work/$1.pt" >"$work/launcher-$1-$ns.log" 2>&1 &
    hosts+=($!)
    pids+=($!)
  done
}
fail() {
  echo "FAIL: $*"
  for f in "$work"/launcher-*.log; do echo "--- $f"; tail -n 15 "$f"; done
  for f in "$work"/logs-*/*/rank-*.log; do echo "--- $f"; tail -n 15 "$f"; done
  exit 1
}
finish() {  # both launchers exit 0 within 120 s
  for p in "${hosts[@]}"; do
    # Not in $(...): a subshell cannot wait for this shell's children.
    wait_launcher "$p" 120 "an elastic-run" || fail "an elastic-run did not end with 0 (above)"
  done
}
weights() { grep -h "done at step .*, weights" "$work"/logs-*/"$1"/rank-*.log | awk '{print $NF}' | sort -u; }

# A relay directory of a launcher that was SIGKILLed a while ago (its socket bound, nobody
# listening) is swept by the next launcher; one made just now is left to its launcher.
dead=$(mktemp -d /tmp/elastic-relay-XXXXXX) fresh=$(mktemp -d /tmp/elastic-relay-XXXXXX)
chmod 700 "$dead" "$fresh"
"$py" -c "import socket,sys; s=socket.socket(socket.AF_UNIX); s.bind(sys.argv[1])" "$dead/store.sock"
touch -h -d "2 minutes ago" "$dead/store.sock" "$dead"

start ref
finish
[ ! -e "$dead" ] || fail "the dead launcher's relay directory $dead was not swept"
[ -d "$fresh" ] || fail "a relay directory made a moment ago was swept"
rmdir "$fresh"
ref=$(weights ref)
[ "$(echo "$ref" | wc -l)" = 1 ] && [ -n "$ref" ] || fail "the undisturbed ranks disagree or printed nothing: $ref"
grep -q "round 1: host [01] of 2, ranks [01] to [01] of 2, MASTER_ADDR=$net" "$work/launcher-ref-$a.log" ||
  fail "host a's launcher did not say its round"

start kill
for _ in $(seq 1 600); do grep -qs "step 15: loss" "$work"/logs-*/kill/rank-*.log && break; sleep 0.1; done
victim=$(grep -h "worker 0 started: pid" "$work/logs-$b/kill/rank-0.log" | head -1 | sed 's/.*pid \([0-9]*\).*/\1/')
[ -n "$victim" ] || fail "no pid of host b's worker"
kill -KILL "$victim"
finish
grep -q "restarting every worker (1 of 3 restarts)" "$work/launcher-kill-$b.log" || fail "host b did not restart its round"
grep -q "another host started the next round.*restarting every worker of this host" "$work/launcher-kill-$a.log" ||
  fail "host a did not restart with host b"
[ "$(weights kill)" = "$ref" ] || fail "weights after the kill: $(weights kill), undisturbed: $ref"
echo "two hosts: a worker killed on one, every worker of both restarted, the undisturbed weights $ref"
