#!/usr/bin/env bash
# The profiler figures of the stage 05 lesson: Nsight Compute on the fused kernels of stages 03-06,
# one launch each, non-causal, batch 4, heads 16, seq 4096, head_dim 64 (the lesson's problem).
# Usage (GPU machine, after scripts/gpu_check.sh built build-gpu): scripts/profile_stages.sh [head_dim]
set -euo pipefail
build=build-gpu
head_dim=${1:-64}
out=${OUT:-gpu-logs}
mkdir -p "$out"

metrics=gpu__time_duration.sum,sm__sass_thread_inst_executed_op_ffma_pred_on.sum,\
sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,smsp__inst_executed_op_shared_ld.sum,\
l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,\
smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,\
smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,\
sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread

declare -A kernel=([3]=online_softmax_attention_kernel [4]=tiled_attention_kernel
                   [5]=warp_shuffle_attention_kernel [6]=causal_attention_kernel)
: > "$out/ncu.csv"
for stage in 3 4 5 6; do
  ncu --clock-control none --metrics "$metrics" --csv -k "regex:${kernel[$stage]}" -c 1 \
    $build/bin/flash-stages --stage $stage --batch 4 --heads 16 --seq 4096 --head-dim "$head_dim" --runs 1 \
    > "$out/ncu_raw.txt" 2>&1 || { cat "$out/ncu_raw.txt"; exit 1; }
  grep '^"' "$out/ncu_raw.txt" | sed "s/^/\"$stage\",/" >> "$out/ncu.csv"
done

# One row per stage, one column per metric.
python3 - "$out/ncu.csv" <<'PY'
import csv, sys
rows = {}
for r in csv.reader(open(sys.argv[1])):
    if r[1] == "ID":
        continue
    stage, name, unit, value = r[0], r[-3], r[-2], r[-1]
    rows.setdefault(stage, {})[f"{name} ({unit})" if unit else name] = value
names = sorted({n for v in rows.values() for n in v})
for n in names:
    print(f"{n:90s} " + " ".join(f"{rows[s].get(n, '-'):>16s}" for s in sorted(rows)))
print(f"{'stage':90s} " + " ".join(f"{s:>16s}" for s in sorted(rows)))
PY
rm -f "$out/ncu_raw.txt"
