"""bench/compare.py's runs: the stages against PyTorch's attention backends in fp32 (compare_h100.*) and
in bf16 and fp16 (compare_h100_bf16.*, compare_h100_fp16.*), and the quoted PyTorch and hardware anchors
(pytorch_anchors_h100.md). The results page, README and lessons 01-12 quote them."""
import json
import math

from .common import COMPARE, RESULTS, TARGET_FLOOR, load_anchors, load_compare, value_kind


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


@value_kind("compare", "compare-ratio")
def _compare(spec, parts, kind, runs, backward, compare, anchors):
    compare = compare if compare is not None else load_compare()
    if kind == "compare":
        impl, direction, d, c, n = parts[1], parts[2], int(parts[3][1:]), parts[4] == "c1", int(parts[5])
        return f"{compare[(impl, direction, d, c, n)]:.1f}"
    impl, stage, direction, d, c, n = parts[1], parts[2], parts[3], int(parts[4][1:]), parts[5] == "c1", int(parts[6])
    return f"{compare[(impl, direction, d, c, n)] / compare[(stage, direction, d, c, n)]:.2f}"


@value_kind("half", "half-geo", "half-min", "half-max", "half-bwd", "half-bwd-geo", "half-bwd-min", "half-bwd-max", "half-min-at", "half-max-at", "half-bwd-min-at", "half-bwd-max-at", "half-below", "half-below-floor", "half-geo3", "half-bwd-geo3")
def _half(spec, parts, kind, runs, backward, compare, anchors):
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


@value_kind("anchor")
def _anchor(spec, parts, kind, runs, backward, compare, anchors):
    anchors = anchors if anchors is not None else load_anchors()
    return anchors["/".join(parts[1:])]
