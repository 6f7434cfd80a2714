#!/usr/bin/env bash
# Two versions of stage 14 in one run on one GPU: the library built with the stage's files from folder A,
# then rebuilt with those from folder B, each build's Python package kept, then
# scripts/device/time_backward.py run with each in turn, ROUNDS times (B, A, B, A, ...). Each process
# times cuDNN's backward too, so each round gives both versions' speed over cuDNN's beside their TFLOP/s.
# A and B hold the files of stages/14_hopper_backward/ (e.g. `git archive C stages/14_hopper_backward`
# unpacked, for a commit C). The stage's own GPU tests run on A's build. Logs in $OUT.
# Usage: OUT=dir scripts/device/stage14_ab.sh A B [ROUNDS] [DTYPE] [SEQS]
# SEQS: time_backward.py's sequence lengths, comma-separated (its default when left out).
set -uo pipefail
a=$(realpath "$1") b=$(realpath "$2") rounds=${3:-3} dtype=${4:-bfloat16} seqs=${5:-1024,4096,16384}
out=${OUT:-gpu-logs}
mkdir -p "$out"
stage=stages/14_hopper_backward
work=$(mktemp -d)
mkdir "$work/stage" && cp $stage/* "$work/stage/"  # the working tree's stage, put back at the end (build/ is then A's)
trap 'cp "$work"/stage/* $stage/; rm -rf "$work"' EXIT
stamp() { echo "[$(date +%T)] $*"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cmake -S . -B build -DFLASH_TESTS=ON -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 > "$out/configure.log" 2>&1
for v in b a; do  # A last: build/ is A's afterwards, its test program and Python package
  src=$a; [ $v = b ] && src=$b
  cp "$src"/* $stage/
  targets=(flash_stages_c); [ $v = a ] && targets+=(test_stages_gpu)
  cmake --build build -j 16 --target "${targets[@]}" > "$out/build_$v.log" 2>&1 || { stamp "build $v failed"; exit 1; }
  rm -rf "$work/py_$v" && cp -r build/python "$work/py_$v"
  stamp "built $v"
done
build/bin/test_stages_gpu --gtest_filter='*stage14*' > "$out/stage14_tests_a.txt" 2>&1
stamp "stage 14 tests on A: $(grep -E '^\[  (PASSED|FAILED)' "$out/stage14_tests_a.txt" | head -1)"
for r in $(seq 1 "$rounds"); do
  for v in b a; do
    stamp "$v, round $r"
    PYTHONPATH="$work/py_$v" python3 scripts/device/time_backward.py "$dtype" 14 "$seqs" | tee "$out/time_${v}_$r.txt"
  done
done
