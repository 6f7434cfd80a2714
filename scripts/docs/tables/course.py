"""The course tables of README.md and the course map: every stage on the course grid, each stage over
sequence lengths, the backward of every stage that has one, the course runner's table; and the figures of
running text that come from the benchmark's JSON and the runner's output."""
import json
import re

from .common import (BENCH, COURSE_GRID, COURSE_SEQ, FP32_PEAK_TFLOPS, RESULTS, RUNNER, load_anchors, load_bench,
                     value, value_kind)


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
                if r["name"] == "backward":  # stage 07's forward is stage 06's kernel, copied
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


@value_kind("bench", "bwd")
def _bench(spec, parts, kind, runs, backward, compare, anchors):
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


@value_kind("speedup")
def _speedup(spec, parts, kind, runs, backward, compare, anchors):
    a, b, d = int(parts[1]), int(parts[2]), int(parts[3][1:])
    return f"{runs[(b, d, False, COURSE_SEQ)]['tflops'] / runs[(a, d, False, COURSE_SEQ)]['tflops']:.2f}"


@value_kind("causal")
def _causal(spec, parts, kind, runs, backward, compare, anchors):
    stage, d = int(parts[1]), int(parts[2][1:])
    return f"{runs[(stage, d, True, COURSE_SEQ)]['ms'] / runs[(stage, d, False, COURSE_SEQ)]['ms']:.2f}"


@value_kind("ratio")
def _ratio(spec, parts, kind, runs, backward, compare, anchors):
    # ratio/SPEC_A+SPEC_B
    a, b = "/".join(parts[1:]).split("+")
    args = dict(runs=runs, backward=backward, compare=compare, anchors=anchors)
    return f"{float(value(a, **args).replace(',', '')) / float(value(b, **args).replace(',', '')):.2f}"


@value_kind("above")
def _above(spec, parts, kind, runs, backward, compare, anchors):
    # above/SPEC_A+SPEC_B
    a, b = "/".join(parts[1:]).split("+")
    args = dict(runs=runs, backward=backward, compare=compare, anchors=anchors)
    x, y = (float(value(spec_, **args).replace(",", "")) for spec_ in (a, b))
    return "above" if x > y else "below" if x < y else "level with"


@value_kind("runner", "runner-max")
def _runner(spec, parts, kind, runs, backward, compare, anchors):
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


@value_kind("traffic-ms")
def _traffic_ms(spec, parts, kind, runs, backward, compare, anchors):
    # traffic-ms/SS/dD/PASSES: passes over the workspace at the measured copy rate
    stage, d, passes = int(parts[1]), int(parts[2][1:]), int(parts[3])
    workspace = next(b["workspace_bytes"] for b in json.loads(BENCH.read_text())["benchmarks"]
                     if b["name"].startswith(f"stage{stage:02d}_") and f"/d{d}/causal0/seq:{COURSE_SEQ}/" in b["name"])
    copy = float((anchors if anchors is not None else load_anchors())["copy"])
    return f"{passes * workspace / (copy * 1e12) * 1e3:.1f}"


OVERHEAD_CASES = {"decode-paged": "flash_stages.decode_paged, 1x256 in 16 pages",
                  "decode": "flash_stages.forward, stage 13, decode 1x256",
                  "forward": "flash_stages.forward, stage 10, 64x64",
                  "attention": "flash_stages.attention, no grad, 64x64"}


@value_kind("overhead")
def _overhead(spec, parts, kind, runs, backward, compare, anchors):
    # overhead/CASE/this|against|ratio|max-ratio: h100_python_overhead.json (tests/python/overhead.py --against),
    # CASE a key of OVERHEAD_CASES; max-ratio: the largest this / against over every case (CASE: all)
    results = {r["case"]: r for r in json.loads((RESULTS / "h100_python_overhead.json").read_text())["results"]}
    if parts[2] == "max-ratio":
        return f"{max(r['this_over_against'] for r in results.values()):.2f}"
    row = results[OVERHEAD_CASES[parts[1]]]
    if parts[2] == "ratio":
        return f"{row['this_over_against']:.2f}"
    return f"{row[parts[2] + '_median_us']:.1f}"
