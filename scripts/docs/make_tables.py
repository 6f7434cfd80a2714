#!/usr/bin/env python3
"""Turns measured results into the Markdown tables of README.md and the lessons.

Every figure in those tables comes from a file under bench/results/, written on the GPU machine by
scripts/device/gpu_check.sh (the benchmark's JSON and the runner's output). Nothing is typed by hand:

    python3 scripts/docs/make_tables.py --update README.md stages/*/README.md

rewrites each region between `<!-- table:NAME -->` and `<!-- /table:NAME -->` with table NAME:
  course      every stage at batch 4, 16 heads, seq 4096, head_dim 64 and 128 (non-causal; causal
              for the stages that support it): TFLOP/s, share of the fp32 peak, speedup
  stage-NN    stage NN over sequence lengths 512 .. 16384
  backward    the backward of every stage that has one, over the same lengths
  runner      the course runner's table, verbatim
  compare     the stages against PyTorch's attention backends (bench/compare.py's table)
  backward-split  the time of each of stage 07's backward kernels (Nsight Compute)
  ptxas-backward  registers and spills of stage 07's kernels (ptxas, bench/results/ptxas_sm90.txt)
  ptxas-stage11   registers and spills of stage 11's kernels per head_dim (the same file)
  ncu-dNN     Nsight Compute metrics of the fused kernels (stages 03-06) at head_dim NN, one row per
              metric, one column per stage, from bench/results/h100_ncu_dNN.csv
              (scripts/profile/profile_stages.sh NN); plus FP32 TFLOP/s achieved = 2 x FFMA / kernel time, and
              the share of instructions that are not FFMA where the CSV counts all instructions
  ncu-kernels-dNN  the same metrics for the stages profiled as several kernels (01, 02: scores,
              softmax, P V; 07: its backward's three), one column per kernel
  stage05-ablation  stage 04 -> 05 one change at a time (bench/stage05_ablation.cu's output,
              bench/results/h100_stage05_ablation.txt, written by scripts/device/gpu_check_ablation.sh)
  stage06-order  from the same file: stage 06's causal/non-causal ratio, its heaviest-first order
              against the natural order
              (scripts/profile/profile_stages.sh NN); plus FP32 TFLOP/s achieved = 2 x FFMA / kernel time
  stage12-compare  stage 12 in bench/compare.py's bf16 and fp16 runs: TFLOP/s and its speed over stage 10,
              FlashAttention-2 and cuDNN per cell, with the geometric means
  stage12-variants-dNN  stage 12 one piece at a time at head_dim NN (bench/stage12_variants.cu's output,
              bench/results/h100_stage12_variants_*.txt), bf16 and fp16, causal and not; "not run" where
              no committed run holds the whole block
  stage12-steps   from the same files: what each piece buys at N = 16384, and how far apart the two rows
              that time the registered kernel are
  stage12-after-b  from the same files: version B, then the three pieces after it, every block
  ncu-stage12     Nsight Compute of stage 12's kernel at head_dim 64 and 128
              (bench/results/h100_ncu_stage12_dNN.csv and _tensor.csv)
  decode-bench    stage 13's decode family of the benchmark (bench/results/h100_bench_decode.json):
              GB/s over the K and V bytes, contiguous and paged, and their share of the HBM datasheet
  decode-compare  stage 13 against SDPA's flash backend (bench/compare.py --decode's table,
              bench/results/compare_h100_decode.md)
  decode-splits-B-N  stage 13 at forced split counts at batch B, cache length N (bench/stage13_splits.cu's
              output, bench/results/h100_stage13_splits.txt): µs and GB/s per split count, the count
              choose_splits picks marked
  stage11-backward-bf16, stage11-backward-fp16  stage 11's backward (both modes) against FlashAttention-2
              (sdpa-flash) and cuDNN: TFLOP/s, stage11 / flash and stage11-det / stage11 per cell, with
              their geometric means over N >= 1024 (from compare_h100_bf16.json, compare_h100_fp16.json)
  stage11-steps  dk_dv_kernel's changes of the fourth session of 2026-11-23, one after the other
              (bench/results/h100_stage11_steps.txt, flash-stages-bench rounds): ms per backward call,
              the fastest round of each version, and its speed over the version it was timed against
  stage11-2d  the fifth session's two changes against the kernel before them, in the same calls
              (h100_stage11_steps.txt, calls 5 and 6): ms per backward call, the fastest of two rounds,
              and the speed-up; 2D warp grids at both head_dims, then 128 query rows at head_dim 64
  stage11-order  the 2026-11-25 session's two kept changes, each against the kernel before it in the same
              call (h100_stage11_steps.txt, calls 10 and 13): ms per backward call, the fastest round
  stage11-bulk   dQ's share added by one bulk copy per warp, and the lse/D loads a step ahead on top of it
  stage11-p-variants  the ways of placing P between the score products, and four changes on the kept
              kernel, each as a speed-up over the kernel it was timed against (h100_stage11_steps.txt,
              calls 11-16)
  stage11-vs-fa2  stage 11's dk_dv_kernel and FlashAttention-2's main backward kernel in Nsight Compute,
              same problem and sections: time, instructions by pipe, spills, stalls per issued instruction
  ncu-stage11 each kernel of one stage 11 backward call at head_dim 64 and 128 (Nsight Compute, first
              call): time, registers, warps active, SM, tensor pipe, busiest memory unit and DRAM
              throughput, share of the call (h100_ncu_stage11_dD.csv and _tensor.csv)
Both decode tables say "not measured yet" and name the script until their file is committed
(scripts/device/gpu_check_decode.sh writes both).

Single figures in running text are generated the same way, inline:

    <!-- value:SPEC -->31.69<!-- /value -->

where SPEC names one measured figure (see `value()` below for the forms), e.g.
`bench/05/d64/c0/4096/tflops`, `speedup/04/05/d64`, `compare/naive-torch/backward/d64/c0/4096`,
`anchor/fp32-matmul`. The figure between the markers is rewritten by --update like a table.

    python3 scripts/docs/make_tables.py --check [FILES]

changes nothing and exits 1 if any table or inline figure in FILES (default: every Markdown page of
the course) differs from what bench/results/ gives, or needs a file bench/results/ does not have (it
names the file); ctest runs it (label cpu) and so does CI.
Without --update or --check it prints every table.
"""
import argparse
import csv
import json
import math
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench/results/h100_bench.json"
RUNNER = ROOT / "bench/results/h100_runner.txt"
RESULTS = ROOT / "bench/results"
COMPARE = ROOT / "bench/results/compare_h100.md"
NCU_BACKWARD = ROOT / "bench/results/h100_ncu_backward.csv"
COMPARE_JSON = ROOT / "bench/results/compare_h100.json"
ANCHORS = ROOT / "bench/results/pytorch_anchors_h100.md"
DECODE_BENCH = ROOT / "bench/results/h100_bench_decode.json"
DECODE_COMPARE = ROOT / "bench/results/compare_h100_decode.md"
DECODE_SPLITS = ROOT / "bench/results/h100_stage13_splits.txt"
# The half stages' targets ask for no cell below 0.9x the peer (the issues of stages 10 to 12).
TARGET_FLOOR = 0.9
# The Markdown pages whose generated regions --check covers when it is given no files.
PAGES = ["README.md", "docs/mainpage.md", "docs/theory/*.md", "stages/*/README.md"]
# H100 SXM datasheet FP32 (FFMA) peak, as quoted in bench/results/pytorch_anchors_h100.md (checked
# against that file by value("anchor/peak-fp32") whenever the tables are made).
FP32_PEAK_TFLOPS = 67.0
COURSE_SEQ = 4096
# The two grids of the committed results, named once (issue 14, item 6).
COURSE_GRID = ("Course grid: B·N = 16384 tokens and 16 heads at every head_dim (`bench/bench_stages.cpp`); at "
               "head_dim 128 it is the FlashAttention benchmark grid (H·d = 2048), at head_dim 64 that grid has "
               "32 heads (the PyTorch comparison, `bench/compare.py`).")
NAME = re.compile(r"stage(\d\d)_(\w+)/d(\d+)/causal(\d)/(backward/)?seq:(\d+)")


def load_bench(backward=False):
    """{(stage, head_dim, causal, seq): result} of the forward runs, or of the backward runs."""
    runs = {}
    for b in json.loads(BENCH.read_text())["benchmarks"]:
        m = NAME.match(b["name"])
        if not m or "TFLOP/s" not in b or bool(m[5]) != backward:
            continue
        stage, name, d, causal, seq = int(m[1]), m[2], int(m[3]), m[4] == "1", int(m[6])
        runs[(stage, d, causal, seq)] = {"name": name, "tflops": b["TFLOP/s"], "ms": b["median_ms"],
                                         "gib": b.get("workspace_bytes", 0) / 2 ** 30}
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
                label = f"{stage:02d} {r['name']}"
                if r["name"] == "backward":  # stage 07's forward is stage 06's kernel, copied (issue 14, item 11)
                    label = f"{stage:02d} (forward = {stage - 1:02d})"
                lines.append(f"| {label} | {d} | {'yes' if causal else 'no'} | {r['ms']:.2f} | "
                             f"{r['tflops']:.2f} | {100 * r['tflops'] / FP32_PEAK_TFLOPS:.0f}% | {speedup} |")
                prev = r["tflops"]
    lines.append("")
    lines.append(f"Batch {16384 // COURSE_SEQ}, 16 heads, seq {COURSE_SEQ}, fp32, on the H100 of the course; TFLOP/s "
                 f"by the FlashAttention convention (4·B·H·N²·d, halved when causal); fp32 peak "
                 f"{FP32_PEAK_TFLOPS:.0f} TFLOP/s. {COURSE_GRID} From `bench/results/h100_bench.json`.")
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
    lines.append(f"{what}; course grid (batch·N = 16384 tokens, 16 heads). From `bench/results/h100_bench.json`.")
    return "\n".join(lines)


def runner_table():
    lines = RUNNER.read_text().splitlines()
    first = next(i for i, line in enumerate(lines) if " | " in line)  # skip nvidia-smi's lines
    return "```\n" + "\n".join(lines[first:]).strip() + "\n```"


# Nsight Compute metric -> (row label, divisor, decimals), in the order the table shows them. The rows
# after the first ten are shown only where the CSV has the metric (scripts/profile/profile_stages.sh collects
# them since issue 14's "what binds" and stage 03's 6x).
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
    "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum.pct_of_peak_sustained_elapsed":
        ("shared-memory data pipe busy (wavefronts, % of peak)", 1, 1),
    "sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active": ("LSU pipe, instructions issued (% of peak)", 1, 1),
    "smsp__issue_inst0.avg.pct_of_peak_sustained_active": ("scheduler cycles with no eligible warp (%)", 1, 1),
    "smsp__issue_active.avg.pct_of_peak_sustained_active": ("scheduler cycles issuing an instruction (%)", 1, 1),
    "smsp__inst_executed.sum": ("warp instructions executed (10⁹)", 1e9, 3),
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": ("DRAM throughput (% of peak)", 1, 1),
    "dram__bytes_read.sum": ("DRAM bytes read (GB)", 1e9, 2),
    "dram__bytes_write.sum": ("DRAM bytes written (GB)", 1e9, 2),
}
NCU_ALWAYS = list(NCU_ROWS)[:10]  # the rows of the tables before issue 14's metrics: shown as "–" when missing
NONFFMA_LABEL = "instructions that are not FFMA (% of warp instructions)"


def ncu_path(head_dim):
    return RESULTS / f"h100_ncu_d{head_dim}.csv"


def load_ncu_kernels(head_dim):
    """{stage: {kernel: {metric: value}}} from the CSV of scripts/profile/profile_stages.sh (first column: the
    stage; then Nsight Compute's columns, the kernel's name sixth), kernels in the order profiled.
    Values that are not numbers (n/a) are left out."""
    out = {}
    with open(ncu_path(head_dim), newline="") as f:
        for row in csv.reader(f):
            if len(row) < 6 or row[1] == "ID":  # the header ncu prints before each stage's rows
                continue
            try:
                number = float(row[-1].replace(",", ""))
            except ValueError:
                continue
            kernel = re.search(r"(\w+)_kernel\b", row[5])
            out.setdefault(int(row[0]), {}).setdefault(kernel[1] if kernel else row[5], {})[row[-3]] = number
    return out


def load_ncu(head_dim):
    """{stage: {metric: value}} of the stages profiled as one kernel (the fused stages 03-06)."""
    return {stage: next(iter(kernels.values())) for stage, kernels in load_ncu_kernels(head_dim).items()
            if len(kernels) == 1}


def nonffma_pct(m):
    """The share of warp instructions that are not FFMA, in percent: 1 - (FFMA thread instructions / 32)
    / warp instructions. Exact where every FFMA runs on a full warp (the fp32 kernels' inner loops)."""
    return 100 * (1 - m["sm__sass_thread_inst_executed_op_ffma_pred_on.sum"] / 32 / m["smsp__inst_executed.sum"])


def ncu_rows(columns, always=()):
    """Table rows, one per metric of NCU_ROWS that a column has (or that is in `always`), plus the
    non-FFMA share where the CSV has the instruction count; columns: [{metric: value}]."""
    lines = []
    for metric, (label, divisor, decimals) in NCU_ROWS.items():
        if metric in always or any(metric in c for c in columns):
            cells = [f"{c[metric] / divisor:,.{decimals}f}" if metric in c else "–" for c in columns]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    if any("smsp__inst_executed.sum" in c for c in columns):
        cells = [f"{nonffma_pct(c):.1f}" if "smsp__inst_executed.sum" in c else "–" for c in columns]
        lines.append(f"| {NONFFMA_LABEL} | " + " | ".join(cells) + " |")
    return lines


def ncu_table(head_dim, runs):
    metrics = load_ncu(head_dim)
    stages = sorted(metrics)
    names = {k[0]: r["name"] for k, r in runs.items()}
    lines = ["| metric | " + " | ".join(f"{s:02d} {names.get(s, '')}".strip() for s in stages) + " |",
             "|---|" + "---|" * len(stages)]
    lines += ncu_rows([metrics[s] for s in stages], always=NCU_ALWAYS)
    # FLOP/s from the FFMAs the kernel really executed (2 flops each); FMUL, FADD and exp not counted.
    tflops = [2 * metrics[s]["sm__sass_thread_inst_executed_op_ffma_pred_on.sum"] /
              (metrics[s]["gpu__time_duration.sum"] * 1e-9) / 1e12 for s in stages]
    lines.append("| FP32 TFLOP/s achieved (2 × FFMA / time) | " + " | ".join(f"{t:.2f}" for t in tflops) + " |")
    lines.append("")
    lines.append(f"Nsight Compute, one launch per stage, batch 4, 16 heads, seq 4096, head_dim {head_dim}, "
                 f"non-causal (stage 06 runs its non-causal kernel). From `bench/results/h100_ncu_d{head_dim}.csv`, "
                 f"written by `scripts/profile/profile_stages.sh {head_dim}`.")
    return "\n".join(lines)


def ncu_kernels_table(head_dim):
    """The stages profiled as several kernels (01 and 02: scores, softmax, P V; 07: its backward's
    three), one column per kernel."""
    kernels = {s: k for s, k in load_ncu_kernels(head_dim).items() if len(k) > 1}
    columns = [(s, name, m) for s in sorted(kernels) for name, m in kernels[s].items()]
    if not columns:
        raise KeyError(f"no multi-kernel stage in {ncu_path(head_dim).name}")
    lines = ["| metric | " + " | ".join(f"{s:02d} {name}" for s, name, _ in columns) + " |",
             "|---|" + "---|" * len(columns)]
    lines += ncu_rows([m for _, _, m in columns])
    lines.append("")
    lines.append(f"Nsight Compute, one call per stage (stages 01-02: the three kernels of one forward; stage 07: "
                 f"the three of one backward), batch 4, 16 heads, seq 4096, head_dim {head_dim}, non-causal. From "
                 f"`bench/results/h100_ncu_d{head_dim}.csv`, written by `scripts/profile/profile_stages.sh {head_dim}`.")
    return "\n".join(lines)


def compare_table():
    """The stages against PyTorch: bench/compare.py's own Markdown table, from its heading to the notes."""
    text = COMPARE.read_text()
    body = text[text.index("TFLOP/s, forward / backward"):text.index("## Notes")].strip()
    made_by = next(line for line in text.splitlines() if line.startswith("Made by"))
    return f"{made_by}\n\n{body}\n\nNotes (backends that refused fp32, cases that did not fit): `bench/results/compare_h100.md`."


def compare_half_table(tag):
    """The half stages against PyTorch in one dtype: compare.py's TFLOP/s table and its per-cell speed
    over sdpa-flash (FlashAttention-2), with the geometric mean, as compare.py wrote them."""
    text = (RESULTS / f"compare_h100_{tag}.md").read_text()
    body = text[text.index("TFLOP/s, forward"):text.index("## Notes")].strip()
    made_by = next(line for line in text.splitlines() if line.startswith("Made by"))
    return f"{made_by}\n\n{body}\n\nNotes: `bench/results/compare_h100_{tag}.md`."


# Rows of the tensor-core profile (scripts/profile/profile_tensor_stages.sh): metric -> (label, divisor, decimals).
NCU_TENSOR_ROWS = {
    "gpu__time_duration.sum": ("kernel time (ms)", 1e6, 3),
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active": ("tensor pipe active (% of peak)", 1, 1),
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum": ("shared-load bank conflicts (ldmatrix)", 1, 0),
    "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum": ("shared-load wavefronts", 1, 0),
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum": ("shared-store bank conflicts", 1, 0),
    "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio": ("stall: barrier (per issue)", 1, 2),
    "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio": ("stall: long scoreboard (global memory)", 1, 2),
    "smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio": ("stall: short scoreboard (shared memory, MUFU)", 1, 2),
    "smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio": ("stall: MIO throttle", 1, 2),
    "smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio": ("stall: math pipe throttle", 1, 2),
    "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio": ("stall: wait (fixed latency)", 1, 2),
    "sm__warps_active.avg.pct_of_peak_sustained_active": ("achieved occupancy (%)", 1, 1),
    "launch__registers_per_thread": ("registers per thread", 1, 0),
}


def ncu_tensor_table(head_dim):
    """Nsight Compute figures of stages 08-10, one column per stage."""
    path = RESULTS / f"h100_ncu_tensor_d{head_dim}_raw.csv"
    values = {}
    for r in csv.reader(path.open()):
        if len(r) < 4 or r[1] == "ID":
            continue
        try:
            values.setdefault(int(r[0]), {})[r[-3]] = float(r[-1].replace(",", ""))
        except ValueError:
            continue
    stages = sorted(values)
    lines = ["| metric | " + " | ".join(f"stage {s:02d}" for s in stages) + " |", "|---|" + "---|" * len(stages)]
    for metric, (label, divisor, decimals) in NCU_TENSOR_ROWS.items():
        if any(metric in values[s] for s in stages):
            lines.append(f"| {label} | " + " | ".join(
                f"{values[s][metric] / divisor:,.{decimals}f}" if metric in values[s] else "–" for s in stages) + " |")
    lines.append("")
    lines.append(f"Nsight Compute, one launch per stage, bf16, batch 4, 16 heads, seq 4096, head_dim {head_dim}, "
                 f"not causal; stalls are warps stalled per issued instruction. From "
                 f"`bench/results/h100_ncu_tensor_d{head_dim}_raw.csv`, written by "
                 f"`scripts/profile/profile_tensor_stages.sh {head_dim}`.")
    return "\n".join(lines)


def load_variants():
    """h100_stage10_variants.txt as {(head_dim, causal, N, slug): {"ms", "tflops"}} (slug: see value())."""
    line = re.compile(r"d(\d+)\s+causal=(\d) N=(\d+)\s+(.+?)\s+([\d.]+) ms\s+([\d.]+) TFLOP/s")
    rows = {}
    for m in map(line.match, (RESULTS / "h100_stage10_variants.txt").read_text().splitlines()):
        if m:
            slug = re.sub(r"[^a-z0-9]", "", m[4].lower())
            rows[(int(m[1]), m[2] == "1", int(m[3]), slug)] = {"ms": float(m[5]), "tflops": float(m[6])}
    return rows


def variants_table():
    """Stage 10's kernel in each tile shape (bench/stage10_variants.cu's text output)."""
    line = re.compile(r"d(\d+)\s+causal=(\d) N=(\d+)\s+(.+?)\s+([\d.]+) ms\s+([\d.]+) TFLOP/s")
    tflops, shapes = {}, []
    for name in ("h100_stage10_variants.txt",):
        for m in map(line.match, (RESULTS / name).read_text().splitlines()):
            if not m:
                continue
            d, causal, n, shape = int(m[1]), m[2] == "1", int(m[3]), m[4].strip()
            tflops[(d, shape, causal, n)] = float(m[6])
            if (d, shape) not in shapes:
                shapes.append((d, shape))
    seqs = sorted({k[3] for k in tflops})
    lines = ["| head_dim | shape (warps x rows x keys, Q, blocks/SM bound) | "
             + " | ".join(f"N={n}" for n in seqs) + " | causal N=" + str(seqs[-1]) + " |",
             "|---|---|" + "---|" * (len(seqs) + 1)]
    for d, shape in sorted(shapes, key=lambda x: x[0]):
        cells = [f"{tflops[(d, shape, False, n)]:.1f}" if (d, shape, False, n) in tflops else "–" for n in seqs]
        last = tflops.get((d, shape, True, seqs[-1]))
        lines.append(f"| {d} | {shape} | " + " | ".join(cells) + (f" | {last:.1f} |" if last else " | – |"))
    lines.append("")
    lines.append("bf16 forward TFLOP/s on the FlashAttention grid (B·N = 16384, H·d = 2048), not causal unless "
                 "the column says so; \"as built\" is the registered stage with its own shape per head_dim. From "
                 "`bench/results/h100_stage10_variants.txt` (`build/bin/stage10-variants`, run by "
                 "`scripts/device/gpu_check_half.sh`).")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Stage 12 (Hopper): its variants one piece at a time (bench/stage12_variants.cu), its profile
# (Nsight Compute of hopper_kernel), its sanitizer log and the full ctest log
# ---------------------------------------------------------------------------------------------

# The stage12-variants runs of the H100 (bench/results/RUNS.md, 2026-11-25, sixth session, call 4):
# one per dtype and head_dim, of the ladder from version A to work tiles back to back, each block's rows
# timed in interleaved rounds, each round in its own order. A block (dtype, head_dim, causal, N) is read from the last file here that holds
# all of its rows. (h100_stage12_variants_cut.txt, an earlier version's first run, has none.)
VARIANTS12_FILES = ("h100_stage12_variants_bf16_d128.txt", "h100_stage12_variants_fp16_d128.txt",
                    "h100_stage12_variants_bf16_d64.txt", "h100_stage12_variants_fp16_d64.txt")
VARIANTS12_LINE = re.compile(r"(bf16|fp16) d(\d+)\s+causal=(\d) N=(\d+)\s+(.+?)\s+([\d.]+) ms\s+([\d.]+) TFLOP/s")
# The rows of one block, in the order the program times them; the ladder runs from version A through
# version B (the intra-warpgroup overlap) to the registered kernel, work tiles back to back.
VARIANTS12_ROWS = ("stage 10 as built", "stage 12 as built", "A: 1 consumer warpgroup, in order",
                   "+ 2 consumer warpgroups", "+ setmaxnreg (producer warpgroup)", "+ ping-pong",
                   "+ intra-warpgroup overlap", "+ TMA store of O", "+ persistent blocks",
                   "+ query tiles in pairs, head by head", "+ work tiles back to back")
VARIANTS12_LADDER = VARIANTS12_ROWS[2:]
VARIANTS12_B = "+ intra-warpgroup overlap"
VARIANTS12_SEQS = (1024, 4096, 16384)


def variant_slug(name):
    """A variant's name in lower case without spaces or punctuation, as value() takes it."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


def load_variants12_file(name):
    """{(dtype, head_dim, causal, N, slug): {"ms", "tflops", "name"}} of one stage12-variants output.
    A line the time limit cut in the middle does not match and is left out."""
    rows = {}
    for m in map(VARIANTS12_LINE.match, (RESULTS / name).read_text().splitlines()):
        if m:
            rows[(m[1], int(m[2]), m[3] == "1", int(m[4]), variant_slug(m[5]))] = {
                "ms": float(m[6]), "tflops": float(m[7]), "name": m[5].strip()}
    return rows


def load_variants12():
    """The rows of every complete block: {(dtype, head_dim, causal, N): (file, {slug: row})}."""
    blocks = {}
    for name in VARIANTS12_FILES:
        rows = load_variants12_file(name)
        for key in {k[:4] for k in rows}:
            block = {k[4]: r for k, r in rows.items() if k[:4] == key}
            if all(variant_slug(v) in block for v in VARIANTS12_ROWS):
                blocks[key] = (name, block)
    return blocks


def variants12_block(blocks, tag, d, causal, n):
    key = (tag, d, causal, n)
    if key not in blocks:
        raise KeyError(f"no complete block {tag} d{d} causal={int(causal)} N={n} in {', '.join(VARIANTS12_FILES)}")
    return blocks[key][1]


def variant12_step(block, slug):
    """The time of the rung before `slug` on the ladder over the time of `slug`."""
    ladder = [variant_slug(v) for v in VARIANTS12_LADDER]
    i = ladder.index(slug)
    if i == 0:
        raise KeyError(f"{slug} is the first rung")
    return block[ladder[i - 1]]["ms"] / block[slug]["ms"]


def variant12_span(block, first, last):
    """The time of rung `first` over the time of rung `last` (names of VARIANTS12_LADDER)."""
    return block[variant_slug(first)]["ms"] / block[variant_slug(last)]["ms"]


# The row that "stage 12 as built" timed again in the runs of VARIANTS12_FILES: forward() ran work
# tiles back to back (kBackToBack) when they were made.
VARIANTS12_AS_BUILT = VARIANTS12_LADDER[-1]


def variant12_same(block, as_built=VARIANTS12_AS_BUILT):
    """How far apart the two rows of the kernel timed twice are, in percent of the smaller time."""
    a, b = block[variant_slug(VARIANTS12_ROWS[1])]["ms"], block[variant_slug(as_built)]["ms"]
    return 100 * abs(a - b) / min(a, b)


def stage12_variants_table(head_dim):
    """Stage 12 one piece at a time at one head_dim: TFLOP/s of every row, bf16 and fp16, causal and not."""
    blocks = load_variants12()
    lines = ["| dtype | variant | " + " | ".join(f"N={n}" for n in VARIANTS12_SEQS) + " | "
             + " | ".join(f"causal N={n}" for n in VARIANTS12_SEQS) + " |",
             "|---|---|" + "---|" * 2 * len(VARIANTS12_SEQS)]
    sources = set()
    for tag in ("bf16", "fp16"):
        for name in VARIANTS12_ROWS:
            cells = []
            for causal in (False, True):
                for n in VARIANTS12_SEQS:
                    found = blocks.get((tag, head_dim, causal, n))
                    if found:
                        sources.add(found[0])
                        cells.append(f"{found[1][variant_slug(name)]['tflops']:.1f}")
                    else:
                        cells.append("not run")
            label = name.replace("setmaxnreg", "`setmaxnreg`")
            lines.append(f"| {tag} | {label} | " + " | ".join(cells) + " |")
    files = " and ".join(f"`bench/results/{s}`" for s in sorted(sources)) or "no file"
    lines.append("")
    lines.append(f"Forward TFLOP/s at head_dim {head_dim} on the FlashAttention grid (B·N = 16384, H·d = 2048), "
                 "each row one `stage12::Variant`, the rows of a shape timed in 11 interleaved rounds, each in its own "
                 "order, of 4 CUDA-event timings after 2 warm-up calls, the median round reported "
                 "(`bench/stage12_variants.cu`). "
                 "\"stage 12 as built\" is the registered configuration, the same kernel as the last row. "
                 "\"not run\": no complete block in the committed runs. "
                 f"From {files} (commands: `bench/results/RUNS.md`).")
    return "\n".join(lines)


def stage12_steps_table(n=16384):
    """What each piece buys at N = n: the time of the rung before over the rung's own, every dtype,
    head_dim and causal; then A to B, B to the registered kernel, and the two rows of the registered
    kernel."""
    blocks = load_variants12()
    columns = [(tag, d, causal) for tag in ("bf16", "fp16") for d in (64, 128) for causal in (False, True)]
    head = [f"{tag} d={d}{' causal' if causal else ''}" for tag, d, causal in columns]
    lines = ["| piece switched on | " + " | ".join(head) + " |", "|---|" + "---|" * len(columns)]

    def row(label, fn):
        cells = []
        for tag, d, causal in columns:
            found = blocks.get((tag, d, causal, n))
            cells.append(fn(found[1]) if found else "not run")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")

    for name in VARIANTS12_LADDER[1:]:
        row(name.replace("setmaxnreg", "`setmaxnreg`"), lambda b, s=variant_slug(name): f"{variant12_step(b, s):.2f}")
    row("A to B, four pieces", lambda b: f"{variant12_span(b, VARIANTS12_LADDER[0], VARIANTS12_B):.2f}")
    row("B to as built, four more", lambda b: f"{variant12_span(b, VARIANTS12_B, VARIANTS12_AS_BUILT):.2f}")
    row("as built, timed twice: rows apart", lambda b: f"{variant12_same(b):.1f}%")
    lines.append("")
    lines.append(f"N = {n}; each step is the time of the row above over the row's own (above 1: the piece "
                 "helps); version B is the ladder up to the intra-warpgroup overlap. The last row compares the "
                 "two rows that time the same kernel (\"stage 12 as built\" and the last rung) in the same block: "
                 "steps smaller than it are not resolved by this program. From the runs of the tables above.")
    return "\n".join(lines)


# Version B and the four pieces after it, as the rows of VARIANTS12_LADDER name them.
VARIANTS12_AFTER_B = VARIANTS12_LADDER[VARIANTS12_LADDER.index(VARIANTS12_B):]


def stage12_after_b_table():
    """Version B, then the TMA store of O, persistent blocks, query tiles in pairs and work tiles back to
    back: TFLOP/s and each step's speed-up at every dtype, head_dim, causal setting and N, with the
    block's spread."""
    blocks = load_variants12()
    slugs = [variant_slug(v) for v in VARIANTS12_AFTER_B]
    lines = ["| dtype | head_dim | causal | N | version B | + TMA store of O | + persistent blocks | + pairs | "
             "+ back to back | TMA store / B | persistent / TMA store | pairs / persistent | "
             "back to back / pairs | spread |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for tag in ("bf16", "fp16"):
        for d in (128, 64):
            for causal in (False, True):
                for n in VARIANTS12_SEQS:
                    found = blocks.get((tag, d, causal, n))
                    if not found:
                        continue
                    t = [found[1][slug] for slug in slugs]
                    lines.append(f"| {tag} | {d} | {'yes' if causal else 'no'} | {n} | "
                                 + " | ".join(f"{r['tflops']:.1f}" for r in t) + " | "
                                 + " | ".join(f"{a['ms'] / b['ms']:.2f}x" for a, b in zip(t, t[1:]))
                                 + f" | {variant12_same(found[1]):.1f}% |")
    lines.append("")
    lines.append("Forward TFLOP/s on the FlashAttention grid, from the variant runs above; the ratios are the "
                 "time of the row before over the row's own (above 1: the piece helps). \"spread\": how far "
                 "apart the block's two timings of the registered kernel (work tiles back to back) are: ratios "
                 "closer to 1 than it are not resolved.")
    return "\n".join(lines)


# The tenth session's two pieces (bench/results/RUNS.md, 2026-11-26, tenth section): their variants against
# back to back, in blocks of stage12-variants output under "## call N, DTYPE, head_dim D" headings. Calls 2
# and 5 ran the registered non-causal kernels of both pieces (the causal kernels of call 5 and of call 3
# still held the unmasked left-over instance, which the final commit leaves out of causal kernels).
STORE_BEHIND_FILE = "h100_stage12_store_behind.txt"
STORE_BEHIND_SLUGS = (variant_slug("+ work tiles back to back"), variant_slug("+ O stored behind the next scores"),
                      variant_slug("+ odd last tile unmasked"))
STORE_BEHIND_ODD_CALLS = (2, 5)


def load_store_behind():
    """{call: {(dtype, head_dim, causal, N): {slug: row}}} of STORE_BEHIND_FILE."""
    calls, call = {}, None
    for line in (RESULTS / STORE_BEHIND_FILE).read_text().splitlines():
        heading = re.match(r"## call (\d+),", line)
        if heading:
            call = calls.setdefault(int(heading[1]), {})
            continue
        m = VARIANTS12_LINE.match(line)
        if m and call is not None:
            call.setdefault((m[1], int(m[2]), m[3] == "1", int(m[4])), {})[variant_slug(m[5])] = {
                "ms": float(m[6]), "tflops": float(m[7])}
    return calls


def stage12_store_behind_table():
    """Each piece's step, call by call: back to back over the store behind the next scores, and (not
    causal) the store behind over the odd last tile unmasked."""
    calls = load_store_behind()
    b2b, behind, odd = STORE_BEHIND_SLUGS
    lines = ["| dtype | head_dim | causal | N | store behind / back to back, calls " + ", ".join(map(str, calls))
             + " | odd tile unmasked / store behind, calls " + ", ".join(map(str, STORE_BEHIND_ODD_CALLS)) + " |",
             "|---|---|---|---|---|---|"]
    for tag in ("bf16", "fp16"):
        for d in (128, 64):
            for causal in (False, True):
                for n in VARIANTS12_SEQS:
                    key = (tag, d, causal, n)
                    steps = [f"{c[key][b2b]['ms'] / c[key][behind]['ms']:.3f}" for c in calls.values() if key in c]
                    odd_steps = [f"{calls[c][key][behind]['ms'] / calls[c][key][odd]['ms']:.3f}"
                                 for c in STORE_BEHIND_ODD_CALLS if key in calls.get(c, {})]
                    lines.append(f"| {tag} | {d} | {'yes' if causal else 'no'} | {n} | {', '.join(steps)} | "
                                 + (", ".join(odd_steps) if not causal else "(not in causal kernels)") + " |")
    lines.append("")
    lines.append("Each step is the time of the row before over the row's own, in the same block of "
                 "`stage12-variants` (above 1: the piece helps); call 5 ran head_dim 64 only. From "
                 f"`bench/results/{STORE_BEHIND_FILE}` (commands: `bench/results/RUNS.md`, tenth section).")
    return "\n".join(lines)


# The eleventh session's wider K/V tiles at head_dim 64 (bench/results/RUNS.md, 2026-11-26, eleventh section), in
# blocks of stage12-variants output under "## call N, DTYPE, head_dim 64[, --seq N]" headings, against the
# odd last tile unmasked (128 keys). In call 1 the 160-key kernel's row carries a stale label (the file's
# header says so).
WIDE_KEYS_FILE = "h100_stage12_wide_keys.txt"
WIDE_KEYS_BASE = variant_slug("+ odd last tile unmasked")
WIDE_KEYS_AGAIN = variant_slug("stage 12 as built")  # the same kernel, registered then, timed again
WIDE_KEYS_160 = (variant_slug("+ 192-key tiles at head_dim 64"), variant_slug("+ 160-key tiles at head_dim 64"))
WIDE_KEYS_THREE_STAGES = variant_slug("+ three K/V stages (160 keys)")
WIDE_KEYS_SEQS = (1024, 2048, 4096, 8192, 16384)
# hopper.cu's wide_key_tiles: the registered stage's choice.
WIDE_KEYS_MIN = {False: 2048, True: 4096}


def load_wide_keys():
    """{(dtype, causal, N): [{slug: ms} per block, in file order]} of WIDE_KEYS_FILE."""
    cells, call = {}, None
    for line in (RESULTS / WIDE_KEYS_FILE).read_text().splitlines():
        heading = re.match(r"## call (\d+),", line)
        if heading:
            call = int(heading[1])
            continue
        m = VARIANTS12_LINE.match(line)
        if m and call is not None:
            blocks = cells.setdefault((m[1], m[3] == "1", int(m[4])), {})
            blocks.setdefault(call, {})[variant_slug(m[5])] = float(m[6])
    return cells


def stage12_wide_keys_table():
    """160 keys a K/V tile at head_dim 64 over 128, call by call; three K/V stages with 160 keys over 128;
    and the spread of the two timings of the 128-key kernel in each block."""
    cells = load_wide_keys()
    lines = ["| dtype | causal | N | 160 keys / 128 keys (calls) | 160 keys, 3 stages / 128 keys | "
             "spread of the 128-key kernel | registered takes |",
             "|---|---|---|---|---|---|---|"]
    for tag in ("bf16", "fp16"):
        for causal in (False, True):
            for n in WIDE_KEYS_SEQS:
                blocks = cells.get((tag, causal, n), {})
                wide, three, spread = [], [], []
                for call, b in sorted(blocks.items()):
                    base = b[WIDE_KEYS_BASE]
                    wide += [f"{base / b[s]:.3f} ({call})" for s in WIDE_KEYS_160 if s in b]
                    if WIDE_KEYS_THREE_STAGES in b:
                        three.append(f"{base / b[WIDE_KEYS_THREE_STAGES]:.3f}")
                    spread.append(f"{max(base, b[WIDE_KEYS_AGAIN]) / min(base, b[WIDE_KEYS_AGAIN]):.3f}")
                keys = 160 if n >= WIDE_KEYS_MIN[causal] else 128
                lines.append(f"| {tag} | {'yes' if causal else 'no'} | {n} | {', '.join(wide)} | {', '.join(three)} | "
                             f"{', '.join(spread)} | {keys} keys |")
    lines.append("")
    lines.append("Head_dim 64, the FlashAttention grid; each ratio is the 128-key kernel's time (the odd last tile "
                 "unmasked) over the row's own in the same block of `stage12-variants` (above 1: 160 keys are "
                 "faster); the spread is how far apart the block's two timings of the 128-key kernel are. From "
                 f"`bench/results/{WIDE_KEYS_FILE}` (commands: `bench/results/RUNS.md`, eleventh section).")
    return "\n".join(lines)


# The twelfth session's causal schedules (bench/results/RUNS.md, 2026-11-26, twelfth section, call 2), in blocks of
# stage12-variants output under "## call 2, DTYPE, head_dim D[, --seq N]" headings, against variant 12. The three
# rows differ only causal: not causal, they are one launch timed three times.
TAIL_FILE = "h100_stage12_tail.txt"
TAIL_BASE = variant_slug("+ 160-key tiles (d64, long seq_kv)")
TAIL_AGAIN = variant_slug("stage 12 as built")  # variant 12, registered then, timed again
TAIL_SINGLES = variant_slug("+ single tiles after the pairs")
TAIL_ALWAYS = variant_slug("+ pairs at any head count")
SMS_H100 = 132  # the H100 SXM's SMs: hopper.cu pairs query tiles where the heads are more than half of them


def load_tail():
    """{(dtype, d, causal, N): {slug: ms}} of TAIL_FILE."""
    cells = {}
    for line in (RESULTS / TAIL_FILE).read_text().splitlines():
        m = VARIANTS12_LINE.match(line)
        if m:
            cells.setdefault((m[1], int(m[2]), m[3] == "1", int(m[4])), {})[variant_slug(m[5])] = float(m[6])
    return cells


def stage12_tail_table():
    """The two causal schedules over variant 12's, cell by cell, with the heads of the cell and what variant 12
    did there; and the spread of variant 12's two timings in each block."""
    lines = ["| dtype | d | causal | N | heads | variant 12 | single tiles after the pairs | pairs at any head count | "
             "spread of variant 12 |",
             "|---|---|---|---|---|---|---|---|---|"]
    for (tag, d, causal, n), b in sorted(load_tail().items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2], kv[0][3])):
        heads = FA_TOKENS // n * (FA_HEADS_TIMES_DIM // d)
        before = ("pairs" if 2 * heads > SMS_H100 else "one tile at a time") if causal else "(same launch)"
        base = b[TAIL_BASE]
        spread = max(base, b[TAIL_AGAIN]) / min(base, b[TAIL_AGAIN])
        # Without pairs there is no tail: variant 13 is variant 12's launch.
        same = " (same launch)" if causal and 2 * heads <= SMS_H100 else ""
        lines.append(f"| {tag} | {d} | {'yes' if causal else 'no'} | {n} | {heads} | {before} | "
                     f"{base / b[TAIL_SINGLES]:.3f}{same} | {base / b[TAIL_ALWAYS]:.3f} | {spread:.3f} |")
    lines.append("")
    lines.append("The FlashAttention grid (heads = B·H); each ratio is variant 12's time over the row's own in the same "
                 "block of `stage12-variants` (above 1: the schedule is faster). Not causal, the three rows are one "
                 "launch, and their ratios show how far two timings of one kernel move; so does the last column. From "
                 f"`bench/results/{TAIL_FILE}` (commands: `bench/results/RUNS.md`, twelfth section).")
    return "\n".join(lines)


def stage12_compare_table():
    """Stage 12's forward in bench/compare.py's runs: TFLOP/s, and its speed over stage 10,
    FlashAttention-2 (sdpa-flash) and cuDNN (sdpa-cudnn) in the same run, bf16 and fp16."""
    tags, bases = ("bf16", "fp16"), ("stage10", "sdpa-flash", "sdpa-cudnn")
    rows = {}
    for tag in tags:
        for r in json.loads((RESULTS / f"compare_h100_{tag}.json").read_text())["results"]:
            if r["status"] == "ok" and r["direction"] == "forward":
                rows[(tag, r["impl"], r["head_dim"], r["causal"], r["seq"])] = r
    keys = sorted({k[2:] for k in rows if k[1] == "stage12"})
    head = " | ".join(f"{tag}: TFLOP/s | × stage 10 | × FA2 | × cuDNN" for tag in tags)
    lines = [f"| d | causal | N | {head} |", "|---|---|---|" + "---|" * 4 * len(tags)]
    for d, c, n in keys:
        cells = []
        for tag in tags:
            r = rows[(tag, "stage12", d, c, n)]
            cells.append(f"{r['tflops']:.1f}")
            for base in bases:
                b = rows.get((tag, base, d, c, n))
                cells.append(f"{b['median_ms'] / r['median_ms']:.2f}x" if b else "–")
        lines.append(f"| {d} | {'yes' if c else 'no'} | {n} | " + " | ".join(cells) + " |")
    geo = []
    for tag in tags:
        geo.append("")
        for base in bases:
            mean, low = (value(f"{kind}/{tag}/stage12/{base}", runs={}) for kind in ("half-geo", "half-min"))
            geo.append(f"{mean}x (min {low}x)")
    lines.append("| geometric mean | | N >= 1024 | " + " | ".join(geo) + " |")
    lines.append("")
    lines.append("Forward, B·N = 16384 tokens, H·d = 2048; × X: X's median time over stage 12's in the same run "
                 "(above 1: stage 12 is faster); FA2 = `sdpa-flash` (FlashAttention-2), cuDNN = `sdpa-cudnn`, "
                 "PyTorch's SDPA backends. The geometric mean and its lowest cell are over N >= 1024, as "
                 "`bench/compare.py` computes them. From `bench/results/compare_h100_bf16.json` and "
                 "`compare_h100_fp16.json`.")
    return "\n".join(lines)


NCU12_METRICS = {  # alias -> (metric, row label, divisor, decimals)
    "time-ms": ("gpu__time_duration.sum", "kernel time (ms)", 1e6, 3),
    "tensor-pct": ("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
                   "tensor pipe active, `sm__pipe_tensor_op_hmma_cycles_active` (% of peak)", 1, 1),
    "gmma-pct": ("sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",
                 "`sm__pipe_tensor_op_gmma_cycles_active` (% of peak)", 1, 1),
    "gmma-inst": ("sm__inst_executed_pipe_tensor_op_gmma.sum", "wgmma instructions executed, warp-level", 1, 0),
    "sm-pct": ("sm__throughput.avg.pct_of_peak_sustained_elapsed", "SM throughput (% of peak)", 1, 1),
    "mem-pct": ("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
                "compute memory throughput (% of peak)", 1, 1),
    "dram-pct": ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "DRAM throughput (% of peak)", 1, 1),
    "warps-pct": ("sm__warps_active.avg.pct_of_peak_sustained_active", "warps active (% of 64 per SM)", 1, 1),
    "registers": ("launch__registers_per_thread", "registers per thread at launch", 1, 0),
}
# The FlashAttention grid the profiled benchmark runs (bench/bench_stages.cpp's half families).
FA_TOKENS, FA_HEADS_TIMES_DIM = 16384, 2048


def ncu_csv_rows(path):
    """The metric rows of an `ncu --csv` file whose program printed its own lines first (the
    benchmark's): (launch ID, kernel, grid, metric, value), the value a float, None where ncu wrote n/a."""
    for row in csv.reader(path.read_text().splitlines()):
        if len(row) != 15 or row[0] == "ID":
            continue
        try:
            value = float(row[14].replace(",", ""))
        except ValueError:
            value = None
        yield row[0], row[4], row[8], row[12], value


def load_ncu12(head_dim):
    """Stage 12's Nsight Compute files at head_dim D (h100_ncu_stage12_dD.csv and its _tensor.csv:
    Google Benchmark's lines, then ncu's CSV). Returns {"metrics": {metric: [value per launch, None
    where ncu wrote n/a]}, "kernel", "grid", "seq"}."""
    out = {"metrics": {}, "kernel": None, "grid": None, "seq": None}
    for suffix in ("", "_tensor"):
        path = RESULTS / f"h100_ncu_stage12_d{head_dim}{suffix}.csv"
        bench = re.search(r"stage12_hopper/bf16/d(\d+)/causal0/seq:(\d+)", path.read_text())
        if not bench or int(bench[1]) != head_dim:
            raise KeyError(f"{path.name} is not the head_dim {head_dim} benchmark")
        out["seq"] = int(bench[2])
        for _, kernel, grid, metric, value in ncu_csv_rows(path):
            out["kernel"], out["grid"] = kernel, int(re.match(r"\((\d+),", grid)[1])
            out["metrics"].setdefault(metric, []).append(value)
    return out


# Nsight Compute of the persistent kernel without and with query tiles in pairs (RUNS.md, 2026-11-25,
# fifth session, call 5): bf16, head_dim 128, causal, N = 1024, the launches of stage12-variants' first
# block that the kernel filter caught. alias -> (metric, divisor, decimals).
NCU12_L2_FILES = {"persistent": "h100_ncu_stage12_persistent_l2.csv", "pairs": "h100_ncu_stage12_pairs_l2.csv"}
NCU12_L2_METRICS = {"time-us": ("gpu__time_duration.sum", 1e3, 1), "dram-mb": ("dram__bytes_read.sum", 1e6, 0),
                    "l2-hit-pct": ("lts__t_sector_hit_rate.pct", 1, 1),
                    "tensor-pct": ("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active", 1, 1)}


def ncu12_l2_value(variant, what):
    """The mean over the profiled launches of one metric of NCU12_L2_FILES[variant], or "launches"."""
    rows = list(ncu_csv_rows(RESULTS / NCU12_L2_FILES[variant]))
    if what == "launches":
        return str(len({launch for launch, *_ in rows}))
    metric, divisor, decimals = NCU12_L2_METRICS[what]
    values = [v for _, _, _, m, v in rows if m == metric]
    if not values or any(v is None for v in values):
        raise KeyError(f"{metric} missing from {NCU12_L2_FILES[variant]}")
    return f"{sum(values) / len(values) / divisor:,.{decimals}f}"


def ncu12_value(head_dim, what):
    """One figure of stage 12's profile, as text: an alias of NCU12_METRICS (the mean over the launches
    profiled; "n/a" where ncu gave no value), tflops (the FlashAttention convention's FLOPs of the
    profiled problem over the mean kernel time), wgmma-count (the wgmma instructions, warp-level, that
    the kernel issues by its construction: blocks x key tiles x 2 consumers x (head_dim/16 + 128/16)
    x 4 warps, to set beside gmma-inst) or launches."""
    p = load_ncu12(head_dim)
    n = p["seq"]
    if what == "launches":
        return str(len(p["metrics"]["gpu__time_duration.sum"]))
    if what == "wgmma-count":
        tiles = -(-n // 128)
        return f"{p['grid'] * tiles * 2 * (head_dim // 16 + 128 // 16) * 4:,}"
    if what == "tflops":
        times = p["metrics"]["gpu__time_duration.sum"]
        heads = FA_HEADS_TIMES_DIM // head_dim
        if p["grid"] != FA_TOKENS // n * heads * -(-n // 128):
            raise KeyError(f"the profiled grid ({p['grid']} blocks) is not the FlashAttention grid at N={n}")
        flops = 4 * FA_TOKENS * n * FA_HEADS_TIMES_DIM
        return f"{flops / (sum(times) / len(times) * 1e-9) / 1e12:.1f}"
    metric, _, divisor, decimals = NCU12_METRICS[what]
    values = p["metrics"][metric]
    if any(v is None for v in values):
        if all(v is None for v in values):
            return "n/a"
        raise KeyError(f"{metric} is n/a in some launches only")
    return f"{sum(values) / len(values) / divisor:,.{decimals}f}"


def ncu_stage12_table():
    """Stage 12's profile at both head_dims, one row per figure."""
    dims = (64, 128)
    p = load_ncu12(128)
    kernel = re.sub(r"<__nv_bfloat16, 128,", "<__nv_bfloat16, D,", p["kernel"].split("(")[0].replace("void ", ""))
    lines = ["| metric | " + " | ".join(f"d={d}" for d in dims) + " |", "|---|" + "---|" * len(dims)]
    rows = [("time-ms", None), ("tflops", "TFLOP/s over the kernel time (FlashAttention convention)"),
            ("tensor-pct", None), ("gmma-pct", None), ("gmma-inst", None),
            ("wgmma-count", "wgmma instructions the kernel issues by construction, warp-level"),
            ("sm-pct", None), ("mem-pct", None), ("dram-pct", None), ("warps-pct", None), ("registers", None)]
    for what, label in rows:
        label = label or NCU12_METRICS[what][1]
        lines.append(f"| {label} | " + " | ".join(ncu12_value(d, what) for d in dims) + " |")
    lines.append("")
    lines.append(f"Nsight Compute (`--clock-control none`) of `{kernel}`, bf16, not causal, N = {p['seq']}, "
                 f"B·N = {FA_TOKENS}, H·d = {FA_HEADS_TIMES_DIM}; the mean of the {ncu12_value(128, 'launches')} "
                 "launches profiled. \"n/a\": the value ncu wrote for that metric on this GPU. From "
                 "`bench/results/h100_ncu_stage12_d64.csv`, `h100_ncu_stage12_d128.csv` and their `_tensor.csv` "
                 "(commands: `bench/results/RUNS.md`).")
    return "\n".join(lines)


def sanitizer_clean(stem, subject):
    """"N of M": how many lines of bench/results/STEM.txt that name `subject` report a clean run (exit
    status 0 and no error or hazard in the tool's summary)."""
    lines = [line for line in (RESULTS / f"{stem}.txt").read_text().splitlines() if subject in line]
    if not lines:
        raise KeyError(f"no line of {stem}.txt names {subject}")
    summaries = ("ERROR SUMMARY: 0 errors", "RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)")
    clean = [line for line in lines if "rc=0" in line and any(summary in line for summary in summaries)]
    return f"{len(clean)} of {len(lines)}"


def ctest_value(what, log="h100_ctest"):
    """A figure of a ctest log of bench/results (the full suite's, h100_ctest.log, unless log names another):
    passed, total, skipped, or one test's status (Passed, Failed, Skipped, Timeout, ...) by its ctest name."""
    text = (RESULTS / f"{log}.log").read_text()
    results = dict(re.findall(r"Test\s+#\d+: (\S+) \.+\**\s*(Passed|Failed|Skipped|Not Run|Timeout)", text))
    if what == "total":
        return re.search(r"tests passed(?:, \d+ tests failed)? out of (\d+)", text)[1]
    if what == "passed":
        return str(sum(1 for s in results.values() if s == "Passed"))
    if what == "skipped":
        return str(sum(1 for s in results.values() if s in ("Skipped", "Not Run")))
    return results[what]


def backward_split_table():
    """Time of each backward kernel (scripts/profile/profile_backward.sh): what the dQ pass costs."""
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
                 "From `bench/results/h100_ncu_backward.csv` (`scripts/profile/profile_backward.sh`).")
    return "\n".join(lines)


def ptxas_backward_table():
    """Registers and spills of stage 07's two main kernels, as ptxas reports them (ptxas_sm90.txt)."""
    def cell(kernel, d):
        f = {w: value(f"ptxas/07/{kernel}/d{d}/{w}", runs={}) for w in ("registers", "stack", "spill-stores", "spill-loads")}
        if f["stack"] == f["spill-stores"] == f["spill-loads"] == "0":
            return f"{f['registers']} registers, no spill"
        return (f"{f['registers']} registers; {f['stack']}-byte stack frame, {f['spill-stores']} bytes of spill "
                f"stores, {f['spill-loads']} of spill loads")
    version = (RESULTS / "ptxas_sm90.txt").read_text().splitlines()[0]
    lines = ["| kernel | d=64 | d=128 |", "|---|---|---|"]
    for kernel, label in (("dk_dv_kernel", "2. dK, dV"), ("dq_kernel", "3. dQ")):
        lines.append(f"| {label} | {cell(kernel, 64)} | {cell(kernel, 128)} |")
    lines.append("")
    lines.append(f"`nvcc -O3 -std=c++17 -arch=sm_90 -Xptxas -v` ({version.strip()}). From "
                 f"`bench/results/ptxas_sm90.txt`, written by `scripts/device/ptxas_report.sh`.")
    return "\n".join(lines)


def ptxas_stage11_entries():
    """Stage 11's kernels in ptxas_sm90.txt: (kernel, dtype, head_dim, causal, dq mode, rows) -> (registers,
    stack, spill stores, spill loads), from the mangled names (stage11::dk_dv_kernel<Element, kHeadDim,
    kCausal, DqMode, Config>, stage11::dq_kernel<Element, kHeadDim, kCausal, Config>). The dq mode is
    DqMode's value for dk_dv_kernel (0 second pass, 1 red.global.add, 2 bulk copy), None for dq_kernel."""
    text = (RESULTS / "ptxas_sm90.txt").read_text()
    entry = re.compile(r"Function properties for _ZN7stage11\d+((?:dk_dv|dq)_kernel)I(6__half|13__nv_bfloat16)"
                       r"Li(\d+)ELb([01])E(?:LNS_6DqModeE([012])E)?(?:NS_13KeyTileConfigILi\d+ELi(\d+)E)?\w*\n\s*(\d+) bytes "
                       r"stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads\nptxas info\s*: Used (\d+) registers")
    out = {}
    for m in entry.finditer(text):
        dtype = "fp16" if m[2] == "6__half" else "bf16"
        mode = int(m[5]) if m[5] else None
        rows = int(m[6]) if m[6] else 0  # dk_dv_kernel's query rows per step; 0 for dq_kernel
        out[(m[1], dtype, int(m[3]), m[4] == "1", mode, rows)] = tuple(int(m[i]) for i in (10, 7, 8, 9))
    if not out:
        raise KeyError("stage 11 in ptxas_sm90.txt")
    return out


def ptxas_stage12_entries():
    """Stage 12's kernels in ptxas_sm90.txt (compiled for sm_90a): (dtype, head_dim, causal, config) ->
    (registers, stack, spill stores, spill loads); config is HopperConfig's arguments joined by '-'
    (consumers, keys per tile, stages, then setmaxnreg, ping-pong, overlap, TMA store as 0/1, then Q
    buffers, then back to back, store behind the next scores, odd last tile unmasked as 0/1), e.g.
    2-128-2-0-0-0-0-1-0-0-0."""
    text = (RESULTS / "ptxas_sm90.txt").read_text()
    entry = re.compile(r"Function properties for _ZN7stage1213hopper_kernelI(6__half|13__nv_bfloat16)Li(\d+)ELb([01])E"
                       r"NS_12HopperConfigILi(\d+)ELi(\d+)ELi(\d+)ELb([01])ELb([01])ELb([01])ELb([01])ELi(\d+)ELb([01])ELb([01])ELb([01])E\w*\n"
                       r"\s*(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads\nptxas info\s*: "
                       r"Used (\d+) registers")
    out = {}
    for m in entry.finditer(text):
        dtype = "fp16" if m[1] == "6__half" else "bf16"
        out[(dtype, int(m[2]), m[3] == "1", "-".join(m[i] for i in range(4, 15)))] = tuple(
            int(m[i]) for i in (18, 15, 16, 17))
    if not out:
        raise KeyError("stage 12 in ptxas_sm90.txt")
    return out


def ptxas_stage11_table():
    """Registers and spills of stage 11's dk_dv_kernel (both modes) and dq_kernel per head_dim, the
    largest over dtype and causal (ptxas_sm90.txt)."""
    entries = ptxas_stage11_entries()
    def cell(kernel, d, mode, rows):
        found = [v for (k, _, hd, _, md, r), v in entries.items() if (k, hd, md, r) == (kernel, d, mode, rows)]
        regs = max(v[0] for v in found)
        spill = max(found, key=lambda v: v[2])
        return f"{regs}" + (f" ({spill[2]} bytes spilled)" if spill[2] else "")
    columns = ((32, 64), (64, 128), (64, 64), (128, 64))  # (head_dim, dk_dv_kernel's query rows per step)
    lines = ["| kernel | head_dim 32 | head_dim 64 | head_dim 64, 64 rows | head_dim 128 |", "|---|---|---|---|---|"]
    for kernel, mode, label in (("dk_dv_kernel", 2, "`dk_dv_kernel`, default, dQ by bulk copy"),
                                ("dk_dv_kernel", 1, "`dk_dv_kernel`, default, dQ by `red.global.add`"),
                                ("dk_dv_kernel", 0, "`dk_dv_kernel`, deterministic")):
        lines.append(f"| {label} | " + " | ".join(cell(kernel, d, mode, r) for d, r in columns) + " |")
    lines.append("| `dq_kernel` (deterministic) | " + cell("dq_kernel", 32, None, 0) + " | " +
                 cell("dq_kernel", 64, None, 0) + " | (the same) | " + cell("dq_kernel", 128, None, 0) + " |")
    version = (RESULTS / "ptxas_sm90.txt").read_text().splitlines()[0]
    lines.append("")
    lines.append(f"Registers per thread (sm_90), the largest over bf16/fp16 and causal on/off, with the spill "
                 f"stores where ptxas reports any. Head_dim 64 runs 128 query rows per step where a block may use "
                 f"162 KiB of shared memory, 64 rows (the column beside it) below. `nvcc -O3 -std=c++17 -arch=sm_90 -Xptxas -v` ({version.strip()}). "
                 f"From `bench/results/ptxas_sm90.txt`, written by `scripts/device/ptxas_report.sh`.")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Stage 04 -> 05 one change at a time, stage 06's block order (bench/stage05_ablation.cu)
# ---------------------------------------------------------------------------------------------

ABLATION = RESULTS / "h100_stage05_ablation.txt"
# d64   causal=0 N=4096   tiles       12.345 ms   11.13 TFLOP/s PASS vs_fp64=6.0e-07 vs_s05=5.1e-07 | label
# d64   causal=0 N=4096   tiles    FAIL, not timed: why | label
ABLATION_LINE = re.compile(r"d(\d+)\s+causal=([01])\s+N=(\d+)\s+(\w+)\s+"
                           r"(?:([\d.]+) ms\s+([\d.]+) TFLOP/s PASS|FAIL)[^|]*\|\s*(.+)$")
# What each rung switches on, in a few words for running text (value:ablation-top/...).
ABLATION_SHORT = {"tiles": "the larger tiles", "oneexp": "one expf per score", "warprows": "warp-owned rows",
                  "regtile": "register tiles", "shuffle": "the warp shuffles", "float4": "the float4 loads",
                  "transp": "the transposed P", "pad4": "the padding of 4"}


def load_ablation():
    """({(head_dim, causal, seq, key): {"ms", "tflops", "label"}}, the ladder's keys in order, the header).
    "ms" is None for a variant that failed its checks and was not timed."""
    runs, ladder, header = {}, [], ""
    for line in ABLATION.read_text().splitlines():
        if line.startswith("# stage05-ablation"):
            header = line
        m = ABLATION_LINE.match(line)
        if not m:
            continue
        d, causal, n, key = int(m[1]), m[2] == "1", int(m[3]), m[4]
        runs[(d, causal, n, key)] = {"ms": float(m[5]) if m[5] else None,
                                     "tflops": float(m[6]) if m[6] else None, "label": m[7].strip()}
        if not causal and n == COURSE_SEQ and key not in ladder:
            ladder.append(key)
    # The ladder runs from stage 04 as built to stage 05 as built; stage 06's non-causal line is not a rung.
    ladder = ladder[ladder.index("s04"):ladder.index("s05") + 1]
    return runs, ladder, header


def ablation_ms(runs, d, key, causal=False, n=COURSE_SEQ):
    r = runs[(d, causal, n, key)]
    if r["ms"] is None:
        raise KeyError(f"{key} at d{d} failed its checks and was not timed")
    return r["ms"]


def ablation_gain(runs, ladder, d, key):
    """Time of the rung before key over key's: what key's change buys."""
    i = ladder.index(key)
    if i == 0:
        raise KeyError(f"{key} is the first rung")
    return ablation_ms(runs, d, ladder[i - 1]) / ablation_ms(runs, d, key)


def ablation_top(runs, ladder, d):
    """The key of the rung (tiles .. pad4) whose change gains most at head_dim d, where it stands."""
    rungs = [k for k in ladder if k in ABLATION_SHORT]
    return max(rungs, key=lambda k: ablation_gain(runs, ladder, d, k))


def ablation_table():
    runs, ladder, header = load_ablation()
    dims = sorted({k[0] for k in runs})
    lines = ["| step | what it switches on | " + " | ".join(f"d={d}: ms | × step | × stage 04" for d in dims) + " |",
             "|---|---|" + "---|---|---|" * len(dims)]
    for key in ladder:
        # Identifiers (stage04::forward, __syncwarp) as code, so that Markdown leaves their underscores alone.
        label = re.sub(r"(\w+::\w+|__\w+)", r"`\1`", runs[(dims[0], False, COURSE_SEQ, key)]["label"])
        cells = []
        for d in dims:
            r = runs.get((d, False, COURSE_SEQ, key))
            if not r or r["ms"] is None:
                cells += ["FAIL (not timed)", "–", "–"]
                continue
            try:
                step = f"{ablation_gain(runs, ladder, d, key):.2f}"
            except KeyError:
                step = "–"
            cells += [f"{r['ms']:.2f}", step, f"{ablation_ms(runs, d, 's04') / r['ms']:.2f}"]
        lines.append(f"| `{key}` | {label} | " + " | ".join(cells) + " |")
    runs_note = re.search(r"median of (\d+)", header)
    lines.append("")
    lines.append(f"fp32 forward, batch 4, 16 heads, seq {COURSE_SEQ}, not causal, on the H100 of the course; "
                 f"median of {runs_note[1] if runs_note else 'the'} CUDA-event timings. Each rung of "
                 "`bench/stage05_ablation.cu`'s kernel adds one change to the rung above it; `base` is stage 04's "
                 "scheme and `pad4` stage 05's kernel, line for line. × step: the time of the row above over this "
                 "row's; × stage 04: stage 04's time over this row's. Every variant matched the fp64 reference "
                 "and stage 05's output before it was timed. From `bench/results/h100_stage05_ablation.txt` "
                 "(`scripts/device/gpu_check_ablation.sh`).")
    return "\n".join(lines)


def causal_predicted(n):
    """Visited tiles over all tiles of stage 06 at seq_q = seq_kv = n, 64-row query tiles: 1/2 + 1/(2T),
    T = n/64 (lesson 06). A count, not a measurement."""
    return 0.5 + 32 / n


def stage06_order_table():
    runs, _, _ = load_ablation()
    keys = sorted({(k[0], k[2]) for k in runs if k[1]})
    lines = ["| head_dim | N | not causal (ms) | causal (ms) | causal / not causal | visited tiles / all "
             "| natural order (ms) | heaviest first (ms) | natural / heaviest first |",
             "|---|---|---|---|---|---|---|---|---|"]
    for d, n in keys:
        def ms(key, causal):
            r = runs.get((d, causal, n, key))
            return r["ms"] if r and r["ms"] is not None else None
        nc, c, nat, heavy = ms("s06", False), ms("s06", True), ms("natural", True), ms("heavy", True)
        cell = lambda x: f"{x:.3f}" if x is not None else "FAIL"
        ratio = lambda a, b: f"{a / b:.2f}" if a is not None and b is not None else "–"
        lines.append(f"| {d} | {n} | {cell(nc)} | {cell(c)} | {ratio(c, nc)} | {causal_predicted(n):.3f} | "
                     f"{cell(nat)} | {cell(heavy)} | {ratio(nat, heavy)} |")
    lines.append("")
    lines.append("Stage 06, fp32, course grid (batch·N = 16384 tokens, 16 heads), measured back to back in one "
                 "program: stage 06 as built, causal and not; and its kernel with the heaviest blocks first (as "
                 "built) and in the natural block order, each checked against the fp64 reference and stage 06 "
                 "first. Visited tiles / all is the tile count's prediction for the causal/non-causal time, not a "
                 "measurement. From `bench/results/h100_stage05_ablation.txt` (`bench/stage05_ablation.cu`).")
    return "\n".join(lines)


# Table name -> the results file it is made from, for the tables that need a file not every checkout
# has yet; a missing one leaves the table out of tables() and is named in MISSING (--check fails on a
# page that asks for it, saying which file to add).
MISSING = {}
# stage13_decoding/bf16/decode/d128/h32kv8/batch:1/seq_kv:131072 (decode_paged64/...: the paged cache)
DECODE_NAME = re.compile(r"stage(\d\d)_\w+/(\w+)/decode(?:_paged(\d+))?/d(\d+)/h(\d+)kv(\d+)/batch:(\d+)/seq_kv:(\d+)")


def not_measured_yet(path):
    """The text of a table whose results file is not committed yet."""
    return (f"Not measured yet: `scripts/device/gpu_check_decode.sh` writes `{path.relative_to(ROOT).as_posix()}` on the "
            "GPU machine; once it is committed, `python3 scripts/docs/make_tables.py --update` fills this table.")


def load_decode_bench():
    """{(page_size or 0, batch, seq_kv): result} of the benchmark's decode family, with its problem."""
    runs = {}
    for b in json.loads(DECODE_BENCH.read_text())["benchmarks"]:
        m = DECODE_NAME.match(b["name"])
        if not m or "GB/s" not in b:
            continue
        runs[(int(m[3] or 0), int(m[7]), int(m[8]))] = dict(
            stage=int(m[1]), dtype=m[2], d=int(m[4]), hq=int(m[5]), hkv=int(m[6]), gbs=b["GB/s"],
            us=b["median_ms"] * 1e3)
    return runs


# The three shapes stage 13 is measured against (lesson 13): (batch, seq_kv), 32 query heads on 8 K/V heads.
DECODE_TARGETS = ((1, 131072), (8, 32768), (64, 4096))
DECODE_GOAL = 0.80  # the stage's target: this share of the HBM datasheet's bandwidth at each target shape
# "On par" in value:decode-versus: stage 13's time within 2% of SDPA's flash backend. It was set when
# compare.py's timings of small calls still held host time (before DECODE_HOLD_CYCLES), and the
# benchmark's and compare.py's timings of one call differed by up to 1.7%; it is kept, so that a
# sentence calls "faster" only what is faster by more than that.
DECODE_PAR = 0.02


def load_decode_compare():
    """{(impl, batch, seq_kv): row} of compare.py --decode's runs that succeeded."""
    return {(r["impl"], r["batch"], r["seq_kv"]): r
            for r in json.loads(DECODE_COMPARE.with_suffix(".json").read_text())["results"] if r["status"] == "ok"}


def decode_compare_ratio(batch, seq_kv):
    """sdpa-flash's median time over stage 13's, as compare.py's last column computes it."""
    rows = load_decode_compare()
    return rows[("sdpa-flash", batch, seq_kv)]["median_us"] / decode_compare_stage(rows, batch, seq_kv)["median_us"]


def decode_compare_stage(rows, batch, seq_kv):
    """The stage's own row (contiguous cache) of compare.py --decode at (batch, seq_kv)."""
    for (impl, b, n), r in rows.items():
        if (b, n) == (batch, seq_kv) and impl.startswith("stage") and not impl.endswith("-paged"):
            return r
    raise KeyError(f"no stage row at batch {batch}, seq_kv {seq_kv} in {DECODE_COMPARE.with_suffix('.json').name}")


def decode_target_gbs(source):
    """GB/s at the three target shapes: bench (contiguous), paged (the benchmark's paged cache) or compare."""
    if source == "compare":
        rows = load_decode_compare()
        return [decode_compare_stage(rows, *shape)["gbs"] for shape in DECODE_TARGETS]
    runs = load_decode_bench()
    if source == "bench":
        return [runs[(0, *shape)]["gbs"] for shape in DECODE_TARGETS]
    if source == "paged":
        pages = sorted({k[0] for k in runs if k[0]})
        return [runs[(pages[0], *shape)]["gbs"] for shape in DECODE_TARGETS]
    raise KeyError(source)


def decode_bench_table():
    """Stage 13's decode family: GB/s over the K and V bytes and the share of the HBM datasheet figure."""
    if not DECODE_BENCH.exists():
        return not_measured_yet(DECODE_BENCH)
    runs = load_decode_bench()
    hbm_gbs = float(load_anchors()["hbm"]) * 1e3
    pages = sorted({k[0] for k in runs if k[0]})
    shapes = [k[1:] for k in runs if k[0] == 0]  # the benchmark's order: the three targets, then the sweep
    any_run = next(iter(runs.values()))
    head = "| batch | seq_kv | K+V (MiB) | µs | GB/s | of HBM |"
    for page in pages:
        head += f" paged ({page}-key pages): GB/s | of HBM |"
    lines = [head, "|---|---|---|---|---|---|" + "---|---|" * len(pages)]
    for batch, seq_kv in shapes:
        r = runs[(0, batch, seq_kv)]
        kv_mib = 2 * batch * r["hkv"] * seq_kv * r["d"] * 2 / 2 ** 20
        cells = [f"{r['us']:.1f}", f"{r['gbs']:.0f}", f"{100 * r['gbs'] / hbm_gbs:.0f}%"]
        for page in pages:
            pr = runs.get((page, batch, seq_kv))
            cells += [f"{pr['gbs']:.0f}", f"{100 * pr['gbs'] / hbm_gbs:.0f}%"] if pr else ["–", "–"]
        lines.append(f"| {batch} | {seq_kv} | {kv_mib:.0f} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(f"Stage {any_run['stage']:02d}, {any_run['dtype']}, one new query per sequence, {any_run['hq']} query "
                 f"heads on {any_run['hkv']} K/V heads, head_dim {any_run['d']}; GB/s are the K and V bytes "
                 f"(2·B·{any_run['hkv']}·N·{any_run['d']}·2) over the median time, L2 flushed before every call; of HBM: "
                 f"against the datasheet's {load_anchors()['hbm']} TB/s (`bench/results/pytorch_anchors_h100.md`). "
                 "From `bench/results/h100_bench_decode.json` (`flash-stages-bench --benchmark_filter=decode`).")
    return "\n".join(lines)


def decode_compare_table():
    """Stage 13 against SDPA's flash backend: bench/compare.py --decode's own table, as it wrote it."""
    if not DECODE_COMPARE.exists():
        return not_measured_yet(DECODE_COMPARE)
    text = DECODE_COMPARE.read_text()
    body = text[text.index("GB/s over the K and V bytes"):text.index("## Notes")].strip()
    made_by = next(line for line in text.splitlines() if line.startswith("Made by"))
    return f"{made_by}\n\n{body}\n\nNotes: `bench/results/compare_h100_decode.md`; the plot: " \
           "`bench/results/compare_h100_decode.png`."


# bench/stage13_splits.cu's output: a header line per shape, then one line per forced split count.
DECODE_SPLITS_SHAPE = re.compile(r"batch (\d+), seq_kv (\d+): .* choose_splits (\d+)")
DECODE_SPLITS_ROW = re.compile(r"\s+splits\s+(\d+)\s+blocks\s+(\d+)\s+([\d.]+) us\s+(\d+) GB/s")


def load_decode_splits():
    """{(batch, seq_kv): {"chosen": splits, "rows": {splits: (blocks, us, gbs)}}} of stage13-splits."""
    shapes, current = {}, None
    for line in DECODE_SPLITS.read_text().splitlines():
        if m := DECODE_SPLITS_SHAPE.match(line):
            current = shapes.setdefault((int(m[1]), int(m[2])), {"chosen": int(m[3]), "rows": {}})
        elif (m := DECODE_SPLITS_ROW.match(line)) and current is not None:
            current["rows"][int(m[1])] = (int(m[2]), float(m[3]), int(m[4]))
    return shapes


def decode_splits_table(batch, seq_kv):
    """Stage 13 at every forced split count of one shape, choose_splits's count marked."""
    shape = load_decode_splits()[(batch, seq_kv)]
    hbm_gbs = float(load_anchors()["hbm"]) * 1e3
    lines = ["| splits | blocks | µs | GB/s | of HBM |", "|---|---|---|---|---|"]
    for splits, (blocks, us, gbs) in sorted(shape["rows"].items()):
        mark = " (choose_splits)" if splits == shape["chosen"] else ""
        lines.append(f"| {splits}{mark} | {blocks} | {us:.1f} | {gbs} | {100 * gbs / hbm_gbs:.0f}% |")
    lines.append("")
    lines.append(f"Batch {batch}, {seq_kv} keys, bf16, 32 query heads on 8 K/V heads, head_dim 128, one new query; "
                 "median of 30 calls, L2 flushed before each. From `bench/results/h100_stage13_splits.txt` "
                 "(`build/bin/stage13-splits`).")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Stage 11's backward: compare.py's backward columns, Nsight Compute per kernel, the bf16 training run,
# the case that changed the half backward's rule
# ---------------------------------------------------------------------------------------------

# The backward columns of the stage 11 table: the stage in its two modes, FlashAttention-2, cuDNN.
BACKWARD_TC_IMPLS = ("stage11", "stage11-det", "sdpa-flash", "sdpa-cudnn")


def load_half_backward(tag):
    """{(impl, head_dim, causal, seq): row} of the backward runs that succeeded in compare_h100_TAG.json."""
    return {(r["impl"], r["head_dim"], r["causal"], r["seq"]): r
            for r in json.loads((RESULTS / f"compare_h100_{tag}.json").read_text())["results"]
            if r["status"] == "ok" and r["direction"] == "backward"}


def geo_mean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def backward_tc_table(tag):
    """Stage 11's backward against PyTorch's backends in one dtype, from compare_h100_TAG.json: TFLOP/s of
    both modes, FlashAttention-2 (sdpa-flash) and cuDNN, the default mode's speed over FlashAttention-2
    and the deterministic mode's over the default's (time over time, as value:half-bwd-geo computes them),
    with their geometric means over N >= 1024."""
    rows = load_half_backward(tag)
    keys = sorted({k[1:] for k in rows if k[0] == "stage11"})
    lines = ["| d | causal | N | " + " | ".join(BACKWARD_TC_IMPLS) + " | stage11 / flash | stage11-det / stage11 |",
             "|---|---|---|" + "---|" * (len(BACKWARD_TC_IMPLS) + 2)]
    over_flash, det_over = [], []
    for d, causal, n in keys:
        cells = [f"{rows[(i, d, causal, n)]['tflops']:.1f}" if (i, d, causal, n) in rows else "–"
                 for i in BACKWARD_TC_IMPLS]
        ms = {i: rows[(i, d, causal, n)]["median_ms"] for i in BACKWARD_TC_IMPLS if (i, d, causal, n) in rows}
        ratios = []
        for num, den, kept in (("sdpa-flash", "stage11", over_flash), ("stage11", "stage11-det", det_over)):
            if num in ms and den in ms:
                ratios.append(f"{ms[num] / ms[den]:.2f}x")
                if n >= 1024:
                    kept.append(ms[num] / ms[den])
            else:
                ratios.append("–")
        lines.append(f"| {d} | {'yes' if causal else 'no'} | {n} | " + " | ".join(cells + ratios) + " |")
    lines.append("| geometric mean | | N >= 1024 | " + " | " * (len(BACKWARD_TC_IMPLS) - 1) +
                 f" | {geo_mean(over_flash):.2f}x (min {min(over_flash):.2f}x) | "
                 f"{geo_mean(det_over):.2f}x (min {min(det_over):.2f}x) |")
    meta = json.loads((RESULTS / f"compare_h100_{tag}.json").read_text())["meta"]
    lines.append("")
    lines.append(f"Backward TFLOP/s, {meta['dtype']}, {meta['gpu']}, PyTorch {meta['torch']} (FlashAttention convention: "
                 "2.5 × the forward's 4·B·H·N²·d, halved when causal); B·N = 16384 tokens, H·d = 2048. stage11: "
                 "dQ by atomics; stage11-det: the deterministic mode; sdpa-flash: PyTorch's FlashAttention-2 "
                 "backend. The ratios are speeds (the other's time over this one's) in the same run. From "
                 f"`bench/results/compare_h100_{tag}.json` (`bench/compare.py --dtype {meta['dtype']}`).")
    return "\n".join(lines)


def stage11_best_rounds(calls):
    """{(call, version): {(d, causal, n): ms}} from h100_stage11_steps.txt for the given calls (bf16): per
    cell the fastest of the call's rounds."""
    best, call, version = {}, None, None
    for line in (RESULTS / "h100_stage11_steps.txt").read_text().splitlines():
        m = re.match(r"## call (\d+) round \d+: (\S+)", line)
        if m:
            call, version = int(m[1]), m[2]
            continue
        m = re.match(r"stage11_backward_tc/bf16/d(\d+)/causal(\d)/backward/seq:(\d+) ([\d.]+)", line)
        if m and call in calls:
            cell = best.setdefault((call, version), {})
            key = (int(m[1]), m[2] == "1", int(m[3]))
            cell[key] = min(cell.get(key, float("inf")), float(m[4]))
    return best


# stage11-steps: (version, label) in the order the lesson takes them. Each is compared with the version
# it was timed against in the same call (h100_stage11_steps.txt says which call timed which).
STAGE11_STEPS = (("two-barriers", "two barriers"), ("one-barrier", "one barrier"),
                 ("br64", "larger step"), ("two-blocks", "2 blocks per SM"))


def stage11_steps_table():
    """dk_dv_kernel's measured changes: per cell, each version's fastest round (ms per backward call), and
    its speed over the version it is compared with, timed in the same call: one-barrier over two-barriers
    (call 2), br64 and two-blocks over one-barrier (call 3)."""
    best = stage11_best_rounds((2, 3))
    pairs = ((2, "one-barrier", "two-barriers"), (3, "br64", "one-barrier"), (3, "two-blocks", "one-barrier"))
    label = dict(STAGE11_STEPS)
    lines = ["| d | causal | N | " + " | ".join(f"{label[v]} (ms)" for v, _ in STAGE11_STEPS) + " | " +
             " | ".join(f"{label[num]} / {label[den]}" for _, num, den in pairs) + " |",
             "|---|---|---|" + "---|" * (len(STAGE11_STEPS) + len(pairs))]
    keys = sorted(best[(2, "two-barriers")])
    gains = [[] for _ in pairs]
    for key in keys:
        d, causal, n = key
        times = [best[(2, "two-barriers")][key], best[(2, "one-barrier")][key], best[(3, "br64")][key],
                 best[(3, "two-blocks")][key]]
        ratios = []
        for i, (c, num, den) in enumerate(pairs):
            r = best[(c, den)][key] / best[(c, num)][key]
            gains[i].append(r)
            ratios.append(f"{r:.2f}x")
        lines.append(f"| {d} | {'yes' if causal else 'no'} | {n} | " + " | ".join(f"{t:.3f}" for t in times) +
                     " | " + " | ".join(ratios) + " |")
    lines.append("| geometric mean | | | " + " | " * (len(STAGE11_STEPS) - 1) + " | " +
                 " | ".join(f"{geo_mean(g):.2f}x" for g in gains) + " |")
    lines.append("")
    lines.append("dk_dv_kernel's changes, bf16, default mode, one backward call on the benchmark's problem "
                 "(B·N = 16384, H·d = 2048), NVIDIA H100 80GB HBM3. Two barriers: the kernel before these changes, "
                 "$B_r$ = 32 at head_dim 128; one barrier: one barrier per step, $dS^\\top$ double-buffered; larger "
                 "step: one barrier with $B_r$ = 64 at head_dim 128 (kept) and 128 at head_dim 64 (not kept then: 162 KiB "
                 "of shared memory); 2 blocks per SM: one barrier with 4 warps ($B_c$ = 64) per block, $B_r$ as "
                 "one barrier's. Each figure is the faster of two interleaved rounds, each round "
                 "`flash-stages-bench`'s median. A ratio compares two versions timed in the same "
                 "call (call 2: one barrier against two; call 3: the two shapes against one barrier), so the "
                 "columns of different calls are not ratios of each other. From "
                 "`bench/results/h100_stage11_steps.txt`; the commands are in `bench/results/RUNS.md`.")
    return "\n".join(lines)


def stage11_order_table():
    """Causal blocks head by head (call 10, against step-counters) and P between the score products
    (p-mixed, call 13, against head-order): ms per call and the speed-up, per cell."""
    best = stage11_best_rounds((10, 13))
    pairs = ((10, "step-counters", "head-order"), (13, "head-order", "p-mixed"))
    lines = ["| d | causal | N | step counters (ms) | head by head (ms) | speed-up | head by head (ms) | "
             "+ P before dP (ms) | speed-up |", "|---|---|---|---|---|---|---|---|---|"]
    gains = [[] for _ in pairs]
    for key in sorted(best[(10, "step-counters")]):
        d, causal, n = key
        row = [str(d), "yes" if causal else "no", str(n)]
        for i, (c, before, after) in enumerate(pairs):
            b, a = best[(c, before)][key], best[(c, after)][key]
            gains[i].append(b / a)
            row += [f"{b:.3f}", f"{a:.3f}", f"{b / a:.2f}x"]
        lines.append("| " + " | ".join(row) + " |")
    lines.append(f"| geometric mean | | | | | {geo_mean(gains[0]):.2f}x | | | {geo_mean(gains[1]):.2f}x |")
    lines.append("")
    lines.append("Stage 11's backward (dk_dv_kernel changed), bf16, default mode, ms per call on the benchmark's "
                 "problem (B·N = 16384, H·d = 2048), NVIDIA H100 80GB HBM3. Step counters: the kernel before these "
                 "changes. Head by head: causal blocks in the non-causal order (call 10). + P before dP: head by "
                 "head with $P$ exponentiated between the two score products, kept (call 13; the copies of the "
                 "step as in the text). Each figure is the fastest of the call's interleaved rounds (two) of "
                 "`flash-stages-bench`'s median; a speed-up compares two versions timed in the same call. From "
                 "`bench/results/h100_stage11_steps.txt`; the commands are in `bench/results/RUNS.md`.")
    return "\n".join(lines)


def stage11_p_variants_table():
    """The placements of P tried (calls 11-13, each over head-order in its call), and four changes on
    the kept kernel (calls 14-16, over p-mixed): speed-ups per cell."""
    best = stage11_best_rounds((11, 12, 13, 14, 15, 16))
    columns = (("mask a branch after dP", 11, "head-order", "head-order+p-branch"),
               ("select on every step", 12, "head-order", "head-order+p-select"),
               ("two copies", 13, "head-order", "head-order+p-copies"),
               ("two copies, not causal (kept)", 13, "head-order", "p-mixed"),
               ("staggered start", 14, "p-mixed", "stagger"),
               ("P stored before dP", 15, "p-mixed", "p-stored-early"),
               ("lse, D by cp.async", 15, "p-mixed", "async-rows-2"),
               ("dQ by 16-byte reductions", 16, "p-mixed", "red-v4"))
    lines = ["| d | causal | N | " + " | ".join(c[0] for c in columns) + " |", "|---|---|---|" + "---|" * len(columns)]
    gains = [[] for _ in columns]
    for key in sorted(best[(13, "head-order")]):
        d, causal, n = key
        row = [str(d), "yes" if causal else "no", str(n)]
        for i, (_, c, before, after) in enumerate(columns):
            r = best[(c, before)][key] / best[(c, after)][key]
            gains[i].append(r)
            row.append(f"{r:.2f}x")
        lines.append("| " + " | ".join(row) + " |")
    lines.append("| geometric mean | | | " + " | ".join(f"{geo_mean(g):.2f}x" for g in gains) + " |")
    lines.append("")
    lines.append("Speed-ups of stage 11's backward, bf16, default mode, on the benchmark's problem (B·N = 16384, "
                 "H·d = 2048), NVIDIA H100 80GB HBM3, each over the kernel it was timed against in the same call: "
                 "the first four over head by head (the mask a branch after dP: call 11; a select on every "
                 "step: call 12; two copies of the step, masked and not, chosen per step: call 13; two copies "
                 "when not causal and the select copy on every causal step, kept: call 13), the last four over "
                 "the kept kernel (the staggered start: call 14; $P$ stored to shared memory as soon as it is "
                 "computed, and each step's lse and $D$ copied by `cp.async`: call 15; dQ's share added by "
                 "`red.global.add.v4.f32`: call 16). Each time is the fastest of the call's interleaved rounds (two "
                 "or three) of `flash-stages-bench`'s median. From `bench/results/h100_stage11_steps.txt`; the "
                 "commands are in `bench/results/RUNS.md`.")
    return "\n".join(lines)


def stage11_bulk_table():
    """dQ's share through shared memory and one bulk copy per warp (bulk-dq, calls 17 and 18, over p-mixed),
    and the next tile's lse and D loaded a step ahead on top of it (call 18, over bulk-dq)."""
    best = stage11_best_rounds((17, 18))
    lines = ["| d | causal | N | before (ms) | dQ by bulk copy (ms) | speed-up | speed-up, again | "
             "+ lse, D a step ahead |", "|---|---|---|---|---|---|---|---|"]
    gains = [[], [], []]
    for key in sorted(best[(17, "p-mixed")]):
        d, causal, n = key
        before, bulk = best[(17, "p-mixed")][key], best[(17, "bulk-dq")][key]
        ratios = (before / bulk, best[(18, "p-mixed")][key] / best[(18, "bulk-dq")][key],
                  best[(18, "bulk-dq")][key] / best[(18, "bulk-dq+lse-regs")][key])
        for g, r in zip(gains, ratios):
            g.append(r)
        lines.append(f"| {d} | {'yes' if causal else 'no'} | {n} | {before:.3f} | {bulk:.3f} | " +
                     " | ".join(f"{r:.2f}x" for r in ratios) + " |")
    lines.append("| geometric mean | | | | | " + " | ".join(f"{geo_mean(g):.2f}x" for g in gains) + " |")
    lines.append("")
    lines.append("Stage 11's backward, bf16, default mode, ms per call on the benchmark's problem (B·N = 16384, "
                 "H·d = 2048), NVIDIA H100 80GB HBM3. Before: the kernel of [block order and P before dP]"
                 "(#block-order-and-p-before-dp), dQ's share added by `red.global.add.v2.f32` from registers. dQ by "
                 "bulk copy: each warp's part staged in shared memory and added by one `cp.reduce.async.bulk`, "
                 "kept (call 17; speed-up, again: the same two versions in call 18). + lse, D a step ahead: the "
                 "next tile's lse and $D$ loaded into registers a step before they are stored to shared memory, "
                 "over dQ by bulk copy (call 18), not kept. Each figure is the fastest of the call's two "
                 "interleaved rounds of `flash-stages-bench`'s median. From `bench/results/h100_stage11_steps.txt`; "
                 "the commands are in `bench/results/RUNS.md`.")
    return "\n".join(lines)


def stage11_2d_table():
    """The two-dimensional warp grids (call 5, both head_dims) and 128 rows per step at head_dim 64
    (call 6), each against key-rows, the kernel before them, timed in the same call: per cell the
    fastest of two interleaved rounds (h100_stage11_steps.txt)."""
    best = {}  # (call, version, dtype) -> {(d, causal, n): ms}
    call = version = None
    for line in (RESULTS / "h100_stage11_steps.txt").read_text().splitlines():
        m = re.match(r"## call (\d+) round \d+: (\S+)", line)
        if m:
            call, version = int(m[1]), m[2]
            continue
        m = re.match(r"stage11_backward_tc/(bf16|fp16)/d(\d+)/causal(\d)/backward/seq:(\d+) ([\d.]+)", line)
        if m and call in (5, 6):
            cell = best.setdefault((call, version, m[1]), {})
            key = (int(m[2]), m[3] == "1", int(m[4]))
            cell[key] = min(cell.get(key, float("inf")), float(m[5]))
    lines = ["| dtype | d | causal | N | key-rows (ms) | 2D warp grids (ms) | speed-up | key-rows (ms) | "
             "2D, 128 rows (ms) | speed-up |", "|---|---|---|---|---|---|---|---|---|---|"]
    gains = {5: [], 6: []}
    keys = sorted({(dt, k) for (c, _, dt), cells in best.items() for k in cells})
    for dtype, key in keys:
        d, causal, n = key
        row = [dtype, str(d), "yes" if causal else "no", str(n)]
        for c, new_version in ((5, "2d-tiles"), (6, "2d-br128")):
            before, after = best.get((c, "key-rows", dtype), {}).get(key), best.get((c, new_version, dtype), {}).get(key)
            if before is None or after is None:
                row += ["–", "–", "–"]
                continue
            gains[c].append(before / after)
            row += [f"{before:.3f}", f"{after:.3f}", f"{before / after:.2f}x"]
        lines.append("| " + " | ".join(row) + " |")
    lines.append(f"| geometric mean | | | | | | {geo_mean(gains[5]):.2f}x | | | {geo_mean(gains[6]):.2f}x |")
    lines.append("")
    lines.append("Stage 11's backward (dk_dv_kernel changed), default mode, ms per call on the benchmark's problem (B·N = 16384, H·d = 2048), "
                 "NVIDIA H100 80GB HBM3. Key-rows: the kernel before these changes (each warp owns 16 keys, "
                 "$B_r$ = 64). 2D warp grids: FlashAttention-2's layout, $B_r$ = 64 (call 5, bf16). 2D, 128 rows: "
                 "the 2D grids with $B_r$ = 128 at head_dim 64, the shape this stage runs where a block may use "
                 "162 KiB (call 6, head_dim 64 only, bf16 and fp16). Each figure is the faster of two interleaved "
                 "rounds of `flash-stages-bench`'s median; a speed-up compares two versions timed in the same "
                 "call. From `bench/results/h100_stage11_steps.txt`; the commands are in `bench/results/RUNS.md`.")
    return "\n".join(lines)


def ncu_kernel_sections(path, kernel):
    """The figures of one kernel in an `ncu --print-details all` report (the block after the line that
    names the kernel): {metric name: value}, values as printed without thousands separators."""
    text, block, found = path.read_text(), {}, False
    for line in text.splitlines():
        if re.match(r"^  \S", line):
            if found:
                break
            found = kernel in line
            continue
        m = re.match(r"^\s{4}(\S.*?)\s{2,}(?:\S+\s+)?([\d,.]+)\s*$", line)
        if found and m and m[1] not in block:
            block[m[1]] = float(m[2].replace(",", ""))
    if not block:
        raise KeyError(f"{kernel} in {path.name}")
    return block


def ncu_kernel_metrics(path, kernel):
    """{metric: value} of one kernel in an `ncu --csv --metrics` file."""
    out = {}
    for row in csv.reader(line for line in path.read_text().splitlines() if line.startswith('"')):
        if len(row) > 4 and kernel in row[4]:
            out[row[-3]] = float(row[-1].replace(",", ""))
    if not out:
        raise KeyError(f"{kernel} in {path.name}")
    return out


def stage11_vs_fa2_table():
    """Stage 11's dk_dv_kernel against FlashAttention-2's main backward kernel, same problem, same
    Nsight Compute sections and metrics (h100_ncu_stage11_sections_dD.txt / _instmix_dD.csv and
    h100_ncu_fa2_bwd_sections_dD.txt / _instmix_dD.csv)."""
    kernels = (("stage 11 `dk_dv_kernel`, fifth session", "stage11", "dk_dv_kernel"),
               ("stage 11 `dk_dv_kernel`, 2026-11-25", "stage11_p_mixed", "dk_dv_kernel"),
               ("stage 11 `dk_dv_kernel`, now (dQ by bulk copy)", "stage11_bulk", "dk_dv_kernel"),
               ("FlashAttention-2 `flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel`", "fa2_bwd",
                "flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel"))
    lines = ["| head_dim | kernel | time (ms) | instructions (M) | mma (M) | `ldmatrix` (M) | ALU pipe (M) | "
             "FMA pipe (M) | local-memory requests (M) | cycles per issued instruction | wait | short scoreboard | "
             "long scoreboard |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for d in (128, 64):
        for label, tag, kernel in kernels:
            sec = ncu_kernel_sections(RESULTS / f"h100_ncu_{tag}_sections_d{d}.txt", kernel)
            mix = ncu_kernel_metrics(RESULTS / f"h100_ncu_{tag}_instmix_d{d}.csv", kernel)
            mega = lambda k: f"{mix[k] / 1e6:.0f}"
            lines.append(f"| {d} | {label} | {sec['Duration']:.2f} | {mega('smsp__inst_executed.sum')} | "
                         f"{mega('smsp__inst_executed_pipe_tensor_op_hmma.sum')} | {mega('smsp__inst_executed_op_ldsm.sum')} | "
                         f"{mega('smsp__inst_executed_pipe_alu.sum')} | {mega('smsp__inst_executed_pipe_fma.sum')} | "
                         f"{sec['Local Memory Spilling Requests'] / 1e6:.2f} | {sec['Warp Cycles Per Issued Instruction']:.2f} | "
                         f"{sec['Stall Wait']:.2f} | {sec['Stall Short Scoreboard']:.2f} | {sec['Stall Long Scoreboard']:.2f} |")
    lines.append("")
    lines.append("Nsight Compute (`ncu --clock-control none`), bf16, batch 4, N 4096, H·d = 2048, not causal, one "
                 "backward call; the same sections and metrics for both kernels. Time: the section report's "
                 "duration (a separate run from the table above). Instructions and pipes: warp instructions "
                 "executed (`smsp__inst_executed*`). Local-memory requests: spills. The last four columns are "
                 "cycles per issued instruction, and the stall reasons' shares of them. Stage 11 at head_dim 64 "
                 "runs 128-row steps, as FlashAttention-2 does there. Fifth session: the kernel of 2026-11-23, "
                 "before the step counters; 2026-11-25: the kernel of the first session of 2026-11-25, before dQ went "
                 "through the copy engine; now: the kernel on this page. From "
                 "`bench/results/h100_ncu_stage11_sections_dD.txt` and `_instmix_dD.csv`, "
                 "`h100_ncu_stage11_p_mixed_sections_dD.txt` and `_instmix_dD.csv`, "
                 "`h100_ncu_stage11_bulk_sections_dD.txt` and `_instmix_dD.csv`, "
                 "`bench/results/h100_ncu_fa2_bwd_sections_dD.txt` and `_instmix_dD.csv`; the commands are in "
                 "`bench/results/RUNS.md`, fifth section of 2026-11-23 and the two sections of 2026-11-25.")
    return "\n".join(lines)


# The columns of the per-kernel profile of a stage (scripts: the ncu command of bench/results/RUNS.md):
# short name -> (metric, label, decimals). "tensor" comes from the _tensor file of the same run.
NCU_STAGE_COLUMNS = {
    "ms": ("gpu__time_duration.sum", "time (ms)", 3),
    "registers": ("launch__registers_per_thread", "registers per thread", 0),
    "warps": ("sm__warps_active.avg.pct_of_peak_sustained_active", "warps active (% of 64)", 1),
    "sm": ("sm__throughput.avg.pct_of_peak_sustained_elapsed", "SM (% of peak)", 1),
    "tensor": ("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active", "tensor pipe (% of peak)", 1),
    "mem": ("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed", "busiest memory unit (% of peak)", 1),
    "dram": ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "DRAM (% of peak)", 1),
}


def load_ncu_stage(stage, head_dim):
    """{kernel: {metric: value}} of the first launch of each kernel in h100_ncu_stageSS_dD.csv and its
    _tensor.csv (ncu --csv: a benchmark's text first, then one row per metric; kernel names shortened to
    row_dot, dk_dv, ...), kernels in launch order. The benchmark calls the backward several times under
    the profiler; the first launch of each kernel belongs to the first call. Times in ns; n/a left out."""
    out = {}
    for suffix in ("", "_tensor"):
        first = {}  # kernel -> the ID of its first launch in this file
        for launch, full_name, _, metric, value in ncu_csv_rows(
                RESULTS / f"h100_ncu_stage{stage:02d}_d{head_dim}{suffix}.csv"):
            name = re.search(r"(\w+?)_kernel\b", full_name)
            kernel = name[1] if name else full_name
            if first.setdefault(kernel, launch) != launch or value is None:
                continue
            out.setdefault(kernel, {})[metric] = value
    return out


def ncu_stage_value(stage, head_dim, kernel, what):
    """One figure of the per-kernel profile: a column of NCU_STAGE_COLUMNS, share (the kernel's % of the
    call's time), warps-per-sm (active warps per SM) or, with kernel "all", ms (the call's time)."""
    kernels = load_ncu_stage(stage, head_dim)
    total_ns = sum(m["gpu__time_duration.sum"] for m in kernels.values())
    if kernel == "all":
        if what != "ms":
            raise KeyError(what)
        return f"{total_ns / 1e6:.2f}"
    m = kernels[kernel]
    if what == "share":
        return f"{100 * m['gpu__time_duration.sum'] / total_ns:.1f}"
    if what == "warps-per-sm":
        return f"{m['sm__warps_active.avg.pct_of_peak_sustained_active'] / 100 * 64:.1f}"
    metric, _, decimals = NCU_STAGE_COLUMNS[what]
    v = m[metric] / (1e6 if what == "ms" else 1)
    return f"{v:,.{decimals}f}"


def ncu_stage_table(stage, head_dims=(64, 128)):
    """Time and what binds each kernel of one backward call of a stage (stage 11: row_dot, dk_dv,
    convert_dq), one row per kernel and head_dim."""
    lines = ["| kernel | head_dim | " + " | ".join(c[1] for c in NCU_STAGE_COLUMNS.values()) + " | share of the call |",
             "|---|---|" + "---|" * (len(NCU_STAGE_COLUMNS) + 1)]
    kernels = list(load_ncu_stage(stage, head_dims[0]))
    for kernel in kernels:
        for d in head_dims:
            cells = [ncu_stage_value(stage, d, kernel, what) for what in NCU_STAGE_COLUMNS]
            lines.append(f"| `{kernel}_kernel` | {d} | " + " | ".join(cells) +
                         f" | {ncu_stage_value(stage, d, kernel, 'share')}% |")
    lines.append("")
    lines.append(f"Nsight Compute (`ncu --clock-control none`), bf16, batch 4, N 4096, H·d = 2048 (16 heads at "
                 f"head_dim 128, 32 at 64), not causal, default mode: the first backward call of the benchmark "
                 f"`stage{stage:02d}_backward_tc/bf16/dD/causal0/backward/seq:4096`. SM, memory and DRAM are "
                 "throughputs over the time the kernel ran (`sm__throughput`, `gpu__compute_memory_throughput`, "
                 "`dram__throughput`); warps active (of the 64 an SM can hold) and the tensor pipe "
                 "(`sm__pipe_tensor_op_hmma_cycles_active`) over the cycles an SM was active. The busiest memory "
                 "unit is ncu's largest memory throughput, of units this profile does not break down (the L1 with "
                 "shared memory, the L2, DRAM). From "
                 + ", ".join(f"`bench/results/h100_ncu_stage{stage:02d}_d{d}.csv` (+ `_tensor.csv`)" for d in head_dims)
                 + "; the command is in `bench/results/RUNS.md`.")
    return "\n".join(lines)


TRAINING_TEST = ROOT / "tests/python/test_training.py"


def training_value(tag, what):
    """A figure of the bf16 training run (h100_training_TAG.json, written by tests/python/test_training.py
    through FLASH_TRAINING_OUT), computed as the test computes it: means over windows of `window` steps,
    the largest relative difference of those means against sdpa_flash, and the tolerance
    max(BF16_SPREAD_FACTOR x the spread of sdpa_math, BF16_FLOOR) with the constants read from the test."""
    run = json.loads((RESULTS / f"h100_training_{tag}.json").read_text())
    losses, w = run["losses"], run["window"]

    def windows(curve):
        return [sum(curve[i:i + w]) / w for i in range(0, len(curve), w)]

    def worst(a, b):
        return max(abs(x - y) / abs(y) for x, y in zip(windows(losses[a]), windows(losses[b])))

    test = TRAINING_TEST.read_text()
    factor = float(re.search(r"^BF16_SPREAD_FACTOR = ([\d.]+)", test, re.M)[1])
    floor = float(re.search(r"^BF16_FLOOR = ([\d.]+)", test, re.M)[1])
    spread = worst("sdpa_math", "sdpa_flash")
    parts = what.split("/")
    if parts[0] in ("steps", "window", "stage"):
        return str(run[parts[0]])
    if parts[0] == "worst":
        return f"{worst('flash_stages', 'sdpa_flash'):.2e}"
    if parts[0] == "spread":
        return f"{spread:.2e}"
    if parts[0] == "spread-times-factor":
        return f"{factor * spread:.2e}"
    if parts[0] == "allowed":
        return f"{max(factor * spread, floor):.2e}"
    if parts[0] in ("factor", "floor"):
        return f"{factor:g}" if parts[0] == "factor" else f"{100 * floor:g}"
    curve = losses[parts[0]]  # IMPL/first|last
    return f"{ {'first': curve[0], 'last': curve[-1]}[parts[1]]:.4f}"


def rule_case_value(what):
    """The case that widened the half backward's rule, as bench/results/RUNS.md records it: error (its
    dK max error), before (the bound without the stored-O term), after (the bound with it)."""
    text = re.sub(r"\s+", " ", (RESULTS / "RUNS.md").read_text())
    m = re.search(r"\(dK ([\d.]+e-\d+) against a bound of ([\d.]+e-\d+)\)\..*?that case's bound becomes "
                  r"([\d.]+e-\d+)", text)
    if not m:
        raise KeyError("RUNS.md has no sentence on the rule's case")
    return {"error": m[1], "before": m[2], "after": m[3]}[what]


def tables():
    runs = load_bench()
    out = {"course": course_table(runs), "runner": runner_table(), "compare": compare_table(),
           "backward-split": backward_split_table(), "compare-bf16": compare_half_table("bf16"),
           "compare-fp16": compare_half_table("fp16"),
           "stage10-variants": variants_table(), "ptxas-backward": ptxas_backward_table(),
           "ptxas-stage11": ptxas_stage11_table(),
           "decode-bench": decode_bench_table(), "decode-compare": decode_compare_table(),
           "decode-splits-1-131072": decode_splits_table(1, 131072),
           "decode-splits-8-32768": decode_splits_table(8, 32768),
           "stage11-backward-bf16": backward_tc_table("bf16"), "stage11-backward-fp16": backward_tc_table("fp16"),
           "stage11-steps": stage11_steps_table(), "stage11-2d": stage11_2d_table(),
           "stage11-order": stage11_order_table(), "stage11-p-variants": stage11_p_variants_table(),
           "stage11-bulk": stage11_bulk_table(),
           "stage11-vs-fa2": stage11_vs_fa2_table()}
    if all((RESULTS / f"h100_ncu_stage11_d{d}{s}.csv").exists() for d in (64, 128) for s in ("", "_tensor")):
        out["ncu-stage11"] = ncu_stage_table(11)
    else:
        MISSING["ncu-stage11"] = "h100_ncu_stage11_d64.csv, _d128.csv and their _tensor.csv (the ncu command of RUNS.md)"
    # Stage 12's tables (its H100 runs, bench/results/RUNS.md): a checkout without one of their files
    # gets the table's name in MISSING, which --check reports with the file, as for the ablation.
    stage12 = {"stage12-variants-d64": lambda: stage12_variants_table(64),
               "stage12-variants-d128": lambda: stage12_variants_table(128),
               "stage12-steps": stage12_steps_table, "stage12-after-b": stage12_after_b_table,
               "ncu-stage12": ncu_stage12_table,
               "stage12-compare": stage12_compare_table, "stage12-store-behind": stage12_store_behind_table,
               "stage12-wide-keys": stage12_wide_keys_table, "stage12-tail": stage12_tail_table}
    for name, make in stage12.items():
        try:
            out[name] = make()
        except FileNotFoundError as e:
            MISSING[name] = f"{pathlib.Path(e.filename).name} (scripts/device/gpu_check_hopper.sh, bench/results/RUNS.md)"
    for d in (64, 128):
        if (RESULTS / f"h100_ncu_tensor_d{d}_raw.csv").exists():
            out[f"ncu-tensor-d{d}"] = ncu_tensor_table(d)
    for d in (64, 128):
        out[f"ncu-d{d}"] = ncu_table(d, runs)
        try:
            out[f"ncu-kernels-d{d}"] = ncu_kernels_table(d)
        except KeyError:
            MISSING[f"ncu-kernels-d{d}"] = f"stages 01, 02 and 07 in {ncu_path(d).name} (scripts/profile/profile_stages.sh {d})"
    if ABLATION.exists():
        out["stage05-ablation"] = ablation_table()
        out["stage06-order"] = stage06_order_table()
    else:
        for name in ("stage05-ablation", "stage06-order"):
            MISSING[name] = f"{ABLATION.name} (scripts/device/gpu_check_ablation.sh)"
    for stage in sorted({k[0] for k in runs}):
        out[f"stage-{stage:02d}"] = stage_table(runs, stage)
    backward = load_bench(backward=True)
    out["backward"] = "\n\n".join(
        stage_table(backward, stage, "Backward TFLOP/s (2.5x the forward FLOPs), stage " + f"{stage:02d}")
        for stage in sorted({k[0] for k in backward}))
    return out


# ---------------------------------------------------------------------------------------------
# Single figures in running text: <!-- value:SPEC -->FIGURE<!-- /value -->
# ---------------------------------------------------------------------------------------------

VALUE = re.compile(r"<!-- value:([\w./+-]+) -->(.*?)<!-- /value -->", re.S)


def load_compare():
    """{(impl, direction, head_dim, causal, seq): tflops} of bench/compare.py's runs that succeeded."""
    out = {}
    for r in json.loads(COMPARE_JSON.read_text())["results"]:
        if r["status"] == "ok":
            out[(r["impl"], r["direction"], r["head_dim"], r["causal"], r["seq"])] = r["tflops"]
    return out


def load_anchors():
    """The quoted anchors: named ceilings and the table's cells, as the strings the quotation prints."""
    text = ANCHORS.read_text()
    found = {
        "bf16-matmul": re.search(r"bf16 matmul 8192\^3: ([\d.]+) TFLOP/s", text)[1],
        "fp32-matmul": re.search(r"fp32 matmul 8192\^3 \(no tf32\): ([\d.]+) TFLOP/s", text)[1],
        "copy": re.search(r"d2d copy 1GiB: ([\d.]+) TB/s", text)[1],
        "peak-bf16": re.search(r"bf16 dense ([\d.]+) TFLOP/s", text)[1],
        "peak-fp32": re.search(r"fp32 FFMA ([\d.]+) TFLOP/s", text)[1],
        "peak-tf32": re.search(r"TF32 ([\d.]+) TFLOP/s", text)[1],
        "hbm": re.search(r"HBM3 ([\d.]+) TB/s", text)[1],
    }
    head = None
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| dtype"):
            head = cells
        elif head and line.startswith("| ") and len(cells) == len(head):
            dtype, d, causal, b, h, n = cells[:6]
            for impl, cell in zip(head[6:], cells[6:]):
                for direction, part in zip(("forward", "backward"), cell.split(" / ")):
                    found[f"{dtype}/{impl}/{direction}/d{d}/c{int(causal == 'yes')}/{n}"] = part
    return found


def value(spec, runs=None, backward=None, compare=None, anchors=None):
    """One measured figure, as text. The forms of SPEC (c0/c1: causal off/on; seq: N):

      bench/SS/dD/cC/N/tflops|ms|peak|gib   stage SS's forward on the course grid (peak: % of fp32 peak;
                                        gib: its workspace in GiB, the benchmark's workspace_bytes)
      bwd/SS/dD/cC/N/tflops|done        stage SS's backward (done: the rate of the 7 products it really does)
      speedup/AA/BB/dD                  TFLOP/s of stage BB over stage AA at the course problem
      causal/SS/dD                      causal time over non-causal time, stage SS, course problem
      compare/IMPL/DIR/dD/cC/N          TFLOP/s of IMPL (stageNN, naive-torch, sdpa-...) in compare_h100.json
      compare-ratio/IMPL/STAGE/DIR/dD/cC/N   IMPL's TFLOP/s over the stage's
      ncu/dD/SS/METRIC                  a metric of h100_ncu_dD.csv (a key of NCU_ROWS, as the table shows it)
      ncu-ratio/dD/SS/METRIC/TT         that metric of stage SS over stage TT
      ncu-per/dD/SS/METRIC_A/METRIC_B   METRIC_A of stage SS over its METRIC_B
      anchor/NAME                       a ceiling of pytorch_anchors_h100.md (bf16-matmul, fp32-matmul,
                                        copy, peak-bf16, peak-fp32, peak-tf32, hbm)
      anchor/DTYPE/IMPL/DIR/dD/cC/N     a cell of its table, e.g. anchor/float32/naive-torch/forward/d64/c0/4096
      half/TAG/IMPL/dD/cC/N             forward TFLOP/s of IMPL in compare_h100_TAG.json (TAG: bf16, fp16)
      half-geo/TAG/IMPL[/BASE]          geometric mean over d, causal and N >= 1024 of IMPL's speed over
                                        BASE's (default sdpa-flash) in that file, e.g. half-geo/bf16/stage10
      half-min/TAG/IMPL[/BASE]          the lowest cell of the same
      half-max/TAG/IMPL[/BASE]          the highest cell of the same
      half-bwd/..., half-bwd-geo/..., half-bwd-min/..., half-bwd-max/...   the same four of the backward
                                        (stage11, stage11-det, sdpa-*), e.g. half-bwd-geo/bf16/stage11,
                                        half-bwd-geo/bf16/stage11-det/stage11 (the deterministic mode's
                                        speed over the default mode's)
        (in half-geo, half-min and the kinds below, TAG may be "both": the cells of bf16 and fp16
        together; and a fifth part dD keeps the cells of one head_dim, e.g. half-geo/both/stage12/sdpa-cudnn/d64)
      half-min-at/TAG/IMPL[/BASE], half-max-at/...   where the lowest (highest) cell is, in words
                                        ("head_dim 64, causal, N = 1024"; the dtype first when TAG is both)
      half-below/TAG/IMPL[/BASE]        how many cells are below BASE as printed: "K of M"
      half-below-floor/TAG/IMPL[/BASE]  the same below the targets' floor, 0.9x as printed
      half-geo3/..., half-bwd-geo3/...  half-geo and half-bwd-geo to 3 decimals, where a target is met or
                                        missed by less than the 2-decimal figure shows
      ncu-tensor/dD/STAGE/WHAT         bank (shared-load conflicts), tensor (pipe %), short/long/barrier
                                        (stalls per issue), occupancy (% of 64 warps), registers (per
                                        thread) of h100_ncu_tensor_dD_raw.csv
      ncu-raw/dD/SS/METRIC              that metric of h100_ncu_dD.csv as the profiler counted it (integer)
      ncu-pct/dD/SS/METRIC_A/METRIC_B   100 x METRIC_A over METRIC_B of stage SS, in percent (2 decimals)
      ncu-tflops/dD/SS/ffma|convention  TFLOP/s over the profiled kernel time: 2 x FFMA (the table's row), or
                                        the FlashAttention convention's 4·B·H·N²·d of the profiled problem
      ncu-warp-ffma/dD/SS               FFMA thread instructions / 32, in 10⁹ (warp-level FFMAs)
      ncu-loads-per-ffma/dD/SS          warp-level shared loads per warp-level FFMA
      ncu-warps-per-scheduler/dD/SS     achieved occupancy in warps per SM scheduler (64 warps, 4 schedulers)
      ffma-split/dD/SS/qk|rest|chained  stage 05's FFMA count taken apart (lesson 05): qk = the FFMAs of
                                        QK^T (three of every four of its multiply-adds), rest = the measured
                                        count less qk, chained = rest plus all of QK^T's multiply-adds
      bwd-split/dD/KERNEL/ms|share      a backward kernel's time (row_dot, dk_dv, dq) of h100_ncu_backward.csv,
                                        or its share of the backward in percent
      runner/SS/COLUMN                  a cell of h100_runner.txt (time_ms, tflops, err_vs_prev, err_vs_ref)
      runner-max/AA-BB/COLUMN           the largest err_vs_ref (or other number column) of stages AA..BB
      ptxas12/dD/cC/CONFIG/WHAT         the same of stage 12's kernel with HopperConfig CONFIG (e.g.
                                        2-128-2-0-0-0-0-1-0-0-0: two consumers, 128 keys, 2 stages, none
                                        of the pieces after them, one Q buffer), the largest over bf16 and fp16
      ptxas12-spilling                  how many of stage 12's kernels spill: "K of M"
      ptxas/SS/KERNEL/dD/WHAT           registers, stack, spill-stores, spill-loads of a kernel (e.g.
                                        online_softmax_attention_kernel, dk_dv_kernel) in ptxas_sm90.txt;
                                        of a kernel compiled for several tile sizes, the largest (the H100's)
      traffic-ms/SS/dD/PASSES           PASSES passes over stage SS's workspace at the course problem, in
                                        ms at the copy rate of pytorch_anchors_h100.md
      ratio/SPEC_A+SPEC_B               the figure SPEC_A over the figure SPEC_B (2 decimals)
      above/SPEC_A+SPEC_B               "above", "below" or "level with": how figure SPEC_A compares with
                                        SPEC_B as printed, for sentences that must stay true
      ncu-nonffma/dD/SS                 the share of warp instructions that are not FFMA, in percent
                                        (1 - FFMA thread instructions / 32 / smsp__inst_executed.sum)
      ncu-kernel/dD/SS/KERNEL/METRIC    a metric of one kernel of a stage profiled as several (stages 01,
                                        02: scores, softmax, pv; 07: row_dot, dk_dv, dq), or nonffma
      ablation/dD/cC/N/KEY/ms|tflops    a variant of h100_stage05_ablation.txt (KEY: s04, base, tiles, oneexp,
                                        warprows, regtile, shuffle, float4, transp, pad4, s05; s06, heavy,
                                        natural)
      ablation-gain/dD/KEY              what the rung KEY buys: the time of the rung before it over its own,
                                        stage 04 -> 05 at the course problem (2 decimals)
      ablation-total/dD/KEY             stage 04's time over rung KEY's
      ablation-top/dD/label|key|gain    the rung (tiles .. pad4) that gains most at head_dim D: its name in
                                        words, its key, its gain
      ablation-top/all/label            the same rung's name, said once where every head_dim agrees
                                        ("register tiles"), else each head_dim's ("X at d=64 and Y at d=128")
      ablation-order/dD/N               stage 06, causal: natural block order's time over heaviest-first's
      ablation-causal/dD/N              stage 06: causal time over non-causal time, measured back to back
      causal-predicted/N                the tile count's prediction of that ratio, 1/2 + 32/N (not measured)
      variant/dD/cC/N/SLUG/tflops|ms    a row of h100_stage10_variants.txt; SLUG is the variant's name in
                                        lower case without spaces or punctuation, e.g. stage10asbuilt,
                                        4wx32rx64kqsmem1blksmlazy
      variant12/TAG/dD/cC/N/SLUG/tflops|ms   a row of stage 12's variants (TAG: bf16, fp16) from the committed
                                        run that holds the whole block (VARIANTS12_FILES); SLUG as for variant,
                                        e.g. stage12asbuilt, a1consumerwarpgroupinorder, 2consumerwarpgroups,
                                        setmaxnregproducerwarpgroup, pingpong, intrawarpgroupoverlap,
                                        tmastoreofo, persistentblocks, querytilesinpairsheadbyhead,
                                        worktilesbacktoback
      variant12-step/TAG/dD/cC/N/SLUG   what the rung SLUG buys: the time of the rung before it (ladder A .. B)
                                        over its own
      variant12-total/TAG/dD/cC/N       version A's time over version B's
      variant12-after-b/TAG/dD/cC/N     version B's time over the registered kernel's (back to back)
      variant12-same/TAG/dD/cC/N        how far apart, in % of the smaller time, the two rows that time
                                        the registered kernel are ("stage 12 as built" and the last rung,
                                        VARIANTS12_AS_BUILT)
      variant12-same-max/all|dD         the largest of those over every complete block
      ncu12-l2/persistent|pairs/WHAT    the persistent kernel's profile without or with query tiles in
                                        pairs (NCU12_L2_FILES): time-us, dram-mb, l2-hit-pct, tensor-pct
                                        (means over the launches), launches
      ncu12/dD/WHAT                     stage 12's profile (h100_ncu_stage12_dD.csv, _tensor.csv), the mean over
                                        the launches: time-ms, tensor-pct, gmma-pct, gmma-inst, sm-pct, mem-pct,
                                        dram-pct, warps-pct, registers (NCU12_METRICS); tflops (FlashAttention
                                        FLOPs over the kernel time); wgmma-count (what the loops issue, to set
                                        beside gmma-inst); launches
      sanitizer/STEM/SUBJECT            "N of M": the lines of bench/results/STEM.txt naming SUBJECT that report
                                        a clean run, e.g. sanitizer/h100_sanitizer_stage11_12/stage12
      ctest/passed|total|skipped|TEST   the full suite's log, h100_ctest.log (TEST: a ctest name, its status)
      ctest-log/STEM/passed|total|...   the same of another ctest log, bench/results/STEM.log
      decode/PAGE/B/N/gbs|pct|us        stage 13's decode family in h100_bench_decode.json (PAGE 0: the
                                        contiguous cache, else the page size; pct: % of the HBM datasheet)
      decode-compare/B/N/IMPL/gbs|pct|us  a cell of compare_h100_decode.json (IMPL: stage13, stage13-paged,
                                        sdpa-flash; pct: % of the HBM datasheet)
      decode-compare/B/N/ratio          its last column: sdpa-flash's time over stage 13's (2 decimals)
      decode-versus/B/N                 "on par with", "faster than" or "slower than": stage 13 against
                                        sdpa-flash at (B, N), on par while the ratio, as printed, is within
                                        DECODE_PAR of 1 (for sentences that must stay true)
      decode-splits/B/N/S[/vsT]         stage13-splits at (B, N) with S splits: µs, or with /vsT its time over
                                        the time with T splits (h100_stage13_splits.txt)
      decode-target/SOURCE/min|max      the lowest or highest % of the HBM datasheet over the three target
                                        shapes (DECODE_TARGETS); SOURCE: bench (the contiguous cache of
                                        h100_bench_decode.json), paged (its paged cache), compare (stage13 in
                                        compare_h100_decode.json)
      ncu-stage/SS/dD/KERNEL/WHAT       one kernel's figure in h100_ncu_stageSS_dD.csv (+ _tensor.csv), first
                                        launch: WHAT is ms, registers, warps, sm, tensor, mem, dram (the
                                        columns of NCU_STAGE_COLUMNS), share (% of the call's time) or
                                        warps-per-sm; KERNEL is the name without _kernel (row_dot, dk_dv,
                                        convert_dq), or all with ms: the three kernels' sum
      training/TAG/WHAT                 the training run of h100_training_TAG.json (bf16), computed as
                                        tests/python/test_training.py does: worst (largest relative
                                        difference of window means, flash_stages vs sdpa_flash), spread
                                        (sdpa_math vs sdpa_flash), spread-times-factor, allowed (the test's
                                        tolerance), factor, floor (in %), steps, window, stage, or
                                        IMPL/first|last: the loss of the first or last step (IMPL:
                                        flash_stages, sdpa_flash, sdpa_math)
      rule-case/error|before|after      the stage 11 case that widened the half backward's rule, as
                                        RUNS.md records it: its dK max error, the bound before and after
                                        the stored-O term was added
      decode-met/SOURCE                 at how many of the three target shapes SOURCE reaches DECODE_GOAL
                                        of the datasheet: "all three", "two of the three", "one of the three"
                                        or "none of the three"
    """
    parts = spec.split("/")
    kind = parts[0]
    runs = runs if runs is not None else load_bench()
    if kind in ("bench", "bwd"):
        src = runs if kind == "bench" else (backward if backward is not None else load_bench(backward=True))
        stage, d, c, n, what = int(parts[1]), int(parts[2][1:]), parts[3] == "c1", int(parts[4]), parts[5]
        r = src[(stage, d, c, n)]
        if what == "peak":
            return f"{100 * r['tflops'] / FP32_PEAK_TFLOPS:.0f}"
        if what == "gib":
            return f"{r['gib']:g}"
        if what == "done":  # stage 07's backward does 7 tile products where the convention counts 5
            return f"{r['tflops'] * 7 / 5:.1f}"
        return f"{r[what]:.2f}"
    if kind == "speedup":
        a, b, d = int(parts[1]), int(parts[2]), int(parts[3][1:])
        return f"{runs[(b, d, False, COURSE_SEQ)]['tflops'] / runs[(a, d, False, COURSE_SEQ)]['tflops']:.2f}"
    if kind == "causal":
        stage, d = int(parts[1]), int(parts[2][1:])
        return f"{runs[(stage, d, True, COURSE_SEQ)]['ms'] / runs[(stage, d, False, COURSE_SEQ)]['ms']:.2f}"
    if kind in ("compare", "compare-ratio"):
        compare = compare if compare is not None else load_compare()
        if kind == "compare":
            impl, direction, d, c, n = parts[1], parts[2], int(parts[3][1:]), parts[4] == "c1", int(parts[5])
            return f"{compare[(impl, direction, d, c, n)]:.1f}"
        impl, stage, direction, d, c, n = parts[1], parts[2], parts[3], int(parts[4][1:]), parts[5] == "c1", int(parts[6])
        return f"{compare[(impl, direction, d, c, n)] / compare[(stage, direction, d, c, n)]:.2f}"
    if kind == "ncu-per":  # ncu-per/dD/SS/METRIC_A/METRIC_B: one metric of a stage over another
        d, stage, a, b = int(parts[1][1:]), int(parts[2]), parts[3], parts[4]
        metrics = load_ncu(d)[stage]
        return f"{metrics[a] / metrics[b]:.1f}"
    if kind in ("ncu", "ncu-ratio"):
        d, stage, metric = int(parts[1][1:]), int(parts[2]), parts[3]
        metrics = load_ncu(d)
        if metric not in NCU_ROWS:
            raise KeyError(metric)
        label, divisor, decimals = NCU_ROWS[metric]
        if metric not in metrics[stage]:
            raise KeyError(f"{ncu_path(d).name} has no {metric} for stage {stage:02d}: run scripts/profile/profile_stages.sh {d}")
        if kind == "ncu":
            return f"{metrics[stage][metric] / divisor:,.{decimals}f}"
        other = int(parts[4])
        return f"{metrics[stage][metric] / metrics[other][metric]:.1f}"
    if kind == "ncu-tensor":  # ncu-tensor/dD/STAGE/bank|tensor: a figure of the tensor-core profile
        d, stage, what = int(parts[1][1:]), int(parts[2]), parts[3]
        metric = {"bank": "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
                  "tensor": "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
                  "short": "smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio",
                  "long": "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",
                  "barrier": "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",
                  "occupancy": "sm__warps_active.avg.pct_of_peak_sustained_active",
                  "registers": "launch__registers_per_thread"}[what]
        for r in csv.reader((RESULTS / f"h100_ncu_tensor_d{d}_raw.csv").open()):
            if len(r) > 4 and r[0] == str(stage) and r[-3] == metric:
                v = float(r[-1].replace(",", ""))
                return (f"{v:,.0f}" if what in ("bank", "registers") else f"{v:.1f}" if what in ("tensor", "occupancy")
                        else f"{v:.2f}")
        raise KeyError(spec)
    if kind in ("half", "half-geo", "half-min", "half-max", "half-bwd", "half-bwd-geo", "half-bwd-min",
                "half-bwd-max", "half-min-at", "half-max-at", "half-below", "half-below-floor", "half-geo3",
                "half-bwd-geo3"):
        direction = "backward" if kind.startswith("half-bwd") else "forward"
        kind = kind.replace("-bwd", "")
        decimals = 3 if kind == "half-geo3" else 2
        tags = ("bf16", "fp16") if parts[1] == "both" else (parts[1],)
        rows = {(tag, r["impl"], r["head_dim"], r["causal"], r["seq"]): r for tag in tags
                for r in json.loads((RESULTS / f"compare_h100_{tag}.json").read_text())["results"]
                if r["status"] == "ok" and r["direction"] == direction}
        if kind == "half":
            return f"{rows[(parts[1], parts[2], int(parts[3][1:]), parts[4] == 'c1', int(parts[5]))]['tflops']:.1f}"
        impl, base = parts[2], parts[3] if len(parts) > 3 else "sdpa-flash"
        only_d = int(parts[4][1:]) if len(parts) > 4 else None  # .../dD: the cells of one head_dim
        cells = {(t, d, c, n): rows[(t, base, d, c, n)]["median_ms"] / r["median_ms"]
                 for (t, i, d, c, n), r in rows.items()
                 if i == impl and n >= 1024 and (t, base, d, c, n) in rows and only_d in (None, d)}
        ratios = list(cells.values())
        if not ratios:
            raise KeyError(spec)
        if kind == "half-min":
            return f"{min(ratios):.2f}"
        if kind == "half-max":
            return f"{max(ratios):.2f}"
        if kind in ("half-min-at", "half-max-at"):  # where the lowest (highest) cell is, in words
            t, d, c, n = (min if kind == "half-min-at" else max)(cells, key=cells.get)
            return (f"{t + ', ' if len(tags) > 1 else ''}head_dim {d}, {'causal' if c else 'not causal'}, "
                    f"N = {n}")
        if kind in ("half-below", "half-below-floor"):  # cells below 1 (0.9) x BASE, as printed: "K of M"
            limit = TARGET_FLOOR if kind == "half-below-floor" else 1
            return f"{sum(round(x, 2) < limit for x in ratios)} of {len(ratios)}"
        return f"{math.exp(sum(math.log(x) for x in ratios) / len(ratios)):.{decimals}f}"
    if kind == "ncu-stage":  # ncu-stage/SS/dD/KERNEL/WHAT
        return ncu_stage_value(int(parts[1]), int(parts[2][1:]), parts[3], parts[4])
    if kind == "training":  # training/TAG/WHAT...
        return training_value(parts[1], "/".join(parts[2:]))
    if kind == "rule-case":
        return rule_case_value(parts[1])
    if kind == "anchor":
        anchors = anchors if anchors is not None else load_anchors()
        return anchors["/".join(parts[1:])]
    if kind == "ratio":  # ratio/SPEC_A+SPEC_B
        a, b = "/".join(parts[1:]).split("+")
        args = dict(runs=runs, backward=backward, compare=compare, anchors=anchors)
        return f"{float(value(a, **args).replace(',', '')) / float(value(b, **args).replace(',', '')):.2f}"
    if kind == "above":  # above/SPEC_A+SPEC_B
        a, b = "/".join(parts[1:]).split("+")
        args = dict(runs=runs, backward=backward, compare=compare, anchors=anchors)
        x, y = (float(value(spec_, **args).replace(",", "")) for spec_ in (a, b))
        return "above" if x > y else "below" if x < y else "level with"
    if kind == "ncu-nonffma":
        d, stage = int(parts[1][1:]), int(parts[2])
        m = load_ncu(d)[stage]
        if "smsp__inst_executed.sum" not in m:
            raise KeyError(f"{ncu_path(d).name} has no smsp__inst_executed.sum for stage {stage:02d}: run "
                           f"scripts/profile/profile_stages.sh {d}")
        return f"{nonffma_pct(m):.1f}"
    if kind == "ncu-kernel":  # ncu-kernel/dD/SS/KERNEL/METRIC
        d, stage, kernel, metric = int(parts[1][1:]), int(parts[2]), parts[3], parts[4]
        m = load_ncu_kernels(d)[stage][kernel]
        if metric == "nonffma":
            return f"{nonffma_pct(m):.1f}"
        label, divisor, decimals = NCU_ROWS[metric]
        return f"{m[metric] / divisor:,.{decimals}f}"
    if kind.startswith("ablation") or kind == "causal-predicted":
        if kind == "causal-predicted":
            return f"{causal_predicted(int(parts[1])):.3f}"
        ab_runs, ladder, _ = load_ablation()
        if kind == "ablation-top" and parts[1] == "all":
            if parts[2] != "label":
                raise KeyError(spec)
            dims = sorted({k[0] for k in ab_runs})
            labels = [ABLATION_SHORT[ablation_top(ab_runs, ladder, d)] for d in dims]
            if len(set(labels)) == 1:
                return labels[0]
            return " and ".join(f"{label} at d={d}" for label, d in zip(labels, dims))
        d = int(parts[1][1:])
        if kind == "ablation":
            causal, n, key, what = parts[2] == "c1", int(parts[3]), parts[4], parts[5]
            r = ab_runs[(d, causal, n, key)]
            if r[what] is None:
                raise KeyError(f"{key} failed its checks and was not timed")
            return f"{r[what]:.3f}" if what == "ms" else f"{r[what]:.2f}"
        if kind == "ablation-gain":
            return f"{ablation_gain(ab_runs, ladder, d, parts[2]):.2f}"
        if kind == "ablation-total":
            return f"{ablation_ms(ab_runs, d, 's04') / ablation_ms(ab_runs, d, parts[2]):.2f}"
        if kind == "ablation-top":
            top = ablation_top(ab_runs, ladder, d)
            return {"label": ABLATION_SHORT[top], "key": top,
                    "gain": f"{ablation_gain(ab_runs, ladder, d, top):.2f}"}[parts[2]]
        n = int(parts[2])
        if kind == "ablation-order":
            return f"{ablation_ms(ab_runs, d, 'natural', True, n) / ablation_ms(ab_runs, d, 'heavy', True, n):.2f}"
        if kind == "ablation-causal":
            return f"{ablation_ms(ab_runs, d, 's06', True, n) / ablation_ms(ab_runs, d, 's06', False, n):.2f}"
    if kind.startswith("ncu-") or kind == "ffma-split":
        d, stage = int(parts[1][1:]), int(parts[2])
        m = load_ncu(d)[stage]
        ffma, time_s = m["sm__sass_thread_inst_executed_op_ffma_pred_on.sum"], m["gpu__time_duration.sum"] * 1e-9
        if kind == "ncu-raw":
            return f"{m[parts[3]]:,.0f}"
        if kind == "ncu-pct":
            return f"{100 * m[parts[3]] / m[parts[4]]:.2f}"
        if kind == "ncu-tflops":
            flops = 2 * ffma if parts[3] == "ffma" else 4 * 4 * 16 * COURSE_SEQ ** 2 * d  # profiled: B 4, H 16
            return f"{flops / time_s / 1e12:.2f}"
        if kind == "ncu-warp-ffma":
            return f"{ffma / 32 / 1e9:.1f}"
        if kind == "ncu-loads-per-ffma":
            return f"{m['smsp__inst_executed_op_shared_ld.sum'] / (ffma / 32):.1f}"
        if kind == "ncu-warps-per-scheduler":
            return f"{m['sm__warps_active.avg.pct_of_peak_sustained_active'] / 100 * 64 / 4:.1f}"
        if kind == "ffma-split":
            # The figures the lesson adds up, each rounded as printed (10⁹, one decimal).
            qk_mads = round(2 * 4 * 16 * COURSE_SEQ ** 2 * d / 2 / 1e9, 1)  # half of 2·B·H·N²·d
            qk = round(0.75 * qk_mads, 1)
            rest = round(round(ffma / 1e9, 1) - qk, 1)
            return f"{ {'qk': qk, 'rest': rest, 'chained': round(qk_mads + rest, 1)}[parts[3]]:.1f}"
    if kind == "bwd-split":
        d, name, what = int(parts[1][1:]), parts[2] + "_kernel", parts[3]
        times = {}
        for row in csv.reader(NCU_BACKWARD.open()):
            if int(row[0]) == d:
                times[next(k for k in ("row_dot_kernel", "dk_dv_kernel", "dq_kernel") if k in row[5])] = \
                    float(row[-1].replace(",", "")) / 1e6
        return f"{times[name]:.2f}" if what == "ms" else f"{100 * times[name] / sum(times.values()):.0f}"
    if kind in ("runner", "runner-max"):
        columns = ["stage", "name", "dtype", "time_ms", "tflops", "speedup", "err_vs_prev", "err_vs_ref"]
        rows = {}
        for line in RUNNER.read_text().splitlines():
            m = re.match(r"(\d+)\s+(.+?)\s+(fp32|bf16|fp16)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+x)\s+"
                         r"(-|\S+ \(vs \d+\))\s+(\S+)", line)
            if m:
                rows[int(m[1])] = dict(zip(columns, m.groups()))
        if kind == "runner":
            return rows[int(parts[1])][parts[2]].split(" ")[0]
        first, last = map(int, parts[1].split("-"))
        worst = max((rows[s][parts[2]] for s in range(first, last + 1)), key=float)
        return worst
    if kind == "ptxas":
        stage, kernel, d, what = parts[1], parts[2], parts[3][1:], parts[4]
        text = (RESULTS / "ptxas_sm90.txt").read_text()
        # The template arguments follow the kernel's name: head_dim first, then (stages 04-07) the tile
        # size, of which the H100 runs the largest.
        entry = re.compile(r"Function properties for _ZN7stage(\d\d)\w*?_cu_[0-9a-f]{8}\d+([a-z_]+_kernel)"
                           r"(?:ILi(\d+)E(?:Li(\d+)E)?)?\w*\n\s*(\d+) bytes stack frame, (\d+) bytes spill stores, "
                           r"(\d+) bytes spill loads\nptxas info\s*: Used (\d+) registers")
        found = [m for m in entry.finditer(text) if (m[1], m[2], m[3] or "") == (stage, kernel, d)]
        if not found:
            raise KeyError(spec)
        m = max(found, key=lambda m: int(m[4] or 0))
        return {"stack": m[5], "spill-stores": m[6], "spill-loads": m[7], "registers": m[8]}[what]
    if kind == "ptxas12":  # ptxas12/dD/cC/CONFIG/WHAT, the largest over bf16 and fp16
        found = [v for (_, d, c, cfg), v in ptxas_stage12_entries().items()
                 if (d, c, cfg) == (int(parts[1][1:]), parts[2] == "c1", parts[3])]
        if not found:
            raise KeyError(spec)
        i = ("registers", "stack", "spill-stores", "spill-loads").index(parts[4])
        return str(max(v[i] for v in found))
    if kind == "ptxas12-spilling":  # ptxas12-spilling: "K of M" of stage 12's kernels spill
        entries = ptxas_stage12_entries()
        return f"{sum(v[2] > 0 for v in entries.values())} of {len(entries)}"
    if kind == "decode":  # decode/PAGE/B/N/gbs|pct|us
        r = load_decode_bench()[(int(parts[1]), int(parts[2]), int(parts[3]))]
        if parts[4] == "pct":
            return f"{100 * r['gbs'] / (float((anchors if anchors is not None else load_anchors())['hbm']) * 1e3):.0f}"
        return f"{r['us']:.1f}" if parts[4] == "us" else f"{r['gbs']:.0f}"
    if kind == "variant":  # variant/dD/cC/N/SLUG/tflops|ms: a row of h100_stage10_variants.txt
        d, causal, n, slug, what = int(parts[1][1:]), parts[2] == "c1", int(parts[3]), parts[4], parts[5]
        row = load_variants()[(d, causal, n, slug)]
        return f"{row['tflops']:.1f}" if what == "tflops" else f"{row['ms']:.3f}"
    if kind in ("variant12", "variant12-step", "variant12-total", "variant12-after-b", "variant12-same"):
        tag, d, causal, n = parts[1], int(parts[2][1:]), parts[3] == "c1", int(parts[4])
        block = variants12_block(load_variants12(), tag, d, causal, n)
        if kind == "variant12":
            row = block[parts[5]]
            return f"{row['tflops']:.1f}" if parts[6] == "tflops" else f"{row['ms']:.3f}"
        if kind == "variant12-step":
            return f"{variant12_step(block, parts[5]):.2f}"
        if kind == "variant12-total":
            return f"{variant12_span(block, VARIANTS12_LADDER[0], VARIANTS12_B):.2f}"
        if kind == "variant12-after-b":
            return f"{variant12_span(block, VARIANTS12_B, VARIANTS12_AS_BUILT):.2f}"
        return f"{variant12_same(block):.1f}"
    if kind == "variant12-same-max":  # .../all or .../dD
        spread = [variant12_same(b) for key, (_, b) in load_variants12().items()
                  if parts[1] == "all" or key[1] == int(parts[1][1:])]
        if not spread:
            raise KeyError(spec)
        return f"{max(spread):.1f}"
    if kind == "ncu12":  # ncu12/dD/WHAT
        return ncu12_value(int(parts[1][1:]), parts[2])
    if kind == "ncu12-l2":  # ncu12-l2/persistent|pairs/WHAT
        return ncu12_l2_value(parts[1], parts[2])
    if kind == "sanitizer":  # sanitizer/STEM/SUBJECT
        return sanitizer_clean(parts[1], parts[2])
    if kind == "ctest":  # ctest/passed|total|skipped|TESTNAME
        return ctest_value(parts[1])
    if kind == "ctest-log":  # ctest-log/STEM/passed|total|skipped|TESTNAME
        return ctest_value(parts[2], parts[1])
    if kind in ("decode-compare", "decode-versus"):
        batch, seq_kv = int(parts[1]), int(parts[2])
        if kind == "decode-versus" or parts[3] == "ratio":
            ratio = decode_compare_ratio(batch, seq_kv)
            if kind == "decode-compare":
                return f"{ratio:.2f}"
            printed = round(ratio, 2)
            return ("on par with" if abs(printed - 1) <= DECODE_PAR else "faster than" if printed > 1
                    else "slower than")
        r = load_decode_compare()[(parts[3], batch, seq_kv)]
        if parts[4] == "pct":
            return f"{100 * r['gbs'] / (float((anchors if anchors is not None else load_anchors())['hbm']) * 1e3):.0f}"
        return f"{r['median_us']:.1f}" if parts[4] == "us" else f"{r['gbs']:.0f}"
    if kind == "decode-splits":  # decode-splits/B/N/S (µs) or decode-splits/B/N/S/vsT (time(S) / time(T))
        rows = load_decode_splits()[(int(parts[1]), int(parts[2]))]["rows"]
        us = rows[int(parts[3])][1]
        if len(parts) == 5:
            return f"{us / rows[int(parts[4][2:])][1]:.2f}"
        return f"{us:.1f}"
    if kind in ("decode-target", "decode-met"):
        hbm_gbs = float((anchors if anchors is not None else load_anchors())["hbm"]) * 1e3
        shares = [g / hbm_gbs for g in decode_target_gbs(parts[1])]
        if kind == "decode-target":
            return f"{100 * {'min': min, 'max': max}[parts[2]](shares):.0f}"
        met = sum(share >= DECODE_GOAL for share in shares)
        return {3: "all three", 2: "two of the three", 1: "one of the three", 0: "none of the three"}[met]
    if kind == "traffic-ms":  # traffic-ms/SS/dD/PASSES: passes over the workspace at the measured copy rate
        stage, d, passes = int(parts[1]), int(parts[2][1:]), int(parts[3])
        workspace = next(b["workspace_bytes"] for b in json.loads(BENCH.read_text())["benchmarks"]
                         if b["name"].startswith(f"stage{stage:02d}_") and f"/d{d}/causal0/seq:{COURSE_SEQ}/" in b["name"])
        copy = float((anchors if anchors is not None else load_anchors())["copy"])
        return f"{passes * workspace / (copy * 1e12) * 1e3:.1f}"
    raise KeyError(spec)


class Values(dict):
    """Every figure a page asks for, computed on first use from files loaded once."""

    def __init__(self):
        super().__init__()
        self.sources = {"runs": load_bench(), "backward": load_bench(backward=True), "compare": load_compare(),
                        "anchors": load_anchors()}
        if float(self.sources["anchors"]["peak-fp32"]) != FP32_PEAK_TFLOPS:
            raise SystemExit("FP32_PEAK_TFLOPS differs from bench/results/pytorch_anchors_h100.md")

    def __missing__(self, spec):
        try:
            self[spec] = value(spec, **self.sources)
        except FileNotFoundError as e:
            raise SystemExit(f"no measured figure for value:{spec}: bench/results/{pathlib.Path(e.filename).name} "
                             f"does not exist yet (scripts/device/gpu_check_ablation.sh and the profile scripts write it)")
        except (KeyError, IndexError, ValueError) as e:
            raise SystemExit(f"no measured figure for value:{spec} ({e!r})")
        return self[spec]


def fill(text, all_tables, values, where):
    """text with every table region and inline figure regenerated."""
    def table(m):
        name = m[1]
        if name in MISSING:
            raise SystemExit(f"{where}: table {name} needs {MISSING[name]}, which bench/results/ does not have yet")
        if name not in all_tables:
            raise SystemExit(f"{where}: no table named {name}")
        return f"<!-- table:{name} -->\n{all_tables[name]}\n<!-- /table:{name} -->"

    text = re.sub(r"<!-- table:([\w-]+) -->.*?<!-- /table:\1 -->", table, text, flags=re.S)
    return VALUE.sub(lambda m: f"<!-- value:{m[1]} -->{values[m[1]]}<!-- /value -->", text)


def stale_regions(old, new):
    """Names of the regions of old that fill() changed."""
    names = []
    olds = re.findall(r"<!-- (table:[\w-]+|value:[\w./+-]+) -->(.*?)<!-- /", old, flags=re.S)
    news = re.findall(r"<!-- (table:[\w-]+|value:[\w./+-]+) -->(.*?)<!-- /", new, flags=re.S)
    for (name, a), (_, b) in zip(olds, news):
        if a != b:
            names.append(f"{name} (has {a.strip()[:40]!r}, measured {b.strip()[:40]!r})" if name.startswith("value")
                         else name)
    return names


def update(path, all_tables, values):
    text = path.read_text()
    new = fill(text, all_tables, values, path)
    if new != text:
        path.write_text(new)
        print(f"updated {path}")


def check(paths, all_tables, values):
    """1 if any generated region of paths is out of date (the CPU test), else 0."""
    stale = 0
    for path in paths:
        text = path.read_text()
        try:
            new = fill(text, all_tables, values, path)
        except SystemExit as e:  # a figure with no source: stale, and say which
            stale += 1
            where = str(path.relative_to(ROOT) if path.is_absolute() else path)
            print(str(e).replace(str(path), where) if str(path) in str(e) else f"{where}: {e}")
            continue
        if new != text:
            stale += 1
            for name in stale_regions(text, new) or ["a generated region"]:
                print(f"{path.relative_to(ROOT) if path.is_absolute() else path}: out of date: {name}")
    n = len(paths)
    if stale:
        print(f"make_tables --check: {stale} of {n} files out of date; "
              f"run python3 scripts/docs/make_tables.py --update {' '.join(PAGES)}")
        return 1
    print(f"make_tables --check: {n} files, every table and inline figure matches bench/results/")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--update", nargs="+", type=pathlib.Path, help="files whose generated regions to rewrite")
    parser.add_argument("--check", nargs="*", type=pathlib.Path,
                        help="files to check (default: every course page); exit 1 if any region is stale")
    args = parser.parse_args()
    all_tables = tables()
    values = Values()
    if args.check is not None:
        paths = args.check or sorted({p for pattern in PAGES for p in ROOT.glob(pattern)})
        return check(paths, all_tables, values)
    if args.update:
        for path in args.update:
            update(path, all_tables, values)
    else:
        for name, table in all_tables.items():
            print(f"## {name}\n\n{table}\n")


if __name__ == "__main__":
    raise SystemExit(main())
