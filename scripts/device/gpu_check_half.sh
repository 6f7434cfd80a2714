#!/usr/bin/env bash
# The GPU machine's run for the tensor-core stages (08-10), in one script: build, the full test suite,
# the runner, compute-sanitizer on the stages given (default 10) in both dtypes, Nsight Compute on stages 08-10, the
# stage 10 tile-shape variants, bench/compare.py in bf16 and fp16, and stage 10's benchmark families.
# Everything lands in $OUT/results.tgz (the device tool returns few files), with a summary on stdout.
# Usage: scripts/device/gpu_check_half.sh [stages to sanitize, default "10"]
#        (scripts/device/gpu_check.sh is the fp32 course's full run)
set -uo pipefail
out=${OUT:-gpu-logs}
res="$out/results"
mkdir -p "$res"
export BUILD=build-gpu
status=0

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$res/gpu.txt"
{ cmake -S . -B $BUILD -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90 -DFLASH_TESTS=ON && cmake --build $BUILD -j 16; } \
  > "$res/build.log" 2>&1 || { echo "BUILD FAILED"; tail -40 "$res/build.log"; exit 1; }

timeout 330 ctest --test-dir $BUILD -j 5 --output-on-failure > "$res/h100_ctest.log" 2>&1 || status=1
grep -E "tests passed|tests failed|\(Failed\)|\(Skipped\)" "$res/h100_ctest.log"
# The exercises as shipped: their GPU tests must fail, each with a line that says what is missing.
timeout 120 ctest --test-dir $BUILD -L exercise --output-on-failure > "$res/h100_ctest_exercises.log" 2>&1
grep -E "^exercise [0-9]+:|tests passed|tests failed" "$res/h100_ctest_exercises.log"

$BUILD/bin/flash-stages > "$res/h100_runner.txt" 2>&1 || status=1
$BUILD/bin/flash-stages --json > "$res/h100_runner.json" 2>&1 || status=1
$BUILD/bin/flash-stages --dtype fp16 --stage 10 > "$res/h100_runner_fp16.txt" 2>&1 || status=1

for stage in ${1:-10}; do
  for dtype in bf16 fp16; do
    for tool in memcheck racecheck synccheck; do
      if timeout 60 compute-sanitizer --tool $tool --error-exitcode 9 $BUILD/bin/flash-stages --stage $stage \
           --dtype $dtype --batch 1 --heads 2 --seq 200 --runs 1 --causal >> "$res/sanitizer.log" 2>&1; then
        echo "sanitizer stage $stage $dtype $tool: clean"
      else
        echo "sanitizer stage $stage $dtype $tool: FAILED"; status=1
      fi
    done
  done
done > "$res/h100_sanitizer_half.txt"
echo "sanitizer: $(grep -c clean "$res/h100_sanitizer_half.txt") of $(wc -l < "$res/h100_sanitizer_half.txt") clean"

OUT="$res" timeout 120 bash scripts/profile/profile_tensor_stages.sh 128 > /dev/null 2>&1 || echo "profile d128 failed"
mv "$res/ncu_tensor_d128_raw.csv" "$res/h100_ncu_tensor_d128_raw.csv" 2>/dev/null
timeout 150 $BUILD/bin/stage10-variants > "$res/h100_stage10_variants.txt" 2>&1 || status=1

for dtype in bfloat16 float16; do
  PYTHONPATH=$BUILD/python timeout 90 python3 bench/compare.py --dtype $dtype --budget-ms 40 --out-dir "$res" \
    > "$res/compare_$dtype.log" 2>&1 || status=1
  grep "geometric mean" "$res/compare_$dtype.log"
done

timeout 60 $BUILD/bin/flash-stages-bench --benchmark_filter='stage10_flash2' --benchmark_out="$res/h100_bench_half.json" \
  --benchmark_out_format=json > "$res/bench_half.txt" 2>&1 || status=1

tar czf "$out/results.tgz" -C "$res" .
exit $status
