#!/usr/bin/env bash
# The prepared GPU check: one run, at most ~8 minutes, on a machine with a GPU and NO build step,
# from the repository root, with the binaries scripts/gpu_build.sh put into .gpu/. It writes a
# results table to "$OUT/gpu_check.md" (markdown, ready for benchmarks/README.md; also printed at
# the end) and every log into one "$OUT/logs.tar.gz" ($OUT defaults to ./gpu-out).
#
#   scripts/gpu_check.sh [--bin DIR] [--budget SECONDS] [--skip S1,S2] [--nccl-lib DIR]...
#   scripts/gpu_check.sh --dry-run --bin DIR --nccl-lib DIR [--nccl-lib DIR]   (the suite, on the model)
#
# Sections, each under its own `timeout`, a failure recorded in the table and the check going on:
#   env        the GPU, the driver, the libnccl releases found (PyTorch's wheel nvidia-nccl-*, the
#              system's), up to two distinct ones picked, and the libraries each binary resolves
#   scenarios  tests/test_nccl_group's kill / hang / restart cases per release, with NCCL's own INFO
#              log timestamped (NCCL_DEBUG_TIMESTAMP_*, 2.26+); per case the median over the three
#              survivors of: noticed, rendezvous, communicator up, resynced, first step (ms after
#              the event), and NCCL's "Init timings" of the rebuilt communicators
#   standby    .gpu/nccl_standby_bench, where it was built: its output pasted
#   demo       scripts/demo_gpu.sh --bin DIR: cuda_train killed, preempted, resumed bit-identical
#   torchrun   benchmarks/torchrun_restart.py --backend nccl: torchrun's full restart of the same
#              4-rank job (PyTorch's ProcessGroupNCCL), compared with our kill's first step
#   checkpoint .gpu/checkpoint_gpu_bench, the adaptive policy's training slowdown on 1 GiB of
#              device weights against the same loop without checkpoints
#   nccl_bench last, if time is left: a one-rank communicator's init, abort and abort + init
# --dry-run (or ELASTIC_GPU_DRY_RUN=1): the same steps against binaries built on the NCCL model
# (tests/nccl_model), whose two libnccl builds stand for two releases; sections the model cannot
# run (real cuBLAS, torch with CUDA, a benchmark of real NCCL) say so in the table.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="$root/.gpu" budget=450 dry=0 skip="" libs=()
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin="$(cd "$2" && pwd)" || exit 2; shift 2 ;;
    --budget) budget="$2"; shift 2 ;;
    --skip) skip=",$2,"; shift 2 ;;
    --nccl-lib) libs+=("$(cd "$2" && pwd)") || exit 2; shift 2 ;;
    --dry-run) dry=1; shift ;;
    *) sed -n '/^#   scripts/p' "$0" >&2; exit 2 ;;
  esac
done
[ "${ELASTIC_GPU_DRY_RUN:-0}" = 1 ] && dry=1
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
raw="$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")"  # everything; only the table and a tarball go to $OUT
mkdir -p "$raw/nccl"
t_start=$(date +%s)
deadline=$((t_start + budget))
status="$raw/status.tsv"  # section <TAB> rc <TAB> seconds <TAB> note
: > "$status"
export TZ=UTC

say() { echo "[gpu_check +$(($(date +%s) - t_start))s] $*"; }
left() { echo $((deadline - $(date +%s))); }
record() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >> "$status"; }
skipped() { case "$skip" in *",$1,"*) return 0 ;; esac; return 1; }

# Processes started from $bin that outlived their section (a timeout kills the section's process
# group; a worker elsewhere would hold the GPU): SIGKILLed by pid. Only ours: their executable is
# one of the files in $bin.
ours=" "
for f in "$bin"/*; do [ -f "$f" ] && [ -x "$f" ] && ours+="$(readlink -f "$f") "; done
sweep() {
  local p exe
  for p in /proc/[0-9]*; do
    exe="$(readlink "$p/exe" 2>/dev/null)" || continue
    case "$ours" in *" $exe "*) [ "${p#/proc/}" != "$$" ] && kill -KILL "${p#/proc/}" 2>/dev/null ;; esac
  done
}

# run NAME SECONDS CMD...: CMD under `timeout` (its whole process group), output into
# $raw/NAME.log; the time it may take is cut to what the budget has left (less a reserve for the
# table). Returns CMD's status (124: timed out; 125: not started, out of time).
run() {
  local name="$1" want="$2" t0 rc allowed
  shift 2
  allowed=$(( $(left) - 15 ))
  [ "$allowed" -gt "$want" ] && allowed="$want"
  if [ "$allowed" -lt 10 ]; then
    echo "not run: out of the check's time budget" > "$raw/$name.log"
    return 125
  fi
  say "$name (up to ${allowed}s): $*"
  t0=$(date +%s)
  timeout -k 5 "$allowed" "$@" > "$raw/$name.log" 2>&1 < /dev/null
  rc=$?
  sweep
  echo "$rc $(( $(date +%s) - t0 ))" > "$raw/$name.rc"
  [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && echo "TIMED OUT after ${allowed}s" >> "$raw/$name.log"
  say "$name: exit $rc in $(( $(date +%s) - t0 ))s"
  return "$rc"
}
seconds_of() { [ -f "$raw/$1.rc" ] && cut -d' ' -f2 "$raw/$1.rc" || echo 0; }
note_of() {  # a section's outcome in words
  case "$1" in
    0) echo ok ;; 77) echo "skipped" ;; 124|137) echo "timed out" ;; 125) echo "not run: out of time" ;;
    *) echo "failed (exit $1)" ;;
  esac
}
# recorded NAME WANT COMMAND...: run, then the section's row of the table; returns its status.
recorded() {
  local name="$1" rc
  run "$@"
  rc=$?
  record "$name" "$rc" "$(seconds_of "$name")" "$(note_of "$rc")"
  return "$rc"
}
# gate NAME DRY_NOTE PROGRAM...: records why section NAME does not run (named in --skip; DRY_NOTE,
# when not empty, on the model; a PROGRAM missing from $bin) and fails; succeeds when it runs.
gate() {
  local name="$1" dry_note="$2" p
  shift 2
  if skipped "$name"; then record "$name" 0 0 "skipped (--skip)"; return 1; fi
  if [ "$dry" = 1 ] && [ -n "$dry_note" ]; then record "$name" 0 0 "$dry_note"; return 1; fi
  for p in "$@"; do
    if [ ! -x "$bin/$p" ]; then record "$name" 1 0 "no $(IFS=/; echo "$*") in $bin"; return 1; fi
  done
}

finish() {
  # The table (a Python report over the raw logs; should that fail, the section list alone), then
  # the logs into one tarball (the GPU machine returns at most 8 files of 16 MiB).
  python3 "$root/scripts/gpu_check_report.py" "$raw" "$OUT/gpu_check.md" > "$raw/report.log" 2>&1 || {
    { echo "# GPU check (the report script failed: see report.log in logs.tar.gz)"; echo
      echo "| section | exit | seconds | note |"; echo "|---|---|---|---|"
      awk -F'\t' '{printf "| %s | %s | %s | %s |\n", $1, $2, $3, $4}' "$status"; } > "$OUT/gpu_check.md"
  }
  tar -C "$raw" -czf "$OUT/logs.tar.gz" . 2>/dev/null
  if [ "$(du -k "$OUT/logs.tar.gz" | cut -f1)" -gt 15000 ]; then  # NCCL's logs go first
    tar -C "$raw" --exclude=./nccl -czf "$OUT/logs.tar.gz" .
  fi
  echo
  cat "$OUT/gpu_check.md"
  echo
  say "table: $OUT/gpu_check.md, logs: $OUT/logs.tar.gz"
  rm -rf "$raw"
}
trap finish EXIT
trap 'exit 130' INT TERM

{
  echo "mode $([ "$dry" = 1 ] && echo "dry run on the NCCL model" || echo "GPU")"
  echo "started $(date -u +%FT%TZ) on $(hostname), $(nproc) cores"
  [ -f "$bin/BUILD_INFO" ] && cat "$bin/BUILD_INFO"
  echo "budget ${budget}s; the scenarios ran with NCCL_DEBUG=INFO (INIT,BOOTSTRAP,NET,ENV,DESTROY) into files"
} > "$raw/meta.txt"

# ---- a. environment ---------------------------------------------------------------------------
env_probe() {
  echo "== nvidia-smi -L"
  if command -v nvidia-smi > /dev/null; then
    nvidia-smi -L 2>&1
    echo "== driver"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
  else
    echo "(no nvidia-smi here)"
  fi
  echo "== python3"; python3 -c 'import sys; print(sys.version.split()[0])' 2>&1
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(), "nccl", ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else "")' 2>&1 | tail -1
  echo "== ldconfig libnccl"; ldconfig -p 2>/dev/null | grep libnccl || echo "(none)"
}
# The version of a libnccl.so.2: ncclGetVersion through ctypes, else its file name (libnccl.so.2.28.9).
nccl_version() {
  timeout 20 python3 - "$1" 2>/dev/null <<'EOF' && return 0
import ctypes, sys
v = ctypes.c_int()
if ctypes.CDLL(sys.argv[1]).ncclGetVersion(ctypes.byref(v)) != 0:
    sys.exit(1)
c = v.value
print(f"{c // 10000}.{c // 100 % 100}.{c % 100}" if c >= 10000 else f"{c // 1000}.{c // 100 % 10}.{c % 100}")
EOF
  local real
  real="$(readlink -f "$1")"
  [[ "$real" =~ libnccl\.so\.([0-9]+\.[0-9]+\.[0-9]+)$ ]] && { echo "${BASH_REMATCH[1]}"; return 0; }
  echo unknown
}
# Directories of the CUDA libraries the binaries need besides libnccl (libcudart, libcublas,
# libcublasLt): PyTorch's nvidia-* wheels, the system's, and the libcudart carried in $bin/lib.
cuda_lib_path() {
  local dirs=() d f
  for f in libcudart.so.13 libcublas.so.13 libcublasLt.so.13; do
    d="$(python3 -c 'import nvidia, os; print("\n".join(nvidia.__path__))' 2>/dev/null \
          | while read -r p; do find "$p" -maxdepth 4 -name "$f" 2>/dev/null; done | head -1)"
    [ -z "$d" ] && d="$(ldconfig -p 2>/dev/null | awk -v f="$f" '$1 == f {print $NF; exit}')"
    [ -z "$d" ] && [ -e "/usr/local/cuda/lib64/$f" ] && d="/usr/local/cuda/lib64/$f"
    [ -n "$d" ] && dirs+=("$(dirname "$d")")
  done
  [ -d "$bin/lib" ] && dirs+=("$bin/lib")
  printf '%s\n' "${dirs[@]}" | awk '!seen[$0]++' | paste -sd:
}

say "a. environment"
t0=$(date +%s)
timeout -k 2 30 bash -c "$(declare -f env_probe); env_probe" > "$raw/env.log" 2>&1
if [ ${#libs[@]} -eq 0 ]; then
  cands="$(timeout 20 python3 -c 'import nvidia.nccl as m, os
for p in m.__path__: print(os.path.join(p, "lib"))' 2>/dev/null)"
  # Wherever else PyTorch's nvidia-* wheels put one (nvidia/nccl/lib, or a nvidia/cu13/lib).
  cands+=$'\n'"$(timeout 20 python3 -c 'import nvidia; print("\n".join(nvidia.__path__))' 2>/dev/null \
                 | while read -r p; do find "$p" -maxdepth 4 -name libnccl.so.2 -printf '%h\n' 2>/dev/null; done)"
  cands+=$'\n'"$(ldconfig -p 2>/dev/null | awk '$1 == "libnccl.so.2" {print $NF}' | xargs -r -n1 dirname)"
  cands+=$'\n'"/usr/local/cuda/lib64"$'\n'"/usr/lib/x86_64-linux-gnu"
  while read -r d; do
    [ -n "$d" ] && [ -e "$d/libnccl.so.2" ] && libs+=("$(cd "$d" && pwd -P)")
  done <<< "$cands"
fi
base=""
[ "$dry" = 1 ] || base="$(cuda_lib_path)"
# Up to two distinct releases, in the order found (PyTorch's wheel first).
releases=() release_dirs=() seen=""
for d in "${libs[@]}"; do
  case " $seen " in *" $d "*) continue ;; esac
  seen+=" $d"
  v="$(nccl_version "$d/libnccl.so.2")"
  echo "libnccl.so.2 in $d: $v" >> "$raw/env.log"
  [ ${#releases[@]} -ge 2 ] && continue
  dup=0
  for r in "${releases[@]}"; do [ "$r" = "$v" ] && [ "$v" != unknown ] && dup=1; done
  [ "$dup" = 1 ] && continue
  releases+=("$v"); release_dirs+=("$d")
done
{
  echo "== picked: ${releases[*]:-none}"
  echo "== base LD_LIBRARY_PATH: ${base:-(none)}"
  for b in elastic_nccl_group_worker cuda_train checkpoint_gpu_bench nccl_standby_bench; do
    [ -x "$bin/$b" ] || continue
    echo "== ldd $b (with the first release)"
    LD_LIBRARY_PATH="${release_dirs[0]:-}${base:+:$base}" timeout 10 ldd "$bin/$b" | grep -E 'nccl|cuda|cublas|not found'
  done
} >> "$raw/env.log" 2>&1
printf '%s\n' "${releases[@]}" > "$raw/releases.txt"
if [ ${#releases[@]} -eq 0 ]; then
  record env 1 "$(( $(date +%s) - t0 ))" "no libnccl.so.2 found: the NCCL sections cannot run"
else
  record env 0 "$(( $(date +%s) - t0 ))" "libnccl ${releases[*]}"
fi

# `env` settings that put release i's libnccl first on the library path (a prefix for run()).
release_env() {
  local path
  path="$(printf '%s' "${release_dirs[$1]}${base:+:$base}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" | tr : '\n' | awk '!seen[$0]++' | paste -sd:)"
  renv=(env "LD_LIBRARY_PATH=$path"
        NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1)
}

# ---- b. the NCCL rebuild scenarios --------------------------------------------------------------
declare -A case_filter=(
  [kill]="4 ranks on four hosts lose one mid-allreduce*"
  [kill-standby]="with standby communicators a rank killed mid-allreduce*"
  [hang]="a rank that hangs is revoked away*"
  [hang-standby]="with standby communicators a rank that hangs*"
  [restart]="a killed rank restarted under its id*")
scenarios() {  # scenarios RELEASE_INDEX CASES...
  local i="$1" c name logdir
  shift
  for c in "$@"; do
    name="scenario-${releases[$i]}-$c"
    if [ ! -x "$bin/test_nccl_group" ] || [ ! -x "$bin/elastic_nccl_group_worker" ]; then
      record "$name" 1 0 "no test_nccl_group/elastic_nccl_group_worker in $bin"; continue
    fi
    logdir="$raw/nccl/${releases[$i]}-$c"
    mkdir -p "$logdir"
    release_env "$i"
    recorded "$name" "$([ "$c" = restart ] && echo 90 || echo 75)" "${renv[@]}" \
      ELASTIC_TEST_NCCL_WORKER="$bin/elastic_nccl_group_worker" NCCL_DEBUG=INFO \
      NCCL_DEBUG_SUBSYS=INIT,BOOTSTRAP,NET,ENV,DESTROY NCCL_DEBUG_TIMESTAMP_FORMAT='[%F %T.%6f] ' \
      NCCL_DEBUG_TIMESTAMP_LEVELS=ALL NCCL_DEBUG_FILE="$logdir/%h.%p.log" \
      "$bin/test_nccl_group" "${case_filter[$c]}"
  done
}
cases=(kill kill-standby hang hang-standby restart)
if skipped scenarios; then
  record scenarios 0 0 "skipped (--skip)"
elif [ ${#releases[@]} -gt 0 ]; then
  say "b. NCCL rebuild scenarios, libnccl ${releases[0]}"
  scenarios 0 "${cases[@]}"
fi

# ---- e. torchrun + NCCL on the same job (before the others: it is the comparison the goal names)
if skipped torchrun; then
  record torchrun 0 0 "skipped (--skip)"
elif [ "$dry" = 1 ]; then
  python3 -m py_compile "$root/benchmarks/torchrun_restart.py" > "$raw/torchrun.log" 2>&1
  record torchrun "$?" 0 "not run on the model (needs torch built for CUDA); the script compiles"
else
  say "e. torchrun + NCCL"
  recorded torchrun 150 python3 "$root/benchmarks/torchrun_restart.py" --backend nccl --intervals 0.1 --trials 2 \
    --timeout 75 --json "$raw/torchrun.json"
fi

# ---- d. the GPU demo ----------------------------------------------------------------------------
if gate demo "" cuda_train elastic-run && [ ${#releases[@]} -gt 0 ]; then
  say "d. the GPU demo"
  release_env 0
  demo_args=(--bin "$bin" --work "$raw/demo-run")
  [ "$dry" = 1 ] && demo_args+=(--dry-run)
  recorded demo "$([ "$dry" = 1 ] && echo 200 || echo 120)" "${renv[@]}" "$root/scripts/demo_gpu.sh" "${demo_args[@]}"
  # The workers' logs are worth keeping; the checkpoints are not.
  rm -rf "$raw/demo-run/ckpt" "$raw/demo-run/ckpt-reference"
fi

# ---- f. the adaptive checkpoint's training slowdown on 1 GiB ------------------------------------
if gate checkpoint "not run on the model (checkpoint_gpu_bench needs real cuBLAS)" checkpoint_gpu_bench; then
  say "f. checkpoint overhead, 1 GiB, adaptive policy"
  ckdir="${TMPDIR:-/tmp}/gpu-check-ckpt.$$"
  mkdir -p "$ckdir"
  release_env 0
  recorded checkpoint 120 "${renv[@]}" "$bin/checkpoint_gpu_bench" --dir="$ckdir" \
    --benchmark_filter='BM_gpu_training_overhead/every:adaptive' --benchmark_format=json \
    --benchmark_out="$raw/checkpoint.json" --benchmark_out_format=json
  rm -rf "$ckdir"
fi

# ---- c. the standby prototype -------------------------------------------------------------------
if ! gate standby ""; then
  :
elif [ ! -x "$bin/nccl_standby_bench" ]; then
  record standby 0 0 "not built in this tree (no nccl_standby_bench in $bin)"
elif [ ${#releases[@]} -gt 0 ]; then
  say "c. the standby prototype"
  release_env 0
  standby_args=()
  [ "$dry" = 1 ] && standby_args=(--size-kib=64 --steps=5 --init-reps=1)  # the model is slow at 16 MiB
  recorded standby 90 "${renv[@]}" "$bin/nccl_standby_bench" "${standby_args[@]}"
fi

# ---- b, again: the second release, with what time is left ---------------------------------------
if ! skipped scenarios && [ ${#releases[@]} -gt 1 ]; then
  say "b. NCCL rebuild scenarios, libnccl ${releases[1]}"
  scenarios 1 "${cases[@]}"
fi
# ---- last, with what time is left: one communicator's init and abort (nccl_bench), the teardown
# the issue puts on the critical path, measured alone -----------------------------------------------
if gate nccl_bench "not run on the model (built against real NCCL only)" nccl_bench && [ ${#releases[@]} -gt 0 ]; then
  say "nccl_bench: init and abort of a one-rank communicator"
  release_env 0
  recorded nccl_bench 60 "${renv[@]}" "$bin/nccl_bench" --benchmark_filter='BM_(init|abort|reinit)/' \
    --benchmark_out="$raw/nccl_bench.json" --benchmark_out_format=json
fi
say "done in $(( $(date +%s) - t_start ))s"
