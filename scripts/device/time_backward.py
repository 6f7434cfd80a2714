#!/usr/bin/env python3
"""Backward TFLOP/s of flash_stages' stages beside cuDNN's on the FlashAttention grid (B·N = 16384,
H·d = 2048, head_dim 64 and 128, N 1024 / 4096 / 16384, causal and not), one line per cell, with each
stage's max error against cuDNN's gradients. A quick check between two builds of a stage, where
bench/compare.py's full interleaved run is more than the question needs; each figure is the median of 20
timed calls after 3 warm-up calls, CUDA events around each call. Stage 14 is also timed in its
deterministic mode (s14d). FLOPs: the FlashAttention convention, backward = 2.5 x forward; causal counts
half the pairs (an approximation: the figures are read as ratios between two builds).

    PYTHONPATH=<build>/python python3 scripts/device/time_backward.py [DTYPE] [STAGES] [SEQS]

DTYPE: bfloat16 (default) or float16; STAGES: comma-separated, default 14,11; SEQS: the sequence
lengths N, comma-separated, default 1024,4096,16384.
"""
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flash_stages


def median_ms(fn, iters=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def max_relative_error(grads, reference):
    """dQ, dK, dV: the largest difference over the reference's largest magnitude, each."""
    return [((g.float() - r.float()).abs().max() / r.float().abs().max()).item() for g, r in zip(grads, reference)]


def cell(dtype, stages, d, n, causal):
    heads, batch = 2048 // d, 16384 // n
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = [torch.randn(batch, heads, n, d, device="cuda", generator=g).to(dtype) for _ in range(4)]
    flops = 4 * batch * heads * n * n * d * (0.5 if causal else 1.0) * 2.5
    o, lse = flash_stages.forward(q, k, v, causal=causal, stage=12)
    tflops, grads = {}, {}
    for stage in stages:
        for deterministic in (False, True) if stage == 14 else (False,):
            name = f"s{stage}{'d' if deterministic else ''}"
            fn = lambda: flash_stages.backward(q, k, v, o, lse, do, causal=causal, stage=stage,  # noqa: E731
                                               deterministic=deterministic)
            try:
                grads[(stage, deterministic)] = fn()
                tflops[name] = flops / median_ms(fn) / 1e9
            except Exception as e:  # a stage that refuses the cell: its column says nan, the run goes on
                tflops[name] = float("nan")
                print("ERR", stage, deterministic, str(e)[:300])
    qq, kk, vv = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        out = F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal)
        cudnn = lambda: torch.autograd.grad(out, (qq, kk, vv), do, retain_graph=True)  # noqa: E731
        reference = cudnn()
        tflops["cudnn"] = flops / median_ms(cudnn) / 1e9
    errors = [f"{key}: " + " ".join(f"{x:.1e}" for x in max_relative_error(g, reference)) for key, g in grads.items()]
    ratio = f" s14/cudnn={tflops.get('s14', 0) / tflops['cudnn']:.3f}" if "s14" in tflops else ""
    print(f"d{d} N{n} causal={int(causal)} " + " ".join(f"{k}={v:.0f}" for k, v in tflops.items()) + ratio + " | "
          + "; ".join(errors), flush=True)


def main():
    dtype = getattr(torch, sys.argv[1] if len(sys.argv) > 1 else "bfloat16")
    stages = [int(s) for s in (sys.argv[2] if len(sys.argv) > 2 else "14,11").split(",")]
    seqs = [int(n) for n in (sys.argv[3] if len(sys.argv) > 3 else "1024,4096,16384").split(",")]
    for d in (64, 128):
        for n in seqs:
            for causal in (False, True):
                cell(dtype, stages, d, n, causal)


if __name__ == "__main__":
    main()
