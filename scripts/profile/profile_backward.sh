#!/usr/bin/env bash
# The profiler figures of the stage 07 lesson: how the backward's time splits between its three
# kernels (D = rowsum(dO o O), the dK/dV pass, the dQ pass), from Nsight Compute on the first
# backward call of the benchmark (batch 4, 16 heads, seq 4096, not causal), at head_dim 64 and 128.
# Usage (GPU machine, after scripts/device/gpu_check.sh built build-gpu): scripts/profile/profile_backward.sh
set -euo pipefail
build=${BUILD:-build-gpu}
out=${OUT:-gpu-logs}
mkdir -p "$out"
: > "$out/ncu_backward.csv"
for d in 64 128; do
  ncu --clock-control none --metrics gpu__time_duration.sum --csv -k "regex:row_dot_kernel|dk_dv_kernel|dq_kernel" \
    -c 3 $build/bin/flash-stages-bench --benchmark_filter="stage07_backward/d$d/causal0/backward/seq:4096/" \
    --benchmark_min_time=0.01 > "$out/ncu_raw.txt" 2>&1 || { cat "$out/ncu_raw.txt"; exit 1; }
  grep '^"' "$out/ncu_raw.txt" | grep -v '"ID"' | sed "s/^/\"$d\",/" >> "$out/ncu_backward.csv"
done
rm -f "$out/ncu_raw.txt"
cat "$out/ncu_backward.csv" | awk -F'","' '{print $1, $6, $NF}'
