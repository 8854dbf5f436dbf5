# Sourced by the tests of several hosts on one machine: two network namespaces joined by a veth
# pair, each with its own address and loopback, and an etcd listening on the first one's veth
# address only (the second reaches it, nothing outside the namespaces can). The caller sets
# `etcd` (the server), `tag` (a prefix of the namespace and link names) and `net` (the /24, e.g.
# 10.231.7: each test its own); this sets a, b (the namespaces), addr_a, addr_b, work (a scratch
# directory), pids (appended to by the caller: killed at the end), url (the etcd store) and the
# EXIT trap that undoes it all. Exits 77 (skipped) where namespaces cannot be made: that needs
# root (CAP_SYS_ADMIN, CAP_NET_ADMIN) and iproute2.
a="${tag}a" b="${tag}b"
addr_a="$net.1" addr_b="$net.2"
work="$(mktemp -d)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  ip netns del "$a" 2>/dev/null || true
  ip netns del "$b" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null; then
  echo "skipped: network namespaces need root and iproute2"; exit 77
fi
if ! ip netns add "$a" 2>"$work/err" || ! ip netns add "$b" 2>>"$work/err"; then
  echo "skipped: cannot make network namespaces: $(cat "$work/err")"; exit 77
fi
ip link add "${tag}va" type veth peer name "${tag}vb"
ip link set "${tag}va" netns "$a"
ip link set "${tag}vb" netns "$b"
ip -n "$a" addr add "$addr_a/24" dev "${tag}va"
ip -n "$b" addr add "$addr_b/24" dev "${tag}vb"
for ns in "$a" "$b"; do
  ip -n "$ns" link set lo up
done
ip -n "$a" link set "${tag}va" up
ip -n "$b" link set "${tag}vb" up

ip netns exec "$a" "$etcd" --name netns-hosts --data-dir "$work/etcd" \
  --listen-client-urls "http://$addr_a:2379" --advertise-client-urls "http://$addr_a:2379" \
  --listen-peer-urls "http://127.0.0.1:2380" --initial-advertise-peer-urls "http://127.0.0.1:2380" \
  --initial-cluster "netns-hosts=http://127.0.0.1:2380" >"$work/etcd.log" 2>&1 &
pids+=($!)
for i in $(seq 1 100); do
  ip netns exec "$b" curl -fsS -m 1 "http://$addr_a:2379/health" >/dev/null 2>&1 && break
  [ "$i" = 100 ] && { echo "etcd did not come up:"; tail -20 "$work/etcd.log"; exit 1; }
  sleep 0.1
done

url="etcd://$addr_a:2379"
