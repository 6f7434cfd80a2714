"""Lessons 01-07: Nsight Compute metrics of the fp32 stages, stage 07's backward kernels and their
registers, and stage 04 -> 05 one change at a time with stage 06's block order
(bench/stage05_ablation.cu)."""
import csv
import re

from .common import COURSE_SEQ, NCU_BACKWARD, RESULTS, value, value_kind


# Nsight Compute metric -> (row label, divisor, decimals), in the order the table shows them. The rows
# after the first ten are shown only where the CSV has the metric (scripts/profile/profile_stages.sh collects
# them for the lessons' "what binds" sections).
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


NCU_ALWAYS = list(NCU_ROWS)[:10]  # the rows every profile has: shown as "–" when missing


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


@value_kind("ncu-per")
def _ncu_per(spec, parts, kind, runs, backward, compare, anchors):
    # ncu-per/dD/SS/METRIC_A/METRIC_B: one metric of a stage over another
    d, stage, a, b = int(parts[1][1:]), int(parts[2]), parts[3], parts[4]
    metrics = load_ncu(d)[stage]
    return f"{metrics[a] / metrics[b]:.1f}"


@value_kind("ncu", "ncu-ratio")
def _ncu(spec, parts, kind, runs, backward, compare, anchors):
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


@value_kind("ncu-nonffma")
def _ncu_nonffma(spec, parts, kind, runs, backward, compare, anchors):
    d, stage = int(parts[1][1:]), int(parts[2])
    m = load_ncu(d)[stage]
    if "smsp__inst_executed.sum" not in m:
        raise KeyError(f"{ncu_path(d).name} has no smsp__inst_executed.sum for stage {stage:02d}: run "
                       f"scripts/profile/profile_stages.sh {d}")
    return f"{nonffma_pct(m):.1f}"


@value_kind("ncu-kernel")
def _ncu_kernel(spec, parts, kind, runs, backward, compare, anchors):
    # ncu-kernel/dD/SS/KERNEL/METRIC
    d, stage, kernel, metric = int(parts[1][1:]), int(parts[2]), parts[3], parts[4]
    m = load_ncu_kernels(d)[stage][kernel]
    if metric == "nonffma":
        return f"{nonffma_pct(m):.1f}"
    label, divisor, decimals = NCU_ROWS[metric]
    return f"{m[metric] / divisor:,.{decimals}f}"


@value_kind("ablation", "ablation-gain", "ablation-total", "ablation-top", "ablation-order", "ablation-causal", "causal-predicted")
def _ablation(spec, parts, kind, runs, backward, compare, anchors):
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


@value_kind("ncu-raw", "ncu-pct", "ncu-tflops", "ncu-warp-ffma", "ncu-loads-per-ffma", "ncu-warps-per-scheduler", "ffma-split")
def _ncu_raw(spec, parts, kind, runs, backward, compare, anchors):
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


@value_kind("bwd-split")
def _bwd_split(spec, parts, kind, runs, backward, compare, anchors):
    d, name, what = int(parts[1][1:]), parts[2] + "_kernel", parts[3]
    times = {}
    for row in csv.reader(NCU_BACKWARD.open()):
        if int(row[0]) == d:
            times[next(k for k in ("row_dot_kernel", "dk_dv_kernel", "dq_kernel") if k in row[5])] = \
                float(row[-1].replace(",", "")) / 1e6
    return f"{times[name]:.2f}" if what == "ms" else f"{100 * times[name] / sum(times.values()):.0f}"


@value_kind("ptxas")
def _ptxas(spec, parts, kind, runs, backward, compare, anchors):
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
