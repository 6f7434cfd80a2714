#!/usr/bin/env bash
# The GPU machine's run for stage 12 (Hopper), in phases, so that each fits one device call and a
# hang (a barrier protocol that deadlocks shows up as one) costs a timeout rather than the whole run:
#   smoke     build, then the stage on the smallest shapes of both kernels, then every rung of the
#             ladder (bench/stage12_ladder/) on the small shapes at head_dim 128 in bf16
#   tests     the stage on the shapes that reach its paths (tests/test_hopper_gpu.cpp), the ladder's
#             check (stage12-variants --check: the last rung bit for bit against the stage, every
#             rung against the reference), then ctest -L stage12 (the registered stage over the
#             whole sweep, the CPU checks, the layout model)
#   sanitize  compute-sanitizer memcheck, racecheck, synccheck, initcheck on the stage's paths and on
#             every rung's small shapes, both dtypes (small problems: the tools are 10-100x slower)
#   perf      stage12-variants (each piece switched on), stage 12's benchmark family, compare.py
#             against SDPA (flash, cuDNN) in bf16 and fp16
#   all       the four in order
# Logs land in $OUT/results (and $OUT/results.tgz); a summary goes to stdout.
# Usage: scripts/device/gpu_check_hopper.sh [smoke|tests|sanitize|perf|all]   (default smoke)
set -uo pipefail
phase=${1:-smoke}
out=${OUT:-gpu-logs}
res="$out/results"
mkdir -p "$res"
BUILD=${BUILD:-build-hopper}
status=0
tests=$BUILD/bin/test_stages_gpu
ladder=$BUILD/bin/stage12-variants

build() {
  nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.sm,clocks.max.sm --format=csv > "$res/gpu.txt" 2>&1
  cat "$res/gpu.txt"
  # sm_90 for the project, sm_90a for stage 12 (CMakeLists.txt): 90 in the list turns stage 12 on.
  { cmake -S . -B $BUILD -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90 -DFLASH_TESTS=ON &&
    cmake --build $BUILD -j 16 --target test_stages_gpu test_validation flash-stages stage12-variants \
      flash-stages-bench flash_stages_c; } > "$res/build.log" 2>&1 || { echo "BUILD FAILED"; tail -40 "$res/build.log"; exit 1; }
  grep -E "stage 12 \(Hopper\)" "$res/build.log"
}

# One gtest run under a time limit; a timeout is reported as such (a hang, likely a barrier).
run() {  # name, seconds, gtest filter
  local name=$1 seconds=$2 filter=$3
  timeout "$seconds" $tests --gtest_filter="$filter" > "$res/$name.log" 2>&1
  local rc=$?
  if [ $rc -eq 124 ]; then echo "$name: TIMED OUT after $seconds s (a hang?)"; status=1
  else echo "$name: $(grep -E '^\[  (PASSED|FAILED)  \]|tests? ran' "$res/$name.log" | tr '\n' ' ')"; [ $rc -eq 0 ] || status=1; fi
}

# One stage12-variants --check under a time limit, as run() does for gtest.
check_ladder() {  # name, seconds, options
  local name=$1 seconds=$2
  shift 2
  timeout "$seconds" $ladder --check "$@" > "$res/$name.log" 2>&1
  local rc=$?
  if [ $rc -eq 124 ]; then echo "$name: TIMED OUT after $seconds s (a hang?)"; status=1
  else echo "$name: $(grep -E 'cases|agree|FAILED|passed' "$res/$name.log" | tr '\n' ' ')"; [ $rc -eq 0 ] || status=1; fi
}

smoke() {
  build
  # The stage on one row and one key (both kernels: head_dim 64 not causal is the in-order kernel),
  # then on one full tile, bf16 and fp16.
  run smoke_tiny 60 'Paths/Stage12Hopper.*stage12_d*_b1h1kv1_q1_k1_*'
  run smoke_tile 60 'Paths/Stage12Hopper.*stage12_d*_b1h2kv2_q64_k128_*'
  # Every rung of the ladder on the small shapes (GQA, causal rows that see no key, a half-empty
  # second consumer among them).
  check_ladder smoke_ladder 300 --small --dtype bf16 --head-dim 128
}

tests_phase() {
  run paths 300 'Paths/Stage12Hopper.*'
  check_ladder ladder 600
  timeout 420 ctest --test-dir $BUILD -L stage12 --output-on-failure > "$res/ctest_stage12.log" 2>&1 || status=1
  grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)" "$res/ctest_stage12.log"
}

sanitize() {
  # The stage on an odd shape of each kernel (GQA, causal rows that see no key, a half-empty second
  # consumer), on one that takes the 160-key tiles (head_dim 64, seq_kv >= 4096 causal) and on one whose
  # causal pairs are followed by single tiles (160 heads, more than half the SMs).
  cases="d128_b2h8kv2_q129_k63_causal d64_b2h8kv2_q129_k63 d64_b1h2kv1_q257_k4133_causal
         d128_b4h40kv8_q300_k257_causal d64_b4h40kv8_q300_k257"
  for shape in $cases; do
    for dtype in bf16 fp16; do
      for tool in memcheck racecheck synccheck initcheck; do
        if timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 $tests \
             --gtest_filter="Paths/Stage12Hopper.*stage12_${shape}_${dtype}_*" \
             >> "$res/sanitizer.log" 2>&1; then
          echo "sanitizer stage 12 $shape $dtype $tool: clean"
        else
          echo "sanitizer stage 12 $shape $dtype $tool: FAILED (exit $?)"; status=1
        fi
      done
    done
  done | tee "$res/h100_sanitizer_stage12.txt"
  # Every rung of the ladder but the last (which is the stage's own kernels) on the small shapes at
  # head_dim 128 (stage 10's reference runs under the tool too).
  for v in $(seq 1 14); do
    for dtype in bf16 fp16; do
      for tool in memcheck racecheck synccheck initcheck; do
        if timeout 240 compute-sanitizer --tool $tool --error-exitcode 9 $ladder --check --rung $v --small \
             --dtype $dtype --head-dim 128 >> "$res/sanitizer.log" 2>&1; then
          echo "sanitizer rung $v $dtype $tool: clean"
        else
          echo "sanitizer rung $v $dtype $tool: FAILED (exit $?)"; status=1
        fi
      done
    done
  done | tee -a "$res/h100_sanitizer_stage12.txt"
  # The registered stage through the runner, as gpu_check_half.sh does for stage 10.
  for tool in memcheck racecheck synccheck; do
    timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 $BUILD/bin/flash-stages --stage 12 --batch 1 \
      --heads 2 --seq 200 --runs 1 --causal >> "$res/sanitizer.log" 2>&1 && echo "runner stage 12 $tool: clean" ||
      { echo "runner stage 12 $tool: FAILED"; status=1; }
  done | tee -a "$res/h100_sanitizer_stage12.txt"
}

perf() {
  $BUILD/bin/flash-stages --stage 12 > "$res/h100_runner_stage12.txt" 2>&1 || status=1
  tail -3 "$res/h100_runner_stage12.txt"
  timeout 240 $BUILD/bin/stage12-variants > "$res/h100_stage12_variants.txt" 2>&1 || status=1
  grep -E "N=16384" "$res/h100_stage12_variants.txt" | grep -E "bf16 d128 causal=0"
  timeout 120 $BUILD/bin/flash-stages-bench --benchmark_filter='stage12_hopper' \
    --benchmark_out="$res/h100_bench_stage12.json" --benchmark_out_format=json > "$res/bench_stage12.txt" 2>&1 || status=1
  for dtype in bfloat16 float16; do
    PYTHONPATH=$BUILD/python timeout 150 python3 bench/compare.py --dtype $dtype --budget-ms 40 --out-dir "$res" \
      > "$res/compare_$dtype.log" 2>&1 || status=1
    grep "geometric mean" "$res/compare_$dtype.log"
  done
}

case $phase in
  smoke) smoke ;;
  tests) [ -x $tests ] || build; tests_phase ;;
  sanitize) [ -x $tests ] || build; sanitize ;;
  perf) [ -x $tests ] || build; perf ;;
  all) smoke; tests_phase; sanitize; perf ;;
  *) echo "usage: $0 [smoke|tests|sanitize|perf|all]"; exit 3 ;;
esac
tar czf "$out/results.tgz" -C "$res" .
exit $status
