#!/bin/bash
# Stage 14's main kernel in its default and its deterministic mode under the counters of lesson 14's
# profile (scripts/profile/profile_stage14.sh's metrics), bf16, not causal, on cells of the FlashAttention
# grid where the two modes' speeds part: N 16384 at head_dim 128 and 64, and N 4096 at head_dim 128 beside
# them. One call each (scripts/profile/stage14_backward_once.py starts the profiler around it).
#
# Usage (GPU machine, after building the Python package in build): scripts/profile/profile_stage14_modes.sh
# Writes $OUT/h100_ncu_stage14_modes.csv: one row per cell, mode and metric.
set -uo pipefail
out=${OUT:-.}
here=$(dirname "$0")
metrics=$(sed -n '/^metrics=/,/^smsp__cycles_elapsed/p' "$here/profile_stage14.sh" | sed 's/^metrics=//; s/\\$//' |
  tr -d '\n')
csv="$out/h100_ncu_stage14_modes.csv"
echo '"head_dim","seq","mode","metric","unit","value"' > "$csv"
for cell in "128 16384" "64 16384" "128 4096"; do
  set -- $cell
  for deterministic in 0 1; do
    mode=default; [ $deterministic = 1 ] && mode=deterministic
    PYTHONPATH=build/python ncu --clock-control none --profile-from-start off -k regex:backward_kernel \
      --metrics "$metrics" --csv python3 "$here/stage14_backward_once.py" "$1" "$2" 0 $deterministic \
      > "$out/ncu_last.txt" 2>&1 || { echo "ncu failed at d$1 N$2 $mode:"; tail -5 "$out/ncu_last.txt"; }
    # Columns of ncu's CSV: ..., "Metric Name", "Metric Unit", "Metric Value" (the last three).
    grep '^"' "$out/ncu_last.txt" | grep -v '"Metric Name"' | awk -v key="\"$1\",\"$2\",\"$mode\"" -F'","' \
      '{k = NF; gsub(/"$/, "", $k); print key ",\"" $(k - 2) "\",\"" $(k - 1) "\",\"" $k "\""}' >> "$csv"
  done
done
rm -f "$out/ncu_last.txt"
grep -E 'gpu__time_duration|lts__d_atomic|barrier|lts__throughput' "$csv"
