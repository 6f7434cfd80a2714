#!/usr/bin/env python3
"""Side by side on one GPU: every stage of the course (through the flash_stages package) and PyTorch
on the same inputs, forward and backward, over the FlashAttention benchmark grid.

    PYTHONPATH=<build>/python python3 bench/compare.py            # the full grid: 173 s on the course's H100
    PYTHONPATH=<build>/python python3 bench/compare.py --quick    # a small subset, a smoke test
    PYTHONPATH=<build>/python python3 bench/compare.py --dtype bfloat16   # the half stages (forward)
    PYTHONPATH=<build>/python python3 bench/compare.py --decode           # stage 13 against SDPA's flash backend

Implementations:
  stageNN          flash_stages.forward / .backward (backward only for stages that have one)
  stageNN-det      the backward of a stage that sums with atomics (stage 11), with deterministic=True
  naive-torch      softmax(scale * q @ k^T (masked)) @ v with cuBLAS matmuls (materializes N x N)
  sdpa-<backend>   torch.nn.functional.scaled_dot_product_attention pinned with
                   torch.nn.attention.sdpa_kernel to flash, cudnn, efficient or math; a backend
                   that refuses the dtype (flash and usually cudnn refuse fp32) is listed as such.
  fa4              FlashAttention-4 (PyPI flash-attn-4, written in the CuTe DSL), where it is installed
                   (half precision only): its flash_attn_func on (batch, seq, heads, head_dim) views of
                   the same tensors; it compiles each kernel at its first call, in the untimed warm-up.
Backward of the PyTorch implementations and of fa4 is autograd (torch.autograd.grad with retain_graph).

Grid (read from bench/bench_grid.h, the C++ benchmarks' header): B*N = 16384 tokens and H*d = 2048
(H = 32 at d = 64, 16 at d = 128), d 64 and 128, N = 512 .. 16384, causal and not; fp32 with TF32
off in cuBLAS and cuDNN. Every q, k, v, o is then 128 MiB, 2.5 times the H100's L2; the inputs are
rotated among several sets all the same, so that no case is flattered by a warm cache.

Timing: CUDA events around each call on PyTorch's current stream; one untimed warm-up, then timed
calls until a per-case budget is spent (at least 3, at most 50); the median is reported. A cell's
forwards and backwards are timed in ROUNDS interleaved rounds, each implementation's calls spread over
them and the order rotated from round to round, so that every implementation of a cell meets the same
GPU clocks: the GPU's power management moves them by up to a few tens of percent within a second
(lesson 12, "A disturbed run"; a sustained attention backward on the H100 reaches its 700 W limit),
and a ratio of two medians timed apart took that in. The paths that hold N x N matrices (naive-torch,
sdpa-math) are timed at once instead, so that their memory (gigabytes at large N) is neither kept
nor fragmented while the rest of the cell runs. A case is
skipped, and the output says so, where it does not fit in free GPU memory (the O(N^2)-memory
stages and PyTorch's naive and math paths at large N) or where the previous N's time predicts a
call longer than --max-call-ms (3 s by default, which on an H100 skips nothing: the naive stages
01-02 take about 2.4 s a call at N = 16384; lower it to leave them out). The full grid took 173 s
on the course's H100 (bench/results/compare_h100.md).

TFLOP/s by the FlashAttention convention: forward 4*B*H*N^2*d, halved when causal; backward 2.5 x
forward. Each forward's output (and each backward's dq) is checked against sdpa-efficient's on the
same inputs (relative L2), so a fast wrong answer shows.

Half precision (--dtype bfloat16 or float16): the stages that have the dtype and PyTorch's
backends in it, forward and backward (--forward-only: forward only, as before stage 11); outputs are
checked against sdpa-math in the same dtype, and the table adds each stage's speed over sdpa-flash
(FlashAttention-2) per cell and as a geometric mean, forward and (stages with a backward) backward.

Writes bench/results/compare_<tag>.json, .md and compare_<tag>_forward.png / _backward.png; a half
dtype adds it to the tag (compare_h100_bf16). A decoding stage (Stage.max_seq_q set: stage 13) is left
out of that grid, whose every problem has seq_q = seq_kv; --decode measures it.

Decode (--decode): one new query per sequence against a cache, head_dim 128, 32 query heads on 8 K/V
heads (GQA 4), bf16 (or --dtype float16), at (batch 1, seq_kv 131072), (8, 32768), (64, 4096) and over
seq_kv 1024 .. 1048576 at batch 1. Implementations: the decoding stage on contiguous K/V
(flash_stages.forward), on a paged cache of 64-key pages in shuffled order (flash_stages.decode_paged),
and SDPA pinned to the flash backend with q [B, 32, 1, 128] and k, v [B, 8, N, 128] and enable_gqa=True
(PyTorch 2.5 and later); where that is refused, SDPA gets K and V expanded to 32 heads
(repeat_interleave, outside the timing) and the table says so. GB/s are the K and V bytes of the GQA
problem (2 * B * 8 * N * 128 * 2) over the median time, for every implementation alike. L2 is flushed
(a buffer of twice its size read) before every timed call, so no call finds the cache there; after the
flush the GPU spins for DECODE_HOLD_CYCLES, so that the host's work to issue the call (Python, the
binding, the launches) happens while the GPU is still busy and stays out of the timed span, which then
holds GPU time only, for every implementation alike.
Writes compare_<gpu>_decode.json, .md and .png (GB/s against seq_kv with the HBM line).
"""

import argparse
import contextlib
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


def read_bench_grid(path=os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_grid.h")):
    """bench_grid.h's kTokens, kHeadsTimesDim, seq_lens() and head_dims(): the grid of the C++
    benchmarks, read from their header so that the two cannot measure different problems. Exits,
    naming what it could not find, where the header no longer reads as expected."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        sys.exit(f"compare.py: cannot read the benchmark grid: {e}")

    def match(what, pattern):
        m = re.search(pattern, text)
        if not m:
            sys.exit(f"compare.py: {path} has no {what} in the form this script reads (pattern {pattern!r})")
        return m.group(1)

    def scalar(name):
        return int(match(name, rf"constexpr\s+int\s+{name}\s*=\s*(\d+)\s*;"))

    def int_list(function):
        body = match(f"{function}()", rf"{function}\(\)\s*\{{[^{{}}]*=\s*\{{([\d\s,]+)\}}\s*;")
        return [int(x) for x in body.replace(",", " ").split()]

    return scalar("kTokens"), scalar("kHeadsTimesDim"), int_list("seq_lens"), int_list("head_dims")


TOKENS, HIDDEN, SEQ_LENS, HEAD_DIMS = read_bench_grid()  # HIDDEN: H * d
QUICK_SEQ_LENS = [512, 1024]

SDPA_BACKENDS = ["flash", "cudnn", "efficient", "math"]
REFERENCE_IMPL = "sdpa-efficient"
# Rounds a cell's forwards are timed in; five leave each implementation up to 10 calls a round.
ROUNDS = 5


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
    p.add_argument("--forward-only", action="store_true", help="half precision: time the forward only")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                   help="element type of q, k, v (default float32, with --decode bfloat16; TF32 stays off)")
    p.add_argument("--decode", action="store_true",
                   help="the decoding stage against SDPA's flash backend on decode shapes (see above)")
    args = p.parse_args()
    if args.dtype is None:
        args.dtype = "bfloat16" if args.decode else "float32"
    if args.decode and args.dtype == "float32":
        p.error("--decode measures the half-precision decoding stage: --dtype bfloat16 or float16")
    return args


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
    if args.decode:
        return main_decode(args, t0, torch, flash_stages, F, SDPBackend, sdpa_kernel)
    budget_s = (args.budget_ms if args.budget_ms is not None else (100.0 if args.quick else 300.0)) / 1e3
    max_call_s = args.max_call_ms / 1e3
    seq_lens = QUICK_SEQ_LENS if args.quick else SEQ_LENS
    half = args.dtype != "float32"
    short = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}[args.dtype]
    tag = args.tag or gpu_tag(props.name) + (f"_{short}" if half else "") + ("_quick" if args.quick else "")
    n_sets = max(1, args.sets)
    dtype = getattr(torch, args.dtype)
    reference_impl = "sdpa-math" if half else REFERENCE_IMPL
    directions = ("forward",) if half and args.forward_only else ("forward", "backward")

    # A decoding stage takes a few query rows, not the grid's seq_q = seq_kv: --decode measures it.
    stages = [s for s in flash_stages.stages() if s.supports(dtype=args.dtype, seq_q=min(seq_lens))]
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

    # FlashAttention-4, where it is installed: its flash_attn_func takes (batch, seq, heads, head_dim) and
    # returns (o, lse); transposed views keep the last dimension contiguous, so nothing is copied.
    fa4_func = None
    if half:
        try:
            from flash_attn.cute import flash_attn_func as fa4_func
        except ImportError:
            pass

    def fa4(q, k, v, causal, scale, mask):
        out = fa4_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), softmax_scale=scale, causal=causal)
        return (out[0] if isinstance(out, tuple) else out).transpose(1, 2)

    # stageNN-det: the deterministic mode of a backward that sums with atomics, beside the default mode.
    deterministic_impls = [f"stage{s.number:02d}-det" for s in stages if s.backward_atomic]
    impls = ([f"stage{s.number:02d}" for s in stages] + deterministic_impls + ["naive-torch"] +
             [f"sdpa-{b}" for b in SDPA_BACKENDS] + (["fa4"] if fa4_func else []))
    stage_of = {f"stage{s.number:02d}": s for s in stages}
    stage_of.update({f"stage{s.number:02d}-det": s for s in stages if s.backward_atomic})
    torch_fn = {"naive-torch": naive_torch, **{f"sdpa-{b}": sdpa(b) for b in SDPA_BACKENDS}, "fa4": fa4}
    # Bytes of N x N float matrices a PyTorch path holds at its peak, in units of B*H*N*N*4.
    quadratic = {"naive-torch": {"forward": 2, "backward": 3}, "sdpa-math": {"forward": 3, "backward": 4}}

    def free_bytes():
        torch.cuda.empty_cache()
        return torch.cuda.mem_get_info(device)[0]

    def timed_calls(fn, count, first_set):
        """ms of each of count calls of fn(i), back to back, i the input set from first_set on."""
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(count)]
        for i, (a, b) in enumerate(events):
            a.record()
            fn((first_set + i) % n_sets)
            b.record()
        torch.cuda.synchronize()
        return [a.elapsed_time(b) for a, b in events]

    def warm_and_size(fn):
        """(the warm-up's result, the first timed call's ms, the calls the budget allows) of fn: one
        untimed warm-up on set 0 (its result is what the output check uses), then one timed call."""
        warm = fn(0)
        torch.cuda.synchronize()
        first = timed_calls(fn, 1, 1)[0]
        return warm, first, int(min(50, max(3, math.ceil(budget_s * 1e3 / max(first, 1e-3)))))

    def time_calls(fn):
        """(median ms, min ms, timed calls, the warm-up's result) of fn: the warm-up, then timed
        calls until the budget is spent."""
        warm, first, reps = warm_and_size(fn)
        times = [first] + timed_calls(fn, reps - 1, 2)
        return statistics.median(times), min(times), len(times), warm

    cell_deferred = []  # [row, fn, calls the budget allows, ms so far] of the current cell

    def defer_calls(fn):
        """time_calls, deferred: the warm-up and the first timed call now, the rest in the cell's
        rounds (time_rounds); until then the row holds the first call's time."""
        warm, first, reps = warm_and_size(fn)
        cell_deferred.append([None, fn, reps, [first]])
        return first, first, 1, warm

    def time_rounds(label):
        """The cell's deferred cases in ROUNDS rounds, each with its share of its calls a round and the
        order rotated a place a round; each row gets the median and minimum over all its calls."""
        cases = [c for c in cell_deferred if c[0] is not None and c[0]["status"] == "ok"]
        for r in range(ROUNDS if cases else 0):
            shift = r % len(cases)
            for case in cases[shift:] + cases[:shift]:
                row, fn, reps, times = case
                if row["status"] != "ok":
                    continue  # out of memory in an earlier round
                share = (reps - 1) * (r + 1) // ROUNDS - (reps - 1) * r // ROUNDS
                try:
                    with torch.no_grad() if row["direction"] == "forward" else contextlib.nullcontext():
                        times += timed_calls(fn, share, len(times) + 1)
                except torch.OutOfMemoryError as e:
                    row.update(status="oom", reason=str(e).split("\n")[0][:200], median_ms=None, min_ms=None,
                               runs=0, tflops=None)
                    log(t0, f"{label} | {row['impl']:14s} {row['direction']:8s} oom in the rounds")
        cases = [c for c in cases if c[0]["status"] == "ok"]
        for row, fn, reps, times in cases:
            ms = statistics.median(times)
            direction = row["direction"]
            row.update(median_ms=ms, min_ms=min(times), runs=len(times),
                       tflops=flops(row["batch"], row["heads"], row["seq"], row["head_dim"], row["causal"],
                                    direction) / (ms * 1e-3) / 1e12)
            last_ms[(row["impl"], direction, row["head_dim"], row["causal"])] = (row["seq"], ms)
            err = f" err {row['err_vs_ref']:.1e}" if row["err_vs_ref"] is not None else ""
            log(t0, f"{label} | {row['impl']:14s} {direction:8s} {ms:9.3f} ms {row['tflops']:7.2f} TFLOP/s{err}")
        cell_deferred.clear()

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
                                if direction == "forward" and impl.endswith("-det"):
                                    continue  # not a case: the flag is the backward's
                            if key in last_ms:
                                prev_seq, prev_ms = last_ms[key]
                                predicted = prev_ms * seq / prev_seq / 1e3  # B*N fixed: time grows with N
                                if predicted > max_call_s:
                                    raise Skip(f"slow: a call would take about {predicted:.1f} s (from the last N), "
                                               f"over --max-call-ms {args.max_call_ms:.0f}")
                            free = free_bytes()
                            # Interleaved in the cell's rounds, but for the paths that hold N x N matrices.
                            timer = time_calls if quadratic.get(impl, {}).get(direction, 0) else defer_calls
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
                                                              timer, deterministic=impl.endswith("-det"))
                            else:
                                factor = quadratic.get(impl, {}).get(direction, 0)
                                if factor and factor * quad_bytes > 0.9 * free:
                                    raise Skip(f"does not fit: about {factor * quad_bytes / 2**30:.1f} GiB of "
                                               f"N x N matrices > 90% of {free / 2**30:.1f} GiB free")
                                ms, mn, runs, out = run_torch(torch, torch_fn[impl], direction, sets, causal, scale,
                                                              mask, timer, heavy=bool(factor))
                            if timer is defer_calls:
                                cell_deferred[-1][0] = row
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
                        if row["status"] == "ok" and timer is defer_calls:
                            continue  # logged with its rounds' times
                        tf = f"{row['tflops']:7.2f} TFLOP/s" if row["tflops"] else ""
                        err = f" err {row['err_vs_ref']:.1e}" if row["err_vs_ref"] is not None else ""
                        detail = (f"{row['median_ms']:9.3f} ms {tf}{err}" if row["status"] == "ok"
                                  else f"{row['status']}: {row['reason']}")
                        log(t0, f"{label} | {impl:14s} {direction:8s} {detail}")
                time_rounds(label)
                del sets, mask, ref_o, ref_dq
                torch.cuda.empty_cache()

    elapsed = time.perf_counter() - t0
    meta = dict(
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        command=" ".join(["PYTHONPATH=<build>/python python3 bench/compare.py"] + sys.argv[1:]),
        gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
        torch=torch.__version__, cuda=torch.version.cuda,
        cudnn=torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        python=platform.python_version(), dtype=args.dtype, tf32=False, fa4=fa4_version(fa4_func),
        grid=dict(tokens=TOKENS, hidden=HIDDEN, head_dims=HEAD_DIMS, seq_lens=seq_lens, causal=[False, True]),
        timing=dict(method="CUDA events per call, median; a cell's forwards and backwards in interleaved rounds "
                           "(but naive-torch's and sdpa-math's)",
                    rounds=ROUNDS, warmup_calls=1, min_runs=3, max_runs=50,
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


def fa4_version(fa4_func):
    """The installed flash-attn-4's version, or None where it is not installed."""
    if fa4_func is None:
        return None
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("flash-attn-4")
    except PackageNotFoundError:
        return "unknown"


def run_stage(torch, flash_stages, st, direction, sets, causal, time_calls, deterministic=False):
    """(median ms, min ms, runs, o or dq of set 0) of one stage."""
    if direction == "forward":
        ms, mn, runs, (o, _) = time_calls(lambda i: flash_stages.forward(*sets[i][:3], stage=st.number,
                                                                          causal=causal))
        return ms, mn, runs, o
    fwd = [flash_stages.forward(*s[:3], stage=st.number, causal=causal) for s in sets]
    ms, mn, runs, (dq, _, _) = time_calls(lambda i: flash_stages.backward(*sets[i][:3], *fwd[i], sets[i][3],
                                                                          stage=st.number, causal=causal,
                                                                          deterministic=deterministic))
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

    for direction in ("forward", "backward"):
        stage_names = [i for i in shown if i.startswith("stage") and
                       any(r["impl"] == i and r["direction"] == direction and r["status"] == "ok" for r in results)]
        if meta["dtype"] == "float32" or "sdpa-flash" not in shown or not stage_names:
            continue
        others = ["sdpa-cudnn"]
        lines += ["", f"{direction.capitalize()} speed over sdpa-flash (FlashAttention-2) in the same run, per cell, "
                  f"and the geometric mean over the cells with N >= 1024:", "",
                  "| d | causal | N | " + " | ".join(f"{i} / flash" for i in stage_names + others) + " |",
                  "|---|---|---|" + "---|" * (len(stage_names) + len(others))]
        ratios = {i: [] for i in stage_names + others}
        for d, causal, seq, batch, heads in configs:
            base = ok.get(("sdpa-flash", direction, d, causal, seq))
            if not base or base["status"] != "ok":
                continue
            cells = []
            for impl in stage_names + others:
                r = ok.get((impl, direction, d, causal, seq))
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


# ------------------------------------------------------------------------------------------------
# --decode: the decoding stage against SDPA's flash backend, GB/s over the K and V bytes
# ------------------------------------------------------------------------------------------------

DECODE_HEADS_Q, DECODE_HEADS_KV, DECODE_HEAD_DIM, DECODE_PAGE = 32, 8, 128, 64
DECODE_SHAPES = [(1, 131072), (8, 32768), (64, 4096)]  # (batch, seq_kv): the three target shapes
DECODE_SWEEP = [1024, 4096, 16384, 65536, 131072, 262144, 1048576]  # seq_kv at batch 1
# GPU clock cycles of torch.cuda._sleep after each flush: about 0.2 ms at the H100's 1.98 GHz, longer
# than the host takes to issue one call. Without the hold, that host time landed in the timed span of
# the small calls (the decode timing of 2026-11-23 in bench/results/RUNS.md as committed in 1df9b43).
DECODE_HOLD_CYCLES = 400_000
ANCHORS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "pytorch_anchors_h100.md")


def hbm_datasheet_tbs():
    """The H100's datasheet HBM bandwidth as quoted in bench/results/pytorch_anchors_h100.md, or None."""
    try:
        with open(ANCHORS) as f:
            m = re.search(r"HBM3 ([\d.]+) TB/s", f.read())
        return float(m[1]) if m else None
    except OSError:
        return None


def main_decode(args, t0, torch, flash_stages, F, SDPBackend, sdpa_kernel):
    device = torch.device("cuda")
    props = torch.cuda.get_device_properties(device)
    dtype = getattr(torch, args.dtype)
    short = {"bfloat16": "bf16", "float16": "fp16"}[args.dtype]
    tag = args.tag or gpu_tag(props.name) + "_decode" + ("" if short == "bf16" else f"_{short}") + \
        ("_quick" if args.quick else "")
    budget_s = (args.budget_ms if args.budget_ms is not None else (30.0 if args.quick else 100.0)) / 1e3
    decoding = [s for s in flash_stages.stages() if s.max_seq_q and s.supports(dtype=args.dtype,
                                                                                head_dim=DECODE_HEAD_DIM)]
    if not decoding:
        sys.exit("compare.py --decode: no decoding stage in flash_stages (a stage with max_seq_q)")
    st = decoding[-1]
    name = f"stage{st.number:02d}"
    impls = [name] + ([f"{name}-paged"] if st.paged else []) + ["sdpa-flash"]
    shapes = list(DECODE_SHAPES) + [(1, n) for n in DECODE_SWEEP if (1, n) not in DECODE_SHAPES]
    if args.quick:
        shapes = [(1, 4096), (8, 4096)]
    l2 = getattr(props, "L2_cache_size", 0) or (64 << 20)
    # Read (not written) before every timed call: a read leaves clean lines in L2, which the call evicts
    # for free; a write would leave dirty ones, whose write-back the call would pay for.
    flush_buffer = torch.zeros(2 * l2, dtype=torch.uint8, device=device)

    def flush():
        flush_buffer.max()
    gqa_mode = {"mode": "enable_gqa"}
    scale = DECODE_HEAD_DIM ** -0.5
    log(t0, f"{props.name}, torch {torch.__version__} (CUDA {torch.version.cuda}); decode, {args.dtype}, "
            f"budget {budget_s * 1e3:.0f} ms per case, L2 flushed ({2 * l2 / 2**20:.0f} MiB) before every call")

    def time_cold(fn):
        """(median us, min us, calls, the warm-up's result): L2 flushed before each timed call."""
        warm = fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        flush()
        torch.cuda._sleep(DECODE_HOLD_CYCLES)
        start.record()
        fn()
        end.record()
        end.synchronize()
        first = start.elapsed_time(end)
        reps = int(min(50, max(5, math.ceil(budget_s * 1e3 / max(first, 1e-3)))))
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps - 1)]
        for a, b in events:
            flush()
            torch.cuda._sleep(DECODE_HOLD_CYCLES)
            a.record()
            fn()
            b.record()
        torch.cuda.synchronize()
        times = [first] + [a.elapsed_time(b) for a, b in events]
        return statistics.median(times) * 1e3, min(times) * 1e3, len(times), warm

    def sdpa_flash(q, k, v, expanded):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            if expanded is not None:
                return F.scaled_dot_product_attention(q, expanded[0], expanded[1], scale=scale)
            return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)

    results = []
    for batch, seq_kv in shapes:
        g = torch.Generator(device=device).manual_seed(7 + batch + seq_kv)
        q = torch.randn(batch, DECODE_HEADS_Q, 1, DECODE_HEAD_DIM, generator=g, device=device, dtype=dtype)
        k = torch.randn(batch, DECODE_HEADS_KV, seq_kv, DECODE_HEAD_DIM, generator=g, device=device, dtype=dtype)
        v = torch.randn_like(k)
        kv_bytes = 2 * k.numel() * k.element_size()
        outputs = {}
        for impl in impls:
            row = dict(impl=impl, batch=batch, seq_kv=seq_kv, kv_bytes=kv_bytes, status="ok", reason="",
                       median_us=None, min_us=None, runs=0, gbs=None, err_vs_flash=None)
            try:
                if impl == name:
                    fn = lambda: flash_stages.forward(q, k, v, stage=st.number)[0]  # noqa: E731
                elif impl.endswith("-paged"):
                    pages = seq_kv // DECODE_PAGE
                    order = torch.randperm(batch * pages, generator=torch.Generator().manual_seed(seq_kv)).to(device)

                    def paged(t):  # [B, Hkv, N, d] -> pages [B * N / 64, 64, Hkv, d], page i stored at order[i]
                        natural = t.view(batch, DECODE_HEADS_KV, pages, DECODE_PAGE, DECODE_HEAD_DIM)
                        natural = natural.permute(0, 2, 3, 1, 4).reshape(batch * pages, DECODE_PAGE, DECODE_HEADS_KV,
                                                                          DECODE_HEAD_DIM)
                        # Not empty_like: at batch 1 the reshape is a view with natural's permuted strides,
                        # which empty_like would copy, and decode_paged takes contiguous pages only.
                        out = torch.empty(natural.shape, dtype=natural.dtype, device=natural.device)
                        out[order] = natural
                        return out

                    k_pages, v_pages = paged(k), paged(v)
                    table = order.view(batch, pages).to(torch.int32).contiguous()
                    lens = torch.full((batch,), seq_kv, dtype=torch.int32, device=device)
                    fn = lambda: flash_stages.decode_paged(q, k_pages, v_pages, table, lens, stage=st.number)[0]  # noqa
                else:
                    expanded = None
                    if gqa_mode["mode"] == "expanded":
                        expanded = (k.repeat_interleave(DECODE_HEADS_Q // DECODE_HEADS_KV, dim=1),
                                    v.repeat_interleave(DECODE_HEADS_Q // DECODE_HEADS_KV, dim=1))
                    else:
                        try:
                            sdpa_flash(q, k, v, None)
                        except (TypeError, RuntimeError) as e:  # no enable_gqa, or the flash backend refuses it
                            gqa_mode.update(mode="expanded", reason=str(e).splitlines()[0][:200])
                            expanded = (k.repeat_interleave(DECODE_HEADS_Q // DECODE_HEADS_KV, dim=1),
                                        v.repeat_interleave(DECODE_HEADS_Q // DECODE_HEADS_KV, dim=1))
                    fn = lambda: sdpa_flash(q, k, v, expanded)  # noqa: E731
                us, mn, runs, out = time_cold(fn)
                row.update(median_us=us, min_us=mn, runs=runs, gbs=kv_bytes / (us * 1e-6) / 1e9)
                outputs[impl] = out
            except torch.OutOfMemoryError as e:
                row.update(status="oom", reason=str(e).split("\n")[0][:200])
            except Exception as e:  # a failed case must not lose the others' results
                row.update(status="error", reason=f"{type(e).__name__}: {str(e).splitlines()[0][:300]}")
            results.append(row)
            fn = out = k_pages = v_pages = expanded = None  # noqa: F841 (free before the next case)
        ref = outputs.get("sdpa-flash")
        for row in results[-len(impls):]:
            if ref is not None and row["impl"] in outputs and row["impl"] != "sdpa-flash":
                x = outputs[row["impl"]]
                row["err_vs_flash"] = (torch.linalg.vector_norm((x - ref).double()) /
                                       torch.linalg.vector_norm(ref.double())).item()
            detail = (f"{row['median_us']:10.1f} us {row['gbs']:8.1f} GB/s" if row["status"] == "ok"
                      else f"{row['status']}: {row['reason']}")
            err = f" err {row['err_vs_flash']:.1e}" if row["err_vs_flash"] is not None else ""
            log(t0, f"B={batch:3d} N={seq_kv:8d} | {row['impl']:14s} {detail}{err}")
        q = k = v = outputs = ref = None  # free this case's tensors before the next one's
        torch.cuda.empty_cache()

    elapsed = time.perf_counter() - t0
    meta = dict(
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        command=" ".join(["PYTHONPATH=<build>/python python3 bench/compare.py"] + sys.argv[1:]),
        gpu=props.name, torch=torch.__version__, cuda=torch.version.cuda, python=platform.python_version(),
        dtype=args.dtype, heads_q=DECODE_HEADS_Q, heads_kv=DECODE_HEADS_KV, head_dim=DECODE_HEAD_DIM, seq_q=1,
        page_size=DECODE_PAGE, sdpa_gqa=gqa_mode, hbm_datasheet_tbs=hbm_datasheet_tbs(),
        timing=dict(method="CUDA events per call, median; L2 flushed before every call, then the GPU held busy "
                           "while the host issues the call", warmup_calls=1, min_runs=5, max_runs=50,
                    budget_ms=budget_s * 1e3, flush_bytes=2 * l2, hold_cycles=DECODE_HOLD_CYCLES),
        bytes="K and V of the GQA problem: 2 * B * heads_kv * seq_kv * head_dim * element size",
        stage=dict(number=st.number, name=st.name), elapsed_s=round(elapsed, 1))
    os.makedirs(args.out_dir, exist_ok=True)
    base = os.path.join(args.out_dir, f"compare_{tag}")
    with open(base + ".json", "w") as f:
        json.dump(dict(meta=meta, results=results), f, indent=1)
    table = decode_markdown(meta, results, impls)
    with open(base + ".md", "w") as f:
        f.write(table)
    print("\n" + table, flush=True)
    written = [base + ".json", base + ".md"]
    if not args.no_plots:
        written += decode_plot(meta, results, impls, base)
    log(t0, "wrote " + ", ".join(os.path.relpath(p) for p in written))


def decode_markdown(meta, results, impls):
    rows = {(r["impl"], r["batch"], r["seq_kv"]): r for r in results}
    stage = impls[0]
    hbm = meta["hbm_datasheet_tbs"]
    mode = ("`enable_gqa=True` (8 K/V heads read as they are)" if meta["sdpa_gqa"]["mode"] == "enable_gqa" else
            "K and V expanded to 32 heads beforehand (`repeat_interleave`, not timed): the flash backend refused "
            f"`enable_gqa` ({meta['sdpa_gqa'].get('reason', '')}), so it reads 4 times the bytes counted here")
    lines = [
        f"# Decoding: {stage} against SDPA's flash backend on the {meta['gpu']} ({meta['dtype']})",
        "",
        f"Made by `{meta['command']}` on {meta['date']} in {meta['elapsed_s']} s: PyTorch {meta['torch']} "
        f"(CUDA {meta['cuda']}).",
        "",
        f"GB/s over the K and V bytes (2·B·{meta['heads_kv']}·N·{meta['head_dim']}·2), one new query per sequence, "
        f"{meta['heads_q']} query heads on {meta['heads_kv']} K/V heads, head_dim {meta['head_dim']}; median of "
        f"CUDA-event timings with L2 flushed before every call and the host's issuing kept out of the timed span "
        f"(the GPU spins {meta['timing']['hold_cycles']} cycles after the flush); time in µs in parentheses. {stage}-paged: pages of "
        f"{meta['page_size']} keys in shuffled order. sdpa-flash: {mode}." +
        (f" Of HBM: {stage} against the datasheet's {hbm} TB/s (`bench/results/pytorch_anchors_h100.md`)."
         if hbm else ""),
        "",
        "| B | N | K+V (MiB) | " + " | ".join(impls) + (" | of HBM" if hbm else "") + f" | {stage} / flash |",
        "|---|---|---|" + "---|" * (len(impls) + (2 if hbm else 1)),
    ]
    shapes = []
    for r in results:
        if (r["batch"], r["seq_kv"]) not in shapes:
            shapes.append((r["batch"], r["seq_kv"]))
    for batch, seq_kv in shapes:
        cells = []
        for impl in impls:
            r = rows.get((impl, batch, seq_kv))
            cells.append(f"{r['gbs']:.0f} ({r['median_us']:.1f})" if r and r["status"] == "ok" else "–")
        ours, flash = rows.get((stage, batch, seq_kv)), rows.get(("sdpa-flash", batch, seq_kv))
        ok = lambda r: r is not None and r["status"] == "ok"  # noqa: E731
        if hbm:
            cells.append(f"{100 * ours['gbs'] / (hbm * 1e3):.0f}%" if ok(ours) else "–")
        cells.append(f"{flash['median_us'] / ours['median_us']:.2f}x" if ok(ours) and ok(flash) else "–")
        kv = rows[next(k for k in rows if k[1:] == (batch, seq_kv))]["kv_bytes"] / 2**20
        lines.append(f"| {batch} | {seq_kv} | {kv:.0f} | " + " | ".join(cells) + " |")
    lines += ["", "## Notes", ""]
    errs = [r["err_vs_flash"] for r in results if r["err_vs_flash"] is not None]
    if errs:
        lines.append(f"- Every output checked against sdpa-flash's on the same inputs: largest relative L2 difference "
                     f"{max(errs):.1e}.")
    for r in results:
        if r["status"] != "ok":
            lines.append(f"- {r['impl']} not run at B={r['batch']} N={r['seq_kv']}: {r['status']}: {r['reason']}.")
    lines.append("")
    return "\n".join(lines)


def decode_plot(meta, results, impls, base):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot", flush=True)
        return []
    fig, ax = plt.subplots(figsize=(8, 5))
    styles = {impls[0]: ("-o", "C0"), "sdpa-flash": ("--s", "black")}
    for impl in impls:
        style, color = styles.get(impl, ("-^", "C2"))
        pts = sorted((r["seq_kv"], r["gbs"]) for r in results if r["impl"] == impl and r["batch"] == 1 and
                     r["status"] == "ok")
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, color=color, label=f"{impl}, batch 1", ms=5)
        for r in results:
            if r["impl"] == impl and r["batch"] != 1 and r["status"] == "ok":
                ax.plot([r["seq_kv"]], [r["gbs"]], style[-1], color=color, mfc="none", ms=9)
                ax.annotate(f"B={r['batch']}", (r["seq_kv"], r["gbs"]), textcoords="offset points", xytext=(6, -4),
                            fontsize=7, color=color)
    hbm = meta["hbm_datasheet_tbs"]
    if hbm:
        left = min(r["seq_kv"] for r in results)
        ax.axhline(hbm * 1e3, color="k", lw=0.8)
        ax.text(left, hbm * 1e3 * 1.01, f"HBM {hbm} TB/s (datasheet)", fontsize=8)
        ax.axhline(0.8 * hbm * 1e3, color="k", lw=0.8, ls=":")
        ax.text(left, 0.8 * hbm * 1e3 * 1.01, "80% of it", fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("seq_kv (cache length); hollow markers: batch 8 and 64 at their lengths")
    ax.set_ylabel("GB/s over the K and V bytes")
    ax.set_title(f"decode: q [B, {meta['heads_q']}, 1, {meta['head_dim']}], k, v [B, {meta['heads_kv']}, N, "
                 f"{meta['head_dim']}], {meta['dtype']}, {meta['gpu']}", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    path = f"{base}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


if __name__ == "__main__":
    main()
