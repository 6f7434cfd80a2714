"""Attention in PyTorch with the course's conventions, for the GPU tests to compare against.

- K/V heads are shared GQA-style: query head h reads K/V head h // (Hq / Hkv).
- causal is bottom-right aligned: query i sees key j iff j <= i + (Nk - Nq). PyTorch's is_causal is
  top-left aligned, so an explicit boolean mask is built instead (the two agree only when Nq == Nk).
- A query that sees no key (causal with Nq > Nk) gives a zero output row and lse = -inf. SDPA
  would give NaN there: such rows are given every key (any finite softmax will do) and zeroed
  afterwards, which also zeroes their gradients.

Computed in float64 this is the truth; in float32 it is PyTorch's own error to compare with.
"""

import math

import torch
import torch.nn.functional as F


def setup_precise_fp32():
    """fp32 really in fp32: no TF32 in cuBLAS or cuDNN, for PyTorch's side of every comparison."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")


def expand_kv(t, heads_q):
    """[B, Hkv, N, d] -> [B, Hq, N, d], each K/V head repeated for its group of query heads."""
    return t.repeat_interleave(heads_q // t.shape[1], dim=1)


def causal_mask(seq_q, seq_kv, device):
    """[Nq, Nk] bool, True where query i may see key j (bottom-right aligned)."""
    i = torch.arange(seq_q, device=device)[:, None]
    j = torch.arange(seq_kv, device=device)[None, :]
    return j <= i + (seq_kv - seq_q)


def sdpa(q, k, v, *, causal, scale):
    """O by torch.nn.functional.scaled_dot_product_attention in the inputs' dtype (differentiable)."""
    heads_q, seq_q, seq_kv = q.shape[1], q.shape[2], k.shape[2]
    k, v = expand_kv(k, heads_q), expand_kv(v, heads_q)
    if not causal:
        return F.scaled_dot_product_attention(q, k, v, scale=scale)
    mask = causal_mask(seq_q, seq_kv, q.device)
    has_key = mask.any(dim=-1, keepdim=True)  # [Nq, 1]
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask | ~has_key, scale=scale)
    return o * has_key.to(o.dtype)


def composite(q, k, v, *, causal, scale):
    """O by attention written out, softmax(scale * q k^T) v with torch.matmul and torch.softmax, in the
    inputs' dtype (differentiable): in fp16 or bf16 every tensor stored between those kernels (the
    scores, the probabilities, the output and, under autograd, each gradient) is rounded to the dtype,
    as in the reference of FlashAttention's own tests with upcast off. Conventions as sdpa()."""
    heads_q, seq_q, seq_kv = q.shape[1], q.shape[2], k.shape[2]
    k, v = expand_kv(k, heads_q), expand_kv(v, heads_q)
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    if not causal:
        return torch.matmul(torch.softmax(s, dim=-1), v)
    mask = causal_mask(seq_q, seq_kv, q.device)
    has_key = mask.any(dim=-1, keepdim=True)  # [Nq, 1]
    s = s.masked_fill(~(mask | ~has_key), -math.inf)
    o = torch.matmul(torch.softmax(s, dim=-1), v)
    return o * has_key.to(o.dtype)


def lse(q, k, *, causal, scale):
    """log sum_j exp(scale * q_i . k_j) over the keys row i sees, in float64; -inf for a row that sees none."""
    k = expand_kv(k, q.shape[1]).double()
    s = scale * torch.matmul(q.double(), k.transpose(-1, -2))
    if causal:
        s = s.masked_fill(~causal_mask(q.shape[2], k.shape[2], q.device), -math.inf)
    return torch.logsumexp(s, dim=-1)


def rel_l2(x, ref):
    """||x - ref|| / ||ref|| in float64 (||x - ref|| alone where ref is all zeros)."""
    x, ref = x.double(), ref.double()
    diff = torch.linalg.vector_norm(x - ref).item()
    norm = torch.linalg.vector_norm(ref).item()
    return diff / norm if norm > 0 else diff


def make_inputs(batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, *, seed, device, dtype=torch.float32):
    """Seeded random normal q, k, v (and a dO), generated in float64 and rounded to dtype."""
    g = torch.Generator(device=device)
    g.manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g, device=device, dtype=torch.float64).to(dtype)

    q = randn(batch, heads_q, seq_q, head_dim)
    k = randn(batch, heads_kv, seq_kv, head_dim)
    v = randn(batch, heads_kv, seq_kv, head_dim)
    do = randn(batch, heads_q, seq_q, head_dim)
    return q, k, v, do
