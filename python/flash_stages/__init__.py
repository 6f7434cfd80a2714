"""flash_stages: the stages of the FlashAttention course, called from PyTorch.

    import flash_stages
    for s in flash_stages.stages():
        print(s.number, s.name, s.lesson)
    o, lse = flash_stages.forward(q, k, v, stage=6, causal=True)
    dq, dk, dv = flash_stages.backward(q, k, v, o, lse, do, stage=7)    # stages with a backward
    o = flash_stages.attention(q, k, v, causal=True)                    # differentiable (12 + 14 on an H100)
    o, lse = flash_stages.forward(q1, k, v, stage=13)                   # decoding: q1 of 1 to 16 rows
    o, lse = flash_stages.decode_paged(q1, k_pages, v_pages, page_table, cache_lens)  # a paged KV cache

A pure-Python package over the C library libflash_stages_c (python/flash_stages_c.h), loaded with
ctypes: no compiled Python extension. The calls are PyTorch custom operators (torch.ops.flash_stages.forward,
backward, attention, decode_paged), so torch.compile(fullgraph=True) traces them and CUDA graphs capture
them. torch is imported on first use, so importing the package and listing the stages work without it.
Tensors: q [B, Hq, Nq, d], k and v [B, Hkv, Nk, d],
contiguous, on a CUDA device, of a dtype the stage supports (fp32 for stages 01-07, bf16 and fp16 from
08); lse is float32 [B, Hq, Nq]. Stage 13 (decoding) takes Nq up to 16 (Stage.max_seq_q). Calls run on
the tensors' device and PyTorch's current stream.
"""

import sys as _sys

from ._lib import ABI_VERSION, Stage, StageError, get_stage, library_path, runs_here, stages
from ._api import attention, backward, decode_paged, default_stage, forward
from ._lib import paged_workspace_bytes as _paged_workspace_bytes
from ._lib import workspace_bytes as _workspace_bytes

# With torch loaded already, the operators are registered now, so that torch.compile finds them even
# when the first call is a traced one; otherwise on the first call (torch stays a lazy import).
if _sys.modules.get("torch") is not None:
    from . import _ops  # noqa: F401

__all__ = [
    "ABI_VERSION",
    "Stage",
    "StageError",
    "attention",
    "backward",
    "backward_workspace_bytes",
    "decode_paged",
    "decode_paged_workspace_bytes",
    "default_stage",
    "forward",
    "forward_workspace_bytes",
    "get_stage",
    "library_path",
    "runs_here",
    "stages",
]


def forward_workspace_bytes(stage, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim):
    """Device bytes one forward call of `stage` allocates as workspace for this problem (0: none)."""
    return _workspace_bytes(stage, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim)


def backward_workspace_bytes(stage, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim):
    """Device bytes one backward call of `stage` allocates as workspace (ValueError: no backward)."""
    return _workspace_bytes(stage, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, backward=True)


def decode_paged_workspace_bytes(stage, batch, heads_q, heads_kv, seq_q, head_dim, page_size, max_pages_per_seq):
    """Device bytes one decode_paged call of `stage` allocates as workspace (ValueError: no paged entry point)."""
    return _paged_workspace_bytes(stage, batch, heads_q, heads_kv, seq_q, head_dim, page_size, max_pages_per_seq)
