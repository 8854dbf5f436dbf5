#!/usr/bin/env bash
# Builds, on a machine WITHOUT a GPU, what scripts/gpu_check.sh runs on a machine WITH one, and puts
# it into .gpu/ at the repository root (ignored by git), stripped, so that the folder can travel
# with the working tree (a lent GPU machine has no cmake and no time to build):
#   scripts/gpu_build.sh [--build-dir DIR]        (default: build-gpu)
# Needs the CUDA toolkit with NCCL's headers and libnccl in /usr/local/cuda (or CUDA_HOME) and
# Google Benchmark. libnccl, libcublas(Lt) are NOT carried (hundreds of MiB): gpu_check.sh finds
# them on the GPU machine (PyTorch's wheels, the system's); only libcudart (0.7 MiB) is, in .gpu/lib,
# as a fallback. Prints what it carried and the total size, which must stay well under 60 MiB.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$root/build-gpu"
case "${1:-}" in
  "") ;;
  --build-dir) build="$(realpath -m "$2")" ;;
  *) echo "usage: scripts/gpu_build.sh [--build-dir DIR]" >&2; exit 2 ;;
esac
cuda="${CUDA_HOME:-/usr/local/cuda}"
[ -f "$cuda/include/nccl.h" ] || { echo "gpu_build: no $cuda/include/nccl.h: install NCCL's headers or set CUDA_HOME" >&2; exit 1; }

echo "=== configuring $build against $cuda (Release, benchmarks on) ==="
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCUDAToolkit_ROOT="$cuda" \
  -DELASTIC_BUILD_TESTS=ON -DELASTIC_BUILD_BENCHMARKS=ON -DELASTIC_BUILD_EXAMPLES=ON -DELASTIC_BUILD_TOOLS=ON >/dev/null

# Only what the check runs (the machine this runs on is shared: never the whole tree). A target
# another change adds (nccl_standby_bench) is built where it exists and skipped, said, elsewhere.
wanted=(test_nccl_group elastic_nccl_group_worker test_nccl nccl_bench checkpoint_gpu_bench cuda_train elastic-run
        nccl_standby_bench)
known="$(ninja -C "$build" -t targets all | sed 's/:.*//')"
targets=()
for t in "${wanted[@]}"; do
  if grep -qx "$t" <<<"$known"; then targets+=("$t"); else echo "gpu_build: no target $t in this tree: not carried"; fi
done
echo "=== building ${targets[*]} (-j2) ==="
ninja -C "$build" -j2 "${targets[@]}"

out="$root/.gpu"
rm -rf "$out"
mkdir -p "$out/lib"
for t in "${targets[@]}"; do
  f="$(find "$build" -type f -name "$t" -perm -u+x | head -1)"
  [ -n "$f" ] || { echo "gpu_build: built $t but cannot find its file" >&2; exit 1; }
  cp "$f" "$out/$t"
  strip --strip-unneeded "$out/$t"
done
cp -L "$cuda/lib64/libcudart.so.13" "$out/lib/" 2>/dev/null || echo "gpu_build: no libcudart.so.13 in $cuda/lib64: not carried"
# The shared libraries this machine's distribution gave the binaries (fmt, Google Benchmark, curl,
# libdw and theirs) travel too: the GPU machine may run another distribution, or lack them.
# gpu_check.sh puts .gpu/lib LAST on the library path, so the GPU machine's own copies win where
# they exist. Not carried: the C runtime (glibc, libstdc++, libgcc: newer there) and CUDA's and
# NCCL's libraries (found there).
for t in "${targets[@]}"; do
  ldd "$out/$t" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | while read -r name path; do
    case "$name" in
      libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|libresolv.so*|libutil.so*|libanl.so*|libnss*) continue ;;
      libstdc++.so*|libgcc_s.so*|ld-linux*) continue ;;
      libnccl.so*|libcublas*|libcudart*|libcuda.so*|libnvidia*) continue ;;
    esac
    [ -e "$out/lib/$name" ] || cp -L "$path" "$out/lib/$name"
  done
done
cp "$root/benchmarks/torchrun_restart.py" "$out/"
# What built it, for the table's header.
{
  echo "commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$root" diff --quiet 2>/dev/null || echo '+changes')"
  echo "built $(date -u +%FT%TZ) on $(hostname) against CUDA $(grep -m1 -o 'CUDART_VERSION *[0-9]*' "$cuda/include/cuda_runtime_api.h" | awk '{v=$2; printf "%d.%d", v/1000, (v%1000)/10}') and nccl.h $(awk '/#define NCCL_(MAJOR|MINOR|PATCH) /{printf "%s%s", sep, $3; sep="."}' "$cuda/include/nccl.h")"
} > "$out/BUILD_INFO"
echo "=== carried in $out ==="
ls -la "$out" "$out/lib"
size_kib="$(du -sk "$out" | cut -f1)"
echo "total: $((size_kib / 1024)) MiB ($size_kib KiB)"
if [ "$size_kib" -gt $((60 * 1024)) ]; then
  echo "gpu_build: .gpu/ is over 60 MiB: it would not travel with the working tree" >&2
  exit 1
fi
