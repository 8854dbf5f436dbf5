#!/usr/bin/env bash
# Measures rendezvous at scale on this tree and plots it against the "before" figures kept in
# benchmarks/results (benchmarks/README.md, "Rendezvous at scale"): builds rendezvous_scale in
# BUILD (default build-bench), runs it, and draws OUT/rendezvous-scale.png from the kept JSON and
# the new one. Installs what is missing (Debian packages) first.
#
#   scripts/rendezvous_scale.sh [--label TEXT] [--sizes 4,16,...] [--out DIR] [--build DIR]
#                               [--hb-timeout-ms MS] [--hosts H] [--relays R] [--launcher] [--torch]
#
#   --label    names the run's lines in the plot (default "after: <short commit>")
#   --sizes    default 4,16,64,128,256,512,1024 (about 7 min on 2 vCPUs; more where sizes do
#              not form, each wait being capped at 120 s)
#   --hosts    participant processes in H network namespaces (root)
#   --relays   the participants reach etcd through R store relays (elastic-run's, one per host)
#   --launcher with --hosts: each namespace runs its own elastic-run, whose workers are that
#              host's participant processes (reaching etcd through its relay)
#   --torch    also runs torchrun's c10d rendezvous (installs python3-torch; about 10 min)
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=scripts/lib.sh
. "$here/scripts/lib.sh"

label="" sizes="4,16,64,128,256,512,1024" out="$here/build-bench/rendezvous-scale" build="$here/build-bench"
hb_timeout=2000 hosts="" relays="" launcher=0 torch=0
while [ $# -gt 0 ]; do
  case "$1" in
    --label) label="$2"; shift 2 ;;
    --sizes) sizes="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    --hb-timeout-ms) hb_timeout="$2"; shift 2 ;;
    --hosts) hosts="$2"; shift 2 ;;
    --relays) relays="$2"; shift 2 ;;
    --launcher) launcher=1; shift ;;
    --torch) torch=1; shift ;;
    *) echo "rendezvous_scale.sh: unknown argument '$1' (see the comment at the top of this script)" >&2; exit 2 ;;
  esac
done
commit="$(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo unknown)"
[ -n "$label" ] || label="after: $commit"

packages=("${ELASTIC_BUILD_PACKAGES[@]}" libbenchmark-dev etcd-server libcurl4-openssl-dev python3-matplotlib)
[ -n "$hosts" ] && packages+=(iproute2)
[ "$torch" = 1 ] && packages+=(python3-torch)
ensure_packages "${packages[@]}"

cmake -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DELASTIC_BUILD_BENCHMARKS=ON \
  -DELASTIC_BUILD_TESTS=OFF -DELASTIC_BUILD_EXAMPLES=OFF >/dev/null
ninja -C "$build" -j"$(jobs)" rendezvous_scale  # and rendezvous_participant, elastic-run
mkdir -p "$out"

args=(--sizes="$sizes" --cap-s=120 --hb-timeout-ms="$hb_timeout" --label="$label" --out="$out/rendezvous_scale.json")
[ "$hb_timeout" -ge 20000 ] && args+=(--hb-interval-ms=$((hb_timeout / 6)))
[ -n "$hosts" ] && args+=(--hosts="$hosts")
[ -n "$relays" ] && args+=(--relays="$relays")
[ "$launcher" = 1 ] && args+=(--launcher)
"$build/benchmarks/rendezvous_scale" "${args[@]}"

files=("$here/benchmarks/results/rendezvous_scale_before.json" "$out/rendezvous_scale.json")
if [ "$torch" = 1 ]; then
  /usr/bin/python3 "$here/benchmarks/torch_rendezvous_scale.py" --sizes "$sizes" --cap-s 120 \
    --label "torch c10d: same day as $label" --out "$out/torch_rendezvous_scale.json"
  files+=("$out/torch_rendezvous_scale.json")
else
  files+=("$here/benchmarks/results/torch_rendezvous_scale.json")
fi
/usr/bin/python3 "$here/benchmarks/plot_rendezvous_scale.py" "$out/rendezvous-scale.png" "${files[@]}"
echo "rendezvous_scale.sh: $out/rendezvous_scale.json and $out/rendezvous-scale.png"
