"""Lesson 11: stage 11's backward against FlashAttention-2 and cuDNN, dk_dv_kernel's changes timed one
against the other, its profile per kernel and beside FlashAttention-2's, its registers, the bf16 training
run, and the case that widened the half backward's error rule."""
import csv
import json
import re

from .common import RESULTS, ROOT, geo_mean, ncu_csv_rows, value_kind


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


# The backward columns of the stage 11 table: the stage in its two modes, FlashAttention-2, cuDNN.
BACKWARD_TC_IMPLS = ("stage11", "stage11-det", "sdpa-flash", "sdpa-cudnn")


def load_half_backward(tag):
    """{(impl, head_dim, causal, seq): row} of the backward runs that succeeded in compare_h100_TAG.json."""
    return {(r["impl"], r["head_dim"], r["causal"], r["seq"]): r
            for r in json.loads((RESULTS / f"compare_h100_{tag}.json").read_text())["results"]
            if r["status"] == "ok" and r["direction"] == "backward"}


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


# A block of h100_stage11_steps.txt: one round of one version in a run, the run named for the change it measures.
STAGE11_BLOCK = re.compile(r"## run (\S+) round \d+: (\S+)")


def stage11_best_rounds(runs):
    """{(run, version): {(d, causal, n): ms}} from h100_stage11_steps.txt for the given runs (bf16): per
    cell the fastest of the run's rounds."""
    best, run, version = {}, None, None
    for line in (RESULTS / "h100_stage11_steps.txt").read_text().splitlines():
        m = STAGE11_BLOCK.match(line)
        if m:
            run, version = m[1], m[2]
            continue
        m = re.match(r"stage11_backward_tc/bf16/d(\d+)/causal(\d)/backward/seq:(\d+) ([\d.]+)", line)
        if m and run in runs:
            cell = best.setdefault((run, version), {})
            key = (int(m[1]), m[2] == "1", int(m[3]))
            cell[key] = min(cell.get(key, float("inf")), float(m[4]))
    return best


# stage11-steps: (version, label) in the order the lesson takes them. Each is compared with the version
# it was timed against in the same run (h100_stage11_steps.txt says which run timed which).
STAGE11_STEPS = (("two-barriers", "two barriers"), ("one-barrier", "one barrier"),
                 ("br64", "larger step"), ("two-blocks", "2 blocks per SM"))


def stage11_steps_table():
    """dk_dv_kernel's measured changes: per cell, each version's fastest round (ms per backward call), and
    its speed over the version it is compared with, timed in the same run: one-barrier over two-barriers,
    br64 and two-blocks over one-barrier."""
    best = stage11_best_rounds(("barriers", "step-shapes"))
    pairs = (("barriers", "one-barrier", "two-barriers"), ("step-shapes", "br64", "one-barrier"),
             ("step-shapes", "two-blocks", "one-barrier"))
    label = dict(STAGE11_STEPS)
    lines = ["| d | causal | N | " + " | ".join(f"{label[v]} (ms)" for v, _ in STAGE11_STEPS) + " | " +
             " | ".join(f"{label[num]} / {label[den]}" for _, num, den in pairs) + " |",
             "|---|---|---|" + "---|" * (len(STAGE11_STEPS) + len(pairs))]
    keys = sorted(best[("barriers", "two-barriers")])
    gains = [[] for _ in pairs]
    for key in keys:
        d, causal, n = key
        times = [best[("barriers", "two-barriers")][key], best[("barriers", "one-barrier")][key],
                 best[("step-shapes", "br64")][key], best[("step-shapes", "two-blocks")][key]]
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
                 "run (run `barriers`: one barrier against two; run `step-shapes`: the two shapes against one "
                 "barrier), so the columns of different runs are not ratios of each other. From "
                 "`bench/results/h100_stage11_steps.txt`; the commands are in `bench/results/MANIFEST.md`.")
    return "\n".join(lines)


def stage11_order_table():
    """Causal blocks head by head (against step-counters) and P between the score products (p-mixed,
    against head-order): ms per call and the speed-up, per cell."""
    best = stage11_best_rounds(("head-order", "p-mixed"))
    pairs = (("head-order", "step-counters", "head-order"), ("p-mixed", "head-order", "p-mixed"))
    lines = ["| d | causal | N | step counters (ms) | head by head (ms) | speed-up | head by head (ms) | "
             "+ P before dP (ms) | speed-up |", "|---|---|---|---|---|---|---|---|---|"]
    gains = [[] for _ in pairs]
    for key in sorted(best[("head-order", "step-counters")]):
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
                 "changes. Head by head: causal blocks in the non-causal order (run `head-order`). + P before dP: "
                 "head by head with $P$ exponentiated between the two score products, kept (run `p-mixed`; the "
                 "copies of the step as in the text). Each figure is the fastest of the run's interleaved rounds "
                 "(two) of `flash-stages-bench`'s median; a speed-up compares two versions timed in the same run. "
                 "From "
                 "`bench/results/h100_stage11_steps.txt`; the commands are in `bench/results/MANIFEST.md`.")
    return "\n".join(lines)


def stage11_p_variants_table():
    """The placements of P tried (each over head-order in its run), and four changes on the kept kernel
    (over p-mixed): speed-ups per cell."""
    best = stage11_best_rounds(("p-branch", "p-select", "p-mixed", "stagger", "p-early-async-rows", "red-v4"))
    columns = (("mask a branch after dP", "p-branch", "head-order", "head-order+p-branch"),
               ("select on every step", "p-select", "head-order", "head-order+p-select"),
               ("two copies", "p-mixed", "head-order", "head-order+p-copies"),
               ("two copies, not causal (kept)", "p-mixed", "head-order", "p-mixed"),
               ("staggered start", "stagger", "p-mixed", "stagger"),
               ("P stored before dP", "p-early-async-rows", "p-mixed", "p-stored-early"),
               ("lse, D by cp.async", "p-early-async-rows", "p-mixed", "async-rows-2"),
               ("dQ by 16-byte reductions", "red-v4", "p-mixed", "red-v4"))
    lines = ["| d | causal | N | " + " | ".join(c[0] for c in columns) + " |", "|---|---|---|" + "---|" * len(columns)]
    gains = [[] for _ in columns]
    for key in sorted(best[("p-mixed", "head-order")]):
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
                 "H·d = 2048), NVIDIA H100 80GB HBM3, each over the kernel it was timed against in the same run: "
                 "the first four over head by head (the mask a branch after dP: run `p-branch`; a select on "
                 "every step: run `p-select`; two copies of the step, masked and not, chosen per step, and two "
                 "copies when not causal with the select copy on every causal step, kept: run `p-mixed`), the "
                 "last four over the kept kernel (the staggered start: run `stagger`; $P$ stored to shared "
                 "memory as soon as it is computed, and each step's lse and $D$ copied by `cp.async`: run "
                 "`p-early-async-rows`; dQ's share added by `red.global.add.v4.f32`: run `red-v4`). Each time "
                 "is the fastest of the run's interleaved rounds (two or three) of `flash-stages-bench`'s "
                 "median. From `bench/results/h100_stage11_steps.txt`; the "
                 "commands are in `bench/results/MANIFEST.md`.")
    return "\n".join(lines)


def stage11_bulk_table():
    """dQ's share through shared memory and one bulk copy per warp (bulk-dq, over p-mixed), and the next
    tile's lse and D loaded a step ahead on top of it (over bulk-dq)."""
    best = stage11_best_rounds(("bulk-dq", "lse-regs"))
    lines = ["| d | causal | N | before (ms) | dQ by bulk copy (ms) | speed-up | speed-up, again | "
             "+ lse, D a step ahead |", "|---|---|---|---|---|---|---|---|"]
    gains = [[], [], []]
    for key in sorted(best[("bulk-dq", "p-mixed")]):
        d, causal, n = key
        before, bulk = best[("bulk-dq", "p-mixed")][key], best[("bulk-dq", "bulk-dq")][key]
        ratios = (before / bulk, best[("lse-regs", "p-mixed")][key] / best[("lse-regs", "bulk-dq")][key],
                  best[("lse-regs", "bulk-dq")][key] / best[("lse-regs", "bulk-dq+lse-regs")][key])
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
                 "kept (run `bulk-dq`; speed-up, again: the same two versions in run `lse-regs`). + lse, D a step "
                 "ahead: the next tile's lse and $D$ loaded into registers a step before they are stored to "
                 "shared memory, over dQ by bulk copy (run `lse-regs`), not kept. Each figure is the fastest of "
                 "the run's two "
                 "interleaved rounds of `flash-stages-bench`'s median. From `bench/results/h100_stage11_steps.txt`; "
                 "the commands are in `bench/results/MANIFEST.md`.")
    return "\n".join(lines)


def stage11_2d_table():
    """The two-dimensional warp grids (both head_dims) and 128 rows per step at head_dim 64, each
    against key-rows, the kernel before them, timed in the same run: per cell the
    fastest of two interleaved rounds (h100_stage11_steps.txt)."""
    best = {}  # (run, version, dtype) -> {(d, causal, n): ms}
    run = version = None
    for line in (RESULTS / "h100_stage11_steps.txt").read_text().splitlines():
        m = STAGE11_BLOCK.match(line)
        if m:
            run, version = m[1], m[2]
            continue
        m = re.match(r"stage11_backward_tc/(bf16|fp16)/d(\d+)/causal(\d)/backward/seq:(\d+) ([\d.]+)", line)
        if m and run in ("2d-grids", "2d-128-rows"):
            cell = best.setdefault((run, version, m[1]), {})
            key = (int(m[2]), m[3] == "1", int(m[4]))
            cell[key] = min(cell.get(key, float("inf")), float(m[5]))
    lines = ["| dtype | d | causal | N | key-rows (ms) | 2D warp grids (ms) | speed-up | key-rows (ms) | "
             "2D, 128 rows (ms) | speed-up |", "|---|---|---|---|---|---|---|---|---|---|"]
    gains = {"2d-grids": [], "2d-128-rows": []}
    keys = sorted({(dt, k) for (c, _, dt), cells in best.items() for k in cells})
    for dtype, key in keys:
        d, causal, n = key
        row = [dtype, str(d), "yes" if causal else "no", str(n)]
        for c, new_version in (("2d-grids", "2d-tiles"), ("2d-128-rows", "2d-br128")):
            before, after = best.get((c, "key-rows", dtype), {}).get(key), best.get((c, new_version, dtype), {}).get(key)
            if before is None or after is None:
                row += ["–", "–", "–"]
                continue
            gains[c].append(before / after)
            row += [f"{before:.3f}", f"{after:.3f}", f"{before / after:.2f}x"]
        lines.append("| " + " | ".join(row) + " |")
    lines.append(f"| geometric mean | | | | | | {geo_mean(gains['2d-grids']):.2f}x | | | "
                 f"{geo_mean(gains['2d-128-rows']):.2f}x |")
    lines.append("")
    lines.append("Stage 11's backward (dk_dv_kernel changed), default mode, ms per call on the benchmark's problem (B·N = 16384, H·d = 2048), "
                 "NVIDIA H100 80GB HBM3. Key-rows: the kernel before these changes (each warp owns 16 keys, "
                 "$B_r$ = 64). 2D warp grids: FlashAttention-2's layout, $B_r$ = 64 (run `2d-grids`, bf16). 2D, 128 rows: "
                 "the 2D grids with $B_r$ = 128 at head_dim 64, the shape this stage runs where a block may use "
                 "162 KiB (run `2d-128-rows`, head_dim 64 only, bf16 and fp16). Each figure is the faster of two "
                 "interleaved rounds of `flash-stages-bench`'s median; a speed-up compares two versions timed in "
                 "the same run. From `bench/results/h100_stage11_steps.txt`; the commands are in `bench/results/MANIFEST.md`.")
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
    kernels = (("stage 11 `dk_dv_kernel`, before the step counters", "stage11", "dk_dv_kernel"),
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
                 "runs 128-row steps, as FlashAttention-2 does there. Before the step counters: the kernel of "
                 "2026-11-23; 2026-11-25: the kernel with P before dP, before dQ went through the copy engine; now: "
                 "the kernel on this page. From "
                 "`bench/results/" + "h100_ncu_stage11_sections_d64.txt`, `h100_ncu_stage11_sections_d128.txt`, "
                 "`h100_ncu_stage11_instmix_d64.csv`, `h100_ncu_stage11_instmix_d128.csv`, "
                 "`h100_ncu_stage11_p_mixed_sections_d64.txt`, `h100_ncu_stage11_p_mixed_sections_d128.txt`, "
                 "`h100_ncu_stage11_p_mixed_instmix_d64.csv`, `h100_ncu_stage11_p_mixed_instmix_d128.csv`, "
                 "`h100_ncu_stage11_bulk_sections_d64.txt`, `h100_ncu_stage11_bulk_sections_d128.txt`, "
                 "`h100_ncu_stage11_bulk_instmix_d64.csv`, `h100_ncu_stage11_bulk_instmix_d128.csv`, "
                 "`h100_ncu_fa2_bwd_sections_d64.txt`, `h100_ncu_fa2_bwd_sections_d128.txt`, "
                 "`h100_ncu_fa2_bwd_instmix_d64.csv` and `h100_ncu_fa2_bwd_instmix_d128.csv`; the commands are in "
                 "`bench/results/MANIFEST.md`.")
    return "\n".join(lines)


# The columns of the per-kernel profile of a stage (its ncu command is in bench/results/MANIFEST.md):
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
                 + ", ".join(f"`bench/results/h100_ncu_stage{stage:02d}_d{d}.csv` and `h100_ncu_stage{stage:02d}_d{d}_tensor.csv`" for d in head_dims)
                 + "; the command is in `bench/results/MANIFEST.md`.")
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
    """The case that widened the half backward's rule, as bench/results/h100_stage11_rule_case.txt records
    it: error (its dK max error), before (the bound without the stored-O term), after (the bound with it)."""
    text = re.sub(r"\s+", " ", (RESULTS / "h100_stage11_rule_case.txt").read_text())
    m = re.search(r"\(dK ([\d.]+e-\d+) against a bound of ([\d.]+e-\d+)\)\..*?that case's bound becomes "
                  r"([\d.]+e-\d+)", text)
    if not m:
        raise KeyError("h100_stage11_rule_case.txt has no sentence on the rule's case")
    return {"error": m[1], "before": m[2], "after": m[3]}[what]


@value_kind("ncu-stage")
def _ncu_stage(spec, parts, kind, runs, backward, compare, anchors):
    # ncu-stage/SS/dD/KERNEL/WHAT
    return ncu_stage_value(int(parts[1]), int(parts[2][1:]), parts[3], parts[4])


@value_kind("training")
def _training(spec, parts, kind, runs, backward, compare, anchors):
    # training/TAG/WHAT...
    return training_value(parts[1], "/".join(parts[2:]))


@value_kind("rule-case")
def _rule_case(spec, parts, kind, runs, backward, compare, anchors):
    return rule_case_value(parts[1])
