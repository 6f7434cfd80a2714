#!/bin/bash
# The profiler figures of lesson 14: Nsight Compute on one launch of stage 14's main kernel and of
# stage 11's K/V-tile kernel, bf16, batch 4, 16 heads x head_dim 128 (or 32 x 64), seq 4096, not causal,
# the FlashAttention benchmark's shape: the metrics of scripts/profile/profile_tensor_stages.sh.
#
# Usage (GPU machine, after a build in build): scripts/profile/profile_stage14.sh [build]
# Writes $OUT/h100_ncu_stage14.csv: one row per kernel and metric.
set -uo pipefail
build=${1:-build}
out=${OUT:-.}
metrics=gpu__time_duration.sum,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active,\
sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,\
sm__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed,\
lts__t_sector_hit_rate.pct,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,\
smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,\
smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,\
smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,\
smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,\
l1tex__data_pipe_lsu_wavefronts_mem_shared.sum.pct_of_peak_sustained_elapsed,\
lts__throughput.avg.pct_of_peak_sustained_elapsed,lts__d_atomic_input_cycles_active.avg.pct_of_peak_sustained_elapsed,\
smsp__cycles_elapsed.avg.per_second,launch__grid_size,launch__shared_mem_per_block_dynamic
csv="$out/h100_ncu_stage14.csv"
echo '"stage","head_dim","metric","unit","value"' > "$csv"
for head_dim in 128 64; do
  for stage in 14 11; do
    if [ $stage = 14 ]; then kernel="regex:backward_kernel"; name=stage14_hopper_backward
    else kernel="regex:dk_dv_kernel"; name=stage11_backward_tc; fi
    ncu --clock-control none -k "$kernel" -c 1 --metrics "$metrics" --csv "$build/bin/flash-stages-bench" \
      --benchmark_filter="^$name/bf16/d$head_dim/causal0/backward/seq:4096/" > "$out/ncu_last.txt" 2>&1 ||
      { echo "ncu failed on stage $stage, head_dim $head_dim:"; tail -5 "$out/ncu_last.txt"; }
    # Columns of ncu's CSV: ..., "Metric Name", "Metric Unit", "Metric Value" (the last three).
    grep '^"' "$out/ncu_last.txt" | grep -v '"Metric Name"' |
      awk -v s=$stage -v d=$head_dim -F'","' '{n=NF; gsub(/"$/, "", $n); print "\"" s "\",\"" d "\",\"" $(n-2) "\",\"" $(n-1) "\",\"" $n "\""}' >> "$csv"
  done
done
rm -f "$out/ncu_last.txt"
cat "$csv"
