#!/usr/bin/env bash
# A real S3 server for the tests: Debian's Ceph (ceph-mon, ceph-osd, radosgw) as a one-node
# cluster in DIR: one monitor on 127.0.0.1:MON_PORT, one OSD keeping its objects in memory
# (memstore: nothing of it survives the cluster, and no disk is formatted), radosgw's S3 API on
# 127.0.0.1:RGW_PORT, and a user whose keys are KEY and SECRET. No authentication between the
# daemons (cephx off): everything listens on loopback only. Each daemon writes its pid into
# DIR/run/*.pid (tests/support/radosgw_server.hpp kills them); logs in DIR/log. About 10 s.
#   tests/support/radosgw_up.sh DIR MON_PORT RGW_PORT KEY SECRET [OWNER_PID]
# With OWNER_PID, a reaper left behind SIGKILLs the daemons once that process is gone, however
# it ended (a test killed at its timeout runs no destructor).
# Exit 77 when Ceph is not installed (Debian: apt-get install radosgw ceph-mon ceph-osd).
set -euo pipefail
# One cluster starting at a time on this machine (flock(1), held by flock itself, -o: the daemons
# started here do not inherit the lock). Two starting together under the suite's load once failed
# three times over ("wrong fsid" from the OSD's first call to its monitor, 2026-12-07); not
# reproduced alone or as a pair, and not understood. Every starter comes through here: the
# tests, the disturbed example on s3://, s3_bench.
if [ -z "${ELASTIC_CEPH_START_LOCKED:-}" ] && command -v flock >/dev/null; then
  ELASTIC_CEPH_START_LOCKED=1 exec flock -o -w 600 "${TMPDIR:-/tmp}/elastic-ceph-start.lock" bash "$0" "$@"
fi
D=$1 mon_port=$2 rgw_port=$3 key=$4 secret=$5 owner=${6:-}
for p in ceph-mon ceph-osd radosgw radosgw-admin monmaptool ceph; do
  command -v "$p" >/dev/null || { echo "no $p: apt-get install radosgw ceph-mon ceph-osd ceph-common"; exit 77; }
done
mkdir -p "$D"/{mon,osd,rgw,run,log}
fsid=$(cat /proc/sys/kernel/random/uuid)
cat > "$D/ceph.conf" <<CONF
[global]
fsid = $fsid
mon host = v1:127.0.0.1:$mon_port
public network = 127.0.0.0/8
auth cluster required = none
auth service required = none
auth client required = none
auth allow insecure global id reclaim = true
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
mon allow pool size one = true
mon warn on pool no redundancy = false
osd crush chooseleaf type = 0
osd objectstore = memstore
memstore device bytes = 2147483648
run dir = $D/run
admin socket = $D/run/\$name.asok
log file = $D/log/\$name.log
pid file = $D/run/\$name.pid
keyring = /dev/null
ms bind ipv4 = true
ms bind ipv6 = false
osd max object name len = 460
osd max object namespace len = 64
osd class update on start = false
[mon.a]
mon data = $D/mon
[osd.0]
osd data = $D/osd
[client.rgw]
# tcp_nodelay: without it a small answer's body waits ~40 ms behind its headers (Nagle against
# the client's delayed ACK), every manifest read.
rgw frontends = beast endpoint=127.0.0.1:$rgw_port tcp_nodelay=1
# Deleted and overwritten objects go to the garbage collector, by default after 2 hours: in a
# memory-backed OSD of 2 GiB a benchmark or a long test would fill it. Collect within seconds.
rgw gc obj min wait = 2
rgw gc processor period = 2
rgw gc processor max time = 2
rgw data = $D/rgw
CONF
C="-c $D/ceph.conf"
monmaptool --create --add a "v1:127.0.0.1:$mon_port" --fsid "$fsid" "$D/monmap" >/dev/null
ceph-mon $C --mkfs -i a --monmap "$D/monmap" 2>/dev/null
ceph-mon $C -i a
osd_uuid=$(cat /proc/sys/kernel/random/uuid)
timeout 30 ceph $C osd create "$osd_uuid" >/dev/null
ceph-osd $C -i 0 --mkfs --osd-uuid "$osd_uuid" 2>/dev/null
timeout 30 ceph $C osd crush add osd.0 1 root=default
ceph-osd $C -i 0
for i in $(seq 1 150); do timeout 5 ceph $C osd stat 2>/dev/null | grep -q "1 up" && break; sleep 0.2; done
radosgw $C -n client.rgw
for i in $(seq 1 150); do curl -fsS -m 1 "http://127.0.0.1:$rgw_port/" >/dev/null 2>&1 && break; sleep 0.2; done
curl -fsS -m 1 "http://127.0.0.1:$rgw_port/" >/dev/null || { echo "radosgw did not answer on $rgw_port"; exit 1; }
radosgw-admin $C user create --uid=elastic --display-name=elastic --access-key="$key" --secret="$secret" >/dev/null
if [ -n "$owner" ]; then
  setsid bash -c 'while kill -0 "$1" 2>/dev/null && [ -d "$2/run" ]; do sleep 1; done
                  for f in "$2"/run/*.pid; do [ -f "$f" ] && kill -KILL "$(cat "$f")" 2>/dev/null; done' \
    reaper "$owner" "$D" </dev/null >/dev/null 2>&1 &
fi
echo "up: http://127.0.0.1:$rgw_port"
