#!/usr/bin/env python3
"""Draws the course's diagrams as SVG, from the kernels' own constants (issue 14).

    python3 scripts/make_diagrams.py            write docs/diagrams/*.svg
    python3 scripts/make_diagrams.py --check    change nothing; exit 1 if a committed SVG is stale

The thread and tile counts are read from the sources (notebooks/stage_sources.py parses their
`constexpr int` lines), never typed here, so a picture changes when the kernel does and CI notices
when it was not redrawn. Each drawing is plain SVG text, no plotting library, so the output is the
same on every machine.

  stage04_threads.svg     stage 04: which thread computes which score (step 1), which thread runs
                          each row's softmax (step 2), which thread owns which output (step 3)
  stage05_lanes.svg       stage 05: the rows and keys of one lane in a warp's score tile, and the
                          transposed warp-private P slice that the PV loop reads as float4s
  shuffle_butterfly.svg   the __shfl_xor_sync butterfly over the eight lanes that share a row
  causal_tiles.svg        causal tile classes (visible, diagonal, skipped), seq_q = seq_kv and
                          seq_q < seq_kv (bottom-right alignment)
  backward_passes.svg     stage 07: the dK/dV pass (per key tile) and the dQ pass (per query tile),
                          and the 16 x 16 thread grid over a 64 x 64 output tile
"""
import argparse
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "docs/diagrams"
sys.path.insert(0, str(ROOT / "notebooks"))
from stage_sources import STAGES, constants, tile_sizes  # noqa: E402

PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7"]
FONT = 'font-family="DejaVu Sans, Arial, sans-serif"'


class Svg:
    def __init__(self, width, height, title):
        self.w, self.h, self.parts = width, height, []
        self.parts.append(f"<title>{title}</title>")
        self.rect(0, 0, width, height, "#ffffff")

    def rect(self, x, y, w, h, fill, stroke="none", sw=1, opacity=1.0):
        self.parts.append(f'<rect x="{x:g}" y="{y:g}" width="{w:g}" height="{h:g}" fill="{fill}" '
                          f'stroke="{stroke}" stroke-width="{sw:g}"' +
                          (f' fill-opacity="{opacity:g}"' if opacity != 1 else "") + "/>")

    def line(self, x1, y1, x2, y2, stroke="#333", sw=1, dash=None, arrow=False):
        extra = (f' stroke-dasharray="{dash}"' if dash else "") + (' marker-end="url(#arrow)"' if arrow else "")
        self.parts.append(f'<line x1="{x1:g}" y1="{y1:g}" x2="{x2:g}" y2="{y2:g}" stroke="{stroke}" '
                          f'stroke-width="{sw:g}"{extra}/>')

    def text(self, x, y, s, size=12, anchor="start", fill="#222", weight="normal"):
        s = s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        self.parts.append(f'<text x="{x:g}" y="{y:g}" font-size="{size}" text-anchor="{anchor}" '
                          f'fill="{fill}" font-weight="{weight}" {FONT}>{s}</text>')

    def render(self):
        defs = ('<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
                'markerHeight="7" orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="#333"/>'
                '</marker></defs>')
        return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.w}" height="{self.h}" '
                f'viewBox="0 0 {self.w} {self.h}">\n{defs}\n' + "\n".join(self.parts) + "\n</svg>\n")


def kernel_constants(stage, name=None):
    folder = STAGES[stage]
    src = folder / name if name else next(folder.glob("*.cu"))
    return constants(src)


def stage04_threads(head_dim=64):
    c = kernel_constants(4)
    rows, cols, threads = c["kBlockRows"], c["kBlockCols"], c["kThreads"]
    per_row = threads // rows                  # kScoreThreadsPerRow
    row_groups = threads // head_dim           # kRowGroups (step 3)
    cell = 7
    gap = 90
    w = 40 + cols * cell + gap + 40 + 2 * gap + head_dim * cell // 2 + 40
    svg = Svg(w, 140 + rows * cell, "Stage 04 thread mappings")
    top = 70
    # Step 1: scores. Thread score_row * per_row + score_col computes keys score_col + per_row * j.
    x0 = 40
    svg.text(x0, 22, f"Step 1: scores ({threads} threads)", 14, weight="bold")
    svg.text(x0, 40, f"{per_row} threads per row; the colour is score_col = key mod {per_row}", 11)
    svg.text(x0, 55, f"thread = {per_row}·row + score_col", 11)
    for r in range(rows):
        for k in range(cols):
            svg.rect(x0 + k * cell, top + r * cell, cell - 1, cell - 1, PALETTE[k % per_row])
    svg.text(x0 + cols * cell / 2, top + rows * cell + 16, f"{cols} keys of the K tile", 11, "middle")
    svg.text(x0 - 6, top + 6, "row 0", 9, "end")
    # Step 2: one thread per row, the rest idle.
    x1 = x0 + cols * cell + gap
    svg.text(x1, 22, "Step 2: softmax", 14, weight="bold")
    svg.text(x1, 40, f"thread r owns row r;", 11)
    svg.text(x1, 55, f"threads {rows}–{threads - 1} wait", 11)
    for r in range(rows):
        svg.rect(x1, top + r * cell, 40, cell - 1, PALETTE[2])
    svg.rect(x1 + 46, top, 10, rows * cell - 1, "#cccccc")
    svg.text(x1 + 20, top + rows * cell + 16, f"{rows} of {threads} busy", 11, "middle")
    # Step 3: thread t owns output column t mod d of rows t / d, t / d + row_groups, ...
    x2 = x1 + 40 + 2 * gap
    half = head_dim // 2
    svg.text(x2, 22, f"Step 3: O += P V (d = {head_dim})", 14, weight="bold")
    svg.text(x2, 40, f"thread t: column t mod {head_dim}, rows t div {head_dim} + {row_groups}·i", 11)
    svg.text(x2, 55, f"colour: t div {head_dim} (first {half} columns shown)", 11)
    for r in range(rows):
        for col in range(half):
            svg.rect(x2 + col * cell, top + r * cell, cell - 1, cell - 1, PALETTE[4 + (r % row_groups)])
    svg.text(x2 + half * cell / 2, top + rows * cell + 16, f"{rows} rows × {head_dim} output columns", 11, "middle")
    return svg


def stage05_lanes(head_dim=64):
    c = kernel_constants(5)
    warp_rows, col_lanes, row_lanes = c["kWarpRows"], c["kColLanes"], c["kRowLanes"]
    rows_per_thread = c["kRowsPerThread"]
    _, bc = tile_sizes(5, head_dim)
    keys_per_thread = bc // col_lanes
    cell = 11
    x0, top = 60, 80
    w = x0 + bc * cell + 80 + rows_per_thread * row_lanes * cell + 60
    svg = Svg(w, top + max(warp_rows, bc // 4) * cell + 120, "Stage 05 lane layout")
    svg.text(x0, 22, f"One warp's score tile: {warp_rows} rows × {bc} keys (d = {head_dim})", 14, weight="bold")
    svg.text(x0, 40, f"lane = {col_lanes}·row_lane + col_lane; lane holds rows row_lane + {row_lanes}i, "
                     f"keys col_lane + {col_lanes}j", 11)
    svg.text(x0, 56, f"colour = col_lane; number = lane. Lane 0's {rows_per_thread} × {keys_per_thread} "
                     f"scores are outlined.", 11)
    for r in range(warp_rows):
        row_lane = r % row_lanes
        for k in range(bc):
            col_lane = k % col_lanes
            lane = col_lanes * row_lane + col_lane
            x, y = x0 + k * cell, top + r * cell
            svg.rect(x, y, cell - 1, cell - 1, PALETTE[col_lane], opacity=0.75)
            if lane == 0:
                svg.rect(x, y, cell - 1, cell - 1, "none", "#000", 1.5)
            if k < col_lanes:
                svg.text(x + cell / 2 - 0.5, y + cell - 3, str(lane), 6, "middle", "#fff")
        svg.text(x0 - 6, top + r * cell + cell - 2, f"{r}", 8, "end")
    svg.text(x0 + bc * cell / 2, top + warp_rows * cell + 16, "keys of the tile", 11, "middle")
    # The transposed P slice: p[key][row_lane * 4 + i]: a lane's four rows of one key are one float4.
    x1 = x0 + bc * cell + 60
    width = row_lanes * rows_per_thread
    shown = min(bc, 16)
    svg.text(x1, top - 12, "P slice, transposed", 11, weight="bold")
    for k in range(shown):
        for e in range(width):
            svg.rect(x1 + e * cell, top + k * cell, cell - 1, cell - 1, PALETTE[k % col_lanes], opacity=0.75)
        for g in range(row_lanes):
            svg.rect(x1 + g * rows_per_thread * cell, top + k * cell, rows_per_thread * cell - 1, cell - 1,
                     "none", "#000", 0.8)
        svg.text(x1 - 4, top + k * cell + cell - 2, f"k{k}", 7, "end")
    svg.text(x1, top + shown * cell + 14, f"row: key (first {shown} of {bc});", 10)
    svg.text(x1, top + shown * cell + 27, f"each box: one lane's {rows_per_thread} rows", 10)
    svg.text(x1, top + shown * cell + 40, "of that key = one float4", 10)
    return svg


def shuffle_butterfly():
    col_lanes = kernel_constants(5)["kColLanes"]
    offsets = []
    o = col_lanes // 2
    while o > 0:
        offsets.append(o)
        o //= 2
    dx, dy, x0, y0 = 70, 80, 60, 60
    svg = Svg(x0 * 2 + dx * (col_lanes - 1) + 160, y0 + dy * len(offsets) + 70, "Shuffle butterfly")
    svg.text(x0, 24, f"Butterfly over the {col_lanes} lanes of a row: __shfl_xor_sync(mask, x, offset)", 14,
             weight="bold")
    for step in range(len(offsets) + 1):
        y = y0 + step * dy
        for lane in range(col_lanes):
            x = x0 + lane * dx
            # Offsets col_lanes/2, ..., 1: after `step` exchanges, lanes equal modulo col_lanes >> step
            # hold the same partial sum; one colour per such group.
            group = lane % (col_lanes >> step)
            svg.rect(x - 16, y - 12, 32, 24, PALETTE[group % len(PALETTE)], "#333", 0.8, 0.8)
            svg.text(x, y + 4, str(lane), 11, "middle", "#fff", "bold")
        label = "values" if step == 0 else f"after offset {offsets[step - 1]}: sums of {2 ** step} lanes"
        svg.text(x0 + col_lanes * dx - 30, y + 4, label, 11)
        if step < len(offsets):
            off = offsets[step]
            for lane in range(col_lanes):
                partner = lane ^ off
                svg.line(x0 + lane * dx, y + 12, x0 + partner * dx, y + dy - 14, "#555", 1, arrow=True)
    svg.text(x0, y0 + dy * len(offsets) + 40, "Lane l adds the value of lane l XOR offset; after the last step "
             "every lane holds the row's total. No shared memory, no barrier.", 11)
    return svg


def tile_class(r0, r1, c0, c1, delta):
    """Theory 06: fully visible, fully masked, or on the diagonal (query rows [r0, r1), keys [c0, c1))."""
    if c1 - 1 <= r0 + delta:
        return "visible"
    if c0 > r1 - 1 + delta:
        return "skipped"
    return "diagonal"


def causal_tiles():
    br, bc = tile_sizes(6, 64)
    colours = {"visible": PALETTE[2], "diagonal": PALETTE[1], "skipped": "#dddddd"}
    cell = 26
    panels = [(8 * br, 8 * bc), (4 * br, 8 * bc)]  # (seq_q, seq_kv)
    svg = Svg(60 + 2 * (8 * cell + 90), 80 + 8 * cell + 90, "Causal tile classes")
    svg.text(30, 24, f"Causal tiles of stage 06 (Br = {br}, Bc = {bc}, d = 64), bottom-right aligned", 14,
             weight="bold")
    x = 60
    for seq_q, seq_kv in panels:
        delta = seq_kv - seq_q
        tq, tk = seq_q // br, seq_kv // bc
        counts = {"visible": 0, "diagonal": 0, "skipped": 0}
        for i in range(tq):
            for j in range(tk):
                cls = tile_class(i * br, (i + 1) * br, j * bc, (j + 1) * bc, delta)
                counts[cls] += 1
                svg.rect(x + j * cell, 60 + i * cell, cell - 2, cell - 2, colours[cls])
        svg.text(x, 52, f"seq_q = {seq_q}, seq_kv = {seq_kv}", 12)
        svg.text(x, 60 + tq * cell + 18, f"{counts['visible']} visible, {counts['diagonal']} diagonal, "
                 f"{counts['skipped']} skipped", 11)
        svg.text(x - 6, 60 + cell / 2 + 4, "q tile 0", 9, "end")
        x += tk * cell + 90
    y = 60 + 8 * cell + 45
    for n, (cls, col) in enumerate(colours.items()):
        svg.rect(60 + n * 200, y, 14, 14, col)
        svg.text(80 + n * 200, y + 12, {"visible": "visible: no mask", "diagonal": "diagonal: mask per element",
                                       "skipped": "skipped: not loaded"}[cls], 11)
    return svg


def backward_passes():
    c = kernel_constants(7, "backward.cu")
    grid, br, bc = c["kGrid"], c["kBlockRows"], c["kBlockCols"]
    rows_per_thread = c["kRowsPerThread"]
    cols_per_thread = bc // grid
    cell, tiles = 22, 6
    step = 290
    small = 4
    svg = Svg(60 + 2 * step + bc * small + 60, 100 + max(tiles * cell + 40, br * small + 40), "Stage 07 backward passes")
    svg.text(30, 24, "Stage 07's backward: two passes over the same (query tile, key tile) pairs", 14, weight="bold")

    def grid_panel(x, title, sub, highlight_col=None, highlight_row=None):
        svg.text(x, 50, title, 12, weight="bold")
        svg.text(x, 64, sub, 10)
        for i in range(tiles):
            for j in range(tiles):
                on = (highlight_col is not None and j == highlight_col) or (highlight_row is not None and i == highlight_row)
                svg.rect(x + j * cell, 76 + i * cell, cell - 2, cell - 2, PALETTE[0] if on else "#e6e6e6")
        if highlight_col is not None:
            xc = x + highlight_col * cell + cell / 2 - 1
            svg.line(xc, 80, xc, 76 + tiles * cell - 6, "#fff", 2, arrow=True)
        if highlight_row is not None:
            yc = 76 + highlight_row * cell + cell / 2 - 1
            svg.line(x + 4, yc, x + tiles * cell - 6, yc, "#fff", 2, arrow=True)
        svg.text(x + tiles * cell / 2, 76 + tiles * cell + 14, "key tiles →", 10, "middle")
        svg.text(x - 4, 90, "q", 10, "end")

    x = 60
    grid_panel(x, "Pass 1: dK, dV", "one block per key tile, down every query tile", highlight_col=2)
    svg.text(x, 76 + tiles * cell + 32, "recomputes S, P, dP, dS;", 10)
    svg.text(x, 76 + tiles * cell + 45, "dV += PᵀdO, dK += dSᵀQ", 10)
    x += step
    grid_panel(x, "Pass 2: dQ", "one block per query tile, across every key tile", highlight_row=3)
    svg.text(x, 76 + tiles * cell + 32, "recomputes S, P, dP, dS again; dQ += dS K", 10)
    # The thread grid over one 64 x 64 output tile: thread (gr, gc) owns rows gr + 16 i, columns 4 gc .. 4 gc + 3.
    x += tiles * cell + 80
    small = 2.4
    svg.text(x, 50, f"Threads over a {br} × {bc} tile", 12, weight="bold")
    svg.text(x, 64, f"{grid} × {grid} grid; thread (0, 0) outlined", 10)
    # One rectangle per (thread, row): the thread's columns of that row are adjacent.
    for gr in range(grid):
        for gc in range(grid):
            for i in range(rows_per_thread):
                r = gr + grid * i
                svg.rect(x + gc * cols_per_thread * small, 76 + r * small, cols_per_thread * small, small,
                         "#000" if gr == gc == 0 else PALETTE[(gr + gc) % len(PALETTE)],
                         opacity=1.0 if gr == gc == 0 else 0.55)
    svg.text(x, 76 + br * small + 16, f"thread (gr, gc): rows gr + {grid}i (i < {rows_per_thread}),", 10)
    svg.text(x, 76 + br * small + 30, f"columns 4gc .. 4gc + 3: a {rows_per_thread} × {cols_per_thread} block", 10)
    return svg


DIAGRAMS = {
    "stage04_threads.svg": stage04_threads,
    "stage05_lanes.svg": stage05_lanes,
    "shuffle_butterfly.svg": shuffle_butterfly,
    "causal_tiles.svg": causal_tiles,
    "backward_passes.svg": backward_passes,
}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 if a committed SVG differs from the sources")
    args = parser.parse_args()
    stale = []
    OUT.mkdir(parents=True, exist_ok=True)
    for name, draw in DIAGRAMS.items():
        text = draw().render()
        path = OUT / name
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        elif not path.exists() or path.read_text() != text:
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    if args.check:
        if stale:
            print(f"make_diagrams --check: stale: {', '.join(stale)}; run python3 scripts/make_diagrams.py")
            return 1
        print(f"make_diagrams --check: {len(DIAGRAMS)} diagrams match the sources")
    return 0


if __name__ == "__main__":
    sys.exit(main())
