#!/bin/bash
# cuDNN's attention backward under the same Nsight Compute counters as stage 14's main kernel
# (scripts/profile/profile_stage14.sh), on the same problem: every kernel of one backward call
# (scripts/profile/cudnn_backward_once.py starts the profiler around it), head_dim 128 and 64.
#
# Usage (GPU machine with PyTorch and cuDNN): scripts/profile/profile_cudnn_backward.sh
# Writes $OUT/h100_ncu_cudnn_backward.csv: one row per kernel and metric, the kernel's name included.
set -uo pipefail
out=${OUT:-.}
metrics=$(grep -A12 '^metrics=' "$(dirname "$0")/profile_stage14.sh" | sed -n '/^metrics=/,/^smsp__cycles_elapsed/p' |
  sed 's/^metrics=//; s/\\$//' | tr -d '\n'),launch__block_size
csv="$out/h100_ncu_cudnn_backward.csv"
echo '"head_dim","kernel","metric","unit","value"' > "$csv"
for head_dim in 128 64; do
  ncu --clock-control none --profile-from-start off --metrics "$metrics" --csv \
    python3 "$(dirname "$0")/cudnn_backward_once.py" $head_dim > "$out/ncu_last.txt" 2>&1 ||
    { echo "ncu failed at head_dim $head_dim:"; tail -5 "$out/ncu_last.txt"; }
  # ncu's CSV: "ID", ..., "Kernel Name" (5th), ..., "Metric Name", "Metric Unit", "Metric Value" (the last three).
  grep '^"' "$out/ncu_last.txt" | grep -v '"Metric Name"' |
    awk -v d=$head_dim -F'","' '{n=NF; gsub(/"$/, "", $n); print "\"" d "\",\"" $5 "\",\"" $(n-2) "\",\"" $(n-1) "\",\"" $n "\""}' >> "$csv"
done
rm -f "$out/ncu_last.txt"
cut -d, -f1-3 "$csv" | sort -u | head -20
