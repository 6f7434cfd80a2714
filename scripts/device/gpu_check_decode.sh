#!/usr/bin/env bash
# The GPU machine's run for stage 13 (decoding), in one script of about five minutes: stage 13's tests
# (ctest -L stage13: its CPU checks and its GPU sweep, paged cache included) and its Python tests, the
# runner on a target decode shape, compute-sanitizer (memcheck, racecheck, synccheck) on a small
# decode problem contiguous (through the runner, with splits and the merge) and paged (through one test
# case), the decode benchmark family and bench/compare.py --decode.
#
# Run from the repository root with the build in build-gpu (BUILD=... to change it) configured with
# -DFLASH_TESTS=ON; the build is brought up to date first. Everything lands in $OUT/results (default
# gpu-logs/results) and in $OUT/results.tgz, with a summary on stdout. The files the docs read, to be
# committed under bench/results/:
#   h100_bench_decode.json    the benchmark's decode family   (table:decode-bench)
#   compare_h100_decode.md    compare.py --decode's table     (table:decode-compare)
#   compare_h100_decode.json  its data; compare_h100_decode.png its plot (README)
#   h100_stage13_splits.txt   stage13-splits: forced split counts (kBlockOverheadSteps's fit)
# Usage: OUT=... scripts/device/gpu_check_decode.sh
set -uo pipefail
out=${OUT:-gpu-logs}
res="$out/results"
mkdir -p "$res"
build=${BUILD:-build-gpu}
status=0
say() { echo "$*" | tee -a "$res/summary.txt"; }

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$res/gpu.txt" 2>&1
cmake --build $build -j 16 > "$res/build_decode.log" 2>&1 || { say "BUILD FAILED"; tail -40 "$res/build_decode.log"; exit 1; }
grep -E "warning" "$res/build_decode.log" | head -20

# 1. Stage 13's tests: CPU validation and the GPU sweep (ctest entries labelled stage13).
SECONDS=0
timeout 240 ctest --test-dir $build -L stage13 --output-on-failure > "$res/h100_ctest_decode.log" 2>&1 || status=1
say "ctest -L stage13 ($SECONDS s): $(grep -E 'tests passed|tests failed' "$res/h100_ctest_decode.log")"
grep -E "\[  FAILED  \]" "$res/h100_ctest_decode.log" | head -20
SECONDS=0
PYTHONDONTWRITEBYTECODE=1 PYTHONPATH=$build/python timeout 150 python3 -m pytest -q -p no:cacheprovider -rs --rootdir=tests/python \
  tests/python/test_decoding.py tests/python/test_package.py > "$res/h100_pytest_decode.log" 2>&1 || status=1
say "pytest test_decoding.py test_package.py ($SECONDS s): $(tail -1 "$res/h100_pytest_decode.log")"

# 2. The runner on the middle target shape (checked against stage 10 and the fp64 reference, timed).
timeout 60 $build/bin/flash-stages --stage 13 --batch 8 --heads 32 --heads-kv 8 --seq-q 1 --seq-kv 32768 \
  --head-dim 128 > "$res/h100_runner_decode.txt" 2>&1 || status=1
tail -2 "$res/h100_runner_decode.txt"

# 3. compute-sanitizer. Contiguous: 3000 keys give this problem 12 splits on an H100, so the split
#    kernel, its partials and the merge all run; causal, 3 query rows. Paged: one test case (pages of
#    16 keys, NaN in the slots no sequence owns, an empty sequence).
paged_case='Paged/PagedDecode.MatchesContiguousAndReference/stage13_paged_d64_h8kv2_q3_page16_causal_bf16'
for tool in memcheck racecheck synccheck; do
  SECONDS=0
  if timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 $build/bin/flash-stages --stage 13 --batch 2 \
       --heads 8 --heads-kv 2 --seq-q 3 --seq-kv 3000 --head-dim 128 --causal --runs 1 \
       > "$res/sanitizer_last.log" 2>&1; then
    say "sanitizer stage 13 contiguous $tool: clean ($SECONDS s)"
  else
    say "sanitizer stage 13 contiguous $tool: FAILED"; tail -20 "$res/sanitizer_last.log"; status=1
  fi
  cat "$res/sanitizer_last.log" >> "$res/h100_sanitizer_decode.txt"
  SECONDS=0
  if timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 $build/bin/test_stages_gpu \
       --gtest_filter="$paged_case" > "$res/sanitizer_last.log" 2>&1 && grep -q "PASSED" "$res/sanitizer_last.log"; then
    say "sanitizer stage 13 paged $tool: clean ($SECONDS s)"
  else
    say "sanitizer stage 13 paged $tool: FAILED"; tail -20 "$res/sanitizer_last.log"; status=1
  fi
  cat "$res/sanitizer_last.log" >> "$res/h100_sanitizer_decode.txt"
done
rm -f "$res/sanitizer_last.log"

# 4. The decode benchmark family: GB/s over the K and V bytes, L2 flushed before every call.
SECONDS=0
timeout 120 $build/bin/flash-stages-bench --benchmark_filter='decode' --benchmark_out="$res/h100_bench_decode.json" \
  --benchmark_out_format=json > "$res/bench_decode.txt" 2>&1 || status=1
say "bench decode ($SECONDS s):"
grep -E "^stage13" "$res/bench_decode.txt" | awk '{print "  " $0}' | tee -a "$res/summary.txt"

# 4b. The split plan against the clock: forced split counts at lesson 13's shapes.
SECONDS=0
timeout 150 $build/bin/stage13-splits > "$res/h100_stage13_splits.txt" 2>&1 || status=1
say "stage13-splits ($SECONDS s): $(grep -c 'choose_splits$' "$res/h100_stage13_splits.txt") shapes"

# 5. Against PyTorch SDPA's flash backend on the same calls.
SECONDS=0
PYTHONPATH=$build/python timeout 180 python3 bench/compare.py --decode --out-dir "$res" \
  > "$res/compare_decode.log" 2>&1 || status=1
say "compare.py --decode ($SECONDS s):"
sed -n '/^| B |/,/^$/p' "$res/compare_h100_decode.md" 2>/dev/null | tee -a "$res/summary.txt"

tar czf "$out/results.tgz" -C "$res" .
say "status $status"
exit $status
