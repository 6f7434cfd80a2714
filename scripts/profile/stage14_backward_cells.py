#!/usr/bin/env python3
"""Stage 14's backward (flash_stages, bf16, default mode) on twelve cells of the FlashAttention grid (B·N =
16384, H·d = 2048): head_dim 128 and 64 at N 1024, 4096 and 16384, causal and not. Per
cell, three unprofiled calls, then REPS calls each with the profiler started around it alone
(cudaProfilerStart/Stop), so that Nsight Compute run with --profile-from-start off sees REPS launches of
each cell's kernels, in the order of CELLS (scripts/device/stage14_ab_ncu.sh).

    PYTHONPATH=build/python python3 scripts/profile/stage14_backward_cells.py [REPS]
"""
import sys

CELLS = [(128, 1024, 0), (128, 1024, 1), (128, 4096, 0), (128, 4096, 1), (128, 16384, 0), (128, 16384, 1),
         (64, 1024, 0), (64, 1024, 1), (64, 4096, 0), (64, 4096, 1), (64, 16384, 0), (64, 16384, 1)]

if __name__ == "__main__":
    import torch

    import flash_stages

    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    g = torch.Generator(device="cuda").manual_seed(0)
    for d, n, causal in CELLS:
        q, k, v, do = [torch.randn(16384 // n, 2048 // d, n, d, device="cuda", generator=g, dtype=torch.bfloat16)
                       for _ in range(4)]
        o, lse = flash_stages.forward(q, k, v, causal=bool(causal), stage=12)

        def backward():
            return flash_stages.backward(q, k, v, o, lse, do, causal=bool(causal), stage=14)

        for _ in range(3):
            backward()
        torch.cuda.synchronize()
        for _ in range(reps):
            torch.cuda.cudart().cudaProfilerStart()
            backward()
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStop()
        print(f"cell d{d} N{n} c{causal}", flush=True)
