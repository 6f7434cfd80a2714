#!/usr/bin/env bash
# The GPU run of the measured ablations, in one script (about four minutes on an H100):
#   1. stage05-ablation --quick under compute-sanitizer memcheck: every variant of the ablation
#      kernel on small ragged problems, against the fp64 reference;
#   2. stage05-ablation: stage 04 -> 05 one change at a time, and stage 06's block order and
#      causal/non-causal ratio (every variant checked before it is timed);
#   3. Nsight Compute on stages 01-07 at head_dim 64 and 03-07 at 128 (scripts/profile/profile_stages.sh);
#   4. stage05-ablation --quick under racecheck.
# Run from the repository root, after the build:
#   cmake -S . -B build-gpu -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90 -DFLASH_TESTS=ON && cmake --build build-gpu -j 16
#   OUT=<folder> scripts/device/gpu_check_ablation.sh [build folder, default build-gpu]
# Into $OUT (default gpu-logs), under the names bench/results/ gives them (copy them there, then
# python3 scripts/docs/make_tables.py --update, which takes every page that holds generated figures):
#   h100_stage05_ablation.txt  h100_ncu_d64.csv  h100_ncu_d128.csv
# and, not for bench/results/: gpu.txt, sanitizer_ablation.log, the profiler's summaries.
# Exit status 0 when every step passed.
set -uo pipefail
build=${1:-build-gpu}
out=${OUT:-gpu-logs}
mkdir -p "$out"
status=0
for binary in stage05-ablation flash-stages flash-stages-bench; do
  [ -x "$build/bin/$binary" ] || { echo "gpu_check_ablation: $build/bin/$binary is missing: build $build first"; exit 1; }
done
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$out/gpu.txt" 2>&1
cat "$out/gpu.txt"

sanitize() {  # sanitize TOOL: the ablation's small checks under compute-sanitizer
  if timeout 150 compute-sanitizer --tool "$1" --error-exitcode 9 "$build/bin/stage05-ablation" --quick \
       > "$out/sanitizer_last.log" 2>&1; then
    echo "sanitizer $1 (stage05-ablation --quick): clean, $(grep -c ' PASS' "$out/sanitizer_last.log") checks passed"
  else
    echo "sanitizer $1 (stage05-ablation --quick): FAILED"; grep -E "FAIL|ERROR" "$out/sanitizer_last.log" | head -20
    status=1
  fi
  cat "$out/sanitizer_last.log" >> "$out/sanitizer_ablation.log"
  rm -f "$out/sanitizer_last.log"
}

: > "$out/sanitizer_ablation.log"
sanitize memcheck

if timeout 150 "$build/bin/stage05-ablation" > "$out/h100_stage05_ablation.txt" 2> "$out/stage05_ablation.err"; then
  echo "stage05-ablation: every variant passed its checks"
else
  echo "stage05-ablation: FAILED (exit $?)"; grep -E "FAIL" "$out/h100_stage05_ablation.txt" | head -20
  cat "$out/stage05_ablation.err"; status=1
fi
grep -v "^# check" "$out/h100_stage05_ablation.txt"

# Stages 01-07 at head_dim 64; 03-07 at 128 (stage 03's 6x over 02 is a head_dim 64 figure, and
# stages 01-02 at 128 would take a minute of the budget).
for d in 64 128; do
  stages="1 2 3 4 5 6 7"; [ $d = 128 ] && stages="3 4 5 6 7"
  if BUILD="$build" OUT="$out" timeout 200 bash scripts/profile/profile_stages.sh $d "$stages" > "$out/ncu_d$d.txt" 2>&1; then
    echo "profile d$d: $(grep -c . "$out/h100_ncu_d$d.csv") rows in h100_ncu_d$d.csv"
  else
    echo "profile d$d: FAILED"; tail -20 "$out/ncu_d$d.txt"; status=1
  fi
  grep -E "dropped|^stage:kernel|gpu__time_duration|pct_of_peak|inst_executed.sum" "$out/ncu_d$d.txt"
done

sanitize racecheck
exit $status
