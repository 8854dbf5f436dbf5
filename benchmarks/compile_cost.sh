#!/usr/bin/env bash
# What including elastic costs a translation unit: preprocessed lines and the compiler's CPU
# time (user + sys, median of N runs of g++ -fsyntax-only) for the headers users include.
#   benchmarks/compile_cost.sh [SOURCE_DIR] [N]
# Run it on a quiet machine: other jobs on the same cores inflate the times, not the lines.
set -euo pipefail
src="${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
runs="${2:-5}"
cxx="${CXX:-g++}"
flags=(-std=c++20 -I"$src/include")
printf '%-34s %10s %10s\n' "header" "lines" "cpu s"
for h in elastic/timer/expires.hpp elastic/timer.hpp elastic/checkpoint.hpp elastic/rendezvous.hpp elastic/elastic.hpp; do
  [ -f "$src/include/$h" ] || continue
  tu="$(mktemp --suffix=.cpp)"
  echo "#include <$h>" > "$tu"
  lines=$("$cxx" "${flags[@]}" -E "$tu" | wc -l)
  times=()
  for _ in $(seq "$runs"); do
    t=$( { /usr/bin/time -f "%U %S" "$cxx" "${flags[@]}" -fsyntax-only "$tu"; } 2>&1 | tail -1 | awk '{print $1 + $2}')
    times+=("$t")
  done
  median=$(printf '%s\n' "${times[@]}" | sort -n | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}')
  printf '%-34s %10s %10s\n' "$h" "$lines" "$median"
  rm -f "$tu"
done
