#!/usr/bin/env bash
# Registers, stack frames and spills of the stages' kernels, as ptxas reports them (`nvcc -Xptxas -v`):
# the compile-time figures of the lessons of stages 03, 07, 11, 12 and 14. No GPU needed. Stages 12 and
# 14 and stage 12's ladder (bench/stage12_ladder/, every configuration the lesson measures) are compiled
# as the build compiles them for Hopper: sm_90a, with their kernels switched on.
# Writes bench/results/ptxas_sm90.txt (the nvcc version, then ptxas's lines without compile times);
# scripts/docs/make_tables.py reads it (value:ptxas/..., table:ptxas-backward).
# Usage: scripts/device/ptxas_report.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-bench/results}/ptxas_sm90.txt
obj=$(mktemp -d)
trap 'rm -rf "$obj"' EXIT
{
  nvcc --version | grep -i "release"
  for src in stages/0[3-7]_*/*.cu stages/11_*/*.cu; do
    echo "== $src"
    nvcc -O3 -std=c++17 -arch=sm_90 -I common -Xptxas -v -c "$src" -o "$obj/stage.o" 2>&1 |
      grep -v "Compile time"
  done
  echo "== stages/12_hopper/hopper.cu (sm_90a)"
  nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -DFLASH_STAGE12_SM90A=1 -I common -Xptxas -v \
    -c stages/12_hopper/hopper.cu -o "$obj/stage.o" 2>&1 | grep -v "Compile time"
  echo "== stages/14_hopper_backward/hopper_backward.cu (sm_90a)"
  nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -DFLASH_STAGE14_SM90A=1 -I common -Xptxas -v \
    -c stages/14_hopper_backward/hopper_backward.cu -o "$obj/stage.o" 2>&1 | grep -v "Compile time"
  echo "== bench/stage12_ladder/ladder.cu (sm_90a)"
  nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -DFLASH_STAGE12_SM90A=1 -I common -I stages \
    -I bench/stage12_ladder -Xptxas -v -c bench/stage12_ladder/ladder.cu -o "$obj/ladder.o" 2>&1 |
    grep -v "Compile time"
} > "$out"
echo "wrote $out"
