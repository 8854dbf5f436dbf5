# Sourced by the shell tests and benchmarks that need a real S3 server: radosgw_start DIR starts
# one (tests/support/radosgw_up.sh, ~12 s) on free loopback ports and exports what the AWS tools
# and elastic's s3:// directories read (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID,
# AWS_SECRET_ACCESS_KEY, AWS_REGION); s3_bucket NAME creates a bucket with curl's own SigV4;
# radosgw_stop DIR SIGKILLs the daemons. radosgw_start returns 77 where Ceph is not installed.
radosgw_support="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

radosgw_free_port() {
  /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

radosgw_start() {
  local dir=$1 code=0 attempt
  for attempt in 1 2 3; do
    local mon rgw
    mon=$(radosgw_free_port)
    rgw=$(radosgw_free_port)
    code=0
    bash "$radosgw_support/radosgw_up.sh" "$dir" "$mon" "$rgw" ELASTICTESTKEY elastic-test-secret $$ >"$dir.up.log" 2>&1 ||
      code=$?
    if [ "$code" -eq 0 ]; then
      export AWS_ENDPOINT_URL="http://127.0.0.1:$rgw" AWS_ACCESS_KEY_ID=ELASTICTESTKEY
      export AWS_SECRET_ACCESS_KEY=elastic-test-secret AWS_REGION=us-east-1
      return 0
    fi
    radosgw_stop "$dir"
    [ "$code" -eq 77 ] && { cat "$dir.up.log"; return 77; }
    rm -rf "$dir"
  done
  cat "$dir.up.log" >&2
  return 1
}

radosgw_stop() {
  local dir=$1 f
  for f in "$dir"/run/*.pid; do
    [ -f "$f" ] && kill -KILL "$(cat "$f")" 2>/dev/null || true
  done
}

# curl's --aws-sigv4 (7.75+) does not send x-amz-content-sha256 before 8.x; S3 servers want it.
s3_curl() {
  curl -fsS --aws-sigv4 "aws:amz:$AWS_REGION:s3" --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" "$@"
}
s3_bucket() {
  s3_curl -X PUT -H "x-amz-content-sha256: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" \
    "$AWS_ENDPOINT_URL/$1" >/dev/null
}
