#!/usr/bin/env bash
# The profiler figures of the fp32 lessons: Nsight Compute on one forward of each stage 01-06 and one
# backward of stage 07, non-causal, batch 4, heads 16, seq 4096 (the course problem).
#   stages 01, 02   the three kernels of one forward (scores, softmax, P V)
#   stages 03-06    the one fused kernel
#   stage 07        the three kernels of one backward (D = rowsum(dO o O), dK/dV, dQ); its forward is
#                   stage 06's kernel
# Usage (GPU machine, after a build in build-gpu): scripts/profile/profile_stages.sh [head_dim] [stages]
#   head_dim 64 (default) or 128; stages default "1 2 3 4 5 6 7"; BUILD (default build-gpu) and
#   OUT (default gpu-logs) from the environment.
# Writes $OUT/h100_ncu_d<head_dim>.csv, one row per stage, kernel and metric: the stage's number,
# then Nsight Compute's own CSV columns (scripts/docs/make_tables.py reads it from bench/results/).
set -euo pipefail
build=${BUILD:-build-gpu}
head_dim=${1:-64}
stages=${2:-1 2 3 4 5 6 7}
out=${OUT:-gpu-logs}
mkdir -p "$out"

# What the lessons read (scripts/docs/make_tables.py, NCU_ROWS): time, FFMAs, the FMA pipe, shared-memory
# loads, wavefronts and bank conflicts, barrier and short-scoreboard stalls, registers, occupancy;
# for "what binds" (lesson 05): the shared-memory data pipe's throughput, the LSU pipe, the share of
# scheduler cycles with no eligible warp, all warp instructions (against the FFMAs); for stages 01-02
# (theory 01): DRAM throughput and bytes.
metrics=(
  gpu__time_duration.sum
  sm__sass_thread_inst_executed_op_ffma_pred_on.sum
  sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active
  smsp__inst_executed_op_shared_ld.sum
  l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum
  l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum
  smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio
  smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio
  sm__warps_active.avg.pct_of_peak_sustained_active
  launch__registers_per_thread
  l1tex__data_pipe_lsu_wavefronts_mem_shared.sum.pct_of_peak_sustained_elapsed
  sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active
  smsp__issue_inst0.avg.pct_of_peak_sustained_active
  smsp__issue_active.avg.pct_of_peak_sustained_active
  smsp__inst_executed.sum
  dram__throughput.avg.pct_of_peak_sustained_elapsed
  dram__bytes_read.sum
  dram__bytes_write.sum
)

declare -A kernel=([3]=online_softmax_attention_kernel [4]=tiled_attention_kernel
                   [5]=warp_shuffle_attention_kernel [6]=causal_attention_kernel)
runner=("$build/bin/flash-stages" --batch 4 --heads 16 --seq 4096 --head-dim "$head_dim" --runs 1)

# ncu's arguments and command for one stage: which kernels, how many launches, what to run.
target() {
  case $1 in
    1|2) echo "--kernel-name-base demangled -k regex:stage0$1:: -c 3" ;;
    7) echo "-k regex:row_dot_kernel|dk_dv_kernel|dq_kernel -c 3" ;;
    *) echo "-k regex:${kernel[$1]} -c 1" ;;
  esac
}
command_for() {
  if [ "$1" = 7 ]; then
    echo "$build/bin/flash-stages-bench --benchmark_filter=stage07_backward/d$head_dim/causal0/backward/seq:4096/ --benchmark_min_time=0.01"
  else
    echo "${runner[*]} --stage $1"
  fi
}

profile() {  # profile STAGE METRIC_LIST > ncu's output
  # shellcheck disable=SC2046  # target and command_for are word lists on purpose
  ncu --clock-control none --print-units base --metrics "$2" --csv $(target "$1") $(command_for "$1")
}

# A metric this ncu or GPU does not know fails the whole run: try the list first on a small problem
# of stage 05, and on failure keep only the metrics that work alone (the dropped ones are named).
probe() {
  ncu --clock-control none --print-units base --metrics "$1" --csv -k regex:warp_shuffle_attention_kernel -c 1 \
    "$build/bin/flash-stages" --stage 5 --batch 1 --heads 2 --seq 256 --head-dim "$head_dim" --runs 1 \
    > "$out/ncu_raw.txt" 2>&1 && grep -q '^"' "$out/ncu_raw.txt"
}
list=$(IFS=,; echo "${metrics[*]}")
if ! probe "$list"; then
  echo "profile_stages: ncu failed with the full metric list; trying each metric alone"
  tail -5 "$out/ncu_raw.txt"
  kept=()
  for m in "${metrics[@]}"; do
    if probe "$m"; then
      kept+=("$m")
    else
      echo "profile_stages: dropped $m: $(grep -m1 -i error "$out/ncu_raw.txt" || tail -1 "$out/ncu_raw.txt")"
    fi
  done
  list=$(IFS=,; echo "${kept[*]}")
fi

csv="$out/h100_ncu_d${head_dim}.csv"
: > "$csv.partial"
for stage in $stages; do
  profile "$stage" "$list" > "$out/ncu_raw.txt" 2>&1 || { tail -20 "$out/ncu_raw.txt"; exit 1; }
  grep '^"' "$out/ncu_raw.txt" | sed "s/^/\"$stage\",/" >> "$csv.partial"
done
mv "$csv.partial" "$csv"
rm -f "$out/ncu_raw.txt"

# One row per metric, one column per stage and kernel.
python3 - "$csv" <<'PY'
import csv, re, sys
rows, columns = {}, []
for r in csv.reader(open(sys.argv[1])):
    if len(r) < 4 or r[1] == "ID":
        continue
    kernel = re.search(r"(\w+_kernel)", r[5])
    column = f"{r[0]}:{(kernel[1] if kernel else r[5]).replace('_kernel', '')[:13]}"
    if column not in columns:
        columns.append(column)
    name, unit, value = r[-3], r[-2], r[-1]
    rows.setdefault(f"{name} ({unit})" if unit else name, {})[column] = value
for n in sorted(rows):
    print(f"{n:90s} " + " ".join(f"{rows[n].get(c, '-'):>16s}" for c in columns))
print(f"{'stage:kernel':90s} " + " ".join(f"{c:>16s}" for c in columns))
PY
