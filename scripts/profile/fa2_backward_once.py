#!/usr/bin/env python3
"""One bf16 backward of PyTorch's flash SDPA backend (FlashAttention-2), for Nsight Compute.

The shape of stage 11's Nsight table: batch 4, N 4096, H·d = 2048, not causal. The backward runs twice
(the first pass warms up); ncu's `-s 3 -c 3` picks the second pass's three kernels. Lesson 11 compares
them with stage 11's (bench/results/h100_ncu_fa2_bwd_sections_d64.txt and _d128.txt beside
h100_ncu_stage11_sections_d64.txt and _d128.txt).
Usage: ncu ... -k regex:flash_bwd -s 3 -c 3 python3 scripts/profile/fa2_backward_once.py HEAD_DIM
"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BATCH, SEQ, MODEL_WIDTH = 4, 4096, 2048  # B, N and H·d of stage 11's Nsight table

head_dim = int(sys.argv[1])
heads = MODEL_WIDTH // head_dim
q, k, v = (torch.randn(BATCH, heads, SEQ, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
           for _ in range(3))
with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
    for _ in range(2):
        o = F.scaled_dot_product_attention(q, k, v)
        o.backward(torch.randn_like(o))
torch.cuda.synchronize()
