#!/usr/bin/env python3
"""One call of stage 14's backward (flash_stages, bf16) on a cell of the FlashAttention grid (B·N = 16384,
H·d = 2048), in its default or its deterministic mode, with the profiler started around that call alone
(cudaProfilerStart/Stop), so that Nsight Compute, run with --profile-from-start off, sees only its kernels
(scripts/profile/profile_stage14_modes.sh). Two calls before it, unprofiled, load the module.

    PYTHONPATH=build/python python3 scripts/profile/stage14_backward_once.py HEAD_DIM N CAUSAL DETERMINISTIC
"""
import sys

import torch

import flash_stages

head_dim, n, causal, deterministic = (int(x) for x in sys.argv[1:5])
g = torch.Generator(device="cuda").manual_seed(0)
q, k, v, do = [torch.randn(16384 // n, 2048 // head_dim, n, head_dim, device="cuda", generator=g, dtype=torch.bfloat16)
               for _ in range(4)]
o, lse = flash_stages.forward(q, k, v, causal=bool(causal), stage=12)


def backward():
    return flash_stages.backward(q, k, v, o, lse, do, causal=bool(causal), stage=14, deterministic=bool(deterministic))


for _ in range(2):
    backward()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
backward()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
