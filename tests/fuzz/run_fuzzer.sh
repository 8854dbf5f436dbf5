#!/bin/sh
# Builds one libFuzzer target with Clang (ASan+UBSan) and runs it for a bounded time over its
# seed corpus. New inputs go to a scratch directory, never into the repository's corpus; a crash
# leaves its input in the build directory and fails the test.
#   run_fuzzer.sh CLANG++ SOURCE OUT_DIR CORPUS SECONDS -- COMPILE_AND_LINK_FLAGS...
set -eu
cxx=$1 src=$2 out=$3 corpus=$4 seconds=$5
shift 5
[ "$1" = "--" ] && shift
name=$(basename "$src" .cpp)
mkdir -p "$out"
bin="$out/$name"
"$cxx" -std=c++20 -D_GNU_SOURCE -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  "$src" -o "$bin" "$@"
scratch=$(mktemp -d "${TMPDIR:-/tmp}/elastic-$name.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
cd "$out"
# -timeout: one input taking over 10 s is a hang; -rss_limit_mb: a parser may not balloon.
"$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=4096 -print_final_stats=1 \
  -artifact_prefix="$out/$name-" "$scratch" "$corpus"
