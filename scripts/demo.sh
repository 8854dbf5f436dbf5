#!/usr/bin/env bash
# The main job: build the examples and run the demos of what elastic does today: a hung
# worker killed by the watchdog, then a training run preempted (SIGTERM), killed (SIGKILL) and
# resumed to the same final weights as an undisturbed run.
#   scripts/demo.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$root/scripts/lib.sh"
ensure_packages "${ELASTIC_BUILD_PACKAGES[@]}"

build="$root/build-demo"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DELASTIC_BUILD_TESTS=OFF -DELASTIC_BUILD_BENCHMARKS=OFF >/dev/null
cmake --build "$build" --target watchdog_demo train_resume -j "$(jobs)" >/dev/null
echo "=== the watchdog: a worker hangs in a collective ==="
"$build/examples/watchdog_demo"
echo
echo "=== checkpoints: preempted, killed, resumed ==="
"$build/examples/train_resume"
