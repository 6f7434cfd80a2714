#!/usr/bin/env python3
"""Stage 14's backward and cuDNN's, each called back to back for two seconds at a time while nvidia-smi
samples the SM clock, the board's power draw and the temperature every 100 ms: what a sustained backward
meets on a GPU that reaches its power limit. Two passes over the cells, the two implementations in turn
within each, so that both meet the GPU as it warms.

    PYTHONPATH=<build>/python python3 scripts/device/backward_power.py [DTYPE]

One line per cell, implementation and pass: the median and minimum ms per call (CUDA events around each
call), their TFLOP/s (FlashAttention convention: backward = 2.5 x 4·B·H·N²·d, causal counts half the
pairs), and the means of the SM clock and the power over the samples taken while it ran (the first two
and the last dropped), with the highest temperature. DTYPE: bfloat16 (default) or float16.
"""
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flash_stages

CELLS = ((128, 16384, False), (128, 16384, True), (128, 4096, False), (64, 16384, False))  # (d, N, causal)
SECONDS = 2.0


def sustained(fn):
    """(median ms, min ms, mean SM MHz, mean W, max °C) of fn called back to back for SECONDS."""
    fn()
    torch.cuda.synchronize()
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu",
                            "--format=csv,noheader,nounits", "-lms", "100"], stdout=subprocess.PIPE, text=True)
    times = []
    start = time.time()
    while time.time() - start < SECONDS:
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(10)]
        for a, b in events:
            a.record()
            fn()
            b.record()
        torch.cuda.synchronize()
        times += [a.elapsed_time(b) for a, b in events]
    smi.terminate()
    samples = [[float(x) for x in line.split(",")] for line in smi.communicate()[0].splitlines() if line.count(",") == 2]
    samples = samples[2:-1] if len(samples) > 4 else samples
    return (statistics.median(times), min(times), statistics.mean(s[0] for s in samples),
            statistics.mean(s[1] for s in samples), max(s[2] for s in samples))


def main():
    dtype = getattr(torch, sys.argv[1] if len(sys.argv) > 1 else "bfloat16")
    print(subprocess.run(["nvidia-smi", "--query-gpu=name,power.limit,clocks.max.sm", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip(), str(dtype))
    for d, n, causal in CELLS:
        heads, batch = 2048 // d, 16384 // n
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v, do = [torch.randn(batch, heads, n, d, device="cuda", generator=g).to(dtype) for _ in range(4)]
        flops = 4 * batch * heads * n * n * d * (0.5 if causal else 1.0) * 2.5
        o, lse = flash_stages.forward(q, k, v, causal=causal, stage=12)
        qq, kk, vv = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            out = F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal)
        implementations = (
            ("stage14", lambda: flash_stages.backward(q, k, v, o, lse, do, causal=causal, stage=14)),
            ("cudnn", lambda: torch.autograd.grad(out, (qq, kk, vv), do, retain_graph=True)))
        for _ in range(2):
            for name, fn in implementations:
                med, low, clock, watts, temp = sustained(fn)
                print(f"d{d} N{n} causal={int(causal)} {name:8s} median {med:7.3f} ms ({flops / med / 1e9:4.0f} "
                      f"TFLOP/s) min {low:7.3f} ms ({flops / low / 1e9:4.0f}) | SM clock {clock:5.0f} MHz, "
                      f"power {watts:4.0f} W, up to {temp:.0f} C", flush=True)


if __name__ == "__main__":
    main()
