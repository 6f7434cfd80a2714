"""The PyTorch custom operators flash_stages::forward, ::backward, ::attention and ::decode_paged.

Importing this module registers them (it imports torch: _api imports it on first use, __init__ at
import when torch is already loaded). As operators, with a fake implementation each for shapes and
dtypes and attention's gradient registered for autograd, torch.compile(fullgraph=True) traces a model
that calls them without a graph break, and CUDA graphs capture them. The real implementations run
eagerly even in a compiled graph: they read PyTorch's current stream there, and call the C library
through ctypes (_api.run_*). Non-tensor arguments are schema scalars: stage (int, or None for the
default stage), causal, scale (None: 1/sqrt(head_dim)), deterministic. The schemas are spelled out,
since inferred ones would make stage a SymInt: the stage picks the kernel, so a compiled graph is
specialised on it, never symbolic.

    torch.ops.flash_stages.forward(q, k, v, stage, causal, scale) -> (o, lse)
    torch.ops.flash_stages.backward(q, k, v, o, lse, do, stage, causal, scale, deterministic) -> (dq, dk, dv)
    torch.ops.flash_stages.attention(q, k, v, stage, causal, scale, deterministic) -> (o, lse)
    torch.ops.flash_stages.decode_paged(q, k_pages, v_pages, page_table, cache_lens, stage, causal, scale)
        -> (o, lse)

attention is forward with a gradient (by flash_stages::backward) for o; lse is an output without one.
"""

from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _api

__all__ = ["forward", "backward", "attention", "decode_paged"]

_SCHEMAS = {
    "forward": "(Tensor q, Tensor k, Tensor v, int stage, bool causal, float? scale) -> (Tensor, Tensor)",
    "backward": "(Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, Tensor do, int stage, bool causal, "
                "float? scale, bool deterministic) -> (Tensor, Tensor, Tensor)",
    "attention": "(Tensor q, Tensor k, Tensor v, int? stage, bool causal, float? scale, bool deterministic) "
                 "-> (Tensor, Tensor)",
    "decode_paged": "(Tensor q, Tensor k_pages, Tensor v_pages, Tensor page_table, Tensor cache_lens, int? stage, "
                    "bool causal, float? scale) -> (Tensor, Tensor)",
}


def _operator(name):
    # No input is written and no output is a view of one (mutates_args=()).
    return torch.library.custom_op(f"flash_stages::{name}", mutates_args=(), schema=_SCHEMAS[name])


@_operator("forward")
def forward(q: Tensor, k: Tensor, v: Tensor, stage: int, causal: bool,
            scale: Optional[float]) -> Tuple[Tensor, Tensor]:
    return _api.run_forward(torch, q, k, v, stage, causal, scale)


@forward.register_fake
def _(q, k, v, stage, causal, scale):
    return _api.fake_forward(torch, q, k, v, stage, causal, scale)


@_operator("backward")
def backward(q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, do: Tensor, stage: int, causal: bool,
             scale: Optional[float], deterministic: bool) -> Tuple[Tensor, Tensor, Tensor]:
    return _api.run_backward(torch, q, k, v, o, lse, do, stage, causal, scale, deterministic)


@backward.register_fake
def _(q, k, v, o, lse, do, stage, causal, scale, deterministic):
    return _api.fake_backward(torch, q, k, v, o, lse, do, stage, causal, scale, deterministic)


@_operator("attention")
def attention(q: Tensor, k: Tensor, v: Tensor, stage: Optional[int], causal: bool, scale: Optional[float],
              deterministic: bool) -> Tuple[Tensor, Tensor]:
    return _api.run_attention(torch, q, k, v, stage, causal, scale, deterministic)


@attention.register_fake
def _(q, k, v, stage, causal, scale, deterministic):
    return _api.fake_attention(torch, q, k, v, stage, causal, scale, deterministic)


def _attention_setup_context(ctx, inputs, output):
    q, k, v, stage, causal, scale, deterministic = inputs
    o, lse = output
    st, chosen = _api.attention_stage(torch, q, k, v, stage, causal)
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.mark_non_differentiable(lse)
    ctx.stage_number = st.number
    ctx.stage_was_chosen = chosen
    ctx.causal = causal
    ctx.scale = scale
    ctx.deterministic = deterministic


def _attention_backward(ctx, grad_o, grad_lse):
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = _api.attention_backward(torch, q, k, v, o, lse, grad_o, ctx.stage_number, ctx.stage_was_chosen,
                                         ctx.causal, ctx.scale, ctx.deterministic)
    return dq, dk, dv, None, None, None, None


attention.register_autograd(_attention_backward, setup_context=_attention_setup_context)


@_operator("decode_paged")
def decode_paged(q: Tensor, k_pages: Tensor, v_pages: Tensor, page_table: Tensor, cache_lens: Tensor,
                 stage: Optional[int], causal: bool, scale: Optional[float]) -> Tuple[Tensor, Tensor]:
    return _api.run_decode_paged(torch, q, k_pages, v_pages, page_table, cache_lens, stage, causal, scale)


@decode_paged.register_fake
def _(q, k_pages, v_pages, page_table, cache_lens, stage, causal, scale):
    return _api.fake_decode_paged(torch, q, k_pages, v_pages, page_table, cache_lens, stage, causal, scale)
