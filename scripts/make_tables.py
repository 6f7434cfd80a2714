#!/usr/bin/env python3
"""Turns measured results into the Markdown tables of README.md and the lessons.

Every figure in those tables comes from a file under bench/results/, written on the GPU machine by
scripts/gpu_check.sh (the benchmark's JSON and the runner's output). Nothing is typed by hand:

    python3 scripts/make_tables.py --update README.md stages/*/README.md

rewrites each region between `<!-- table:NAME -->` and `<!-- /table:NAME -->` with table NAME:
  course      every stage at batch 4, 16 heads, seq 4096, head_dim 64 and 128 (non-causal; causal
              for the stages that support it): TFLOP/s, share of the fp32 peak, speedup
  stage-NN    stage NN over sequence lengths 512 .. 16384
  backward    the backward of every stage that has one, over the same lengths
  runner      the course runner's table, verbatim
  compare     the stages against PyTorch's attention backends (bench/compare.py's table)
  backward-split  the time of each of stage 07's backward kernels (Nsight Compute)
  ncu-dNN     Nsight Compute metrics of the fused kernels (stages 03-06) at head_dim NN, one row per
              metric, one column per stage, from bench/results/h100_ncu_dNN.csv
              (scripts/profile_stages.sh NN); plus FP32 TFLOP/s achieved = 2 x FFMA / kernel time
Without --update it prints every table.
"""
import argparse
import csv
import json
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench/results/h100_bench.json"
RUNNER = ROOT / "bench/results/h100_runner.txt"
COMPARE = ROOT / "bench/results/compare_h100.md"
NCU_BACKWARD = ROOT / "bench/results/h100_ncu_backward.csv"
NCU = ROOT / "bench/results/h100_ncu_d{}.csv"
# H100 SXM datasheet FP32 (FFMA) peak, as listed in ../shared/perf-anchors.md.
FP32_PEAK_TFLOPS = 67.0
COURSE_SEQ = 4096
NAME = re.compile(r"stage(\d\d)_(\w+)/d(\d+)/causal(\d)/(backward/)?seq:(\d+)")


def load_bench(backward=False):
    """{(stage, head_dim, causal, seq): result} of the forward runs, or of the backward runs."""
    runs = {}
    for b in json.loads(BENCH.read_text())["benchmarks"]:
        m = NAME.match(b["name"])
        if not m or "TFLOP/s" not in b or bool(m[5]) != backward:
            continue
        stage, name, d, causal, seq = int(m[1]), m[2], int(m[3]), m[4] == "1", int(m[6])
        runs[(stage, d, causal, seq)] = {"name": name, "tflops": b["TFLOP/s"], "ms": b["median_ms"]}
    return runs


def course_table(runs):
    lines = ["| stage | head_dim | causal | time (ms) | TFLOP/s | of fp32 peak | vs previous stage |",
             "|---|---|---|---|---|---|---|"]
    for d in (64, 128):
        for causal in (False, True):
            prev = None
            for stage in sorted({k[0] for k in runs}):
                r = runs.get((stage, d, causal, COURSE_SEQ))
                if not r:
                    continue
                speedup = f"{r['tflops'] / prev:.2f}x" if prev else "–"
                if causal and (stage, d, False, COURSE_SEQ) in runs:
                    speedup = f"time {r['ms'] / runs[(stage, d, False, COURSE_SEQ)]['ms']:.2f}x of non-causal"
                lines.append(f"| {stage:02d} {r['name']} | {d} | {'yes' if causal else 'no'} | {r['ms']:.2f} | "
                             f"{r['tflops']:.2f} | {100 * r['tflops'] / FP32_PEAK_TFLOPS:.0f}% | {speedup} |")
                prev = r["tflops"]
    lines.append("")
    lines.append(f"Batch {16384 // COURSE_SEQ}, 16 heads, seq {COURSE_SEQ}, fp32, on the H100 of the course; TFLOP/s "
                 f"by the FlashAttention convention (4·B·H·N²·d, halved when causal); fp32 peak "
                 f"{FP32_PEAK_TFLOPS:.0f} TFLOP/s. From `bench/results/h100_bench.json`.")
    return "\n".join(lines)


def stage_table(runs, stage, what="TFLOP/s"):
    keys = sorted({(k[1], k[2]) for k in runs if k[0] == stage})
    seqs = sorted({k[3] for k in runs if k[0] == stage})
    head = "| head_dim | causal | " + " | ".join(f"N={s}" for s in seqs) + " |"
    lines = [head, "|" + "---|" * (2 + len(seqs))]
    for d, causal in keys:
        cells = []
        for s in seqs:
            r = runs.get((stage, d, causal, s))
            cells.append(f"{r['tflops']:.2f}" if r else "–")
        lines.append(f"| {d} | {'yes' if causal else 'no'} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(f"{what}; batch·N = 16384 tokens, 16 heads. From `bench/results/h100_bench.json`.")
    return "\n".join(lines)


def runner_table():
    lines = RUNNER.read_text().splitlines()
    first = next(i for i, line in enumerate(lines) if " | " in line)  # skip nvidia-smi's lines
    return "```\n" + "\n".join(lines[first:]).strip() + "\n```"


# Nsight Compute metric -> (row label, divisor, decimals), in the order the table shows them.
NCU_ROWS = {
    "gpu__time_duration.sum": ("kernel time (ms)", 1e6, 2),
    "sm__sass_thread_inst_executed_op_ffma_pred_on.sum": ("FFMA thread instructions (10⁹)", 1e9, 1),
    "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active": ("FMA pipe busy (% of peak)", 1, 1),
    "smsp__inst_executed_op_shared_ld.sum": ("shared-memory load instructions, warp-level (10⁹)", 1e9, 3),
    "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum": ("shared-memory load wavefronts (10⁹)", 1e9, 3),
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum": ("shared-load bank conflicts (10⁶)", 1e6, 2),
    "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio":
        ("warps stalled at a barrier, per issue", 1, 2),
    "smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio":
        ("warps waiting on shared memory (short scoreboard), per issue", 1, 2),
    "launch__registers_per_thread": ("registers per thread", 1, 0),
    "sm__warps_active.avg.pct_of_peak_sustained_active": ("achieved occupancy (% of 64 warps)", 1, 1),
}


def load_ncu(head_dim):
    """{stage: {metric: value}} from the CSV of scripts/profile_stages.sh (first column: stage)."""
    metrics = {}
    with open(str(NCU).format(head_dim), newline="") as f:
        for row in csv.reader(f):
            if row[1] == "ID":  # the header ncu prints before each stage's rows
                continue
            name, value = row[-3], row[-1]
            metrics.setdefault(int(row[0]), {})[name] = float(value.replace(",", ""))
    return metrics


def ncu_table(head_dim, runs):
    metrics = load_ncu(head_dim)
    stages = sorted(metrics)
    names = {k[0]: r["name"] for k, r in runs.items()}
    lines = ["| metric | " + " | ".join(f"{s:02d} {names.get(s, '')}".strip() for s in stages) + " |",
             "|---|" + "---|" * len(stages)]
    for metric, (label, divisor, decimals) in NCU_ROWS.items():
        cells = [f"{metrics[s][metric] / divisor:,.{decimals}f}" if metric in metrics[s] else "–" for s in stages]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    # FLOP/s from the FFMAs the kernel really executed (2 flops each); FMUL, FADD and exp not counted.
    tflops = [2 * metrics[s]["sm__sass_thread_inst_executed_op_ffma_pred_on.sum"] /
              (metrics[s]["gpu__time_duration.sum"] * 1e-9) / 1e12 for s in stages]
    lines.append("| FP32 TFLOP/s achieved (2 × FFMA / time) | " + " | ".join(f"{t:.2f}" for t in tflops) + " |")
    lines.append("")
    lines.append(f"Nsight Compute, one launch per stage, batch 4, 16 heads, seq 4096, head_dim {head_dim}, "
                 f"non-causal (stage 06 runs its non-causal kernel). From `bench/results/h100_ncu_d{head_dim}.csv`, "
                 f"written by `scripts/profile_stages.sh {head_dim}`.")
    return "\n".join(lines)


def compare_table():
    """The stages against PyTorch: bench/compare.py's own Markdown table, from its heading to the notes."""
    text = COMPARE.read_text()
    body = text[text.index("TFLOP/s, forward / backward"):text.index("## Notes")].strip()
    made_by = next(line for line in text.splitlines() if line.startswith("Made by"))
    return f"{made_by}\n\n{body}\n\nNotes (backends that refused fp32, cases that did not fit): `bench/results/compare_h100.md`."


def backward_split_table():
    """Time of each backward kernel (scripts/profile_backward.sh): what the dQ pass costs."""
    times = {}
    for row in csv.reader(NCU_BACKWARD.open()):
        d, kernel, value = int(row[0]), row[5], float(row[-1].replace(",", "")) / 1e6
        name = next(k for k in ("row_dot_kernel", "dk_dv_kernel", "dq_kernel") if k in kernel)
        times[(d, name)] = value
    labels = {"row_dot_kernel": "1. D = rowsum(dO o O)", "dk_dv_kernel": "2. dK, dV (per key tile)",
              "dq_kernel": "3. dQ (per query tile)"}
    dims = sorted({d for d, _ in times})
    lines = ["| kernel | " + " | ".join(f"d={d}: ms (share)" for d in dims) + " |", "|---|" + "---|" * len(dims)]
    for name, label in labels.items():
        cells = []
        for d in dims:
            total = sum(v for (dd, _), v in times.items() if dd == d)
            cells.append(f"{times[(d, name)]:.2f} ({100 * times[(d, name)] / total:.0f}%)")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("Batch 4, 16 heads, seq 4096, not causal; Nsight Compute durations of one backward call. "
                 "From `bench/results/h100_ncu_backward.csv` (`scripts/profile_backward.sh`).")
    return "\n".join(lines)


def tables():
    runs = load_bench()
    out = {"course": course_table(runs), "runner": runner_table(), "compare": compare_table(),
           "backward-split": backward_split_table()}
    for d in (64, 128):
        out[f"ncu-d{d}"] = ncu_table(d, runs)
    for stage in sorted({k[0] for k in runs}):
        out[f"stage-{stage:02d}"] = stage_table(runs, stage)
    backward = load_bench(backward=True)
    out["backward"] = "\n\n".join(
        stage_table(backward, stage, "Backward TFLOP/s (2.5x the forward FLOPs), stage " + f"{stage:02d}")
        for stage in sorted({k[0] for k in backward}))
    return out


def update(path, all_tables):
    text = path.read_text()

    def fill(m):
        name = m[1]
        if name not in all_tables:
            raise SystemExit(f"{path}: no table named {name}")
        return f"<!-- table:{name} -->\n{all_tables[name]}\n<!-- /table:{name} -->"

    new = re.sub(r"<!-- table:([\w-]+) -->.*?<!-- /table:\1 -->", fill, text, flags=re.S)
    if new != text:
        path.write_text(new)
        print(f"updated {path}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--update", nargs="+", type=pathlib.Path, help="files whose table regions to rewrite")
    args = parser.parse_args()
    all_tables = tables()
    if args.update:
        for path in args.update:
            update(path, all_tables)
    else:
        for name, table in all_tables.items():
            print(f"## {name}\n\n{table}\n")


if __name__ == "__main__":
    main()
