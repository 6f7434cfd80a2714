#!/usr/bin/env python3
"""One call of cuDNN's attention backward (SDPA pinned to the cuDNN backend), bf16, the problem lesson
14's profile uses: batch 4, N = 4096, H·d = 2048 (16 heads at head_dim 128, 32 at 64), not causal. The
profiler is started around the backward alone (cudaProfilerStart/Stop: autograd launches its kernels
from a thread of its own, where an NVTX range of this thread would not reach), so that Nsight Compute,
run with --profile-from-start off, sees its kernels only (scripts/profile/profile_cudnn_backward.sh).

    python3 scripts/profile/cudnn_backward_once.py HEAD_DIM
"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

head_dim = int(sys.argv[1]) if len(sys.argv) > 1 else 128
g = torch.Generator(device="cuda").manual_seed(0)
q, k, v, do = [torch.randn(4, 2048 // head_dim, 4096, head_dim, device="cuda", generator=g, dtype=torch.bfloat16)
               for _ in range(4)]
q, k, v = [t.requires_grad_() for t in (q, k, v)]
with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
    out = F.scaled_dot_product_attention(q, k, v)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
torch.autograd.grad(out, (q, k, v), do)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
