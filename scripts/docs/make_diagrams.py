#!/usr/bin/env python3
"""Draws the course's diagrams as SVG, from the kernels' own constants.

    python3 scripts/docs/make_diagrams.py            write docs/diagrams/*.svg
    python3 scripts/docs/make_diagrams.py --check    change nothing; exit 1 if a committed SVG is stale

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
  mma_fragments.svg       mma.sync m16n8k16 (stage 08): which lane holds which element of A, B and
                          C/D, and in which register (the PTX ISA's layout, checked to cover each
                          element exactly once)
  p_in_registers.svg      stage 08: the S accumulators of two 8-key blocks are, lane for lane, the
                          A operand of P for one 16-key step of O += P V
  swizzle.svg             stage 09: one ldmatrix 8 x 8 matrix in a row-major tile (8 rows in one
                          bank group) and in the XOR-swizzled tile (8 rows in 8 bank groups)
  stage11_warp_tiles.svg  stage 11: which warp owns which part of S and dP, of dK and dV, and of dQ's
                          share, and how the share reaches the fp32 accumulator in one copy per warp
  stage12_pingpong_timeline.svg  stage 12's ping-pong kernel: the producer's copies, the K and V
                          buffers of the ring, the two consumers' turns on the tensor cores
  stage13_split_merge.svg stage 13: one sequence's keys split over blocks, the warps' 16-key slices of
                          a step, the partials (o, lse) and their merge by lse
  stage14_backward_pipeline.svg  stage 14's main kernel: the load warp's copies and the dQ warp's bulk
                          additions, the Q/dO stages, the two consumer warpgroups through one step, the
                          dS^T and dQ staging buffers, and the named barriers between them
"""
import argparse
import pathlib
import re
import sys
import textwrap

ROOT = pathlib.Path(__file__).resolve().parents[2]
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
    (rows, cols), threads = tile_sizes(4, head_dim), c["kThreads"]
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
    grid, br, bc = c["kGrid"], c["kPreferredTile"], c["kPreferredTile"]  # the H100's tiles: Br = Bc
    rows_per_thread = br // grid
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


# ---------------------------------------------------------------------------------------------
# Tensor cores (stages 08-10): the mma.sync m16n8k16 fragments, P in registers, the XOR swizzle
# ---------------------------------------------------------------------------------------------

# The fragment layouts of mma.sync.aligned.m16n8k16 with .f16/.bf16 inputs and .f32 accumulators,
# as the PTX ISA gives them ("Matrix Fragments for mma.m16n8k16 with floating point type",
# section 9.7.14.5.8 of PTX ISA 9.1): with g = lane >> 2 and t = lane % 4, element i of a lane's
# fragment sits at (row, column) below. A has 8 elements per lane (a0..a7, two per 32-bit register),
# B has 4 (b0..b3), C/D has 4 fp32 values (c0..c3, one per register).
def mma_a_element(lane, i):
    g, t = lane >> 2, lane % 4
    row = g if (i < 2 or 4 <= i < 6) else g + 8
    col = 2 * t + (i & 1) + (8 if i >= 4 else 0)
    return row, col


def mma_b_element(lane, i):
    g, t = lane >> 2, lane % 4
    row = 2 * t + (i & 1) + (8 if i >= 2 else 0)
    return row, g


def mma_c_element(lane, i):
    g, t = lane >> 2, lane % 4
    return (g if i < 2 else g + 8), 2 * t + (i & 1)


def fragment_grid(rows, cols, element, per_lane):
    """[row][col] -> (lane, i), checked: the 32 lanes' fragments cover every element exactly once."""
    grid = [[None] * cols for _ in range(rows)]
    for lane in range(32):
        for i in range(per_lane):
            r, c = element(lane, i)
            if grid[r][c] is not None:
                raise RuntimeError(f"element ({r}, {c}) is held by lanes {grid[r][c][0]} and {lane}")
            grid[r][c] = (lane, i)
    if any(cell is None for row in grid for cell in row):
        raise RuntimeError("a fragment layout leaves an element to no lane")
    return grid


def mma_shape():
    """(M, N, K) of the mma the stages use, from stage 08's constants; the layouts above are m16n8k16's."""
    c = kernel_constants(8)
    shape = (c["kWarpRows"], c["kMmaN"], c["kMmaK"])
    if shape != (16, 8, 16):
        raise RuntimeError(f"stage 08 uses an mma of shape {shape}; these diagrams draw m16n8k16")
    return shape


def draw_grid(svg, x, y, grid, cw, ch, colour, label=None, col_labels=True, row_labels=True):
    """One cell per element: the owning lane's number on the colour of its register."""
    for r, row in enumerate(grid):
        for c, (lane, i) in enumerate(row):
            svg.rect(x + c * cw, y + r * ch, cw - 1, ch - 1, colour(r, c, lane, i))
            svg.text(x + c * cw + cw / 2 - 0.5, y + r * ch + ch / 2 + 3.5, label(lane, i) if label else str(lane),
                     10, "middle", "#fff", "bold")
        if row_labels:
            svg.text(x - 5, y + r * ch + ch / 2 + 3.5, str(r), 9, "end", "#555")
    if col_labels:
        for c in range(len(grid[0])):
            svg.text(x + c * cw + cw / 2 - 0.5, y - 5, str(c), 9, "middle", "#555")


def mma_fragments():
    m, n, k = mma_shape()
    a = fragment_grid(m, k, mma_a_element, 8)
    b = fragment_grid(k, n, mma_b_element, 4)
    c = fragment_grid(m, n, mma_c_element, 4)
    cw, ch = 26, 20
    xa, xb, xc, top = 50, 50 + k * cw + 60, 50 + k * cw + 60 + n * cw + 70, 96
    width = xc + n * cw + 100
    svg = Svg(width, top + m * ch + 130, "mma.sync m16n8k16 fragment layouts")
    svg.text(30, 24, f"mma.sync.aligned.m{m}n{n}k{k}: D ({m}×{n}, fp32) = A ({m}×{k}) · B ({k}×{n}) + C, "
             "one warp", 14, weight="bold")
    svg.text(30, 42, "Number in a cell: the lane that holds the element; colour: the register it is in. "
             "g = lane / 4, t = lane % 4 (PTX ISA, mma.m16n8k16 fragments).", 11)
    reg = lambda r, col, lane, i: PALETTE[i // 2]
    panels = [(xa, a, f"A: {m} × {k}, row-major (query rows × dims for S = QKᵀ)", "row", "column (k)"),
              (xb, b, f"B: {k} × {n} (k × n)", "row (k)", "column"),
              (xc, c, f"C / D: {m} × {n} fp32", "row", "column")]
    for x, grid, title, _, cols in panels:
        svg.text(x, 66, title, 12, weight="bold")
        svg.text(x, 80, cols + " →", 10, fill="#555")
        draw_grid(svg, x, top, grid, cw, ch, reg)
    legends = [
        (xa, ["a[0]: A[g][2t], A[g][2t+1]", "a[1]: A[g+8][2t], A[g+8][2t+1]",
              "a[2]: A[g][2t+8], A[g][2t+9]", "a[3]: A[g+8][2t+8], A[g+8][2t+9]"]),
        (xb, ["b[0]: B[2t][g], B[2t+1][g]", "b[1]: B[2t+8][g], B[2t+9][g]"]),
        (xc, ["c[0], c[1]: C[g][2t], C[g][2t+1]", "c[2], c[3]: C[g+8][2t], C[g+8][2t+1]"]),
    ]
    y0 = top + m * ch + 22
    for x, lines in legends:
        for j, line in enumerate(lines):
            svg.rect(x, y0 + j * 18 - 10, 12, 12, PALETTE[j])
            svg.text(x + 18, y0 + j * 18, line, 11)
    svg.text(30, y0 + 4 * 18 + 12, "A and B: two 16-bit elements per 32-bit register, the lower column (A) or "
             "row (B) in the low half. C/D: one fp32 value per register.", 11)
    return svg


def p_in_registers():
    m, n, k = mma_shape()
    c = fragment_grid(m, n, mma_c_element, 4)
    a = fragment_grid(m, k, mma_a_element, 8)
    # S for keys [k·ks, k·ks + k) is two accumulators, key blocks 2ks and 2ks + 1; lane l's a[2h + j]
    # (h = key block, j = row half) is pack2 of its c[2j], c[2j + 1] of block h. Check it cell by cell.
    blocks = k // n
    s = [[None] * k for _ in range(m)]
    for r in range(m):
        for col in range(k):
            h, kc = divmod(col, n)
            lane, i = c[r][kc]
            s[r][col] = (lane, i)
            a_lane, a_i = a[r][col]
            if a_lane != lane or a_i // 2 != 2 * h + i // 2 or a_i % 2 != i % 2:
                raise RuntimeError(f"S accumulator and P's A operand differ at ({r}, {col})")
    cw, ch = 26, 20
    x0, x1, top = 50, 50 + k * cw + 130, 100
    svg = Svg(x1 + k * cw + 40, top + m * ch + 120, "S accumulators are P's A operand")
    svg.text(30, 24, f"P never leaves registers: S's accumulators for keys [{k}·ks, {k}·ks + {k}) are, lane for "
             "lane, P's A operand", 14, weight="bold")
    svg.text(30, 42, "Number: the lane holding the element; colour: the A-operand register it becomes. "
             "Left, each lane's four fp32 accumulators of two 8-key blocks; right, its four packed registers.", 11)
    a_reg = lambda r, col, lane, i: PALETTE[2 * (col // n) + i // 2]
    svg.text(x0, 70, f"S = Q Kᵀ: {blocks} accumulators ({m} × {n} fp32 each)", 12, weight="bold")
    for h in range(blocks):
        svg.text(x0 + h * n * cw + n * cw / 2, 84, f"s[{blocks}ks + {h}]" if h else f"s[{blocks}ks]", 10,
                 "middle", "#555")
    draw_grid(svg, x0, top, s, cw, ch, a_reg, label=None, col_labels=False)
    svg.line(x0 + n * cw - 0.5, top - 4, x0 + n * cw - 0.5, top + m * ch + 3, "#000", 2)
    svg.text(x1, 70, f"P as the A operand ({m} × {k}, bf16/fp16)", 12, weight="bold")
    svg.text(x1, 84, "keys of the k-step →", 10, fill="#555")
    draw_grid(svg, x1, top, a, cw, ch, lambda r, col, lane, i: PALETTE[i // 2], col_labels=False)
    ym = top + m * ch / 2
    svg.line(x0 + k * cw + 14, ym, x1 - 18, ym, "#333", 2, arrow=True)
    svg.text((x0 + k * cw + x1) / 2, ym - 10, "pack2: 2 fp32 →", 10, "middle")
    svg.text((x0 + k * cw + x1) / 2, ym + 18, "1 register", 10, "middle")
    y0 = top + m * ch + 24
    lines = ["a[0] = pack2(s[2ks][0], s[2ks][1])    row g", "a[1] = pack2(s[2ks][2], s[2ks][3])    row g + 8",
             "a[2] = pack2(s[2ks+1][0], s[2ks+1][1])    row g", "a[3] = pack2(s[2ks+1][2], s[2ks+1][3])    row g + 8"]
    for j, line in enumerate(lines):
        x = x0 if j % 2 == 0 else x0 + 420
        y = y0 + (j // 2) * 18
        svg.rect(x, y - 10, 12, 12, PALETTE[j])
        svg.text(x + 18, y, line, 11)
    svg.text(x0, y0 + 2 * 18 + 14, "No shuffle and no shared memory: the rounding to bf16/fp16 is the whole "
             "conversion (stages/08_tensor_cores/tensor_cores.cu).", 11)
    return svg


def swizzled_chunk(row, chunk, chunks_per_row):
    """Stage 09's `swizzled`, per 16-byte chunk: rows of at least 128 bytes XOR the chunk with row % 8;
    shorter rows share a 128-byte window and use (row / rows_per_window) % chunks_per_row."""
    rows_per_window = 1 if chunks_per_row >= 8 else 8 // chunks_per_row
    patterns = 8 if chunks_per_row >= 8 else chunks_per_row
    return chunk ^ ((row // rows_per_window) % patterns)


def swizzle(head_dim=64):
    c = kernel_constants(9)
    vec = c["kVecElems"]              # 16-bit elements per 16-byte chunk
    chunk_bytes = vec * 2
    chunks = head_dim // vec          # chunks per tile row
    row_bytes = head_dim * 2
    rows = 8                          # one ldmatrix 8 x 8 matrix: 8 rows of one chunk each

    def bank_group(row, physical_chunk):
        """The four 4-byte banks a 16-byte chunk occupies, as the index of the first one / 4."""
        return ((row * row_bytes + physical_chunk * chunk_bytes) // 4 % 32) // 4

    highlight = {0: PALETTE[3], 5: PALETTE[0]}  # two logical chunks an ldmatrix might read
    cw, ch = 48, 30
    x0, top = 80, 110
    gap = 110
    x1 = x0 + chunks * cw + gap
    svg = Svg(x1 + chunks * cw + 40, top + rows * ch + 110, "XOR swizzle")
    svg.text(30, 24, f"One ldmatrix matrix reads the same 16-byte chunk of 8 rows (d = {head_dim}: "
             f"{row_bytes}-byte rows, {chunks} chunks)", 14, weight="bold")
    svg.text(30, 42, "Each cell is a 16-byte slot of shared memory; its label is the logical chunk stored there. "
             "Columns are bank groups (4 banks of 4 bytes each).", 11)
    panels = [(x0, "Row-major (stage 08): chunk c at slot c", lambda r, cc: cc),
              (x1, "Swizzled (stage 09): chunk c at slot c XOR (row mod 8)",
               lambda r, cc: swizzled_chunk(r, cc, chunks))]
    for x, title, place in panels:
        svg.text(x, 70, title, 12, weight="bold")
        slot = {}
        for r in range(rows):
            for cc in range(chunks):
                slot[(r, place(r, cc))] = cc
        for p in range(chunks):
            g = bank_group(0, p)
            svg.text(x + p * cw + cw / 2, top - 8, f"{4 * g}–{4 * g + 3}", 9, "middle", "#555")
        svg.text(x - 8, top - 8, "banks", 9, "end", "#555")
        for r in range(rows):
            svg.text(x - 8, top + r * ch + ch / 2 + 4, f"row {r}", 10, "end")
            for p in range(chunks):
                cc = slot[(r, p)]
                fill = highlight.get(cc, "#e6e6e6")
                svg.rect(x + p * cw, top + r * ch, cw - 2, ch - 2, fill)
                svg.text(x + p * cw + cw / 2 - 1, top + r * ch + ch / 2 + 3, f"c{cc}", 10, "middle",
                         "#fff" if cc in highlight else "#444", "bold" if cc in highlight else "normal")
        y = top + rows * ch + 22
        for n, (cc, colour) in enumerate(highlight.items()):
            groups = {bank_group(r, place(r, cc)) for r in range(rows)}
            passes = rows // len(groups)
            svg.rect(x, y + n * 20 - 10, 12, 12, colour)
            svg.text(x + 18, y + n * 20, f"chunk {cc} of rows 0–7: {len(groups)} bank group"
                     f"{'s' if len(groups) > 1 else ''} → {passes} pass{'es' if passes > 1 else ''}" +
                     (f" ({passes}-way conflict)" if passes > 1 else " (no conflict)"), 11)
    svg.text(30, top + rows * ch + 82, "The same XOR is applied when the tile is written (cp.async, 16 bytes "
             "per thread) and when it is read (ldmatrix), so a row's chunks are only permuted within the row: "
             "no padding.", 11)
    return svg



# ---------------------------------------------------------------------------------------------
# Stage 11's warp tiles of the backward, and stage 13's split-KV with its merge
# ---------------------------------------------------------------------------------------------

def stage11_shape(head_dim):
    """The H100's dk_dv_kernel shape at HEAD_DIM, from stage 11's sources: warps, Br, Bc and the warp
    grids of its three kinds of product, as the kernel computes them."""
    folder = STAGES[11]
    launcher = (folder / "backward_tc.cu").read_text()
    kernel = (folder / "backward_tc_kernel.cuh").read_text()
    c = {**constants(folder / "backward_tc_kernel.cuh"), **constants(folder / "backward_tc.cu")}
    warps = int(re.search(r"KeyTileConfig<(\d+), kBlockRows, \d+>", launcher)[1])
    score_nblocks = int(re.search(r"kScoreNBlocks = (\d+);", kernel)[1])
    grad_mtiles = int(re.search(r"kGradMTiles = (\d+),", kernel)[1])
    bc = 16 * warps  # KeyTileConfig: Bc = 16 * kWarps
    br = c["kWideStepRows"] if head_dim == 64 else c["kStepRows"]  # the H100 takes the taller step at 64
    m, n = c["kMmaM"], c["kMmaN"]
    score_cols = score_nblocks * n                 # keys per warp of S and dP
    score_grid = (warps // (bc // score_cols), bc // score_cols)
    grad_keys = grad_mtiles * m                    # keys per warp of dK and dV
    grad_grid = (bc // grad_keys, warps // (bc // grad_keys))
    dq_cols = 2 if head_dim == 32 or head_dim < br else 4  # DqShare::kWarpCols
    dq_grid = (warps // dq_cols, dq_cols)
    return dict(warps=warps, br=br, bc=bc, d=head_dim, score=score_grid, grad=grad_grid, dq=dq_grid)


def stage11_warp_tiles(head_dim=128):
    s = stage11_shape(head_dim)
    warps, br, bc, d = s["warps"], s["br"], s["bc"], s["d"]
    px = 1.5  # pixels per element
    svg = Svg(1060, 480, "Stage 11 warp tiles")
    svg.text(30, 26, f"Stage 11's dk_dv_kernel at head_dim {d}: {warps} warps, Bc = {bc} keys, "
                     f"Br = {br} query rows per step", 14, weight="bold")

    def panel(x, y, rows, cols, grid, title, sub, row_label, col_label, owner):
        """A rows x cols output split over a grid of warps; owner(gr, gc) gives the warp's number."""
        svg.text(x, y - 30, title, 12, weight="bold")
        svg.text(x, y - 16, sub, 10)
        gr_n, gc_n = grid
        h, w = rows / gr_n * px, cols / gc_n * px
        for gr in range(gr_n):
            for gc in range(gc_n):
                warp = owner(gr, gc)
                svg.rect(x + gc * w, y + gr * h, w - 1, h - 1, PALETTE[warp % len(PALETTE)], opacity=0.8)
                svg.text(x + gc * w + w / 2, y + gr * h + h / 2 + 4, f"w{warp}", 11, "middle", "#fff", "bold")
        svg.text(x + cols * px / 2, y + rows * px + 14, f"{col_label} ({cols})", 10, "middle")
        svg.text(x - 6, y + rows * px / 2, f"{row_label} ({rows})", 10, "end")
        return y + rows * px

    y0 = 86
    sg, gg, qg = s["score"], s["grad"], s["dq"]
    # S, dP: warp w owns queries (w / cols) * Br/rows.., keys (w % cols) * Bc/cols..
    panel(110, y0, br, bc, sg, "1. S = Q Kᵀ, dP = dO Vᵀ",
          f"{sg[0]} × {sg[1]} warps of {br // sg[0]} queries × {bc // sg[1]} keys",
          "queries", "keys", lambda gr, gc: gr * sg[1] + gc)
    # dK, dV: warp w owns keys (w % key_warps) * 32.., dims (w / key_warps) * d/2..
    panel(470, y0, bc, d, gg, "2. dV += Pᵀ dO, dK += dSᵀ Q",
          f"{gg[0]} × {gg[1]} warps of {bc // gg[0]} keys × {d // gg[1]} dims, in registers",
          "keys", "dims", lambda gr, gc: gc * gg[0] + gr)
    bottom = panel(800, y0, br, d, qg, "3. dQ share += dS K",
                   f"{qg[0]} × {qg[1]} warps of {br // qg[0]} rows × {d // qg[1]} dims",
                   "queries", "dims", lambda gr, gc: gr * qg[1] + gc)
    # Between 1 and 2: P and dS through shared memory, two barriers per step.
    ymid = y0 + br * px / 2
    svg.line(110 + bc * px + 12, ymid, 470 - 60, ymid, arrow=True)
    svg.text(110 + bc * px + 14, ymid - 22, "P, dS to shared", 10)
    svg.text(110 + bc * px + 14, ymid - 10, "memory [query][key];", 10)
    svg.text(110 + bc * px + 14, ymid + 14, "barrier; read back", 10)
    svg.text(110 + bc * px + 14, ymid + 26, "transposed (ldmatrix.trans)", 10)
    # The accumulator: one query tile of the fp32 workspace, each warp's part contiguous.
    ya = 346
    svg.text(110, ya - 44, "The fp32 dQ accumulator, one query tile (DqShare): each warp's part is contiguous, "
                           "in the order its lanes hold the fragments", 12, weight="bold")
    svg.text(110, ya - 16, f"each step, each warp (Hopper): registers → its staging buffer in shared memory → one "
                           f"cp.reduce.async.bulk .add.f32 of {br * d // warps * 4 // 1024} KiB;", 10)
    svg.text(110, ya - 4, "every K/V block of the head adds into the same tile", 10)
    width = 900
    part = width / warps
    for w in range(warps):
        svg.rect(110 + w * part, ya, part - 2, 26, PALETTE[w % len(PALETTE)], opacity=0.8)
        svg.text(110 + w * part + part / 2, ya + 17, f"w{w}: {br * d // warps} floats", 10, "middle", "#fff", "bold")
    svg.line(800 + d * px / 2, bottom + 20, 800 + d * px / 2, ya - 56, arrow=True)
    svg.text(110, ya + 48, "convert_dq_kernel reads the accumulator once, scales it by τ, rounds it to the dtype "
                           "and puts each row back in its place.", 10)
    svg.text(110, ya + 64, "Without the bulk copy (before Hopper, or where the staging does not fit), each lane "
                           "adds its float4s with two red.global.add.v2.f32 into the same layout.", 10)
    return svg


def stage13_split_merge(seq_len=1000, splits=4):
    folder = STAGES[13]
    c = {**constants(folder / "decoding.h"), **constants(folder / "decoding_kernel.cuh")}
    step, warps, warp_keys, batch = c["kBlockKeys"], c["kWarps"], c["kWarpKeys"], c["kMergeBatch"]
    # decoding_kernel.cuh: whole steps per split, the last split ends at the sequence's length.
    per_split = ((seq_len + splits - 1) // splits + step - 1) // step * step
    ranges = [(min(seq_len, s * per_split), min(seq_len, s * per_split + per_split)) for s in range(splits)]
    svg = Svg(1000, 430, "Stage 13 split-KV and merge")
    svg.text(30, 26, f"Stage 13: one sequence of {seq_len} cached keys in {splits} splits, merged by lse",
             14, weight="bold")
    x0, width, y = 40, 920, 70
    scale = width / seq_len
    svg.text(x0, y - 8, f"keys 0 .. {seq_len - 1}; each split takes whole steps of {step} keys "
                        f"({per_split} per split, the last one shorter)", 10)
    for s, (a, b) in enumerate(ranges):
        svg.rect(x0 + a * scale, y, (b - a) * scale - 3, 34, PALETTE[s % len(PALETTE)], opacity=0.35)
        for k in range(a, b, step):  # the block's steps
            svg.line(x0 + k * scale, y, x0 + k * scale, y + 34, "#777", 0.6)
        svg.text(x0 + (a + b) / 2 * scale, y + 22, f"split {s}: keys {a}..{b - 1}", 11, "middle", weight="bold")
    # One step of split 0, its warps' 16-key slices.
    ys = y + 70
    svg.text(x0, ys - 8, f"one step of a split's block: {step} keys, {warps} warps of {warp_keys} keys; every warp "
                         f"holds the same {c['kBlockRows']} query rows (the K/V group's)", 10)
    for w in range(warps):
        svg.rect(x0 + w * 90, ys, 88, 24, PALETTE[w % len(PALETTE)], opacity=0.8)
        svg.text(x0 + w * 90 + 44, ys + 16, f"warp {w}: {w * warp_keys}..{(w + 1) * warp_keys - 1}", 10,
                 "middle", "#fff", "bold")
    svg.text(x0 + warps * 90 + 12, ys + 10, "each warp keeps its own max, sum and O;", 10)
    svg.text(x0 + warps * 90 + 12, ys + 23, "the block merges its warps at the end (stage 03's rescale)", 10)
    # Partials and the merge.
    yp = ys + 80
    bw = width / splits
    for s, (a, b) in enumerate(ranges):
        cx = x0 + (a + b) / 2 * scale
        svg.line(cx, y + 38, cx, yp - 4, "#999", 1, dash="3,3")
        svg.rect(x0 + s * bw + 20, yp, bw - 40, 40, PALETTE[s % len(PALETTE)], opacity=0.8)
        svg.text(x0 + s * bw + bw / 2, yp + 17, f"partial {s}: o{s}, lse{s}", 11, "middle", "#fff", "bold")
        svg.text(x0 + s * bw + bw / 2, yp + 32, "fp32, in the workspace", 9, "middle", "#fff")
        svg.line(x0 + s * bw + bw / 2, yp + 42, x0 + width / 2, yp + 92, arrow=True)
    ym = yp + 96
    svg.rect(x0 + width / 2 - 300, ym, 600, 74, "#f3f3f3", "#555")
    svg.text(x0 + width / 2, ym + 18, "merge_kernel, per query row, in split order", 12, "middle", weight="bold")
    svg.text(x0 + width / 2, ym + 36, "lse = ln Σₛ exp(lseₛ)        o = Σₛ exp(lseₛ − lse) · oₛ", 12, "middle")
    svg.text(x0 + width / 2, ym + 54, f"{batch} partials loaded at once, folded one by one; "
                                      "a split that saw no key: lseₛ = −∞, weight 0", 10, "middle")
    svg.text(x0 + width / 2, ym + 68, "one split only: the block writes o and lse itself, no merge", 10, "middle")
    return svg


def stage12_pingpong_timeline(tiles=4):
    """Stage 12's ping-pong kernel in its steady state: the producer's copies, the K and V buffers of the
    ring, the two consumers' turns on the tensor cores. Widths are schematic (a turn is one unit), not
    measured; the order of events is the kernel's (pingpong_kernel.cuh, mainloop.cuh's produce)."""
    folder = STAGES[12]
    c = {**constants(folder / "mainloop.cuh"), **constants(folder / "pingpong_kernel.cuh")}
    stages, producer_regs, consumer_regs = c["kStages"], c["kProducerRegisters"], c["kConsumerRegisters"]
    turn_barrier, group = c["kTurnBarrier"], c["kWarpgroupThreads"]
    svg = Svg(1000, 540, "Stage 12 ping-pong timeline")
    svg.text(30, 26, "Stage 12's ping-pong kernel, one block on one SM: who does what, K/V tile after tile",
             14, weight="bold")
    svg.text(30, 44, f"one producer warpgroup ({group} threads, setmaxnreg {producer_regs}; one thread issues every "
                     f"copy), two consumer warpgroups ({group} threads, setmaxnreg {consumer_regs}, {c['kWgmmaM']} query rows "
                     "each)", 10)
    svg.text(30, 58, "a turn is one consumer's S_j = Q K_j^T and P_j-1 V_j-1 on the tensor cores; widths are "
                     "schematic, not measured", 10)
    x0, unit = 250, 180  # a turn: one consumer's S_j = Q K_j^T and P_j-1 V_j-1 on the tensor cores
    lanes = ["producer (TMA)", "tensor cores", "consumer 0", "consumer 1"] + \
            [f"{kind} buffer {s}" for kind in ("K", "V") for s in range(stages)]
    top, height = 76, 34
    y = {name: top + i * (height + 12) for i, name in enumerate(lanes)}
    end = x0 + 2 * tiles * unit / 2
    for name in lanes:
        svg.text(x0 - 12, y[name] + 21, name, 11, "end", weight="bold")
        svg.line(x0, y[name] + height, end, y[name] + height, "#ccc", 0.6)
    def tx(t):  # time in half turns from here on: a turn is 2
        return x0 + t * unit / 2
    consumer_colour = [PALETTE[0], PALETTE[1]]
    first = 2  # the first tile drawn: j = 2 .. tiles + 1
    for j in range(first, first + tiles):
        for k in range(2):  # consumer k's turn for tile j starts at 2 (j - first) + k (in turns)
            t = 2 * (2 * (j - first) + k)
            if tx(t + 2) > end:
                continue
            svg.rect(tx(t) + 1, y["tensor cores"] + 2, unit - 2, height - 4, consumer_colour[k], opacity=0.85)
            svg.text(tx(t) + unit / 2, y["tensor cores"] + 21, f"C{k}: S{j} then P{j - 1}·V{j - 1}", 10, "middle",
                     "#fff", "bold")
            row = f"consumer {k}"
            svg.rect(tx(t) + 1, y[row] + 4, unit * 0.14, height - 8, consumer_colour[k])
            svg.text(tx(t) + unit * 0.07 + 1, y[row] + 21, "issue", 8, "middle", "#fff")
            svg.rect(tx(t) + unit * 0.14 + 1, y[row] + 4, unit * 0.36, height - 8, "#eeeeee")
            svg.text(tx(t) + unit * 0.32, y[row] + 21, "wait for S", 8, "middle", "#555")
            if tx(t + 3) <= end:
                svg.rect(tx(t + 1) + 1, y[row] + 4, unit - 2, height - 8, consumer_colour[k], opacity=0.45)
                svg.text(tx(t + 2), y[row] + 21, f"softmax S{j} -> P{j}, rescale O", 10, "middle", weight="bold")
            # pass_turn right after the issue: the other consumer's wait_for_turn returns at its turn.
            other = f"consumer {1 - k}"
            if tx(t + 2) < end:
                y1, y2 = (y[row] + height - 4, y[other] + 4) if k == 0 else (y[row] + 4, y[other] + height - 4)
                svg.line(tx(t) + unit * 0.14, y1, tx(t + 2) + 2, y2, "#333", 1, dash="3,2", arrow=True)
    # The producer: once V_j-2's buffer is released (by the later consumer's P V wait), V_j, then K_j+1.
    for j in range(first, first + tiles):
        t = 2 * (2 * (j - first)) + 1
        if tx(t) + unit * 0.45 > end:
            continue
        svg.rect(tx(t), y["producer (TMA)"] + 4, unit * 0.45, height - 8, PALETTE[2], opacity=0.85)
        svg.text(tx(t) + unit * 0.225, y["producer (TMA)"] + 21, f"V{j}, K{j + 1}", 10, "middle", "#fff", "bold")
    # The ring: when a tile's copy is issued and when its empty barrier completes (both consumers done).
    def occupy(kind, j, start, stop, label):
        lane = f"{kind} buffer {j % stages}"
        a, b = max(tx(start), x0), min(tx(stop), end)
        if b <= a:
            return
        svg.rect(a + 1, y[lane] + 4, b - a - 2, height - 8, PALETTE[4 if kind == "K" else 6], opacity=0.6)
        svg.text((a + b) / 2, y[lane] + 21, label if b - a > 240 else f"{kind}{j}", 9, "middle")
    for j in range(first - 2, first + tiles + 1):
        base = 4 * (j - first)
        occupy("K", j, base - 3, base + 3, f"K{j}: full, read by S{j} of C0, C1; empty")
        occupy("V", j, base + 1, base + 9, f"V{j}: full, read by P{j}·V{j} of C0, C1; empty")
    yl = y[lanes[-1]] + height + 26
    svg.text(30, yl, f"Each buffer has a full barrier (1 arrival, the producer's arrive.expect_tx, plus the copy "
                     f"engine's bytes) and an empty one ({4 * 2} arrivals: one per consumer warp).", 10)
    svg.text(30, yl + 15, "A consumer releases K_j once its S_j is done (wgmma.wait_group 1) and V_j-1 at its next "
                          "iteration's start (wait_group 0): V buffers are held twice as long as K buffers.", 10)
    svg.text(30, yl + 30, "While one consumer's products run, the other runs its softmax; the producer stays "
                          f"{stages} tiles ahead, gated by the release of V.", 10)
    svg.text(30, yl + 45, f"Dashed arrows: pass_turn, a bar.arrive on the other consumer's turn barrier "
                          f"({turn_barrier} or {turn_barrier + 1}), which its wait_for_turn (bar.sync) takes.", 10)
    return svg


def stage14_backward_pipeline(step=540):
    """Stage 14's main kernel in its steady state: the producer warpgroup's two warps (the load warp's
    TMA copies, the dQ warp's bulk additions), the Q/dO stages, the two consumer warpgroups through one
    step, the dS^T buffers and the dQ staging buffer, with the named barriers between them. Widths are
    schematic; the order of events is the kernel's (backward_kernel.cuh, mainloop.cuh's produce)."""
    folder = STAGES[14]
    c = {**constants(folder / "mainloop.cuh"), **constants(folder / "backward_kernel.cuh")}
    group, keys, stages = c["kWarpgroupThreads"], c["kWgmmaM"], c["kStages"]
    consumers, bc = c["kConsumers"], c["kBlockCols"]
    ds_bar, staged_bar, free_bar = c["kDsWrittenBarrier"], c["kDqStagedBarrier"], c["kDqFreeBarrier"]
    stage_free_bar = c["kStageFreeBarrier"]
    ds_threads, dq_threads, pair_threads = c["kConsumerThreads"], c["kConsumersAndWarp"], c["kWarpgroupAndWarp"]
    if stages != 2 or consumers != 2:
        raise RuntimeError("this diagram draws two Q/dO stages and two consumer warpgroups")
    first, last = -0.4, 1.45  # the window, in steps: the end of step n-1, step n, the start of step n+1
    x0 = 230
    width = int(x0 + (last - first) * step + 30)
    lanes = [("load warp (TMA)", 30), ("Q/dO stage s = n mod 2", 30), ("Q/dO stage s' (the other)", 30)]
    for k in range(consumers):
        lanes += [(f"consumer {k}: its wgmma", 26), (f"consumer {k}: its threads", 26)]
    lanes += [("dSᵀ buffers (by step parity)", 30), ("dQ staging (fp32)", 30), ("dQ warp (lane 0)", 30)]
    top, gap, apart = 130, 8, 14  # apart: more room above the consumers, for the release's label
    bottom = top + sum(height + gap for _, height in lanes) + apart
    notes = [
        f"mbarriers: q_full[s] and do_full[s] (the load warp's arrive.expect_tx, then the bytes of Q with its lse, "
        f"of dO with its D), for which the consumers wait before Sᵀ and before dPᵀ. bar {stage_free_bar} + s "
        f"({dq_threads} threads: the consumers arrive once the step's last product has read the stage, the load warp "
        "syncs before it loads the stage again).",
        f"bar {ds_bar} (bar.sync, {ds_threads} threads: both consumers): each dQ share reads the dSᵀ rows of both "
        f"consumers ({bc} keys), so neither starts its share before both have written theirs. dK is issued behind "
        "the share, so that the tensor cores run it while the share is staged (at head_dim 128 dV is waited for "
        "first).",
        f"bar {free_bar} and bar {staged_bar} for consumer 0, bar {free_bar + 4} and bar {staged_bar + 4} for "
        f"consumer 1 ({pair_threads} threads each: the consumer and the dQ warp): dQ free (the consumer syncs, the "
        "dQ warp arrives) and dQ staged (the other way round): each consumer's part of the staging buffer passes "
        "to the copy engine and back on its own.",
        "For each consumer's share, the dQ warp's lane 0 issues one cp.reduce.async.bulk .add.f32 into its part "
        "of the fp32 accumulator in global memory, waits until the engine has read it (not until it has added "
        "it), and frees that part.",
        "dSᵀ has two buffers by step parity: a consumer may write step n+1's while the other still reads step "
        "n's for its dQ share.",
    ]
    wrapped = [line for note in notes for line in textwrap.wrap(note, 180)]
    svg = Svg(width, bottom + 90 + 15 * len(wrapped), "Stage 14 backward pipeline")
    svg.text(30, 26, f"Stage 14's main kernel: one block ({bc} keys of one K/V head), step after step; a step is "
                     "one query tile of one query head", 14, weight="bold")
    svg.text(30, 44, f"producer warpgroup ({group} threads, setmaxnreg {c['kProducerRegisters']}): in warp "
                     f"{c['kLoadWarp']} lane 0 issues every copy; warp {c['kDqWarp']} hands dQ's additions to "
                     f"the copy engine", 10)
    svg.text(30, 58, f"two consumer warpgroups ({group} threads each, setmaxnreg {c['kConsumerRegisters']}), "
                     f"{keys} keys each; both run the same sequence on their own keys", 10)
    svg.text(30, 72, "K and V are loaded once when the block starts (kv_full) and stay; widths are schematic, "
                     "not measured", 10)

    def tx(t):
        return x0 + (t - first) * step

    y, h = {}, {}
    at = top
    for name, height in lanes:
        at += apart if name == "consumer 0: its wgmma" else 0
        y[name], h[name] = at, height
        at += height + gap
    for name, _ in lanes:
        svg.text(x0 - 10, y[name] + h[name] / 2 + 4, name, 11, "end", weight="bold")
        svg.line(x0, y[name] + h[name], tx(last), y[name] + h[name], "#ccc", 0.6)
    for t in (0, 1):  # step boundaries
        svg.line(tx(t), top - 14, tx(t), bottom - gap, "#999", 1)
    for t0, t1, label in ((first, 0, "step n−1"), (0, 1, "step n"), (1, last, "step n+1")):
        svg.text((tx(t0) + tx(t1)) / 2, top - 30, label, 12, "middle", weight="bold")

    def box(lane, t0, t1, colour, label="", opacity=0.85, text="#fff"):
        a, b = max(tx(t0), tx(first)), min(tx(t1), tx(last))
        if b - a < 1:
            return
        svg.rect(a + 1, y[lane] + 3, b - a - 2, h[lane] - 6, colour, opacity=opacity)
        size = min(9, (b - a - 6) / (0.66 * max(len(label), 1)))  # the label fits its box, or is left out
        if label and size >= 6.5:
            svg.text((a + b) / 2, y[lane] + h[lane] / 2 + 3, label, f"{size:.1f}", "middle", text, "bold")

    wgmma, regs, smem, wait, issuing = PALETTE[0], PALETTE[1], PALETTE[2], "#e6e6e6", "#333333"
    tma, bulk, qdo, ds, staging = PALETTE[4], PALETTE[3], PALETTE[6], PALETTE[5], PALETTE[7]
    release, ds_written, dq_free, dq_staged, loaded = 0.82, 0.545, 0.67, 0.80, 0.14
    reads, read_out = 0.82, 0.98  # the copy engine reading the shares out, at the dQ warp's command
    name = {-1: "n−1", 0: "n", 1: "n+1", 2: "n+2", 3: "n+3"}
    for n in (-1, 0, 1):  # the steps in the window, as offsets from step n
        for k in range(consumers):
            w, th = f"consumer {k}: its wgmma", f"consumer {k}: its threads"
            box(w, n + 0.02, n + 0.13, wgmma, "Sᵀ = K Qᵀ")
            box(w, n + 0.13, n + 0.27, wgmma, "dPᵀ = V dOᵀ")
            box(w, n + 0.37, n + 0.50, wgmma, "dV += Pᵀ dO")
            box(w, n + 0.56, n + 0.67, wgmma, "dQ += dS K")
            box(w, n + 0.67, n + release, wgmma, "dK += dSᵀ Q")
            box(th, n, n + 0.04, issuing)
            box(th, n + 0.04, n + 0.12, wait, "wait", text="#555")
            box(th, n + 0.12, n + 0.27, regs, "Pᵀ = exp2(…)")
            box(th, n + 0.27, n + 0.36, regs, "dSᵀ")
            box(th, n + 0.36, n + 0.39, issuing)
            box(th, n + 0.39, n + 0.53, smem, "dSᵀ → shared")
            box(th, n + 0.55, n + 0.58, issuing)
            box(th, n + 0.58, n + dq_free, wait, "wait", text="#555")
            box(th, n + dq_free, n + dq_staged - 0.01, smem, "dQ → staging")
            box(th, n + dq_staged, n + release, wait)
        # Step n's stage (n mod 2) was loaded once step n-2 released it; step n releases it (stage free) once
        # its last product has read it, and the load warp loads step n+2's tiles into it.
        lane = "Q/dO stage s = n mod 2" if n % 2 == 0 else "Q/dO stage s' (the other)"
        box(lane, n - 2 + release + loaded, n + release, qdo,
            f"Q, dO, lse, D of step {name[n]}: read by both consumers", opacity=0.55, text="#222")
        box(lane, n + release, n + release + loaded, tma, "loading")
        box("load warp (TMA)", n + release, n + release + loaded, tma, f"TMA {name[n + 2]}")
        # dS^T: written by both consumers, read by both dQ shares, in the buffer of the step's parity.
        box("dSᵀ buffers (by step parity)", n + 0.39, n + 0.53, ds, f"{name[n]}: written", opacity=0.7, text="#222")
        box("dSᵀ buffers (by step parity)", n + 0.56, n + 0.67, ds, f"{name[n]}: read", opacity=0.95, text="#222")
        # dQ: staged by the consumers, read out by the copy engine at the dQ warp's command.
        box("dQ staging (fp32)", n + dq_free, n + dq_staged - 0.01, staging, f"{name[n]}: shares written", opacity=0.8,
            text="#222")
        box("dQ staging (fp32)", n + reads, n + read_out, staging, "engine reads", opacity=0.45, text="#222")
        box("dQ warp (lane 0)", n + dq_staged, n + reads, issuing)
        box("dQ warp (lane 0)", n + reads, n + read_out, bulk, "bulk adds")
        box("dQ warp (lane 0)", n + read_out - 1 + 0.01, n + dq_staged, wait, "wait for the next shares", text="#555")
    # The named barriers: who meets whom.
    consumer_top = y["consumer 0: its wgmma"]
    last_threads = f"consumer {consumers - 1}: its threads"
    consumer_bottom, dq_bottom = y[last_threads] + h[last_threads], y["dQ warp (lane 0)"] + h["dQ warp (lane 0)"]
    for t, label, colour in ((ds_written, f"bar {ds_bar}: dS written", "#c00"),
                             (dq_free, f"bars {free_bar}, {free_bar + 4}: dQ free", "#06c"),
                             (dq_staged, f"bars {staged_bar}, {staged_bar + 4}: dQ staged", "#080"),
                             (dq_staged - 1, f"bars {staged_bar}, {staged_bar + 4}: dQ staged", "#080")):
        if first <= t <= last:
            below = 14 if t < ds_written else 14 + 12 * [ds_written, dq_free, dq_staged].index(t)  # apart, when close
            svg.line(tx(t), consumer_top - 4, tx(t), dq_bottom + below - 10, colour, 1.4, dash="4,3")
            svg.text(tx(t) + 3, dq_bottom + below, label, 9, fill=colour, weight="bold")
    svg.line(tx(release), y["Q/dO stage s = n mod 2"] + h["Q/dO stage s = n mod 2"], tx(release), consumer_top,
             "#555", 1, dash="2,2")
    svg.text(tx(release) - 3, consumer_top - 5, f"arrive bar {stage_free_bar} + s: stage free", 9, "end", fill="#555")
    yl = bottom + 50
    legend = ((wgmma, "wgmma (tensor cores)"), (regs, "registers"), (smem, "stores to shared memory"),
              (issuing, "issuing"), (wait, "wait"), (tma, "TMA loads"),
              (bulk, "cp.reduce.async.bulk .add.f32"))
    for i, (colour, label) in enumerate(legend):
        svg.rect(30 + i * 150, yl, 12, 12, colour)
        svg.text(30 + i * 150 + 18, yl + 10, label, 10)
    for i, line in enumerate(wrapped):
        svg.text(30, yl + 34 + 15 * i, line, 10)
    return svg


DIAGRAMS = {
    "stage04_threads.svg": stage04_threads,
    "stage05_lanes.svg": stage05_lanes,
    "shuffle_butterfly.svg": shuffle_butterfly,
    "causal_tiles.svg": causal_tiles,
    "backward_passes.svg": backward_passes,
    "mma_fragments.svg": mma_fragments,
    "p_in_registers.svg": p_in_registers,
    "swizzle.svg": swizzle,
    "stage11_warp_tiles.svg": stage11_warp_tiles,
    "stage13_split_merge.svg": stage13_split_merge,
    "stage12_pingpong_timeline.svg": stage12_pingpong_timeline,
    "stage14_backward_pipeline.svg": stage14_backward_pipeline,
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
            print(f"make_diagrams --check: stale: {', '.join(stale)}; run python3 scripts/docs/make_diagrams.py")
            return 1
        print(f"make_diagrams --check: {len(DIAGRAMS)} diagrams match the sources")
    return 0


if __name__ == "__main__":
    sys.exit(main())
