"""Lessons 08-10: the tensor-core stages' profile (scripts/profile/profile_tensor_stages.sh) and stage 10's
variants (bench/stage10_variants.cu)."""
import csv
import re

from .common import RESULTS, value_kind


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


@value_kind("ncu-tensor")
def _ncu_tensor(spec, parts, kind, runs, backward, compare, anchors):
    # ncu-tensor/dD/STAGE/WHAT: a figure of the tensor-core profile (WHAT: a key of the table below)
    d, stage, what = int(parts[1][1:]), int(parts[2]), parts[3]
    metric = {"bank": "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
              "tensor": "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
              "short": "smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio",
              "long": "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",
              "barrier": "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",
              "wait": "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio",
              "occupancy": "sm__warps_active.avg.pct_of_peak_sustained_active",
              "registers": "launch__registers_per_thread"}[what]
    for r in csv.reader((RESULTS / f"h100_ncu_tensor_d{d}_raw.csv").open()):
        if len(r) > 4 and r[0] == str(stage) and r[-3] == metric:
            v = float(r[-1].replace(",", ""))
            return (f"{v:,.0f}" if what in ("bank", "registers") else f"{v:.1f}" if what in ("tensor", "occupancy")
                    else f"{v:.2f}")
    raise KeyError(spec)


@value_kind("variant")
def _variant(spec, parts, kind, runs, backward, compare, anchors):
    # variant/dD/cC/N/SLUG/tflops|ms: a row of h100_stage10_variants.txt
    d, causal, n, slug, what = int(parts[1][1:]), parts[2] == "c1", int(parts[3]), parts[4], parts[5]
    row = load_variants()[(d, causal, n, slug)]
    return f"{row['tflops']:.1f}" if what == "tflops" else f"{row['ms']:.3f}"
