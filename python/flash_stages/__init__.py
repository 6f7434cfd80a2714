"""flash_stages: the stages of the FlashAttention course, called from PyTorch.

    import flash_stages
    for s in flash_stages.stages():
        print(s.number, s.name, s.lesson)
    o, lse = flash_stages.forward(q, k, v, stage=6, causal=True)
    dq, dk, dv = flash_stages.backward(q, k, v, o, lse, do, stage=7)    # stages with a backward
    o = flash_stages.attention(q, k, v, causal=True)                    # differentiable

A pure-Python package over the C library libflash_stages_c (python/flash_stages_c.h), loaded with
ctypes: no compiled Python extension. torch is imported on first use, so importing the package
and listing the stages work without it. Tensors: q [B, Hq, Nq, d], k and v [B, Hkv, Nk, d],
contiguous, on a CUDA device, of a dtype the stage supports (fp32 for now); lse is float32
[B, Hq, Nq]. Calls run on the tensors' device and PyTorch's current stream.
"""

from ._lib import ABI_VERSION, Stage, StageError, get_stage, library_path, stages
from ._api import attention, backward, default_stage, forward
from ._lib import workspace_bytes as _workspace_bytes

__all__ = [
    "ABI_VERSION",
    "Stage",
    "StageError",
    "attention",
    "backward",
    "backward_workspace_bytes",
    "default_stage",
    "forward",
    "forward_workspace_bytes",
    "get_stage",
    "library_path",
    "stages",
]


def forward_workspace_bytes(stage, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim):
    """Device bytes one forward call of `stage` allocates as workspace for this problem (0: none)."""
    return _workspace_bytes(stage, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim)


def backward_workspace_bytes(stage, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim):
    """Device bytes one backward call of `stage` allocates as workspace (ValueError: no backward)."""
    return _workspace_bytes(stage, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, backward=True)
