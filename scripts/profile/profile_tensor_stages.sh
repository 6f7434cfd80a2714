#!/usr/bin/env bash
# The profiler figures of lessons 08-12: Nsight Compute on one launch of each tensor-core kernel,
# bf16, non-causal, batch 4, heads 16, seq 4096 (the runner's problem at that size). Stage 11 is a
# backward: its main kernel (dk_dv_kernel) is profiled in the benchmark's backward of the same problem
# at head_dim 128 (at head_dim 64 the benchmark's grid has 32 heads: the same B·N and H·d).
# Usage (GPU machine, after a build in build-gpu): scripts/profile/profile_tensor_stages.sh [head_dim]
# Writes $OUT/ncu_tensor_d<head_dim>.csv (one row per metric, one column per stage) and the raw CSV.
set -uo pipefail
build=${BUILD:-build-gpu}
head_dim=${1:-128}
out=${OUT:-gpu-logs}
mkdir -p "$out"

# Shared-memory traffic and conflicts (ldmatrix counts as a shared load, cp.async as ldgsts), the
# tensor pipe, and the stall reasons the lessons discuss, per issued instruction.
metrics=gpu__time_duration.sum,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active,\
sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,\
l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,\
l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,\
smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,\
smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,\
smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,\
smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio,\
smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,\
smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,\
smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio,\
smsp__average_warps_issue_stalled_selected_per_issue_active.ratio

raw="$out/ncu_tensor_d${head_dim}_raw.csv"
: > "$raw"
for stage in 8 9 10 11 12; do
  if [ $stage = 11 ]; then
    target=(-k "regex:dk_dv_kernel" -c 1 "$build/bin/flash-stages-bench"
            --benchmark_filter="^stage11_backward_tc/bf16/d${head_dim}/causal0/backward/seq:4096/")
  else
    target=(--kernel-name-base demangled -k "regex:stage$(printf %02d $stage)::" -c 1
            "$build/bin/flash-stages" --stage $stage --dtype bf16 --batch 4 --heads 16 --seq 4096
            --head-dim "$head_dim" --runs 1)
  fi
  ncu --clock-control none --metrics "$metrics" --csv "${target[@]}" > "$out/ncu_last.txt" 2>&1 ||
    { echo "ncu failed on stage $stage:"; tail -5 "$out/ncu_last.txt"; }
  grep '^"' "$out/ncu_last.txt" | sed "s/^/\"$stage\",/" >> "$raw"
done
rm -f "$out/ncu_last.txt"

python3 - "$raw" > "$out/ncu_tensor_d${head_dim}.txt" <<'PY'
import csv, sys
rows = {}
for r in csv.reader(open(sys.argv[1])):
    if len(r) < 4 or r[1] == "ID":
        continue
    stage, name, unit, value = r[0], r[-3], r[-2], r[-1]
    rows.setdefault(stage, {})[f"{name} ({unit})" if unit else name] = value
names = sorted({n for v in rows.values() for n in v})
print(f"{'metric':90s} " + " ".join(f"{'stage ' + s:>16s}" for s in sorted(rows, key=int)))
for n in names:
    print(f"{n:90s} " + " ".join(f"{rows[s].get(n, '-'):>16s}" for s in sorted(rows, key=int)))
PY
cat "$out/ncu_tensor_d${head_dim}.txt"
