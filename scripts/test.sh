#!/usr/bin/env bash
# The whole test suite: a release build, then ASan+UBSan and TSan builds, each running every
# test through CTest. The packaging tests (install + find_package, FetchContent) run once.
#   scripts/test.sh [--fast]     --fast: the release build only
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$root/scripts/lib.sh"
ensure_packages "${ELASTIC_BUILD_PACKAGES[@]}" "${ELASTIC_TEST_PACKAGES[@]}"

configs=("default" "asan" "tsan")
# GPU tests (label gpu) run only where a GPU answers; never under the sanitizers.
gpu_exclude="gpu"
command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 && gpu_exclude=""
[ "${1:-}" = "--fast" ] && configs=("default")

for c in "${configs[@]}"; do
  case "$c" in
    default) dir=build type=RelWithDebInfo san="" exclude="$gpu_exclude" ;;
    asan) dir=build-asan type=Debug san="address,undefined" exclude="packaging|gpu|slurm" ;;
    tsan) dir=build-tsan type=RelWithDebInfo san="thread" exclude="packaging|gpu|slurm" ;;
  esac
  echo "=== elastic: $c build ($dir) ==="
  cmake -S "$root" -B "$root/$dir" -G Ninja -DCMAKE_BUILD_TYPE=$type -DELASTIC_SANITIZE="$san" \
    -DELASTIC_BUILD_BENCHMARKS=$([ -z "$san" ] && echo ON || echo OFF) >/dev/null
  cmake --build "$root/$dir" -j "$(jobs)"
  # The README's settings 10 times over (2 minutes of real time) run once, in the release build.
  skip=""
  [ -n "$san" ] && skip="10 times out of 10"
  ctest --test-dir "$root/$dir" --output-on-failure -j "$(jobs)" ${exclude:+-LE "$exclude"} ${skip:+-E "$skip"}
done
echo "=== elastic: all tests passed (${configs[*]}) ==="
