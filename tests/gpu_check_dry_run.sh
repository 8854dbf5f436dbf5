#!/usr/bin/env bash
# The suite's dry run of scripts/gpu_check.sh (label nccl-model): the binaries built on the NCCL
# model stand where scripts/gpu_build.sh puts the real ones (a folder of links named as in .gpu/),
# the model's two libnccl builds stand for two releases, and the table must come out with a row
# for every section and every scenario of both.
#   gpu_check_dry_run.sh SOURCE_DIR WORK_DIR TEST_NCCL_GROUP WORKER ELASTIC_RUN CUDA_TRAIN NCCL_DIR NCCL_227_DIR
#                        [with-demo|skip-demo] [STANDBY_BENCH]   (the model build of nccl_standby_bench, if any)
set -euo pipefail
src="$1" work="$2" demo="${9:-with-demo}"
skip=()
[ "$demo" = skip-demo ] && skip=(--skip demo)
rm -rf "$work"
mkdir -p "$work/bin"
ln -s "$(realpath "$3")" "$work/bin/test_nccl_group"
ln -s "$(realpath "$4")" "$work/bin/elastic_nccl_group_worker"
ln -s "$(realpath "$5")" "$work/bin/elastic-run"
ln -s "$(realpath "$6")" "$work/bin/cuda_train"
[ -n "${10:-}" ] && ln -s "$(realpath "${10}")" "$work/bin/nccl_standby_bench"
OUT="$work/out" "$src/scripts/gpu_check.sh" --dry-run --bin "$work/bin" --nccl-lib "$7" --nccl-lib "$8" --budget 330 "${skip[@]}"
table="$work/out/gpu_check.md"
fail() { echo "gpu_check_dry_run: $*" >&2; exit 1; }
[ -s "$table" ] || fail "no table at $table"
[ -s "$work/out/logs.tar.gz" ] || fail "no logs.tar.gz"
grep -q "^| env | libnccl 2.30.7 2.27.7 |" "$table" || fail "the env row does not name both model releases"
for rel in 2.30.7 2.27.7; do
  for event in "SIGKILL inside an allreduce" "SIGKILL, standby communicators" "SIGSTOP (hang)" \
               "SIGSTOP, standby communicators" "the killed rank restarted"; do
    row="$(grep -F "| $event | $rel |" "$table")" || fail "no row for '$event' on $rel"
    # A path and four measured phases: the scenario ran and its lines were parsed.
    echo "$row" | grep -Eq "^\| [^|]+ \| $rel \| [a-z/]+ \| [-+0-9.,]+ \| [-+0-9.,]+ \| [-+0-9.,]+ \| [-+0-9.,]+ \|" \
      || fail "the row for '$event' on $rel has no measured phases: $row"
  done
done
for section in torchrun checkpoint standby demo; do
  grep -q "^| $section |" "$table" || fail "no row for section $section"
done
if [ "$demo" = with-demo ]; then
  grep -q "^| demo | ok |" "$table" || fail "the demo did not pass: $(grep '^| demo |' "$table")"
  grep -q "^bit-identical: final weights: undisturbed \([0-9a-f]*\), disturbed \1$" "$table" \
    || fail "the table does not show the demo's identical weights"
fi
echo "gpu_check_dry_run: the table has every row"
