# Sourced by the tests that start elastic-run in the background.
# wait_launcher PID SECONDS WHAT: waits up to SECONDS for PID (a child of this shell) to exit and
# reaps it; returns 1, saying "WHAT still running after S s" or "WHAT exited N", unless it
# exited 0.
wait_launcher() {
  local pid="$1" secs="$2" what="$3" code
  for _ in $(seq 1 $((secs * 10))); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then echo "$what still running after $secs s"; return 1; fi
  code=0
  wait "$pid" || code=$?
  [ "$code" = 0 ] || { echo "$what exited $code"; return 1; }
}
