#!/usr/bin/env python3
"""Backward TFLOP/s of flash_stages' stages beside cuDNN's on the FlashAttention grid (B·N = 16384,
H·d = 2048, head_dim 64 and 128, N 1024 / 4096 / 16384, causal and not), one line per cell, with each
stage's max error against cuDNN's gradients. A quick check between two builds of a stage, where
bench/compare.py's full interleaved run is more than the question needs; each figure is the median of 20
timed calls after 3 warm-up calls, CUDA events around each call. Stage 14 is also timed in its
deterministic mode (s14d). FLOPs: the FlashAttention convention, backward = 2.5 x forward, causal half.

    PYTHONPATH=<build>/python python3 scripts/device/time_backward.py [DTYPE] [STAGES]

DTYPE: bfloat16 (default) or float16; STAGES: comma-separated, default 14,11.
"""
import sys, torch, statistics
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
import flash_stages as fs

def bench(fn, iters=20):
    for _ in range(3): fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b))
    return statistics.median(ts)

dt = getattr(torch, sys.argv[1] if len(sys.argv) > 1 else "bfloat16")
stages = [int(s) for s in (sys.argv[2].split(",") if len(sys.argv) > 2 else ["14", "11"])]
for d in (64, 128):
    for n in (1024, 4096, 16384):
        for causal in (False, True):
            h = 2048 // d; b = 16384 // n
            g = torch.Generator(device="cuda").manual_seed(0)
            q, k, v, do = [torch.randn(b, h, n, d, device="cuda", generator=g).to(dt) for _ in range(4)]
            flops = 4 * b * h * n * n * d * (0.5 if causal else 1.0) * 2.5
            res = {}
            o, lse = fs.forward(q, k, v, causal=causal, stage=12)
            grads = {}
            for st in stages:
                for det in (False, True):
                    if det and st != 14: continue
                    fn = lambda: fs.backward(q, k, v, o, lse, do, causal=causal, stage=st, deterministic=det)
                    try:
                        grads[(st, det)] = fn()
                        res[f"s{st}{'d' if det else ''}"] = flops / bench(fn) / 1e9
                    except Exception as e:
                        res[f"s{st}{'d' if det else ''}"] = float('nan'); print("ERR", st, det, str(e)[:300])
            qq, kk, vv = [t.detach().clone().requires_grad_() for t in (q, k, v)]
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                out = F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal)
                ref = torch.autograd.grad(out, (qq, kk, vv), do, retain_graph=True)
                res["cudnn"] = flops / bench(lambda: torch.autograd.grad(out, (qq, kk, vv), do, retain_graph=True)) / 1e9
            errs = []
            for key, gr in grads.items():
                e = [((x.float() - r.float()).abs().max() / r.float().abs().max()).item() for x, r in zip(gr, ref)]
                errs.append(f"{key}: " + " ".join(f"{x:.1e}" for x in e))
            print(f"d{d} N{n} causal={int(causal)} " + " ".join(f"{k}={v:.0f}" for k, v in res.items()) +
                  (f" s14/cudnn={res.get('s14', 0)/res['cudnn']:.3f}" if 's14' in res else "") + " | " + "; ".join(errs), flush=True)
