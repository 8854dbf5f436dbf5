# Sourced by the tests of several hosts on one machine: one network namespace per host, each
# joined by a veth to a bridge in the test's own namespace, where etcd listens on the bridge's
# address (as hosts on one switch would reach it). The caller sets `etcd` (the server), `tag` (a
# prefix of the namespace and link names, short: a link name holds 15 bytes), `net` (the /24,
# e.g. 10.232.7: each test its own) and `hosts` (an array of host names); this sets work (a
# scratch directory), pids (appended to by the caller: stopped processes are continued, then all
# killed at the end), url (the etcd store) and the EXIT trap that undoes it all (KEEP_LOGS=DIR
# copies the scratch directory there first). Host i gets address $net.(i+2). Exits 77 (skipped)
# where namespaces cannot be made: that needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN) and iproute2.
work="$(mktemp -d)"
# etcd's peer port on this run's own bridge address: a port on loopback picked from the pid could
# be one another test holds (TSan run, 2026-11-27: "bind: address already in use").
peer="$net.1:2380"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -CONT "$p" 2>/dev/null || true; kill -KILL "$p" 2>/dev/null || true; done
  pkill -KILL -f "$work/ckpt" 2>/dev/null || true  # workers, whose arguments name the checkpoints
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  for h in "${hosts[@]}"; do ip netns del "$tag$h" 2>/dev/null || true; done
  ip link del "${tag}br" 2>/dev/null || true
  [ -n "${KEEP_LOGS:-}" ] && cp -r "$work" "$KEEP_LOGS" 2>/dev/null; rm -rf "$work"
}
trap cleanup EXIT

if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null; then
  echo "skipped: network namespaces need root and iproute2"; exit 77
fi
if ! ip link add "${tag}br" type bridge 2>"$work/err"; then
  echo "skipped: cannot make a bridge: $(cat "$work/err")"; exit 77
fi
ip addr add "$net.1/24" dev "${tag}br"
ip link set "${tag}br" up
i=2
for h in "${hosts[@]}"; do
  ip netns add "$tag$h" 2>"$work/err" || { echo "skipped: cannot make network namespaces: $(cat "$work/err")"; exit 77; }
  ip link add "${tag}v$h" type veth peer name "${tag}p$h"
  ip link set "${tag}p$h" netns "$tag$h"
  ip link set "${tag}v$h" master "${tag}br"
  ip link set "${tag}v$h" up
  ip -n "$tag$h" addr add "$net.$i/24" dev "${tag}p$h"
  ip -n "$tag$h" link set "${tag}p$h" up
  ip -n "$tag$h" link set lo up
  i=$((i + 1))
done

"$etcd" --name "${tag}etcd" --data-dir "$work/etcd" \
  --listen-client-urls "http://$net.1:2379" --advertise-client-urls "http://$net.1:2379" \
  --listen-peer-urls "http://$peer" --initial-advertise-peer-urls "http://$peer" \
  --initial-cluster "${tag}etcd=http://$peer" >"$work/etcd.log" 2>&1 &
pids+=($!)
for n in $(seq 1 100); do
  curl -fsS -m 1 "http://$net.1:2379/health" >/dev/null 2>&1 && break
  [ "$n" = 100 ] && { echo "etcd did not come up:"; tail -20 "$work/etcd.log"; exit 1; }
  sleep 0.1
done
url="etcd://$net.1:2379"
