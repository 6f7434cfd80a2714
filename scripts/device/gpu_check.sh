#!/usr/bin/env bash
# Everything the GPU machine is asked to do, in one script: build for the local GPU, the full test
# suite (with the sweep under a T4's, an RTX 30/40 card's and the default shared memory per block),
# the course runner, compute-sanitizer on each stage and on the smaller tiles of stages 04-07, the
# exercises (failing as shipped, passing when solved), the benchmark. Logs go to $OUT (or
# ./gpu-logs). Usage: scripts/device/gpu_check.sh [benchmark filter regex]
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
# The tiles a T4 runs (64 KiB of shared memory per block), at head_dim 128 where stages 05-07 change them.
$build/bin/flash-stages --smem-limit 64 --head-dim 128 | tee "$out/runner_smem64.txt" || status=1

# compute-sanitizer on the runner, one stage at a time, on a problem small enough to finish quickly; a
# decoding stage (stage 13, at most 16 query rows) on a decode problem with several splits.
for stage in $($build/bin/flash-stages --list | awk '{print $1}'); do
  shape="--batch 1 --heads 2 --seq 200"
  if $build/bin/flash-stages --list | grep -qE "^$stage +decoding"; then
    shape="--batch 1 --heads 4 --heads-kv 2 --seq-q 3 --seq-kv 3000"
  fi
  for tool in memcheck racecheck synccheck; do
    if compute-sanitizer --tool $tool --error-exitcode 9 $build/bin/flash-stages --stage "$stage" $shape \
         --runs 1 > "$out/sanitizer_last.log" 2>&1; then
      echo "sanitizer stage $stage $tool: clean"
    else
      echo "sanitizer stage $stage $tool: FAILED"; tail -20 "$out/sanitizer_last.log"; status=1
    fi
    cat "$out/sanitizer_last.log" >> "$out/sanitizer.log"
  done
done
# The backward (stages that have one), through two small cases of the test sweep.
backward_cases='*BackwardSweep*/stage*_d64_b2h8kv2_q129_k129:*BackwardSweep*/stage*_d128_b2h3kv3_q17_k100_causal'
for tool in memcheck racecheck synccheck; do
  if compute-sanitizer --tool $tool --error-exitcode 9 $build/bin/test_stages_gpu --gtest_filter="$backward_cases" \
       > "$out/sanitizer_last.log" 2>&1 && grep -q "PASSED" "$out/sanitizer_last.log"; then
    echo "sanitizer backward $tool: clean ($(grep -o '[0-9]* tests\? from [0-9]* test suites\? ran' "$out/sanitizer_last.log"))"
  else
    echo "sanitizer backward $tool: FAILED"; tail -20 "$out/sanitizer_last.log"; status=1
  fi
  cat "$out/sanitizer_last.log" >> "$out/sanitizer.log"
done
# The smaller tiles of stages 04-07 (flash-stages --smem-limit; the tests' SharedMemoryLimits cases):
# 64 KiB (a T4) and 48 KiB (any GPU) at head_dim 128, where every one of those stages changes its tiles.
for limit in 64 48; do
  for stage in 4 5 6 7; do
    causal=; [ $stage -ge 6 ] && causal=--causal
    for tool in memcheck racecheck; do
      if compute-sanitizer --tool $tool --error-exitcode 9 $build/bin/flash-stages --stage $stage $causal \
           --smem-limit $limit --head-dim 128 --batch 1 --heads 2 --seq 200 --runs 1 > "$out/sanitizer_last.log" 2>&1; then
        echo "sanitizer stage $stage at $limit KiB $tool: clean"
      else
        echo "sanitizer stage $stage at $limit KiB $tool: FAILED"; tail -20 "$out/sanitizer_last.log"; status=1
      fi
      cat "$out/sanitizer_last.log" >> "$out/sanitizer.log"
    done
  done
done
limited_backward='*SharedMemoryLimits/BackwardSweep*/stage07_d64_b2h8kv2_q129_k129_smem64k'
limited_backward+=':*SharedMemoryLimits/BackwardSweep*/stage07_d128_b2h3kv3_q17_k100_causal_smem48k'
for tool in memcheck racecheck; do
  if compute-sanitizer --tool $tool --error-exitcode 9 $build/bin/test_stages_gpu --gtest_filter="$limited_backward" \
       > "$out/sanitizer_last.log" 2>&1 && grep -q "PASSED.* 2 tests" "$out/sanitizer_last.log"; then
    echo "sanitizer backward, smaller tiles, $tool: clean"
  else
    echo "sanitizer backward, smaller tiles, $tool: FAILED"; tail -20 "$out/sanitizer_last.log"; status=1
  fi
  cat "$out/sanitizer_last.log" >> "$out/sanitizer.log"
done
rm -f "$out/sanitizer_last.log"

# The exercises (exercises/README.md). As shipped each one's GPU tests fail, with a last line that
# names it and its file, and memcheck finds nothing: wrong results, no crash, no out-of-bounds access.
# Built from the stages' files (FLASH_EXERCISES_SOLVED, the solutions) the same tests pass.
ctest --test-dir $build -L exercise --output-on-failure > "$out/exercises_shipped.log" 2>&1
shipped_failed=$(grep -cE "gpu_exercise[0-9]+_[a-z_]+ \(Failed\)" "$out/exercises_shipped.log")
other_failed=$(grep -E "^\s+[0-9]+ - .* \((Failed|Not Run|Timeout)\)" "$out/exercises_shipped.log" | grep -vc "gpu_exercise")
grep -E "^exercise [0-9]+: " "$out/exercises_shipped.log"
if [ "$shipped_failed" -eq 7 ] && [ "$other_failed" -eq 0 ]; then
  echo "exercises as shipped: the 7 GPU tests fail, each with its message; the CPU ones pass"
else
  echo "exercises as shipped: FAILED ($shipped_failed of 7 GPU tests failed, $other_failed other failures)"; status=1
fi
for n in 1 2 3 4 5 6 7; do
  causal=; [ $n -ge 6 ] && causal=--causal
  compute-sanitizer --tool memcheck --error-exitcode 9 $build/bin/flash-stages --exercise $n $causal --batch 1 \
    --heads 2 --seq 200 --runs 1 > "$out/sanitizer_last.log" 2>&1
  rc=$?  # 1: the exercise's results are wrong, as shipped; 9: memcheck found an error
  if [ $rc -le 1 ] && grep -q "ERROR SUMMARY: 0 errors" "$out/sanitizer_last.log"; then
    echo "sanitizer exercise $n memcheck: clean (runner exit $rc)"
  else
    echo "sanitizer exercise $n memcheck: FAILED (exit $rc)"; tail -20 "$out/sanitizer_last.log"; status=1
  fi
  cat "$out/sanitizer_last.log" >> "$out/sanitizer.log"
done
compute-sanitizer --tool memcheck --error-exitcode 9 $build/bin/test_stages_gpu \
  --gtest_filter='*BackwardSweep*/exercise07_d64_b2h8kv2_q129_k129' > "$out/sanitizer_last.log" 2>&1
rc=$?
if [ $rc -le 1 ] && grep -q "ERROR SUMMARY: 0 errors" "$out/sanitizer_last.log"; then
  echo "sanitizer exercise 7 backward memcheck: clean (test exit $rc)"
else
  echo "sanitizer exercise 7 backward memcheck: FAILED (exit $rc)"; tail -20 "$out/sanitizer_last.log"; status=1
fi
cat "$out/sanitizer_last.log" >> "$out/sanitizer.log"
rm -f "$out/sanitizer_last.log"
solved=$build-solved
{ cmake -S . -B $solved -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90 -DFLASH_TESTS=ON -DFLASH_EXERCISES_SOLVED=ON &&
  cmake --build $solved -j 16 --target test_stages_gpu test_validation skip_summary; } > "$out/build_solved.log" 2>&1 ||
  { echo "exercises solved: BUILD FAILED"; tail -30 "$out/build_solved.log"; status=1; }
if ctest --test-dir $solved -L 'exercise[0-9]' --output-on-failure > "$out/exercises_solved.log" 2>&1; then
  echo "exercises solved: every exercise test passes"
else
  echo "exercises solved: FAILED"; grep -E "\(Failed\)|^exercise [0-9]+: " "$out/exercises_solved.log"; status=1
fi
grep -E "tests passed|^exercise [0-9]+: " "$out/exercises_solved.log"

if [ -x $build/bin/flash-stages-bench ]; then
  $build/bin/flash-stages-bench --benchmark_filter="${1:-.}" --benchmark_out="$out/bench.json" \
    --benchmark_out_format=json > "$out/bench.txt" 2>&1 || status=1
  tail -60 "$out/bench.txt"
fi
exit $status
