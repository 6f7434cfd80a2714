#!/usr/bin/env python3
"""Side by side on one GPU: every stage of the course (through the flash_stages package) and PyTorch
on the same inputs, forward and backward, over the FlashAttention benchmark grid.

    PYTHONPATH=<build>/python python3 bench/compare.py            # the full grid: 176 s on the course's H100
    PYTHONPATH=<build>/python python3 bench/compare.py --quick    # a small subset, a smoke test
    PYTHONPATH=<build>/python python3 bench/compare.py --dtype bfloat16   # the half stages (forward)

Implementations:
  stageNN          flash_stages.forward / .backward (backward only for stages that have one)
  naive-torch      softmax(scale * q @ k^T (masked)) @ v with cuBLAS matmuls (materializes N x N)
  sdpa-<backend>   torch.nn.functional.scaled_dot_product_attention pinned with
                   torch.nn.attention.sdpa_kernel to flash, cudnn, efficient or math; a backend
                   that refuses the dtype (flash and usually cudnn refuse fp32) is listed as such.
Backward of the PyTorch implementations is autograd (torch.autograd.grad with retain_graph).

Grid: B*N = 16384 tokens and H*d = 2048 (H = 32 at d = 64, 16 at d = 128), d 64 and 128,
N = 512 .. 16384, causal and not; fp32 with TF32 off in cuBLAS and cuDNN. Every q, k, v, o is then
128 MiB, 2.5 times the H100's L2; the inputs are rotated among several sets all the same, so that no
case is flattered by a warm cache.

Timing: CUDA events around each call on PyTorch's current stream; one untimed warm-up, then timed
calls until a per-case budget is spent (at least 3, at most 50); the median is reported. A case is
skipped, and the output says so, where it does not fit in free GPU memory (the O(N^2)-memory
stages and PyTorch's naive and math paths at large N) or where the previous N's time predicts a
call longer than --max-call-ms (3 s by default, which on an H100 skips nothing: the naive stages
01-02 take about 2.4 s a call at N = 16384; lower it to leave them out). The full grid took 176 s
on the course's H100 (bench/results/compare_h100.md).

TFLOP/s by the FlashAttention convention: forward 4*B*H*N^2*d, halved when causal; backward 2.5 x
forward. Each forward's output (and each backward's dq) is checked against sdpa-efficient's on the
same inputs (relative L2), so a fast wrong answer shows.

Half precision (--dtype bfloat16 or float16): the stages that have the dtype and PyTorch's
backends in it, forward only (no half stage has a backward yet); outputs are checked against
sdpa-math in the same dtype, and the table adds each stage's speed over sdpa-flash
(FlashAttention-2) per cell and as a geometric mean.

Writes bench/results/compare_<tag>.json, .md and compare_<tag>_forward.png / _backward.png; a half
dtype adds it to the tag (compare_h100_bf16).
"""

import argparse
import datetime
import json
import math
import os
import platform
import re
import statistics
import sys
import time
import warnings

TOKENS = 16384
HIDDEN = 2048  # H * d
SEQ_LENS = [512, 1024, 2048, 4096, 8192, 16384]
HEAD_DIMS = [64, 128]
QUICK_SEQ_LENS = [512, 1024]

SDPA_BACKENDS = ["flash", "cudnn", "efficient", "math"]
REFERENCE_IMPL = "sdpa-efficient"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help=f"a small subset: N in {QUICK_SEQ_LENS}, both head dims and both causal settings, "
                        "shorter timing budget")
    p.add_argument("--out-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"),
                   help="where the compare_* files go (default: bench/results)")
    p.add_argument("--tag", default=None, help="file name tag (default: the GPU, e.g. h100; _quick appended)")
    p.add_argument("--budget-ms", type=float, default=None,
                   help="timed milliseconds per case before stopping (default 300, quick 100)")
    p.add_argument("--max-call-ms", type=float, default=3000.0,
                   help="skip a case whose single call the previous N predicts longer than this (default 3000: "
                        "on an H100 every case runs; the naive stages 01-02 take about 2.4 s a call at N = 16384)")
    p.add_argument("--sets", type=int, default=2, help="input sets rotated through (default 2)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="element type of q, k, v (default float32; TF32 stays off)")
    return p.parse_args()


def log(t0, msg):
    print(f"[{time.perf_counter() - t0:6.1f}s] {msg}", flush=True)


def gpu_tag(name):
    m = re.search(r"(H100|H200|H20|A100|A10G|A10|L40S|L40|L4|B200|GB200|RTX ?\d{4}|V100|T4)", name, re.I)
    tag = m.group(1) if m else name
    return re.sub(r"[^a-z0-9]+", "", tag.lower()) or "gpu"


def flops(batch, heads, seq, head_dim, causal, direction):
    f = 4.0 * batch * heads * seq * seq * head_dim
    if causal:
        f /= 2
    return f * (2.5 if direction == "backward" else 1.0)


class Skip(Exception):
    """A case not run, with the reason."""


def main():
    args = parse_args()
    t0 = time.perf_counter()
    try:
        import torch
    except ImportError:
        sys.exit("compare.py needs PyTorch")
    if not torch.cuda.is_available():
        sys.exit("compare.py needs a CUDA GPU (torch.cuda.is_available() is False)")
    try:
        import flash_stages
    except ImportError:
        sys.exit("compare.py needs the flash_stages package: build the project and run with "
                 "PYTHONPATH=<build>/python")
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    warnings.filterwarnings("ignore", category=UserWarning)  # SDPA explains every refused backend
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")

    device = torch.device("cuda")
    props = torch.cuda.get_device_properties(device)
    budget_s = (args.budget_ms if args.budget_ms is not None else (100.0 if args.quick else 300.0)) / 1e3
    max_call_s = args.max_call_ms / 1e3
    seq_lens = QUICK_SEQ_LENS if args.quick else SEQ_LENS
    half = args.dtype != "float32"
    short = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}[args.dtype]
    tag = args.tag or gpu_tag(props.name) + (f"_{short}" if half else "") + ("_quick" if args.quick else "")
    n_sets = max(1, args.sets)
    dtype = getattr(torch, args.dtype)
    reference_impl = "sdpa-math" if half else REFERENCE_IMPL
    directions = ("forward",) if half else ("forward", "backward")

    stages = [s for s in flash_stages.stages() if s.supports(dtype=args.dtype)]
    backend_enum = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                    "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}

    # ------------------------------------------------------------------------------------------
    # Implementations: forward(q, k, v, causal, scale) -> o, and whether/how they do backward.
    # ------------------------------------------------------------------------------------------
    def naive_torch(q, k, v, causal, scale, mask):
        # In place where autograd allows it (matmul and mul do not need their outputs), so that the
        # peak is the scores and the probabilities: two N x N matrices per head.
        s = torch.matmul(q, k.transpose(-1, -2)).mul_(scale)
        if causal:
            s.masked_fill_(mask, -math.inf)
        return torch.matmul(torch.softmax(s, dim=-1), v)

    def sdpa(backend):
        def run(q, k, v, causal, scale, mask):
            with sdpa_kernel(backend_enum[backend]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
        return run

    impls = [f"stage{s.number:02d}" for s in stages] + ["naive-torch"] + [f"sdpa-{b}" for b in SDPA_BACKENDS]
    stage_of = {f"stage{s.number:02d}": s for s in stages}
    torch_fn = {"naive-torch": naive_torch, **{f"sdpa-{b}": sdpa(b) for b in SDPA_BACKENDS}}
    # Bytes of N x N float matrices a PyTorch path holds at its peak, in units of B*H*N*N*4.
    quadratic = {"naive-torch": {"forward": 2, "backward": 3}, "sdpa-math": {"forward": 3, "backward": 4}}

    def free_bytes():
        torch.cuda.empty_cache()
        return torch.cuda.mem_get_info(device)[0]

    def time_calls(fn):
        """(median ms, min ms, timed calls, the warm-up's result) of fn(i), i the input set: one
        untimed warm-up on set 0 (its result is what the output check uses), then timed calls
        until the budget is spent."""
        warm = fn(0)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(1 % n_sets)
        end.record()
        end.synchronize()
        first = start.elapsed_time(end)
        reps = int(min(50, max(3, math.ceil(budget_s * 1e3 / max(first, 1e-3)))))
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(reps - 1)]
        for i, (a, b) in enumerate(events):
            a.record()
            fn((i + 2) % n_sets)
            b.record()
        torch.cuda.synchronize()
        times = [first] + [a.elapsed_time(b) for a, b in events]
        return statistics.median(times), min(times), len(times), warm

    def rel_l2(x, ref):
        return (torch.linalg.vector_norm((x - ref).double()) / torch.linalg.vector_norm(ref.double())).item()

    # ------------------------------------------------------------------------------------------
    results = []
    last_ms = {}  # (impl, direction, d, causal) -> (N, median ms): predicts the next N
    log(t0, f"{props.name}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
            f"{props.total_memory / 2**30:.0f} GiB; {'quick' if args.quick else 'full'} grid, budget "
            f"{budget_s * 1e3:.0f} ms per case, {n_sets} input sets")

    for head_dim in HEAD_DIMS:
        heads = HIDDEN // head_dim
        for causal in (False, True):
            for seq in seq_lens:
                batch = TOKENS // seq
                scale = 1.0 / math.sqrt(head_dim)
                shape = (batch, heads, seq, head_dim)
                quad_bytes = batch * heads * seq * seq * dtype.itemsize
                g = torch.Generator(device=device).manual_seed(1000 + seq + head_dim + int(causal))
                sets = [tuple(torch.randn(shape, generator=g, device=device, dtype=dtype) for _ in range(4))
                        for _ in range(n_sets)]  # (q, k, v, do) per set
                mask = torch.ones(seq, seq, dtype=torch.bool, device=device).triu(1) if causal else None
                config = dict(head_dim=head_dim, causal=causal, seq=seq, batch=batch, heads=heads)
                label = f"d={head_dim} causal={int(causal)} N={seq} B={batch} H={heads}"

                ref_o = ref_dq = None
                ordered = [reference_impl] + [i for i in impls if i != reference_impl]
                for impl in ordered:
                    for direction in directions:
                        row = dict(config, impl=impl, direction=direction, status="ok", reason="",
                                   median_ms=None, min_ms=None, runs=0, tflops=None, err_vs_ref=None)
                        key = (impl, direction, head_dim, causal)
                        try:
                            st = stage_of.get(impl)
                            if st is not None:
                                if causal and not st.causal:
                                    continue  # not a case: the stage has no causal mask
                                if direction == "backward" and not st.backward:
                                    continue  # not a case: the stage has no backward
                            if key in last_ms:
                                prev_seq, prev_ms = last_ms[key]
                                predicted = prev_ms * seq / prev_seq / 1e3  # B*N fixed: time grows with N
                                if predicted > max_call_s:
                                    raise Skip(f"slow: a call would take about {predicted:.1f} s (from the last N), "
                                               f"over --max-call-ms {args.max_call_ms:.0f}")
                            free = free_bytes()
                            if st is not None:
                                need = 2 * shape[0] * shape[1] * shape[2] * shape[3] * dtype.itemsize * n_sets
                                if direction == "forward":
                                    ws = flash_stages.forward_workspace_bytes(st.number, batch, heads, heads, seq,
                                                                              seq, head_dim)
                                else:
                                    ws = flash_stages.backward_workspace_bytes(st.number, batch, heads, heads, seq,
                                                                               seq, head_dim)
                                    need *= 3
                                if ws + need > 0.9 * free:
                                    raise Skip(f"does not fit: workspace {ws / 2**30:.1f} GiB + outputs "
                                               f"{need / 2**30:.1f} GiB > 90% of {free / 2**30:.1f} GiB free")
                                ms, mn, runs, out = run_stage(torch, flash_stages, st, direction, sets, causal,
                                                              time_calls)
                            else:
                                factor = quadratic.get(impl, {}).get(direction, 0)
                                if factor and factor * quad_bytes > 0.9 * free:
                                    raise Skip(f"does not fit: about {factor * quad_bytes / 2**30:.1f} GiB of "
                                               f"N x N matrices > 90% of {free / 2**30:.1f} GiB free")
                                ms, mn, runs, out = run_torch(torch, torch_fn[impl], direction, sets, causal, scale,
                                                              mask, time_calls, heavy=bool(factor))
                            row.update(median_ms=ms, min_ms=mn, runs=runs,
                                       tflops=flops(batch, heads, seq, head_dim, causal, direction) / (ms * 1e-3)
                                       / 1e12)
                            last_ms[key] = (seq, ms)
                            if impl == reference_impl:
                                if direction == "forward":
                                    ref_o = out
                                else:
                                    ref_dq = out
                            else:
                                ref = ref_o if direction == "forward" else ref_dq
                                if ref is not None and out is not None:
                                    row["err_vs_ref"] = rel_l2(out, ref)
                            out = None
                        except Skip as e:
                            row.update(status="skipped", reason=str(e))
                        except torch.OutOfMemoryError as e:
                            row.update(status="oom", reason=str(e).split("\n")[0][:200])
                        except RuntimeError as e:
                            text = str(e).split("\n")[0][:300]
                            if impl.startswith("sdpa-") and ("No available kernel" in text or "not supported"
                                                              in text.lower()):
                                row.update(status="unsupported", reason=text)
                            else:
                                row.update(status="error", reason=text)
                        except Exception as e:  # a bug in one case must not lose the others' results
                            row.update(status="error", reason=f"{type(e).__name__}: {str(e).splitlines()[0][:300]}")
                        results.append(row)
                        tf = f"{row['tflops']:7.2f} TFLOP/s" if row["tflops"] else ""
                        err = f" err {row['err_vs_ref']:.1e}" if row["err_vs_ref"] is not None else ""
                        detail = (f"{row['median_ms']:9.3f} ms {tf}{err}" if row["status"] == "ok"
                                  else f"{row['status']}: {row['reason']}")
                        log(t0, f"{label} | {impl:14s} {direction:8s} {detail}")
                del sets, mask, ref_o, ref_dq
                torch.cuda.empty_cache()

    elapsed = time.perf_counter() - t0
    meta = dict(
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        command=" ".join(["PYTHONPATH=<build>/python python3 bench/compare.py"] + sys.argv[1:]),
        gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
        torch=torch.__version__, cuda=torch.version.cuda,
        cudnn=torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        python=platform.python_version(), dtype=args.dtype, tf32=False,
        grid=dict(tokens=TOKENS, hidden=HIDDEN, head_dims=HEAD_DIMS, seq_lens=seq_lens, causal=[False, True]),
        timing=dict(method="CUDA events per call, median", warmup_calls=1, min_runs=3, max_runs=50,
                    budget_ms=budget_s * 1e3, input_sets=n_sets, max_call_ms=args.max_call_ms),
        flops="forward 4*B*H*N^2*d, halved when causal; backward 2.5 x forward",
        reference=reference_impl, elapsed_s=round(elapsed, 1),
        stages={f"stage{s.number:02d}": dict(name=s.name, lesson=s.lesson, backward=s.backward, causal=s.causal)
                for s in stages},
    )
    os.makedirs(args.out_dir, exist_ok=True)
    base = os.path.join(args.out_dir, f"compare_{tag}")
    with open(base + ".json", "w") as f:
        json.dump(dict(meta=meta, results=results), f, indent=1)
    table = markdown(meta, results, impls)
    with open(base + ".md", "w") as f:
        f.write(table)
    print("\n" + table, flush=True)
    written = [base + ".json", base + ".md"]
    if not args.no_plots:
        written += plots(meta, results, impls, base)
    log(t0, "wrote " + ", ".join(os.path.relpath(p) for p in written))


def run_stage(torch, flash_stages, st, direction, sets, causal, time_calls):
    """(median ms, min ms, runs, o or dq of set 0) of one stage."""
    if direction == "forward":
        ms, mn, runs, (o, _) = time_calls(lambda i: flash_stages.forward(*sets[i][:3], stage=st.number,
                                                                          causal=causal))
        return ms, mn, runs, o
    fwd = [flash_stages.forward(*s[:3], stage=st.number, causal=causal) for s in sets]
    ms, mn, runs, (dq, _, _) = time_calls(lambda i: flash_stages.backward(*sets[i][:3], *fwd[i], sets[i][3],
                                                                          stage=st.number, causal=causal))
    return ms, mn, runs, dq


def run_torch(torch, fn, direction, sets, causal, scale, mask, time_calls, heavy):
    """(median ms, min ms, runs, o or dq of set 0) of a PyTorch implementation. Backward: autograd
    through a graph kept per input set (one only for the paths that hold N x N matrices)."""
    if direction == "forward":
        with torch.no_grad():
            return time_calls(lambda i: fn(*sets[i][:3], causal, scale, mask))
    graphs = []
    for s in sets[:1] if heavy else sets:
        q, k, v = (t.detach().requires_grad_(True) for t in s[:3])
        graphs.append(((q, k, v), fn(q, k, v, causal, scale, mask), s[3]))

    def step(i):
        inputs, o, do = graphs[i % len(graphs)]
        return torch.autograd.grad(o, inputs, do, retain_graph=True)

    ms, mn, runs, grads = time_calls(step)
    return ms, mn, runs, grads[0]


def markdown(meta, results, impls):
    ok = {(r["impl"], r["direction"], r["head_dim"], r["causal"], r["seq"]): r for r in results}
    shown = [i for i in impls if any(r["impl"] == i and r["status"] == "ok" for r in results)]
    lines = [
        f"# Stages vs PyTorch on the {meta['gpu']} ({meta['dtype']}{', TF32 off' if meta['dtype'] == 'float32' else ''})",
        "",
        f"Made by `{meta['command']}` on {meta['date']} in {meta['elapsed_s']} s: PyTorch {meta['torch']} "
        f"(CUDA {meta['cuda']}, cuDNN {meta['cudnn']}).",
        "",
        "TFLOP/s, forward / backward (FlashAttention convention: forward 4·B·H·N²·d, halved when causal; "
        "backward 2.5 x forward). B·N = 16384 tokens, H·d = 2048. Median of CUDA-event timings; "
        "`–` not run (see the notes), `·` the implementation has no such pass.",
        "",
        "| d | causal | B | H | N | " + " | ".join(shown) + " |",
        "|---|---|---|---|---|" + "---|" * len(shown),
    ]

    def cell(impl, direction, key):
        r = ok.get((impl, direction) + key)
        if r is None:
            return "·"
        return f"{r['tflops']:.1f}" if r["status"] == "ok" else "–"

    configs = sorted({(r["head_dim"], r["causal"], r["seq"], r["batch"], r["heads"]) for r in results})
    for d, causal, seq, batch, heads in configs:
        key = (d, causal, seq)
        cells = []
        for impl in shown:
            f, b = cell(impl, "forward", key), cell(impl, "backward", key)
            cells.append(f if b == "·" else f"{f} / {b}")
        if all(c in ("·", "–", "– / –", "· / ·") for c in cells):
            continue
        lines.append(f"| {d} | {'yes' if causal else 'no'} | {batch} | {heads} | {seq} | " + " | ".join(cells) + " |")

    stage_names = [i for i in shown if i.startswith("stage")]
    if meta["dtype"] != "float32" and "sdpa-flash" in shown and stage_names:
        lines += ["", f"Forward speed over sdpa-flash (FlashAttention-2) in the same run, per cell, and the geometric "
                  f"mean over the cells with N >= 1024:", "",
                  "| d | causal | N | " + " | ".join(f"{i} / flash" for i in stage_names) + " | sdpa-cudnn / flash |",
                  "|---|---|---|" + "---|" * (len(stage_names) + 1)]
        ratios = {i: [] for i in stage_names + ["sdpa-cudnn"]}
        for d, causal, seq, batch, heads in configs:
            base = ok.get(("sdpa-flash", "forward", d, causal, seq))
            if not base or base["status"] != "ok":
                continue
            cells = []
            for impl in stage_names + ["sdpa-cudnn"]:
                r = ok.get((impl, "forward", d, causal, seq))
                if r and r["status"] == "ok":
                    ratio = base["median_ms"] / r["median_ms"]
                    if seq >= 1024:
                        ratios[impl].append(ratio)
                    cells.append(f"{ratio:.2f}x")
                else:
                    cells.append("–")
            lines.append(f"| {d} | {'yes' if causal else 'no'} | {seq} | " + " | ".join(cells) + " |")
        geo = [f"{math.exp(sum(map(math.log, v)) / len(v)):.2f}x (min {min(v):.2f}x)" if v else "–"
               for v in ratios.values()]
        lines.append("| geometric mean | | N >= 1024 | " + " | ".join(geo) + " |")

    errs = [r["err_vs_ref"] for r in results if r["err_vs_ref"] is not None]
    lines += ["", "## Notes", ""]
    if errs:
        lines.append(f"- Every output checked against {meta['reference']} on the same inputs (forward: O, backward: "
                     f"dQ): largest relative L2 difference {max(errs):.1e}.")
    never = [i for i in impls if i not in shown]
    for impl in never:
        reasons = sorted({f"{r['status']}: {r['reason'].rstrip('.')}" for r in results if r["impl"] == impl})
        lines.append(f"- {impl} never ran: {'; '.join(reasons) if reasons else 'no case'}.")
    not_run = {}
    for r in results:
        if r["status"] != "ok" and r["impl"] not in never:
            kind = re.sub(r"[0-9][0-9.]*", "#", r["reason"])
            where = f"d={r['head_dim']}{' causal' if r['causal'] else ''} N={r['seq']}"
            not_run.setdefault((r["impl"], r["direction"], r["status"], kind), []).append((where, r["reason"]))
    for (impl, direction, status, _), items in sorted(not_run.items()):
        where = ", ".join(w for w, _ in items)
        lines.append(f"- {impl} {direction} not run at {where}: {status}: {items[0][1].rstrip('.')}"
                     f"{' (first of these)' if len(items) > 1 else ''}.")
    lines.append("")
    return "\n".join(lines)


def plots(meta, results, impls, base):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plots", flush=True)
        return []
    stage_colors = plt.get_cmap("tab10")
    torch_colors = iter(["black", "dimgray", "darkgoldenrod", "purple", "teal", "olive"])
    colors = {}
    for i, impl in enumerate(impls):
        colors[impl] = stage_colors(i % 10) if impl.startswith("stage") else next(torch_colors, "gray")
    written = []
    for direction in ("forward", "backward"):
        rows = [r for r in results if r["direction"] == direction and r["status"] == "ok"]
        if not rows:
            continue
        fig, axes = plt.subplots(2, 2, figsize=(13, 9), sharex=True)
        for ax, (d, causal) in zip(axes.flat, [(64, False), (64, True), (128, False), (128, True)]):
            for impl in impls:
                pts = sorted((r["seq"], r["tflops"]) for r in rows
                             if r["impl"] == impl and r["head_dim"] == d and r["causal"] == causal)
                if pts:
                    style = "-o" if impl.startswith("stage") else "--s"
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=impl, markersize=4,
                            color=colors[impl])
            ax.set_xscale("log", base=2)
            seqs = sorted({r["seq"] for r in rows})
            ax.set_xticks(seqs)
            ax.set_xticklabels([str(n) for n in seqs])
            ax.set_ylim(bottom=0)
            ax.set_title(f"d = {d}, H = {HIDDEN // d}, {'causal' if causal else 'not causal'}")
            ax.set_xlabel("N (B = 16384 / N)")
            ax.set_ylabel("TFLOP/s")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7, ncol=2)
        fig.suptitle(f"{direction}, {meta['dtype']}{' (TF32 off)' if meta['dtype'] == 'float32' else ''}, "
                     f"{meta['gpu']}, PyTorch {meta['torch']}")
        fig.tight_layout()
        path = f"{base}_{direction}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


if __name__ == "__main__":
    main()
