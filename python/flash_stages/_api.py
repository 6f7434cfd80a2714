"""forward, backward and attention on torch tensors, through the C library.

torch is imported on first call, never at import. Every argument is checked here before the C
library sees it, so a bad input raises ValueError or TypeError naming the argument; what the C
library still refuses raises ValueError (an argument) or RuntimeError (CUDA) with its message.
"""

import math

from . import _lib

__all__ = ["forward", "backward", "attention", "decode_paged"]

_INT_MAX = 2**31 - 1
_ALIGNMENT = 16  # flash::kTensorAlignment


def _torch():
    try:
        import torch
    except ImportError as e:
        raise ImportError("flash_stages.forward/backward/attention need PyTorch (import torch failed: "
                          f"{e}); flash_stages.stages() works without it") from e
    return torch


def _torch_dtype(torch, registry_name):
    return getattr(torch, _lib.DTYPE_NAMES.get(registry_name, registry_name), None)


def _stage_dtypes(torch, stage):
    return tuple(d for d in (_torch_dtype(torch, n) for n in stage.dtypes) if d is not None)


def _check_causal(causal):
    if isinstance(causal, bool):
        return causal
    if isinstance(causal, int) and causal in (0, 1):
        return bool(causal)
    raise TypeError(f"causal must be a bool, got {causal!r}")


def _check_tensor(torch, name, t):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cuda":
        raise ValueError(f"{name} must be a CUDA tensor, got a tensor on {t.device} (move it with .cuda())")
    if t.dim() != 4 and name != "lse":
        raise ValueError(f"{name} must be 4-D [batch, heads, seq, head_dim], got shape {tuple(t.shape)}")


def _check_layout(name, t):
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (call .contiguous() on it), got strides {tuple(t.stride())} "
                         f"for shape {tuple(t.shape)}")
    if t.data_ptr() % _ALIGNMENT != 0:
        raise ValueError(f"{name} must start on a {_ALIGNMENT}-byte boundary (a view at an odd offset is not): "
                         "pass a copy (.clone())")


def _check_scale(scale, head_dim):
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(scale, bool) or not hasattr(scale, "__float__"):  # a str has no __float__: float("2") is no scale
        raise TypeError(f"scale must be a float or None, got {type(scale).__name__}")
    try:
        value = float(scale)
    except (TypeError, ValueError, RuntimeError):  # RuntimeError: a tensor of more than one element
        raise TypeError(f"scale must be a float or None, got {type(scale).__name__} {scale!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"scale must be finite, got {value}")
    return value


def _check_qkv(torch, stage, q, k, v, causal):
    """Checks q, k, v against each other and the stage; returns (batch, heads_q, heads_kv, seq_q, seq_kv, d)."""
    for name, t in (("q", q), ("k", k), ("v", v)):  # types first: a list is named as such wherever it is
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(torch, name, t)
    for name, t in (("k", k), ("v", v)):
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}: all tensors must be on one device")
    dtypes = _stage_dtypes(torch, stage)
    if q.dtype not in dtypes:
        raise TypeError(f"q has dtype {q.dtype}, but {stage} supports {', '.join(str(d) for d in dtypes)}")
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise TypeError(f"{name} has dtype {t.dtype} but q has {q.dtype}: q, k and v must share one dtype")
    batch, heads_q, seq_q, head_dim = q.shape
    batch_k, heads_kv, seq_kv, head_dim_k = k.shape
    if batch_k != batch:
        raise ValueError(f"k has batch {batch_k} but q has {batch} (q {tuple(q.shape)}, k {tuple(k.shape)})")
    if head_dim_k != head_dim:
        raise ValueError(f"k has head_dim {head_dim_k} but q has {head_dim} (q {tuple(q.shape)}, k {tuple(k.shape)})")
    if tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"v must have k's shape {tuple(k.shape)}, got {tuple(v.shape)}")
    for name, value in (("batch", batch), ("heads_q", heads_q), ("seq_q", seq_q), ("heads_kv", heads_kv),
                        ("seq_kv", seq_kv)):
        if value < 1:
            raise ValueError(f"{name} = {value} must be >= 1 (q {tuple(q.shape)}, k {tuple(k.shape)})")
    if head_dim not in stage.head_dims:
        raise ValueError(f"head_dim = {head_dim} (q.shape[-1]) is not supported by {stage}: supported "
                         f"{', '.join(str(d) for d in stage.head_dims)}")
    _check_seq_q(stage, seq_q)
    if heads_q % heads_kv != 0:
        raise ValueError(f"heads_q = {heads_q} (q.shape[1]) must be a multiple of heads_kv = {heads_kv} (k.shape[1])")
    if causal and not stage.causal:
        with_causal = ", ".join(str(s.number) for s in _lib.stages() if s.causal) or "none"
        raise ValueError(f"causal=True is not supported by {stage}; stages with causal: {with_causal}")
    if batch * heads_q * seq_q > _INT_MAX or batch * heads_kv * seq_kv > _INT_MAX:
        raise ValueError(f"q {tuple(q.shape)} / k {tuple(k.shape)}: batch*heads*seq must fit in a 32-bit int")
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_layout(name, t)
    return batch, heads_q, heads_kv, seq_q, seq_kv, head_dim


def _check_seq_q(stage, seq_q):
    if stage.max_seq_q and seq_q > stage.max_seq_q:
        raise ValueError(f"seq_q = {seq_q} (q.shape[2]) is more than {stage} takes: at most {stage.max_seq_q} query "
                         "rows, it is a decoding stage (the other stages take any seq_q)")


def _check_like(torch, name, t, ref_name, ref, shape=None, dtype=None):
    _check_tensor(torch, name, t)
    if t.device != ref.device:
        raise ValueError(f"{name} is on {t.device} but {ref_name} is on {ref.device}: all tensors must be on one device")
    want_dtype = dtype if dtype is not None else ref.dtype
    if t.dtype != want_dtype:
        raise TypeError(f"{name} has dtype {t.dtype}, must be {want_dtype}")
    want_shape = tuple(shape if shape is not None else ref.shape)
    if tuple(t.shape) != want_shape:
        raise ValueError(f"{name} must have shape {want_shape}, got {tuple(t.shape)}")
    _check_layout(name, t)


def _workspace(torch, nbytes, device):
    if nbytes == 0:
        return None, 0
    # The caching allocator hands out 512-byte aligned blocks on the current stream.
    return torch.empty(nbytes, dtype=torch.uint8, device=device), nbytes


def forward(q, k, v, *, stage, causal=False, scale=None):
    """O and lse of attention by one stage of the course.

    q [B, Hq, Nq, d], k and v [B, Hkv, Nk, d]: contiguous CUDA tensors of a dtype the stage supports,
    Hq a multiple of Hkv (GQA/MQA). causal is bottom-right aligned (query i sees key j iff
    j <= i + Nk - Nq; a query that sees no key gets zeros and lse = -inf). scale defaults to
    1/sqrt(d). Returns (o, lse): o like q, lse float32 [B, Hq, Nq]. Runs on the tensors' device and
    PyTorch's current stream, asynchronously like any torch op.
    """
    torch = _torch()
    st = _lib.get_stage(stage)
    causal = _check_causal(causal)
    dims = _check_qkv(torch, st, q, k, v, causal)
    batch, heads_q, _, seq_q, _, head_dim = dims
    scale = _check_scale(scale, head_dim)

    o = torch.empty_like(q)
    lse = torch.empty((batch, heads_q, seq_q), dtype=torch.float32, device=q.device)
    ws, ws_bytes = _workspace(torch, _lib.workspace_bytes(st.number, *dims), q.device)
    stream = torch.cuda.current_stream(q.device).cuda_stream
    msg = _lib.message_buffer()
    code = _lib.lib().flash_stages_forward(st.number, q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(),
                                           lse.data_ptr(), *dims, scale, int(causal),
                                           _lib.DTYPE_CODES[str(q.dtype).replace("torch.", "")],
                                           ws.data_ptr() if ws is not None else None, ws_bytes, q.device.index,
                                           stream, msg, len(msg))
    _lib.check_status(code, msg, f"flash_stages.forward ({st})")
    return o, lse


def backward(q, k, v, o, lse, do, *, stage, causal=False, scale=None, deterministic=False):
    """dq, dk, dv of attention by a stage with a backward, from the forward's o and lse and the gradient do.

    Shapes, dtypes and conventions as in forward(); o and do like q, lse float32 [B, Hq, Nq].
    deterministic=True asks for the same bits from the same inputs: stage 11 then sums dq without
    atomics, in a second pass (slower); by default it adds dq with fp32 atomics, whose order, and so
    dq's last bits, may change from run to run (Stage.backward_atomic). Stage 07 has no atomics and
    is deterministic either way. Returns (dq, dk, dv) shaped like q, k, v.
    """
    torch = _torch()
    st = _lib.get_stage(stage)
    if not st.backward:
        raise ValueError(f"stage = {st.number} ({st.name}) has no backward; stages with a backward: "
                         f"{_lib.backward_stage_list()}")
    causal = _check_causal(causal)
    if not isinstance(deterministic, bool):
        raise TypeError(f"deterministic must be a bool, got {deterministic!r}")
    dims = _check_qkv(torch, st, q, k, v, causal)
    batch, heads_q, _, seq_q, _, head_dim = dims
    _check_like(torch, "o", o, "q", q)
    _check_like(torch, "lse", lse, "q", q, shape=(batch, heads_q, seq_q), dtype=torch.float32)
    _check_like(torch, "do", do, "q", q)
    scale = _check_scale(scale, head_dim)

    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    ws, ws_bytes = _workspace(torch, _lib.workspace_bytes(st.number, *dims, backward=True), q.device)
    stream = torch.cuda.current_stream(q.device).cuda_stream
    msg = _lib.message_buffer()
    code = _lib.lib().flash_stages_backward(st.number, q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(),
                                            lse.data_ptr(), do.data_ptr(), dq.data_ptr(), dk.data_ptr(),
                                            dv.data_ptr(), *dims, scale, int(causal),
                                            _lib.DTYPE_CODES[str(q.dtype).replace("torch.", "")], int(deterministic),
                                            ws.data_ptr() if ws is not None else None, ws_bytes, q.device.index,
                                            stream, msg, len(msg))
    _lib.check_status(code, msg, f"flash_stages.backward ({st})")
    return dq, dk, dv


# Stages whose code runs on one GPU architecture only (12: Hopper's sm_90a); attention() does not pick
# them by default, since it must run on any GPU. Ask for one with stage=12.
_ARCHITECTURE_SPECIFIC_STAGES = (12,)


def default_stage(dtype, head_dim, causal, seq_q=None):
    """The stage attention() uses: the latest with a backward that supports the problem, else the
    latest that supports its forward. seq_q (the query rows per head), when given, leaves out a stage
    that takes fewer (the decoding stage takes 16). Stages that run on one GPU architecture only (12)
    are left out. Raises naming what no stage supports."""
    all_stages = [s for s in _lib.stages()
                  if s.supports(seq_q=seq_q) and s.number not in _ARCHITECTURE_SPECIFIC_STAGES]
    name = str(dtype).replace("torch.", "")
    fits = [s for s in all_stages if s.supports(dtype=name)]
    if not fits:
        have = sorted({d for s in all_stages for d in s.torch_dtype_names})
        raise TypeError(f"q has dtype {dtype}, but no stage supports it (stages support: {', '.join(have)})")
    fits = [s for s in fits if s.supports(head_dim=head_dim)]
    if not fits:
        raise ValueError(f"head_dim = {head_dim} (q.shape[-1]) is supported by no stage for {name}")
    if causal:
        fits = [s for s in fits if s.causal]
        if not fits:
            raise ValueError(f"causal=True is supported by no stage for {name}, head_dim {head_dim}")
    with_backward = [s for s in fits if s.backward]
    return (with_backward or fits)[-1]


_function = None


def _attention_function():
    """The autograd.Function, built on first use so that torch stays a lazy import."""
    global _function
    if _function is not None:
        return _function
    torch = _torch()
    from torch.autograd.function import once_differentiable

    class FlashStagesAttention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, causal, scale, stage_number, stage_was_chosen, deterministic):
            o, lse = forward(q, k, v, stage=stage_number, causal=causal, scale=scale)
            ctx.save_for_backward(q, k, v, o, lse)
            ctx.causal = causal
            ctx.scale = scale
            ctx.deterministic = deterministic
            ctx.stage_number = stage_number
            ctx.stage_was_chosen = stage_was_chosen
            return o

        @staticmethod
        @once_differentiable
        def backward(ctx, grad_o):
            st = _lib.get_stage(ctx.stage_number)
            q, k, v, o, lse = ctx.saved_tensors
            if not st.backward:
                if ctx.stage_was_chosen:
                    raise RuntimeError(
                        f"flash_stages.attention: no stage with a backward supports this problem ({q.dtype}, "
                        f"head_dim {q.shape[-1]}, causal={ctx.causal}); stages with a backward: "
                        f"{_lib.backward_stage_list()}. The forward ran on {st}; for inference use "
                        "torch.no_grad() or flash_stages.forward")
                raise ValueError(f"stage = {st.number} ({st.name}) has no backward; stages with a backward: "
                                 f"{_lib.backward_stage_list()}")
            dq, dk, dv = backward(q, k, v, o, lse, grad_o.contiguous(), stage=st.number, causal=ctx.causal,
                                  scale=ctx.scale, deterministic=ctx.deterministic)
            return dq, dk, dv, None, None, None, None, None

    _function = FlashStagesAttention
    return _function


def attention(q, k, v, *, causal=False, scale=None, stage=None, deterministic=False):
    """softmax(scale * q k^T) v as a differentiable torch op, so a model trains with it.

    Arguments as in forward(); returns o. stage=None picks the latest stage with a backward that
    supports the dtype, head_dim and causality (or, where none has a backward yet, the latest that
    supports the forward: then the forward works and the backward raises RuntimeError): in fp16 and
    bf16 that is stage 11, whose forward is stage 10's; in fp32 stage 07. deterministic is passed
    to the backward (see backward()). Inputs must be contiguous: call .contiguous() on a transposed
    view first.
    """
    torch = _torch()
    causal = _check_causal(causal)
    if not isinstance(deterministic, bool):
        raise TypeError(f"deterministic must be a bool, got {deterministic!r}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(torch, name, t)
    if stage is None:
        st = default_stage(q.dtype, q.shape[-1], causal, seq_q=q.shape[2])
        chosen = True
    else:
        st = _lib.get_stage(stage)
        chosen = False
    if scale is not None:
        scale = _check_scale(scale, q.shape[-1])
    return _attention_function().apply(q, k, v, causal, scale, st.number, chosen, deterministic)


def _paged_stage(stage):
    if stage is None:
        with_paged = [s for s in _lib.stages() if s.paged]
        if not with_paged:
            raise ValueError("no stage has a paged entry point")
        return with_paged[-1]
    st = _lib.get_stage(stage)
    if not st.paged:
        raise ValueError(f"stage = {st.number} ({st.name}) has no paged entry point; stages with one: "
                         f"{_lib.paged_stage_list()}")
    return st


def decode_paged(q, k_pages, v_pages, page_table, cache_lens, *, causal=False, scale=None, stage=None):
    """O and lse of attention of a few new queries against a paged K/V cache (stage 13's second entry point).

    q [B, Hq, Nq, d] with Nq at most the stage's max_seq_q (16); k_pages and v_pages [P, page_size, Hkv, d],
    P pages of page_size keys, every K/V head of a key in one row (appending a token writes one row);
    page_table int32 [B, max_pages]: sequence b's pages in key order, key j of sequence b in row
    j % page_size of page page_table[b, j // page_size]; cache_lens int32 [B]: sequence b's keys, its Nq new
    ones included (their K and V are in the cache already). All contiguous CUDA tensors on one device; q,
    k_pages and v_pages of one dtype the stage has (bfloat16, float16); page_size a power of two from 16 to
    65536. causal is bottom-right per sequence: query i of sequence b sees the keys before
    cache_lens[b] - Nq + i + 1. A sequence of length 0 gives zeros and lse = -inf. The table's and the
    lengths' contents stay on the device: a length past max_pages * page_size is clamped to it, and a
    page number outside [0, P) is not read (wrong results, never a fault). stage defaults to the latest
    stage with a paged entry point. Returns (o, lse): o like q, lse float32 [B, Hq, Nq].
    """
    torch = _torch()
    st = _paged_stage(stage)
    causal = _check_causal(causal)
    named = (("q", q), ("k_pages", k_pages), ("v_pages", v_pages), ("page_table", page_table),
             ("cache_lens", cache_lens))
    for name, t in named:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    for name, t in named:
        if t.device.type != "cuda":
            raise ValueError(f"{name} must be a CUDA tensor, got a tensor on {t.device} (move it with .cuda())")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}: all tensors must be on one device")
    for name, t, dims, what in (("q", q, 4, "[batch, heads_q, seq_q, head_dim]"),
                                ("k_pages", k_pages, 4, "[num_pages, page_size, heads_kv, head_dim]"),
                                ("v_pages", v_pages, 4, "[num_pages, page_size, heads_kv, head_dim]"),
                                ("page_table", page_table, 2, "[batch, max_pages_per_seq]"),
                                ("cache_lens", cache_lens, 1, "[batch]")):
        if t.dim() != dims:
            raise ValueError(f"{name} must be {dims}-D {what}, got shape {tuple(t.shape)}")
    dtypes = _stage_dtypes(torch, st)
    if q.dtype not in dtypes:
        raise TypeError(f"q has dtype {q.dtype}, but {st} supports {', '.join(str(d) for d in dtypes)}")
    for name, t in (("k_pages", k_pages), ("v_pages", v_pages)):
        if t.dtype != q.dtype:
            raise TypeError(f"{name} has dtype {t.dtype} but q has {q.dtype}: q, k_pages and v_pages must share one "
                            "dtype")
    for name, t in (("page_table", page_table), ("cache_lens", cache_lens)):
        if t.dtype != torch.int32:
            raise TypeError(f"{name} must be torch.int32, got {t.dtype}")
    batch, heads_q, seq_q, head_dim = q.shape
    num_pages, page_size, heads_kv, head_dim_k = k_pages.shape
    if tuple(v_pages.shape) != tuple(k_pages.shape):
        raise ValueError(f"v_pages must have k_pages' shape {tuple(k_pages.shape)}, got {tuple(v_pages.shape)}")
    if head_dim_k != head_dim:
        raise ValueError(f"k_pages has head_dim {head_dim_k} but q has {head_dim}")
    if page_table.shape[0] != batch or cache_lens.shape[0] != batch:
        raise ValueError(f"page_table {tuple(page_table.shape)} and cache_lens {tuple(cache_lens.shape)} must have "
                         f"q's batch {batch} rows")
    max_pages = page_table.shape[1]
    for name, value in (("batch", batch), ("heads_q", heads_q), ("seq_q", seq_q), ("num_pages", num_pages),
                        ("page_size", page_size), ("heads_kv", heads_kv), ("max_pages_per_seq", max_pages)):
        if value < 1:
            raise ValueError(f"{name} = {value} must be >= 1")
    if head_dim not in st.head_dims:
        raise ValueError(f"head_dim = {head_dim} (q.shape[-1]) is not supported by {st}: supported "
                         f"{', '.join(str(d) for d in st.head_dims)}")
    _check_seq_q(st, seq_q)
    if heads_q % heads_kv != 0:
        raise ValueError(f"heads_q = {heads_q} (q.shape[1]) must be a multiple of heads_kv = {heads_kv} "
                         "(k_pages.shape[2])")
    if page_size & (page_size - 1) or not 16 <= page_size <= 65536:
        raise ValueError(f"page_size = {page_size} (k_pages.shape[1]) must be a power of two from 16 to 65536")
    for name, t in named:
        _check_layout(name, t)
    scale = _check_scale(scale, head_dim)

    o = torch.empty_like(q)
    lse = torch.empty((batch, heads_q, seq_q), dtype=torch.float32, device=q.device)
    ws_bytes = _lib.paged_workspace_bytes(st.number, batch, heads_q, heads_kv, seq_q, head_dim, page_size, max_pages)
    ws, ws_bytes = _workspace(torch, ws_bytes, q.device)
    stream = torch.cuda.current_stream(q.device).cuda_stream
    msg = _lib.message_buffer()
    code = _lib.lib().flash_stages_forward_paged(
        st.number, q.data_ptr(), k_pages.data_ptr(), v_pages.data_ptr(), page_table.data_ptr(), cache_lens.data_ptr(),
        o.data_ptr(), lse.data_ptr(), batch, heads_q, heads_kv, seq_q, head_dim, page_size, num_pages, max_pages,
        scale, int(causal), _lib.DTYPE_CODES[str(q.dtype).replace("torch.", "")],
        ws.data_ptr() if ws is not None else None, ws_bytes, q.device.index, stream, msg, len(msg))
    _lib.check_status(code, msg, f"flash_stages.decode_paged ({st})")
    return o, lse
