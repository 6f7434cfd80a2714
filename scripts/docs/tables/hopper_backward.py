"""Lesson 14 (the Hopper backward): stage 14 against cuDNN's and FlashAttention-2's backward, and against
stage 11's, in bench/compare.py's bf16 and fp16 runs (compare_h100_bf16.json, compare_h100_fp16.json), and
its main kernel in Nsight Compute beside stage 11's (h100_ncu_stage14.csv, scripts/profile/profile_stage14.sh).

The pages ask for these before the runs exist: where the results files hold no stage 14 cells, or the
profile file is not there yet, each table and phrase says "not measured yet" and names what writes it,
so that make_tables --check passes until the files are committed, and then fills them in."""
import csv
import json
import re
import statistics

from .common import RESULTS, TARGET_FLOOR, geo_mean, value_kind

TAGS = ("bf16", "fp16")


# compare.py's impl names: the default mode, the deterministic mode, the peers and stage 11.
STAGE, DETERMINISTIC = "stage14", "stage14-det"
PEERS = (("stage11", "× stage 11"), ("sdpa-flash", "× FA2"), ("sdpa-cudnn", "× cuDNN"), ("fa4", "× FA4"))


# The cells the lesson's table shows; the geometric means are over every cell with N >= 1024, as
# bench/compare.py and the other lessons compute them.
SHOWN_SEQS = (4096, 16384)


MIN_SEQ = 1024


COMPARE_HINT = ("`bench/compare.py --dtype bfloat16` and `--dtype float16` on an H100 with stage 14 built "
                "write its cells (`stage14`, `stage14-det`) into `bench/results/compare_h100_bf16.json` and "
                "`compare_h100_fp16.json`; then `python3 scripts/docs/make_tables.py --update` fills this in")


NCU_FILE = "h100_ncu_stage14.csv"


NCU_HINT = (f"`scripts/profile/profile_stage14.sh` writes `bench/results/{NCU_FILE}` on an H100; once it is "
            "committed, `python3 scripts/docs/make_tables.py --update` fills this table")


def load_backward_file(name):
    """{(impl, head_dim, causal, seq): row} of the backward cells that ran in bench/results/NAME."""
    return {(r["impl"], r["head_dim"], r["causal"], r["seq"]): r
            for r in json.loads((RESULTS / name).read_text())["results"]
            if r["status"] == "ok" and r["direction"] == "backward"}


def load_backward(tag):
    """load_backward_file of compare_h100_TAG.json, the lesson's run."""
    return load_backward_file(f"compare_h100_{tag}.json")


def measured_tags():
    """The dtypes whose compare file holds stage 14's backward."""
    return [tag for tag in TAGS if any(k[0] == STAGE for k in load_backward(tag))]


def speeds(rows, over, base):
    """{(d, causal, n): base's time over `over`'s} for the cells with N >= MIN_SEQ where both ran: above 1,
    `over` is faster."""
    return {k[1:]: rows[(base,) + k[1:]]["median_ms"] / r["median_ms"]
            for k, r in rows.items() if k[0] == over and k[3] >= MIN_SEQ and (base,) + k[1:] in rows}


def not_measured(what):
    return f"(not measured yet) {what}: {COMPARE_HINT}."


def stage14_compare_table():
    """Stage 14's backward per cell, bf16 and fp16: TFLOP/s, its speed over stage 11, FlashAttention-2 and
    cuDNN, and the deterministic mode's speed over the default mode's; the geometric means over N >= 1024."""
    tags = measured_tags()
    if not tags:
        return not_measured("no stage 14 backward cells in the committed compare runs")
    rows = {tag: load_backward(tag) for tag in TAGS}
    columns = [(base, label) for base, label in PEERS] + [(DETERMINISTIC, "det / default")]
    head = " | ".join(f"{tag}: TFLOP/s | " + " | ".join(label for _, label in columns) for tag in TAGS)
    lines = [f"| d | causal | N | {head} |", "|---|---|---|" + "---|" * (len(columns) + 1) * len(TAGS)]
    for d in (64, 128):
        for causal in (False, True):
            for n in SHOWN_SEQS:
                cells = []
                for tag in TAGS:
                    r = rows[tag].get((STAGE, d, causal, n))
                    cells.append(f"{r['tflops']:.1f}" if r else "–")
                    for base, _ in columns:
                        b = rows[tag].get((base, d, causal, n))
                        if not (r and b):
                            cells.append("–")
                        elif base == DETERMINISTIC:  # the deterministic mode's speed over the default's
                            cells.append(f"{r['median_ms'] / b['median_ms']:.2f}x")
                        else:
                            cells.append(f"{b['median_ms'] / r['median_ms']:.2f}x")
                lines.append(f"| {d} | {'yes' if causal else 'no'} | {n} | " + " | ".join(cells) + " |")
    means = []
    for tag in TAGS:
        means.append("")
        for base, _ in columns:
            found = (speeds(rows[tag], DETERMINISTIC, STAGE) if base == DETERMINISTIC
                     else speeds(rows[tag], STAGE, base)).values()
            means.append(f"{geo_mean(list(found)):.2f}x (min {min(found):.2f}x)" if found else "–")
    lines.append(f"| geometric mean | | N >= {MIN_SEQ} | " + " | ".join(means) + " |")
    meta = json.loads((RESULTS / f"compare_h100_{tags[0]}.json").read_text())["meta"]
    missing = [tag for tag in TAGS if tag not in tags]
    lines.append("")
    lines.append(f"Backward, {meta['gpu']}, PyTorch {meta['torch']}; B·N = 16384 tokens, H·d = 2048 (32 heads at "
                 "head_dim 64, 16 at 128). TFLOP/s by the FlashAttention convention (2.5 × the forward's "
                 "4·B·H·N²·d, halved when causal). × X: X's median time over stage 14's in the same run (above 1: "
                 "stage 14 is faster); FA2 = `sdpa-flash` (FlashAttention-2), cuDNN = `sdpa-cudnn`, FA4 = FlashAttention-4 "
                 f"(`flash-attn-4` {meta.get('fa4') or 'not installed: –'}, its `flash_attn_func`). det / default: "
                 "the deterministic mode's speed over the default mode's. The rows show N = "
                 f"{' and '.join(map(str, SHOWN_SEQS))}; the geometric means and their lowest cells are over every "
                 f"cell with N >= {MIN_SEQ} (the compare files hold N = 512 to 16384). "
                 + (f"{' and '.join(missing)}: not measured yet ({COMPARE_HINT}). " if missing else "")
                 + "From `bench/results/compare_h100_bf16.json` and `compare_h100_fp16.json`.")
    return "\n".join(lines)


def where(cell, with_dtype):
    tag, d, causal, n = cell
    return f"{tag + ', ' if with_dtype else ''}head_dim {d}, {'causal' if causal else 'not causal'}, N = {n}"


def summary(form):
    """Stage 14's backward in a sentence, from the compare runs: form "lesson" (the lesson's opening
    paragraph) or "short" (a cell of the course tables). "(not measured yet)" and what writes the cells,
    until the runs hold stage 14."""
    tags = measured_tags()
    if not tags:
        if form == "short":
            return "backward: not measured yet (`bench/compare.py` writes its cells)"
        return not_measured("stage 14's backward against cuDNN's and FlashAttention-2's")
    rows = {tag: load_backward(tag) for tag in tags}

    def cells(over, base):
        return {(tag,) + k: v for tag in tags for k, v in speeds(rows[tag], over, base).items()}

    def mean(c, decimals=2):
        return f"{geo_mean(list(c.values())):.{decimals}f}x" if c else "–"

    cudnn, flash, s11 = cells(STAGE, "sdpa-cudnn"), cells(STAGE, "sdpa-flash"), cells(STAGE, "stage11")
    det = cells(DETERMINISTIC, STAGE)
    dtypes = " and ".join(tags)
    both = len(tags) > 1
    if form == "short":
        return (f"backward {mean(cudnn)} cuDNN's over {dtypes}" +
                (f" (lowest cell {min(cudnn.values()):.2f}x)" if cudnn else "") +
                f", {mean(flash)} FlashAttention-2's, {mean(s11)} stage 11's; deterministic mode {mean(det)} the default's")
    low = min(cudnn, key=cudnn.get) if cudnn else None
    below = sum(round(x, 2) < 1 for x in cudnn.values())
    below_floor = sum(round(x, 2) < TARGET_FLOOR for x in cudnn.values())
    text = (f"Over {dtypes}, head_dim 64 and 128, causal and not, N {MIN_SEQ}-16384 (geometric means of "
            f"`bench/compare.py`'s cells), this backward runs at {mean(cudnn, 3)} the speed of cuDNN's "
            f"(`sdpa-cudnn`)")
    if low:
        text += (f", {below} of {len(cudnn)} cells below 1.0x and {below_floor} below {TARGET_FLOOR}x, the lowest "
                 f"{cudnn[low]:.2f}x ({where(low, both)})")
    text += f"; at {mean(flash)} FlashAttention-2's (`sdpa-flash`) and {mean(s11)} stage 11's"
    fa4 = cells("fa4", "sdpa-cudnn")
    if fa4:
        text += f". FlashAttention-4's backward (`flash-attn-4`), timed in the same runs, is at {mean(fa4)} cuDNN's"
    text += (f". Its deterministic "
             f"mode runs at {mean(det)} the default mode's speed")
    if det:
        text += f" (lowest cell {min(det.values()):.2f}x)"
    text += ". From `bench/results/compare_h100_bf16.json` and `compare_h100_fp16.json`"
    if not both:
        text += f" ({[t for t in TAGS if t not in tags][0]}: not measured yet)"
    return text + "."


def stage14_standing():
    return summary("lesson")


@value_kind("stage14-summary")
def _stage14_summary(spec, parts, kind, runs, backward, compare, anchors):
    # stage14-summary/short|lesson
    return summary(parts[1])


# The rows of the profile table: the script's metrics, in the order the lesson reads them.
# metric -> (label, decimals)
NCU14_ROWS = {
    "gpu__time_duration.sum": ("kernel time (ms)", 3),
    "launch__registers_per_thread": ("registers per thread at launch", 0),
    "sm__warps_active.avg.pct_of_peak_sustained_active": ("warps active (% of 64 per SM)", 1),
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active": ("tensor pipe active (% of peak)", 1),
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": ("SM throughput (% of peak)", 1),
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": ("DRAM throughput (% of peak)", 1),
    "lts__t_sector_hit_rate.pct": ("L2 hit rate (% of sectors)", 1),
    "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum.pct_of_peak_sustained_elapsed":
        ("shared memory's data pipe busy (% of peak wavefronts)", 1),
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum": ("shared-memory bank conflicts", 0),
    "lts__throughput.avg.pct_of_peak_sustained_elapsed": ("L2 throughput (% of peak)", 1),
    "lts__d_atomic_input_cycles_active.avg.pct_of_peak_sustained_elapsed": ("L2 reduction units busy (% of peak)", 1),
    "smsp__cycles_elapsed.avg.per_second": ("SM clock (GHz)", 2),
    "launch__grid_size": ("blocks in the grid", 0),
    "launch__shared_mem_per_block_dynamic": ("dynamic shared memory per block (bytes)", 0),
    "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio": ("stalled at a barrier, per issue", 2),
    "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio":
        ("stalled on the long scoreboard, per issue", 2),
    "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio": ("stalled on a fixed wait, per issue", 2),
    "smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio":
        ("stalled on a busy math pipe, per issue", 2),
}


# The profiled problem (the script's benchmark): batch 4, N 4096, H·d = 2048, not causal.
NCU14_FLOPS = 2.5 * 4 * 4 * 4096 * 4096 * 2048


# Nsight Compute's clock units, to GHz.
CLOCK_UNITS = {"hz": 1e-9, "cycle/second": 1e-9, "cycle/usecond": 1e-3, "cycle/nsecond": 1.0, "ghz": 1.0,
               "mhz": 1e-3}
TIME_UNITS = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0, "msecond": 1.0, "s": 1e3, "second": 1e3}


def ncu_rows(name):
    """(row, value or None for n/a) of each row of the Nsight Compute CSV bench/results/NAME."""
    with (RESULTS / name).open(newline="") as f:
        for row in csv.DictReader(f):
            try:
                yield row, float(row["value"].replace(",", ""))
            except ValueError:
                yield row, None


def load_ncu14():
    """{(stage, head_dim, metric): (unit, value or None for n/a)} of NCU_FILE."""
    return {(int(row["stage"]), int(row["head_dim"]), row["metric"]): (row["unit"], figure)
            for row, figure in ncu_rows(NCU_FILE)}


CUDNN_NCU_FILE = "h100_ncu_cudnn_backward.csv"


def load_ncu_cudnn():
    """{("cudnn", head_dim, metric): (unit, value)} of cuDNN's main backward kernel (the longest of the
    call's kernels) per head_dim, from CUDNN_NCU_FILE; empty where the file is missing."""
    if not (RESULTS / CUDNN_NCU_FILE).exists():
        return {}
    kernels = {}
    for row, figure in ncu_rows(CUDNN_NCU_FILE):
        kernels.setdefault((int(row["head_dim"]), row["kernel"]), {})[row["metric"]] = (row["unit"], figure)
    out = {}
    for d in {d for d, _ in kernels}:
        main = max((m for (hd, _), m in kernels.items() if hd == d),
                   key=lambda m: m.get("gpu__time_duration.sum", ("", 0))[1] or 0)
        out.update({("cudnn", d, metric): entry for metric, entry in main.items()})
    return out


def ncu14_cell(found, stage, d, metric):
    entry = found.get((stage, d, metric))
    if entry is None:
        return None, "–"
    unit, figure = entry
    if figure is None:
        return None, "n/a"
    if metric == "gpu__time_duration.sum":
        figure *= TIME_UNITS.get(unit, float("nan"))
    if metric == "smsp__cycles_elapsed.avg.per_second":
        figure *= CLOCK_UNITS.get(unit.lower(), float("nan"))
    return figure, f"{figure:,.{NCU14_ROWS[metric][1]}f}"


def ncu_stage14_table():
    """Stage 14's main kernel (backward_kernel) and stage 11's (dk_dv_kernel) side by side, head_dim 128 and
    64, one row per metric of the script, and the backward's FLOPs over the kernel's time."""
    if not (RESULTS / NCU_FILE).exists():
        return f"(not measured yet) {NCU_HINT}."
    found = load_ncu14()
    found.update(load_ncu_cudnn())
    columns = [(d, stage) for d in (128, 64) for stage in (14, 11, "cudnn") if any(k[:2] == (stage, d) for k in found)]
    names = {14: "stage 14 `backward_kernel`", 11: "stage 11 `dk_dv_kernel`", "cudnn": "cuDNN's main kernel"}
    lines = ["| metric | " + " | ".join(f"{names[s]}, d = {d}" for d, s in columns) + " |",
             "|---|" + "---|" * len(columns)]
    for metric, (label, _) in NCU14_ROWS.items():
        lines.append(f"| {label} | " + " | ".join(ncu14_cell(found, s, d, metric)[1] for d, s in columns) + " |")
        if metric == "gpu__time_duration.sum":
            cells = []
            for d, s in columns:
                ms, _ = ncu14_cell(found, s, d, metric)
                cells.append(f"{NCU14_FLOPS / (ms * 1e-3) / 1e12:.1f}" if ms else "–")
            lines.append("| the backward's FLOPs over this kernel's time (TFLOP/s) | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("Nsight Compute (`ncu --clock-control none`), one launch of each main kernel, bf16, batch 4, N = 4096, "
                 "H·d = 2048 (16 heads at head_dim 128, 32 at 64), not causal, default mode: the benchmarks "
                 "`stage14_hopper_backward/bf16/dD/causal0/backward/seq:4096` and `stage11_backward_tc/...`. The "
                 "FLOPs are the whole backward's by the FlashAttention convention (2.5 × 4·B·H·N²·d), over the main "
                 "kernel's time alone (each stage's two small kernels left out). Registers at launch: stage 14's "
                 "consumer warpgroups then take 240 each with `setmaxnreg`, its producer warpgroup gives back to 24. "
                 "Stalls: warps stalled for that reason per issued instruction. \"–\": not in the file; \"n/a\": "
                 "what ncu wrote. From `bench/results/h100_ncu_stage14.csv` (`scripts/profile/profile_stage14.sh`). "
                 "cuDNN's: the longest kernel of one backward call of SDPA pinned to cuDNN on the same problem (its "
                 "other two, D = rowsum(dO o O) and dQ's conversion, left out), from `bench/results/"
                 + CUDNN_NCU_FILE + "` (`scripts/profile/profile_cudnn_backward.sh`).")
    return "\n".join(lines)


VARIANTS_FILE = "h100_stage14_variants_bf16.txt"
# (run, the variant's commit, what it changed, the baseline it was timed against)
VARIANT_RUNS = (("scores-ahead", "ceb7008", "the next step's $S^\\top$ issued before this step's dQ share is staged",
                 "3e1012a"),
                ("red-v4", "aba51c0", "dQ's share added from the consumers' registers by `red.global.add.v4.f32`",
                 "3e1012a"),
                ("descriptors-at-issue", "fa0b401, kept", "each `wgmma`'s descriptors advanced where it is issued",
                 "3e1012a"),
                ("step-order", "1cbccea", "dV issued before $dS^\\top$ is computed (head_dim 128), the dQ share before "
                 "dK and staged while dK runs", "9c41013"),
                ("rotated-start-on-step-order", "00ace29", "the above, and without the mask each block starting at its "
                 "own query tile", "1cbccea"),
                ("rotated-start-and-step-order", "00ace29", "the same two changes", "9c41013"),
                ("lse-d-shuffles", "a4a37ca", "lse and D loaded once per warp and handed out by shuffles "
                 "(64 query rows: head_dim 128)", "9c41013"),
                ("key-fragments", "4654f2a, kept", "K's first 4 k-steps held in registers as $S^\\top$'s A operand",
                 "9c41013"),
                ("dq-barriers-per-warpgroup", "f8f7691, kept", "a pair of dQ staging barriers per consumer warpgroup, "
                 "each share added on its own", "4654f2a"),
                ("columns-ahead", "53d9289", "at head_dim 128 lse and D loaded into registers ahead of the "
                 "products, in place of K's fragments", "642116a"),
                ("staggered-start", "55c977a", "without the mask each block starting at a query tile of its own, "
                 "the deterministic adds ranked by arrival", "ca08815"),
                ("head-waves", "ee2a5e8, kept", "the blocks in waves of K/V heads, key tile first inside a wave",
                 "ca08815"))
# The runs about the block order, whose deterministic mode the second table shows cell by cell.
ORDER_RUNS = ("staggered-start", "head-waves")


def load_variants(column="s14"):
    """{(run, 'baseline' | 'variant', d, causal, n): [TFLOP/s, one per round]} of VARIANTS_FILE: stage 14's
    (column s14) or its deterministic mode's (s14d)."""
    found, key = {}, None
    for line in (RESULTS / VARIANTS_FILE).read_text().splitlines():
        head = re.match(r"## (\S+) run, round \d+: (baseline|variant)", line)
        if head:
            key = (head[1], head[2])
            continue
        cell = re.match(r"d(\d+) N(\d+) causal=(\d) s14=(\d+) s14d=(\d+)", line)
        if cell and key:
            d, n, causal = (int(x) for x in cell.groups()[:3])
            tflops = int(cell[4] if column == "s14" else cell[5])
            found.setdefault(key + (d, causal, n), []).append(tflops)
    return found


def variant_ratio(found, run, d, c, n):
    """The median over the run's rounds of the variant's TFLOP/s over that of the baseline's."""
    return statistics.median(found[(run, "variant", d, c, n)]) / statistics.median(found[(run, "baseline", d, c, n)])


def stage14_variants_table():
    """Each variant against its baseline in its run: per cell of the sequence lengths every run timed, the
    median over rounds of stage 14's TFLOP/s, the variant's over the baseline's; the geometric mean of that
    per head_dim, and the same for the deterministic mode; then the deterministic mode cell by cell for the
    runs about the block order."""
    found, det = load_variants(), load_variants("s14d")
    runs = [run for run, _, _, _ in VARIANT_RUNS]
    seqs = sorted(set.intersection(*({k[4] for k in found if k[0] == run} for run in runs)))
    lines = ["| variant | baseline | head_dim | " + " | ".join(f"N {n}{', causal' if c else ''}" for c in (0, 1) for n in seqs)
             + " | geometric mean | deterministic mode, geometric mean |", "|---|---|---|" + "---|" * (2 * len(seqs) + 2)]
    for run, commit, what, baseline in VARIANT_RUNS:
        for d in (64, 128):
            ratios = [variant_ratio(found, run, d, c, n) for c in (0, 1) for n in seqs]
            det_ratios = [variant_ratio(det, run, d, c, n) for c in (0, 1) for n in seqs]
            lines.append(f"| {what} ({commit}) | {baseline} | {d} | " + " | ".join(f"{r:.2f}" for r in ratios)
                         + f" | {geo_mean(ratios):.2f} | {geo_mean(det_ratios):.2f} |")
    rounds = {run: len(found[(run, "baseline", 64, 0, seqs[0])]) for run in runs}
    lines.append("")
    lines.append("Stage 14's backward, bf16, on the FlashAttention grid (B·N = 16384, H·d = 2048), NVIDIA H100 80GB "
                 "HBM3: each variant's TFLOP/s over its baseline's (stage 14 at the baseline's commit), each the median over the run's rounds ("
                 + ", ".join(f"{run}: {k}" for run, k in rounds.items()) + ") of `scripts/device/time_backward.py`'s "
                 "median of 20 calls; the two builds alternated in one run, the baseline first. Above 1: the "
                 "variant is faster. The geometric means are over the cells shown; the last column's, over the same "
                 f"cells of the deterministic mode (each build's own). From `bench/results/{VARIANTS_FILE}`.")
    lines.append("")
    order_seqs = sorted({k[4] for k in det if k[0] in ORDER_RUNS})
    lines.append("| variant | head_dim | causal | " + " | ".join(f"N {n}" for n in order_seqs)
                 + " | variant: deterministic / default, lowest |")
    lines.append("|---|---|---|" + "---|" * (len(order_seqs) + 1))
    for run, commit, what, baseline in VARIANT_RUNS:
        if run not in ORDER_RUNS:
            continue
        for d in (64, 128):
            for c in (0, 1):
                cells = [f"{variant_ratio(det, run, d, c, n):.2f}" if (run, "variant", d, c, n) in det else "–"
                         for n in order_seqs]
                own = [statistics.median(det[(run, "variant", d, c, n)]) / statistics.median(found[(run, "variant", d, c, n)])
                       for n in order_seqs if (run, "variant", d, c, n) in det]
                lines.append(f"| {what} ({commit}) | {d} | {'yes' if c else 'no'} | " + " | ".join(cells)
                             + f" | {min(own):.2f} |")
    lines.append("")
    lines.append("The deterministic mode of the same runs: its TFLOP/s in the variant's build over that in the "
                 "baseline's, the median over the rounds of each, per cell (\"–\": not timed in that run). The last "
                 "column: the variant's deterministic mode over its default mode, the lowest over the row's cells. "
                 f"From `bench/results/{VARIANTS_FILE}`.")
    return "\n".join(lines)


POWER_FILE = "h100_backward_power_bf16.txt"


def stage14_power_table():
    """Stage 14's backward and cuDNN's, each called back to back for two seconds (backward_power.py): per
    cell the means over the file's two passes of TFLOP/s at the median call, SM clock and power, and
    stage 14's speed and work per clock over cuDNN's."""
    found = {}
    for line in (RESULTS / POWER_FILE).read_text().splitlines():
        m = re.match(r"d(\d+) N(\d+) causal=(\d) (\S+)\s+median\s+\S+ ms \(\s*(\d+) TFLOP/s\).*SM clock\s+(\d+) MHz, "
                     r"power\s+(\d+) W", line)
        if m:
            d, n, causal, impl = int(m[1]), int(m[2]), int(m[3]), m[4]
            found.setdefault((d, n, causal), {}).setdefault(impl, []).append((float(m[5]), float(m[6]), float(m[7])))
    lines = ["| d | N | causal | stage 14 TFLOP/s | its SM clock (MHz) | its power (W) | cuDNN TFLOP/s | "
             "its SM clock (MHz) | its power (W) | stage 14 / cuDNN | per clock |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for (d, n, causal), impls in found.items():
        s14 = [statistics.mean(x[i] for x in impls["stage14"]) for i in range(3)]
        cud = [statistics.mean(x[i] for x in impls["cudnn"]) for i in range(3)]
        lines.append(f"| {d} | {n} | {'yes' if causal else 'no'} | {s14[0]:.0f} | {s14[1]:.0f} | {s14[2]:.0f} | "
                     f"{cud[0]:.0f} | {cud[1]:.0f} | {cud[2]:.0f} | {s14[0] / cud[0]:.2f}x | "
                     f"{(s14[0] / s14[1]) / (cud[0] / cud[1]):.2f}x |")
    lines.append("")
    lines.append("Stage 14's backward and cuDNN's (`sdpa-cudnn`), bf16, B·N = 16384, H·d = 2048, NVIDIA H100 80GB HBM3 "
                 "(power limit 700 W, SM clock up to 1980 MHz), each called back to back for two seconds while "
                 "`nvidia-smi` sampled the SM clock and the board's power every 100 ms; two passes over the cells, "
                 "the two in turn in each, and each figure the mean of the two passes. TFLOP/s: at the median call "
                 "(FlashAttention convention, causal counting half the pairs). Per clock: stage 14's TFLOP/s per MHz "
                 "over cuDNN's. From `bench/results/" + POWER_FILE + "` (`scripts/device/backward_power.py`).")
    return "\n".join(lines)


def stage14_timing_method_table():
    """Stage 14's backward over cuDNN's and FlashAttention-2's with a cell's backwards timed one after the
    other (the *_sequential_backward files) and in interleaved rounds (the lesson's files): geometric
    means over N >= MIN_SEQ and over the issue grid's N 4096 and 16384, and the lowest cell."""
    lines = ["| timing of a cell's backwards | dtype | stage 14 / cuDNN, N >= 1024 | lowest cell | "
             "N 4096 and 16384 | stage 14 / FA2, N >= 1024 | deterministic / default |",
             "|---|---|---|---|---|---|---|"]
    for label, suffix in (("one implementation after the other (fa0b401)", "_sequential_backward"),
                          ("in the cell's interleaved rounds (4d2c213)", "_interleaved_backward")):
        for tag in TAGS:
            rows = load_backward_file(f"compare_h100_{tag}{suffix}.json")
            cudnn, flash = speeds(rows, STAGE, "sdpa-cudnn"), speeds(rows, STAGE, "sdpa-flash")
            det = speeds(rows, DETERMINISTIC, STAGE)
            grid = [v for k, v in cudnn.items() if k[2] in SHOWN_SEQS]
            lines.append(f"| {label} | {tag} | {geo_mean(list(cudnn.values())):.3f}x | {min(cudnn.values()):.2f}x | "
                         f"{geo_mean(grid):.3f}x | {geo_mean(list(flash.values())):.2f}x | "
                         f"{geo_mean(list(det.values())):.2f}x |")
    lines.append("")
    lines.append("Stage 14's backward over cuDNN's (`sdpa-cudnn`) and FlashAttention-2's (`sdpa-flash`), and its "
                 "deterministic mode over its default mode: geometric means of the ratios of median times, NVIDIA "
                 "H100 80GB HBM3, head_dim 64 and 128, causal and not. The kernel is the same in both runs (fa0b401's; "
                 "d20d578 and abfe272 changed compare.py's timing, 4d2c213 added the fa4 column). One after the other: `--budget-ms 40`, "
                 "`bench/results/compare_h100_bf16_sequential_backward.json` and `compare_h100_fp16_sequential_backward.json`; "
                 "interleaved: `--budget-ms 150`, `compare_h100_bf16_interleaved_backward.json` and "
                 "`compare_h100_fp16_interleaved_backward.json` (the lesson's files before the kernel changed again).")
    return "\n".join(lines)


LOCKED_FILE = "h100_ncu_stage14_locked_clock_ab.txt"
DQ_ORDER_FILE = "h100_ncu_stage14_locked_clock_dq_order.txt"


def _locked_clock_runs(name):
    """The runs of a file of scripts/device/stage14_ab_ncu.sh's output: per run, per cell (d, N, causal), B's
    median time over A's and the tensor pipe's activity of B and A."""
    runs, run = {}, None
    for line in (RESULTS / name).read_text().splitlines():
        m = re.match(r'## Run "([^"]+)"', line)
        if m:
            run = m[1]
            runs[run] = {}
        m = re.match(r"d(\d+) N(\d+) c(\d) \|.*\| B/A ([\d.]+) \| tensor % B ([\d.]+) A ([\d.]+)", line)
        if m and run:
            runs[run][(int(m[1]), int(m[2]), int(m[3]))] = (float(m[4]), float(m[5]), float(m[6]))
    return runs


def _locked_clock_table(name, runs_said):
    """Per cell (every cell of any run: head_dim 128 first, then by N and mask), each run's B time / A time and
    tensor pipe (B → A); a cell a run did not time reads "-"."""
    runs = _locked_clock_runs(name)
    names = list(runs)
    cells = sorted({cell for r in names for cell in runs[r]}, key=lambda c: (-c[0], c[1], c[2]))
    lines = ["| d | N | causal | " + " | ".join(f"{n}: B time / A time | {n}: tensor pipe % (B → A)" for n in names)
             + " |", "|---|---|---|" + "---|---|" * len(names)]
    for cell in cells:
        d, n, causal = cell
        cols = [f"{runs[r][cell][0]:.3f}x | {runs[r][cell][1]:.1f} → {runs[r][cell][2]:.1f}" if cell in runs[r]
                else "- | -" for r in names]
        lines.append(f"| {d} | {n} | {'yes' if causal else 'no'} | " + " | ".join(cols) + " |")
    lines.append("")
    lines.append("Stage 14's main kernel under Nsight Compute with the clocks locked at base (`ncu --clock-control "
                 "base`), bf16, default mode, B·N = 16384, H·d = 2048, NVIDIA H100 80GB HBM3: the median of four "
                 "launches of each version (two rounds, the two versions in turn), B's time over A's (above 1: A is "
                 f"faster). {runs_said} From `bench/results/{name}` (`scripts/device/stage14_ab_ncu.sh`).")
    return "\n".join(lines)


def stage14_locked_clock_table():
    """The lse read ahead and the dS^T stores first, at locked clocks."""
    return _locked_clock_table(LOCKED_FILE, "lse-ahead: B the stage at 8e2dc1a, A the lse read before the products "
                               "(c7a770f); ds-stores-first: B that stage, A with $dS^\\top$ stored before $dV$ and "
                               "$dK$ are issued (7196da9).")


def stage14_dq_order_table():
    """The order of dK and dQ's share, at locked clocks."""
    return _locked_clock_table(DQ_ORDER_FILE, "B in every run: the stage at c7a770f. dq-before-dk: A issues dQ's "
                               "share before dK and stages it while dK runs, at every head_dim (f779061); "
                               "dv-waited: that order with dV waited for first, at every head_dim (dd0cd22); "
                               "kept: dV waited for at head_dim 128 only (2965763); q-tile-rotation: each block of "
                               "the unmasked default mode starts at its own query tile (da4b986).")


HEAD_DIM32_FILE = "h100_backward_head_dim32.txt"


def stage14_head_dim32_table():
    """Stage 14 at head_dim 32 (head_dim 64's tiles) beside stage 11, cuDNN and FlashAttention-2, and beside
    itself at head_dim 64 on the same tokens (scripts/device/head_dim32_backward.py)."""
    lines = ["| N | causal | stage 14 TFLOP/s | × stage 11 | × cuDNN | × FA2 | stage 14 at head_dim 64, TFLOP/s | "
             "head_dim 32's time / head_dim 64's |", "|---|---|---|---|---|---|---|---|"]
    for line in (RESULTS / HEAD_DIM32_FILE).read_text().splitlines():
        m = re.match(r"32 (\d+) (\d) \| (.*)", line)
        if not m:
            continue
        ms = {k: float(v) for k, v in re.findall(r"(d\d+ [\w-]+): ([\d.]+) ms", m[3])}
        tflops = dict(re.findall(r"(d\d+ [\w-]+): [\d.]+ ms, ([\d.]+) TFLOP/s", m[3]))
        own = ms["d32 stage14"]
        lines.append(f"| {m[1]} | {'yes' if m[2] == '1' else 'no'} | {float(tflops['d32 stage14']):.0f} | "
                     f"{ms['d32 stage11'] / own:.2f}x | {ms['d32 sdpa-cudnn'] / own:.2f}x | "
                     f"{ms['d32 sdpa-flash'] / own:.2f}x | {float(tflops['d64 stage14']):.0f} | "
                     f"{own / ms['d64 stage14']:.2f} |")
    lines.append("")
    lines.append("Stage 14's backward at head_dim 32, on head_dim 64's tiles, bf16, B·N = 16384, H·d = 2048 (64 heads "
                 "at head_dim 32), NVIDIA H100 80GB HBM3: the median of 20 calls of each implementation's backward "
                 "alone, in four interleaved rounds; × X: X's time over stage 14's (cuDNN and FA2: SDPA pinned to "
                 "its cuDNN and flash backends). The last two columns: stage 14 at head_dim 64 on the same tokens (32 "
                 "heads), which does the same products per head as head_dim 32 does here, on half the heads. TFLOP/s "
                 f"by the FlashAttention convention. From `bench/results/{HEAD_DIM32_FILE}` "
                 "(`scripts/device/head_dim32_backward.py`).")
    return "\n".join(lines)
