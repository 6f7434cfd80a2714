#!/usr/bin/env bash
# The GPU machine's run for stage 11 (the tensor-core backward), in steps that each fit one device
# command (10 minutes). Everything lands in $OUT (default gpu-logs), with a summary on stdout.
# Usage: scripts/device/gpu_check_backward.sh STEP
#   build      configure and build build-gpu for sm_90; ptxas's registers and spills of stage 11's kernels
#   test       ctest -R stage11 (CPU validation and the GPU sweep in bf16 and fp16, both modes)
#   sanitize   compute-sanitizer (memcheck, racecheck, synccheck) on stage 11's backward, both modes,
#              bf16 and fp16, GQA, causal, odd lengths, the 64-row step under 99 KiB, dQ by red.global.add
#              under 163 KiB (test_stages_gpu cases)
#   python     the Python tests of the half backward and the bf16 training run (curves in $OUT)
#   bench      stage 11's benchmark families (half dtypes, default and deterministic) and
#              bench/compare.py --dtype bfloat16 and float16 (forward and backward)
set -uo pipefail
out=${OUT:-gpu-logs}
mkdir -p "$out"
build=build-gpu
status=0

case "${1:-}" in
  build)
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$out/gpu.txt" 2>&1
    { cmake -S . -B $build -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90 -DFLASH_TESTS=ON && cmake --build $build -j 16; } \
      > "$out/build.log" 2>&1 || { echo "BUILD FAILED"; tail -40 "$out/build.log"; exit 1; }
    grep -E "warning|error" "$out/build.log"
    nvcc -O3 -std=c++17 -arch=sm_90 -I common -Xptxas -v -c stages/11_backward_tc/backward_tc.cu \
      -o /tmp/backward_tc.o 2>&1 | grep -v "Compile time" > "$out/ptxas_stage11_sm90.txt"
    grep "bytes spill" "$out/ptxas_stage11_sm90.txt" | grep -v " 0 bytes spill stores" | sed 's/^/spills: /'
    echo "build: done"
    ;;
  test)
    timeout 580 ctest --test-dir $build -R "stage11|stage07|stage10" -j 3 --output-on-failure \
      > "$out/h100_ctest_stage11.log" 2>&1 || status=1
    grep -E "tests passed|tests failed|\(Failed\)|\(Skipped\)|Passed|Failed" "$out/h100_ctest_stage11.log"
    ;;
  sanitize)
    cases='*BackwardSweep*/stage11_d64_b2h8kv2_q129_k129_bf16:*BackwardSweep*/stage11_d128_b2h3kv3_q17_k100_causal_fp16'
    cases="$cases:*BackwardSweep*/stage11_d32_b4h8kv1_q65_k65_causal_bf16:*BackwardSweep*/stage11_d128_b1h1kv1_q129_k1_causal_bf16"
    cases="$cases:*BackwardSweep*/stage11_d64_b2h3kv3_q100_k17_causal_fp16_smem99k"  # the 64-row step at head_dim 64
    # dQ by red.global.add rather than the bulk copy (no room for the staging under an A100's 163 KiB)
    cases="$cases:*Stage11RedAdd*/stage11_d128_b2h3kv3_q17_k100_causal_bf16_smem163k"
    for tool in memcheck racecheck synccheck; do
      if timeout 180 compute-sanitizer --tool $tool --error-exitcode 9 $build/bin/test_stages_gpu \
           --gtest_filter="$cases" > "$out/sanitizer_last.log" 2>&1 && grep -q "PASSED" "$out/sanitizer_last.log"; then
        echo "sanitizer stage 11 backward $tool: clean ($(grep -o '[0-9]* tests\? from' "$out/sanitizer_last.log" | head -1))"
      else
        echo "sanitizer stage 11 backward $tool: FAILED"; tail -20 "$out/sanitizer_last.log"; status=1
      fi
      cat "$out/sanitizer_last.log" >> "$out/h100_sanitizer_stage11.txt"
    done
    rm -f "$out/sanitizer_last.log"
    ;;
  python)
    FLASH_TRAINING_OUT="$out" PYTHONPATH=$build/python timeout 580 python3 -m pytest -p no:cacheprovider -rs \
      tests/python/test_backward_half.py tests/python/test_training.py tests/python/test_backward.py \
      tests/python/test_package.py -s > "$out/h100_pytest_stage11.log" 2>&1 || status=1
    tail -3 "$out/h100_pytest_stage11.log"
    grep -E "bf16: loss|largest difference" "$out/h100_pytest_stage11.log"
    ;;
  bench)
    timeout 240 $build/bin/flash-stages-bench --benchmark_filter='stage11_backward_tc/.*/backward' \
      --benchmark_out="$out/h100_bench_stage11.json" --benchmark_out_format=json > "$out/bench_stage11.txt" 2>&1 ||
      status=1
    for dtype in bfloat16 float16; do
      PYTHONPATH=$build/python timeout 170 python3 bench/compare.py --dtype $dtype --budget-ms 40 --out-dir "$out" \
        > "$out/compare_$dtype.log" 2>&1 || status=1
      grep "geometric mean" "$out/compare_$dtype.log"
    done
    ;;
  *)
    sed -n '2,12p' "$0"
    exit 2
    ;;
esac
exit $status
