"""Lesson 12 (Hopper): stage 12's variants one piece at a time (bench/stage12_variants.cu), its pieces
timed against the kernel before them, its profile (Nsight Compute of hopper_kernel), its registers and
spills (ptxas), its sanitizer and ctest logs."""
import json
import re

from .common import RESULTS, ctest_value, ncu_csv_rows, sanitizer_clean, value, value_kind, variant_slug


# The stage12-variants runs of the H100 (bench/results/MANIFEST.md): one per dtype and head_dim, of the
# ladder from version A to work tiles back to back, each block's rows timed in interleaved rounds, each
# round in its own order. A block (dtype, head_dim, causal, N) is read from the last file here that holds
# all of its rows.
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
                 f"From {files} (commands: `bench/results/MANIFEST.md`).")
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


# O stored behind the next scores and the odd last tile unmasked: their variants against work tiles back
# to back, in blocks of stage12-variants output under "## COMMIT, DTYPE, head_dim D" headings, COMMIT the
# tree timed. The blocks of STORE_BEHIND_ODD_TREES ran the registered non-causal kernels of both pieces;
# the causal kernels of the others still held the unmasked left-over instance, which the registered stage
# leaves out of causal kernels.
STORE_BEHIND_FILE = "h100_stage12_store_behind.txt"


STORE_BEHIND_SLUGS = (variant_slug("+ work tiles back to back"), variant_slug("+ O stored behind the next scores"),
                      variant_slug("+ odd last tile unmasked"))


STORE_BEHIND_ODD_TREES = ("003eabd", "e01acbe")


def load_store_behind():
    """{commit: {(dtype, head_dim, causal, N): {slug: row}}} of STORE_BEHIND_FILE, commits in file order."""
    trees, tree = {}, None
    for line in (RESULTS / STORE_BEHIND_FILE).read_text().splitlines():
        heading = re.match(r"## ([0-9a-f]{7,}),", line)
        if heading:
            tree = trees.setdefault(heading[1], {})
            continue
        m = VARIANTS12_LINE.match(line)
        if m and tree is not None:
            tree.setdefault((m[1], int(m[2]), m[3] == "1", int(m[4])), {})[variant_slug(m[5])] = {
                "ms": float(m[6]), "tflops": float(m[7])}
    return trees


def stage12_store_behind_table():
    """Each piece's step, tree by tree: back to back over the store behind the next scores, and (not
    causal) the store behind over the odd last tile unmasked."""
    trees = load_store_behind()
    b2b, behind, odd = STORE_BEHIND_SLUGS
    lines = ["| dtype | head_dim | causal | N | store behind / back to back, at " + ", ".join(trees)
             + " | odd tile unmasked / store behind, at " + ", ".join(STORE_BEHIND_ODD_TREES) + " |",
             "|---|---|---|---|---|---|"]
    for tag in ("bf16", "fp16"):
        for d in (128, 64):
            for causal in (False, True):
                for n in VARIANTS12_SEQS:
                    key = (tag, d, causal, n)
                    steps = [f"{t[key][b2b]['ms'] / t[key][behind]['ms']:.3f}" for t in trees.values() if key in t]
                    odd_steps = [f"{trees[t][key][behind]['ms'] / trees[t][key][odd]['ms']:.3f}"
                                 for t in STORE_BEHIND_ODD_TREES if key in trees.get(t, {})]
                    lines.append(f"| {tag} | {d} | {'yes' if causal else 'no'} | {n} | {', '.join(steps)} | "
                                 + (", ".join(odd_steps) if not causal else "(not in causal kernels)") + " |")
    lines.append("")
    lines.append("Each step is the time of the row before over the row's own, in the same block of "
                 "`stage12-variants` (above 1: the piece helps), one figure per commit timed, in the order of the "
                 f"column's heading; {STORE_BEHIND_ODD_TREES[-1]} ran head_dim 64 only. From "
                 f"`bench/results/{STORE_BEHIND_FILE}` (commands: `bench/results/MANIFEST.md`).")
    return "\n".join(lines)


# Wider K/V tiles at head_dim 64, in blocks of stage12-variants output under "## build B, DTYPE, head_dim
# 64[, --seq N]" headings (build a: 160-key tiles alone; b: with three K/V stages added), against the odd
# last tile unmasked (128 keys). In build a the 160-key kernel's row carries a stale label (the file's
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
    cells, build = {}, None
    for line in (RESULTS / WIDE_KEYS_FILE).read_text().splitlines():
        heading = re.match(r"## build (\w+),", line)
        if heading:
            build = heading[1]
            continue
        m = VARIANTS12_LINE.match(line)
        if m and build is not None:
            blocks = cells.setdefault((m[1], m[3] == "1", int(m[4])), {})
            blocks.setdefault(build, {})[variant_slug(m[5])] = float(m[6])
    return cells


def stage12_wide_keys_table():
    """160 keys a K/V tile at head_dim 64 over 128, build by build; three K/V stages with 160 keys over 128;
    and the spread of the two timings of the 128-key kernel in each block."""
    cells = load_wide_keys()
    lines = ["| dtype | causal | N | 160 keys / 128 keys (build) | 160 keys, 3 stages / 128 keys | "
             "spread of the 128-key kernel | registered takes |",
             "|---|---|---|---|---|---|---|"]
    for tag in ("bf16", "fp16"):
        for causal in (False, True):
            for n in WIDE_KEYS_SEQS:
                blocks = cells.get((tag, causal, n), {})
                wide, three, spread = [], [], []
                for build, b in sorted(blocks.items()):
                    base = b[WIDE_KEYS_BASE]
                    wide += [f"{base / b[s]:.3f} ({build})" for s in WIDE_KEYS_160 if s in b]
                    if WIDE_KEYS_THREE_STAGES in b:
                        three.append(f"{base / b[WIDE_KEYS_THREE_STAGES]:.3f}")
                    spread.append(f"{max(base, b[WIDE_KEYS_AGAIN]) / min(base, b[WIDE_KEYS_AGAIN]):.3f}")
                keys = 160 if n >= WIDE_KEYS_MIN[causal] else 128
                lines.append(f"| {tag} | {'yes' if causal else 'no'} | {n} | {', '.join(wide)} | {', '.join(three)} | "
                             f"{', '.join(spread)} | {keys} keys |")
    lines.append("")
    lines.append("Head_dim 64, the FlashAttention grid; each ratio is the 128-key kernel's time (the odd last tile "
                 "unmasked) over the row's own in the same block of `stage12-variants` (above 1: 160 keys are "
                 "faster); the spread is how far apart the block's two timings of the 128-key kernel are. Build (a): "
                 "the tree with 160-key tiles alone; (b): with three K/V stages added, timed again at N = 1024, "
                 "4096 and 16384. From "
                 f"`bench/results/{WIDE_KEYS_FILE}` (commands: `bench/results/MANIFEST.md`).")
    return "\n".join(lines)


# The causal schedules (single tiles after the pairs, pairs at any head count), in blocks of
# stage12-variants output under "## DTYPE, head_dim D[, --seq N]" headings, against variant 12. The
# three rows differ only causal: not causal, they are one launch timed three times.
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
                 f"`bench/results/{TAIL_FILE}` (commands: `bench/results/MANIFEST.md`).")
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
        for _, kernel, grid, metric, figure in ncu_csv_rows(path):
            out["kernel"], out["grid"] = kernel, int(re.match(r"\((\d+),", grid)[1])
            out["metrics"].setdefault(metric, []).append(figure)
    return out


# Nsight Compute of the persistent kernel without and with query tiles in pairs: bf16, head_dim 128,
# causal, N = 1024, the launches of stage12-variants' first block that the kernel filter caught. alias -> (metric, divisor, decimals).
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
                 "`bench/results/h100_ncu_stage12_d64.csv`, `h100_ncu_stage12_d128.csv`, `h100_ncu_stage12_d64_tensor.csv` and `h100_ncu_stage12_d128_tensor.csv` "
                 "(commands: `bench/results/MANIFEST.md`).")
    return "\n".join(lines)


def ptxas_stage12_entries():
    """Stage 12's kernels in ptxas_sm90.txt (compiled for sm_90a): (dtype, head_dim, causal, config) ->
    (registers, stack, spill stores, spill loads). The stage's own kernels have config "in-order" and
    "pingpong-BC" (BC keys per K/V tile); the ladder's (bench/stage12_ladder) have HopperConfig's arguments
    joined by '-' (consumers, keys per tile, stages, then setmaxnreg, ping-pong, overlap, TMA store as 0/1,
    then Q buffers, then back to back, store behind the next scores, odd last tile unmasked as 0/1), e.g.
    2-128-2-0-0-0-0-1-0-0-0."""
    text = (RESULTS / "ptxas_sm90.txt").read_text()
    tail = (r"\w*\n\s*(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads\nptxas info\s*: "
            r"Used (\d+) registers")
    ladder = re.compile(r"Function properties for _ZN14stage12_ladder13ladder_kernelI(6__half|13__nv_bfloat16)Li(\d+)"
                        r"ELb([01])ENS_12HopperConfigILi(\d+)ELi(\d+)ELi(\d+)ELb([01])ELb([01])ELb([01])ELb([01])ELi(\d+)"
                        r"ELb([01])ELb([01])ELb([01])E" + tail)
    in_order = re.compile(r"Function properties for _ZN7stage1215in_order_kernelI(6__half|13__nv_bfloat16)E" + tail)
    pingpong = re.compile(r"Function properties for _ZN7stage1215pingpong_kernelI(6__half|13__nv_bfloat16)Li(\d+)"
                          r"ELb([01])ENS_9TileShapeILi2ELi(\d+)ELi2EEE" + tail)
    out = {}
    for m in ladder.finditer(text):
        dtype = "fp16" if m[1] == "6__half" else "bf16"
        out[(dtype, int(m[2]), m[3] == "1", "-".join(m[i] for i in range(4, 15)))] = tuple(
            int(m[i]) for i in (18, 15, 16, 17))
    for m in in_order.finditer(text):
        dtype = "fp16" if m[1] == "6__half" else "bf16"
        out[(dtype, 64, False, "in-order")] = tuple(int(m[i]) for i in (5, 2, 3, 4))
    for m in pingpong.finditer(text):
        dtype = "fp16" if m[1] == "6__half" else "bf16"
        out[(dtype, int(m[2]), m[3] == "1", f"pingpong-{m[4]}")] = tuple(int(m[i]) for i in (8, 5, 6, 7))
    if not out:
        raise KeyError("stage 12 in ptxas_sm90.txt")
    return out


@value_kind("ptxas12")
def _ptxas12(spec, parts, kind, runs, backward, compare, anchors):
    # ptxas12/dD/cC/CONFIG/WHAT, the largest over bf16 and fp16
    found = [v for (_, d, c, cfg), v in ptxas_stage12_entries().items()
             if (d, c, cfg) == (int(parts[1][1:]), parts[2] == "c1", parts[3])]
    if not found:
        raise KeyError(spec)
    i = ("registers", "stack", "spill-stores", "spill-loads").index(parts[4])
    return str(max(v[i] for v in found))


@value_kind("ptxas12-spilling")
def _ptxas12_spilling(spec, parts, kind, runs, backward, compare, anchors):
    # ptxas12-spilling: "K of M" of the stage's own kernels (not the ladder's) spill
    entries = [v for (_, _, _, cfg), v in ptxas_stage12_entries().items() if cfg == "in-order" or cfg.startswith("pingpong-")]
    return f"{sum(v[2] > 0 for v in entries)} of {len(entries)}"


@value_kind("variant12", "variant12-step", "variant12-total", "variant12-after-b", "variant12-same")
def _variant12(spec, parts, kind, runs, backward, compare, anchors):
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


@value_kind("variant12-same-max")
def _variant12_same_max(spec, parts, kind, runs, backward, compare, anchors):
    # .../all or .../dD
    spread = [variant12_same(b) for key, (_, b) in load_variants12().items()
              if parts[1] == "all" or key[1] == int(parts[1][1:])]
    if not spread:
        raise KeyError(spec)
    return f"{max(spread):.1f}"


@value_kind("ncu12")
def _ncu12(spec, parts, kind, runs, backward, compare, anchors):
    # ncu12/dD/WHAT
    return ncu12_value(int(parts[1][1:]), parts[2])


@value_kind("ncu12-l2")
def _ncu12_l2(spec, parts, kind, runs, backward, compare, anchors):
    # ncu12-l2/persistent|pairs/WHAT
    return ncu12_l2_value(parts[1], parts[2])


@value_kind("sanitizer")
def _sanitizer(spec, parts, kind, runs, backward, compare, anchors):
    # sanitizer/STEM/SUBJECT
    return sanitizer_clean(parts[1], parts[2])


@value_kind("ctest")
def _ctest(spec, parts, kind, runs, backward, compare, anchors):
    # ctest/passed|total|skipped|TESTNAME
    return ctest_value(parts[1])


@value_kind("ctest-log")
def _ctest_log(spec, parts, kind, runs, backward, compare, anchors):
    # ctest-log/STEM/passed|total|skipped|TESTNAME
    return ctest_value(parts[2], parts[1])
