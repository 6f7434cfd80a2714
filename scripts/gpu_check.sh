#!/usr/bin/env bash
# Everything the GPU machine is asked to do in one call: build for the local GPU, the full test
# suite, the course runner, compute-sanitizer on each stage, the benchmark. Logs go to $OUT (or
# ./gpu-logs). Usage: scripts/gpu_check.sh [benchmark filter regex]
set -uo pipefail
out=${OUT:-gpu-logs}
mkdir -p "$out"
build=build-gpu
status=0

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$out/runner.txt"
{ cmake -S . -B $build -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90 -DFLASH_TESTS=ON && cmake --build $build -j 16; } > "$out/build.log" 2>&1 ||
  { echo "BUILD FAILED"; tail -50 "$out/build.log"; exit 1; }
grep -E "warning|error" "$out/build.log"

ctest --test-dir $build -j 4 --output-on-failure > "$out/ctest.log" 2>&1 || status=1
grep -E "tests passed|tests failed|\(Skipped\)|\(Failed\)" "$out/ctest.log"
sed -n '/^Why they were skipped:/,$p' "$out/ctest.log"  # one reason per skipped test (tests/skip_summary.cpp)

$build/bin/flash-stages | tee -a "$out/runner.txt" || status=1
$build/bin/flash-stages --json > "$out/runner.json" || status=1

# compute-sanitizer on the runner, one stage at a time, on a problem small enough to finish quickly.
for stage in $($build/bin/flash-stages --list | awk '{print $1}'); do
  for tool in memcheck racecheck synccheck; do
    if compute-sanitizer --tool $tool --error-exitcode 9 $build/bin/flash-stages --stage "$stage" --batch 1 --heads 2 \
         --seq 200 --runs 1 > "$out/sanitizer_last.log" 2>&1; then
      echo "sanitizer stage $stage $tool: clean"
    else
      echo "sanitizer stage $stage $tool: FAILED"; tail -20 "$out/sanitizer_last.log"; status=1
    fi
    cat "$out/sanitizer_last.log" >> "$out/sanitizer.log"
  done
done
# The backward (stages that have one), through two small cases of the test sweep.
backward_cases='*BackwardSweep*_d64_b2h8kv2_q129_k129:*BackwardSweep*_d128_b2h3kv3_q17_k100_causal'
for tool in memcheck racecheck synccheck; do
  if compute-sanitizer --tool $tool --error-exitcode 9 $build/bin/test_stages_gpu --gtest_filter="$backward_cases" \
       > "$out/sanitizer_last.log" 2>&1 && grep -q "PASSED" "$out/sanitizer_last.log"; then
    echo "sanitizer backward $tool: clean ($(grep -o '[0-9]* tests\? from [0-9]* test suites\? ran' "$out/sanitizer_last.log"))"
  else
    echo "sanitizer backward $tool: FAILED"; tail -20 "$out/sanitizer_last.log"; status=1
  fi
  cat "$out/sanitizer_last.log" >> "$out/sanitizer.log"
done
rm -f "$out/sanitizer_last.log"

if [ -x $build/bin/flash-stages-bench ]; then
  $build/bin/flash-stages-bench --benchmark_filter="${1:-.}" --benchmark_out="$out/bench.json" \
    --benchmark_out_format=json > "$out/bench.txt" 2>&1 || status=1
  tail -60 "$out/bench.txt"
fi
exit $status
