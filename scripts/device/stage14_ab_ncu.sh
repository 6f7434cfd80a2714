#!/usr/bin/env bash
# Two versions of stage 14's main kernel timed under Nsight Compute at locked clocks (--clock-control
# base), where the power limit that moves back-to-back timings (lesson 14's power table) does not
# reach: the library built with the stage's files from folder A, then from folder B (as
# scripts/device/stage14_ab.sh), then two rounds of B, A, each one process that profiles every launch
# of backward_kernel in scripts/profile/stage14_backward_cells.py (12 cells, 2 calls each). Prints, per
# cell, each version's kernel times (ns) and tensor-pipe activity, and B's median time over A's.
# Usage: OUT=dir scripts/device/stage14_ab_ncu.sh A B
set -uo pipefail
a=$(realpath "$1") b=$(realpath "$2")
out=${OUT:-gpu-logs}
mkdir -p "$out"
stage=stages/14_hopper_backward
here=$(dirname "$0")
work=$(mktemp -d)
mkdir "$work/stage" && cp $stage/* "$work/stage/"
trap 'cp "$work"/stage/* $stage/; rm -rf "$work"' EXIT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 > "$out/configure.log" 2>&1
for v in b a; do
  src=$a; [ $v = b ] && src=$b
  cp "$src"/* $stage/
  cmake --build build -j 16 --target flash_stages_c > "$out/build_$v.log" 2>&1 || { echo "build $v failed"; exit 1; }
  rm -rf "$work/py_$v" && cp -r build/python "$work/py_$v"
done
for r in 1 2; do
  for v in b a; do
    PYTHONPATH="$work/py_$v" ncu --clock-control base --profile-from-start off -k regex:backward_kernel \
      --metrics gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active \
      --csv python3 "$here/../profile/stage14_backward_cells.py" 2 > "$out/ncu_${v}_$r.csv" 2>&1 ||
      { echo "ncu $v, round $r failed"; tail -5 "$out/ncu_${v}_$r.csv"; exit 1; }
  done
done
OUT="$out" python3 - <<'PY'
import collections, csv, glob, os, statistics, sys
sys.path.insert(0, "scripts/profile")
from stage14_backward_cells import CELLS
out = os.environ["OUT"]
names = [f"d{d} N{n} c{c}" for d, n, c in CELLS]
found = {v: (collections.defaultdict(list), collections.defaultdict(list)) for v in "ab"}
for v in "ab":
    for f in sorted(glob.glob(f"{out}/ncu_{v}_*.csv")):
        rows = list(csv.reader(line for line in open(f) if line.startswith('"')))
        head, rows = rows[0], rows[1:]
        ids = sorted({int(r[head.index("ID")]) for r in rows})
        for r in rows:
            cell = names[ids.index(int(r[head.index("ID")])) // 2]
            time = r[head.index("Metric Name")].startswith("gpu__time")
            found[v][0 if time else 1][cell].append(float(r[-1].replace(",", "")))
for c in names:
    (ta, sa), (tb, sb) = [(found[v][0][c], found[v][1][c]) for v in "ab"]
    print(f"{c} | B ns: {' '.join(f'{x:.0f}' for x in tb)} | A ns: {' '.join(f'{x:.0f}' for x in ta)} | "
          f"B/A {statistics.median(tb) / statistics.median(ta):.3f} | tensor % B {statistics.median(sb):.1f} "
          f"A {statistics.median(sa):.1f}")
PY
