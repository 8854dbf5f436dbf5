#!/usr/bin/env bash
# tests/example_disrupted.sh with the checkpoints in object storage: a real S3 server (Ceph's
# radosgw, one node, started here on loopback: tests/support/radosgw_env.sh), the trainer's
# --ckpt s3://BUCKET/..., the same kills, hang, SIGTERM and resume, and the final weights bit
# for bit those of the undisturbed run.
#   tests/example_disrupted_s3.sh ELASTIC_RUN TRAINER [TRAINER ARGS...]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/support/radosgw_env.sh"
ceph="$(mktemp -d)"
trap 'radosgw_stop "$ceph/c"; rm -rf "$ceph"' EXIT
code=0
radosgw_start "$ceph/c" || code=$?
[ "$code" -eq 0 ] || exit "$code"
s3_bucket digits
CKPT_BASE="s3://digits/run-$$" bash "$here/example_disrupted.sh" "$@"
