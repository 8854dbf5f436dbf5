#!/usr/bin/env bash
# The main job: build the examples and run the demo of what elastic does today.
#   scripts/demo.sh [demo args...]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$root/scripts/lib.sh"
ensure_packages "${ELASTIC_BUILD_PACKAGES[@]}"

build="$root/build-demo"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DELASTIC_BUILD_TESTS=OFF -DELASTIC_BUILD_BENCHMARKS=OFF >/dev/null
cmake --build "$build" --target watchdog_demo -j "$(jobs)" >/dev/null
exec "$build/examples/watchdog_demo" "$@"
