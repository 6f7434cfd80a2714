"""forward, backward, attention and decode_paged on torch tensors: thin wrappers over the custom
operators flash_stages::forward, ::backward, ::attention and ::decode_paged (_ops.py), and the
argument checks and C library calls those operators run.

torch is imported on first call, never at import. The wrappers check what the operators' schemas
cannot say clearly (a list where a tensor goes, a str for causal, an infinite scale); the rest (the
stage, devices, dtypes, shapes, layout) is checked by the operators themselves: eagerly by the real
implementation before the C library sees anything, and under torch.compile by the fake
implementation while the graph is traced. Either way a bad input raises ValueError or TypeError
naming the argument (under torch.compile wrapped in the compiler's own error, the message kept);
what the C library still refuses raises ValueError (an argument) or RuntimeError (CUDA) with its
message.
"""

import functools
import math

from . import _lib

__all__ = ["forward", "backward", "attention", "decode_paged"]

_INT_MAX = 2**31 - 1
_ALIGNMENT = 16  # flash::kTensorAlignment

# Devices the checks accept: the real implementation runs on CUDA only; the fake one also takes
# meta tensors, so that shapes can be worked out without a GPU.
_REAL = ("cuda",)
_FAKE = ("cuda", "meta")


def _torch():
    try:
        import torch
    except ImportError as e:
        raise ImportError("flash_stages.forward/backward/attention need PyTorch (import torch failed: "
                          f"{e}); flash_stages.stages() works without it") from e
    return torch


_ops_registered = False  # a bool, not the namespace: torch.compile guards on it as a constant


def _operators(torch):
    """torch.ops.flash_stages, its operators registered on first use (importing _ops registers them)."""
    global _ops_registered
    if not _ops_registered:
        from . import _ops  # noqa: F401
        _ops_registered = True
    return torch.ops.flash_stages


def _torch_dtype(torch, registry_name):
    return getattr(torch, _lib.DTYPE_NAMES.get(registry_name, registry_name), None)


_dtypes_by_stage = {}


def _stage_dtypes(torch, stage):
    dtypes = _dtypes_by_stage.get(stage.number)
    if dtypes is None:
        dtypes = tuple(d for d in (_torch_dtype(torch, n) for n in stage.dtypes) if d is not None)
        _dtypes_by_stage[stage.number] = dtypes
    return dtypes


def _check_causal(causal):
    if isinstance(causal, bool):
        return causal
    if isinstance(causal, int) and causal in (0, 1):
        return bool(causal)
    raise TypeError(f"causal must be a bool, got {causal!r}")


def _check_deterministic(deterministic):
    if not isinstance(deterministic, bool):
        raise TypeError(f"deterministic must be a bool, got {deterministic!r}")
    return deterministic


def _check_is_tensor(torch, named):
    for name, t in named:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")


def _check_tensor(torch, name, t, devices):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type not in devices:
        raise ValueError(f"{name} must be a CUDA tensor, got a tensor on {t.device} (move it with .cuda())")
    if t.dim() != 4 and name != "lse":
        raise ValueError(f"{name} must be 4-D [batch, heads, seq, head_dim], got shape {tuple(t.shape)}")


def _check_layout(name, t, devices):
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (call .contiguous() on it), got strides {tuple(t.stride())} "
                         f"for shape {tuple(t.shape)}")
    # Only a real tensor has an address; a fake one (tracing) is checked when the graph runs.
    if devices is _REAL and t.data_ptr() % _ALIGNMENT != 0:
        raise ValueError(f"{name} must start on a {_ALIGNMENT}-byte boundary (a view at an odd offset is not): "
                         "pass a copy (.clone())")


def _check_scale(torch, scale):
    """None (1/sqrt(head_dim), worked out where head_dim is known) or a finite float."""
    if scale is None:
        return None
    # A value torch.compile traces (a float argument of the compiled function becomes symbolic on
    # its second value) is checked where it is concrete: by the real implementation, before the launch.
    if isinstance(scale, torch.SymFloat) or (torch.compiler.is_compiling() and isinstance(scale, (int, float))
                                             and not isinstance(scale, bool)):
        return scale
    if isinstance(scale, bool) or not hasattr(scale, "__float__"):  # a str has no __float__: float("2") is no scale
        raise TypeError(f"scale must be a float or None, got {type(scale).__name__}")
    try:
        value = float(scale)
    except (TypeError, ValueError, RuntimeError):  # RuntimeError: a tensor of more than one element
        raise TypeError(f"scale must be a float or None, got {type(scale).__name__} {scale!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"scale must be finite, got {value}")
    return value


def _scale_value(scale, head_dim):
    return 1.0 / math.sqrt(head_dim) if scale is None else scale


def _check_qkv(torch, stage, q, k, v, causal, devices):
    """Checks q, k, v against each other and the stage; returns (batch, heads_q, heads_kv, seq_q, seq_kv, d)."""
    _check_is_tensor(torch, (("q", q), ("k", k), ("v", v)))  # types first: a list is named as such wherever it is
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(torch, name, t, devices)
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
        _check_layout(name, t, devices)
    return batch, heads_q, heads_kv, seq_q, seq_kv, head_dim


def _check_seq_q(stage, seq_q):
    if stage.max_seq_q and seq_q > stage.max_seq_q:
        raise ValueError(f"seq_q = {seq_q} (q.shape[2]) is more than {stage} takes: at most {stage.max_seq_q} query "
                         "rows, it is a decoding stage (the other stages take any seq_q)")


def _check_like(torch, name, t, ref_name, ref, devices, shape=None, dtype=None):
    _check_tensor(torch, name, t, devices)
    if t.device != ref.device:
        raise ValueError(f"{name} is on {t.device} but {ref_name} is on {ref.device}: all tensors must be on one "
                         "device")
    want_dtype = dtype if dtype is not None else ref.dtype
    if t.dtype != want_dtype:
        raise TypeError(f"{name} has dtype {t.dtype}, must be {want_dtype}")
    want_shape = tuple(shape if shape is not None else ref.shape)
    if tuple(t.shape) != want_shape:
        raise ValueError(f"{name} must have shape {want_shape}, got {tuple(t.shape)}")
    _check_layout(name, t, devices)


# The sizes depend on the problem only (not on the device), and a model repeats few problems.
@functools.lru_cache(maxsize=1024)
def _workspace_bytes(stage, dims, backward):
    return _lib.workspace_bytes(stage, *dims, backward=backward)


@functools.lru_cache(maxsize=1024)
def _paged_workspace_bytes(*args):
    return _lib.paged_workspace_bytes(*args)


def _workspace(torch, nbytes, device):
    if nbytes == 0:
        return None, 0
    # The caching allocator hands out 512-byte aligned blocks on the current stream.
    return torch.empty(nbytes, dtype=torch.uint8, device=device), nbytes


def _dtype_code(dtype):
    return _lib.DTYPE_CODES[str(dtype).replace("torch.", "")]


# ---- what the operators run (_ops.py): checks, then the C library on the current stream ----

def _forward_checked(torch, q, k, v, stage, causal, scale, devices):
    st = _lib.get_stage(stage)
    causal = _check_causal(causal)
    dims = _check_qkv(torch, st, q, k, v, causal, devices)
    _check_scale(torch, scale)
    return st, dims


def run_forward(torch, q, k, v, stage, causal, scale):
    """flash_stages::forward's real implementation: (o, lse), launched on the current stream."""
    st, dims = _forward_checked(torch, q, k, v, stage, causal, scale, _REAL)
    batch, heads_q, _, seq_q, _, head_dim = dims
    o = torch.empty_like(q)
    lse = torch.empty((batch, heads_q, seq_q), dtype=torch.float32, device=q.device)
    ws, ws_bytes = _workspace(torch, _workspace_bytes(st.number, dims, False), q.device)
    # Read here, where the operator runs eagerly (in a CUDA graph's capture too), never traced.
    stream = torch.cuda.current_stream(q.device).cuda_stream
    msg = _lib.message_buffer()
    code = _lib.lib().flash_stages_forward(st.number, q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(),
                                           lse.data_ptr(), *dims, _scale_value(scale, head_dim), int(causal),
                                           _dtype_code(q.dtype), ws.data_ptr() if ws is not None else None, ws_bytes,
                                           q.device.index, stream, msg, len(msg))
    _lib.check_status(code, msg, f"flash_stages.forward ({st})")
    return o, lse


def fake_forward(torch, q, k, v, stage, causal, scale):
    """flash_stages::forward's fake implementation: the same checks (but the address), empty outputs."""
    _, (batch, heads_q, _, seq_q, _, _) = _forward_checked(torch, q, k, v, stage, causal, scale, _FAKE)
    return torch.empty_like(q), q.new_empty((batch, heads_q, seq_q), dtype=torch.float32)


def _backward_checked(torch, q, k, v, o, lse, do, stage, causal, scale, deterministic, devices):
    st = _lib.get_stage(stage)
    if not st.backward:
        raise ValueError(f"stage = {st.number} ({st.name}) has no backward; stages with a backward: "
                         f"{_lib.backward_stage_list()}")
    causal = _check_causal(causal)
    _check_deterministic(deterministic)
    _check_is_tensor(torch, (("q", q), ("k", k), ("v", v), ("o", o), ("lse", lse), ("do", do)))
    dims = _check_qkv(torch, st, q, k, v, causal, devices)
    batch, heads_q, _, seq_q, _, _ = dims
    _check_like(torch, "o", o, "q", q, devices)
    _check_like(torch, "lse", lse, "q", q, devices, shape=(batch, heads_q, seq_q), dtype=torch.float32)
    _check_like(torch, "do", do, "q", q, devices)
    _check_scale(torch, scale)
    return st, dims


def run_backward(torch, q, k, v, o, lse, do, stage, causal, scale, deterministic):
    """flash_stages::backward's real implementation: (dq, dk, dv), launched on the current stream."""
    st, dims = _backward_checked(torch, q, k, v, o, lse, do, stage, causal, scale, deterministic, _REAL)
    head_dim = dims[-1]
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    ws, ws_bytes = _workspace(torch, _workspace_bytes(st.number, dims, True), q.device)
    stream = torch.cuda.current_stream(q.device).cuda_stream
    msg = _lib.message_buffer()
    code = _lib.lib().flash_stages_backward(st.number, q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(),
                                            lse.data_ptr(), do.data_ptr(), dq.data_ptr(), dk.data_ptr(),
                                            dv.data_ptr(), *dims, _scale_value(scale, head_dim), int(causal),
                                            _dtype_code(q.dtype), int(deterministic),
                                            ws.data_ptr() if ws is not None else None, ws_bytes, q.device.index,
                                            stream, msg, len(msg))
    _lib.check_status(code, msg, f"flash_stages.backward ({st})")
    return dq, dk, dv


def fake_backward(torch, q, k, v, o, lse, do, stage, causal, scale, deterministic):
    _backward_checked(torch, q, k, v, o, lse, do, stage, causal, scale, deterministic, _FAKE)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def attention_stage(torch, q, k, v, stage, causal, devices=_FAKE):
    """(Stage, chosen): the stage attention runs, and whether it was picked (stage None) or asked for."""
    if stage is not None:
        return _lib.get_stage(stage), False
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(torch, name, t, devices)
    device = q.device.index if q.device.type == "cuda" else None
    return default_stage(q.dtype, q.shape[-1], _check_causal(causal), seq_q=q.shape[2], device=device), True


def run_attention(torch, q, k, v, stage, causal, scale, deterministic):
    """flash_stages::attention's real implementation: the chosen stage's forward, (o, lse)."""
    st, _ = attention_stage(torch, q, k, v, stage, causal, _REAL)
    _check_deterministic(deterministic)
    return run_forward(torch, q, k, v, st.number, causal, scale)


def fake_attention(torch, q, k, v, stage, causal, scale, deterministic):
    st, _ = attention_stage(torch, q, k, v, stage, causal, _FAKE)
    _check_deterministic(deterministic)
    return fake_forward(torch, q, k, v, st.number, causal, scale)


def attention_backward(torch, q, k, v, o, lse, grad_o, stage, chosen, causal, scale, deterministic):
    """dq, dk, dv of attention through flash_stages::backward, or the reason the stage has none."""
    st = _lib.get_stage(stage)
    if not st.backward:
        if chosen:
            raise RuntimeError(
                f"flash_stages.attention: no stage with a backward supports this problem ({q.dtype}, "
                f"head_dim {q.shape[-1]}, causal={causal}); stages with a backward: "
                f"{_lib.backward_stage_list()}. The forward ran on {st}; for inference use "
                "torch.no_grad() or flash_stages.forward")
        raise ValueError(f"stage = {st.number} ({st.name}) has no backward; stages with a backward: "
                         f"{_lib.backward_stage_list()}")
    return _operators(torch).backward(q, k, v, o, lse, grad_o.contiguous(), st.number, causal, scale, deterministic)


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


# k_pages.shape[1]: a power of two from 16 to 65536 (a tuple, so that a symbolic size compares too).
_PAGE_SIZES = tuple(2**i for i in range(4, 17))


def _decode_paged_checked(torch, q, k_pages, v_pages, page_table, cache_lens, stage, causal, scale, devices):
    st = _paged_stage(stage)
    causal = _check_causal(causal)
    named = (("q", q), ("k_pages", k_pages), ("v_pages", v_pages), ("page_table", page_table),
             ("cache_lens", cache_lens))
    _check_is_tensor(torch, named)
    for name, t in named:
        if t.device.type not in devices:
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
    if page_size not in _PAGE_SIZES:
        raise ValueError(f"page_size = {page_size} (k_pages.shape[1]) must be a power of two from 16 to 65536")
    for name, t in named:
        _check_layout(name, t, devices)
    _check_scale(torch, scale)
    return st, (batch, heads_q, heads_kv, seq_q, head_dim, page_size, num_pages, max_pages)


def run_decode_paged(torch, q, k_pages, v_pages, page_table, cache_lens, stage, causal, scale):
    """flash_stages::decode_paged's real implementation: (o, lse), launched on the current stream."""
    st, dims = _decode_paged_checked(torch, q, k_pages, v_pages, page_table, cache_lens, stage, causal, scale, _REAL)
    batch, heads_q, heads_kv, seq_q, head_dim, page_size, num_pages, max_pages = dims
    o = torch.empty_like(q)
    lse = torch.empty((batch, heads_q, seq_q), dtype=torch.float32, device=q.device)
    ws_bytes = _paged_workspace_bytes(st.number, batch, heads_q, heads_kv, seq_q, head_dim, page_size, max_pages)
    ws, ws_bytes = _workspace(torch, ws_bytes, q.device)
    stream = torch.cuda.current_stream(q.device).cuda_stream
    msg = _lib.message_buffer()
    code = _lib.lib().flash_stages_forward_paged(
        st.number, q.data_ptr(), k_pages.data_ptr(), v_pages.data_ptr(), page_table.data_ptr(), cache_lens.data_ptr(),
        o.data_ptr(), lse.data_ptr(), *dims, _scale_value(scale, head_dim), int(causal), _dtype_code(q.dtype),
        ws.data_ptr() if ws is not None else None, ws_bytes, q.device.index, stream, msg, len(msg))
    _lib.check_status(code, msg, f"flash_stages.decode_paged ({st})")
    return o, lse


def fake_decode_paged(torch, q, k_pages, v_pages, page_table, cache_lens, stage, causal, scale):
    _, dims = _decode_paged_checked(torch, q, k_pages, v_pages, page_table, cache_lens, stage, causal, scale, _FAKE)
    batch, heads_q, _, seq_q = dims[:4]
    return torch.empty_like(q), q.new_empty((batch, heads_q, seq_q), dtype=torch.float32)


# ---- the public functions: thin wrappers over torch.ops.flash_stages.* ----

# False: every call goes through the dispatcher (torch.ops.flash_stages.*), eager ones too.
DIRECT_EAGER = True
_no_interceptor = None


def _interceptor_checks(torch):
    """The states in which something other than the real implementation must see the call: a
    torch_dispatch or torch_function mode (FakeTensorMode, make_fx, export), a functorch transform,
    the profiler (which names the operator). An empty tuple where this PyTorch lacks one of them:
    then every call takes the dispatcher."""
    names = (("_C", "_len_torch_dispatch_stack"), ("_C", "_is_torch_function_mode_enabled"),
             ("_C", "_are_functorch_transforms_active"), ("autograd", "_profiler_enabled"))
    checks = tuple(getattr(getattr(torch, mod, None), name, None) for mod, name in names)
    return checks if all(checks) else ()


def _direct(torch, tensors):
    """True where calling the real implementation straight does what the dispatcher would: eager,
    plain CUDA tensors, no gradient to record, nothing that intercepts operators. It skips the
    dispatcher's round trip (two Python layers), which would otherwise add to every eager call's
    host time; compiled code, CUDA graphs and every other case take torch.ops.flash_stages.*."""
    global _no_interceptor
    if not DIRECT_EAGER or torch.compiler.is_compiling():
        return False
    if _no_interceptor is None:
        _no_interceptor = _interceptor_checks(torch)
    if not _no_interceptor:
        return False
    dispatch_modes, function_modes, transforms, profiler = _no_interceptor
    if dispatch_modes() or function_modes() or transforms() or profiler():
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:
        if type(t) is not torch.Tensor or not t.is_cuda or (grad and t.requires_grad):
            return False
    return True


def _optional_stage(stage):
    return None if stage is None else _lib.stage_number(stage)


def forward(q, k, v, *, stage, causal=False, scale=None):
    """O and lse of attention by one stage of the course.

    q [B, Hq, Nq, d], k and v [B, Hkv, Nk, d]: contiguous CUDA tensors of a dtype the stage supports,
    Hq a multiple of Hkv (GQA/MQA). causal is bottom-right aligned (query i sees key j iff
    j <= i + Nk - Nq; a query that sees no key gets zeros and lse = -inf). scale defaults to
    1/sqrt(d). Returns (o, lse): o like q, lse float32 [B, Hq, Nq]. Runs on the tensors' device and
    PyTorch's current stream, asynchronously like any torch op. The operator flash_stages::forward.
    """
    torch = _torch()
    number = _lib.stage_number(stage)
    causal = _check_causal(causal)
    _check_is_tensor(torch, (("q", q), ("k", k), ("v", v)))
    scale = _check_scale(torch, scale)
    if _direct(torch, (q, k, v)):
        return run_forward(torch, q, k, v, number, causal, scale)
    # Not differentiable (attention() is): outputs that need no gradient, as in the direct path,
    # rather than the dispatcher's placeholder gradient that raises when called.
    with torch.no_grad():
        return _operators(torch).forward(q, k, v, number, causal, scale)


def backward(q, k, v, o, lse, do, *, stage, causal=False, scale=None, deterministic=False):
    """dq, dk, dv of attention by a stage with a backward, from the forward's o and lse and the gradient do.

    Shapes, dtypes and conventions as in forward(); o and do like q, lse float32 [B, Hq, Nq].
    deterministic=True asks for the same bits from the same inputs: stage 11 then sums dq without
    atomics, in a second pass (slower); by default it adds dq with fp32 atomics, whose order, and so
    dq's last bits, may change from run to run (Stage.backward_atomic). Stage 07 has no atomics and
    is deterministic either way. Returns (dq, dk, dv) shaped like q, k, v. The operator
    flash_stages::backward.
    """
    torch = _torch()
    number = _lib.stage_number(stage)
    causal = _check_causal(causal)
    deterministic = _check_deterministic(deterministic)
    _check_is_tensor(torch, (("q", q), ("k", k), ("v", v), ("o", o), ("lse", lse), ("do", do)))
    scale = _check_scale(torch, scale)
    if _direct(torch, (q, k, v, o, lse, do)):
        return run_backward(torch, q, k, v, o, lse, do, number, causal, scale, deterministic)
    with torch.no_grad():  # as forward()
        return _operators(torch).backward(q, k, v, o, lse, do, number, causal, scale, deterministic)


# Stages whose code runs on one GPU architecture only (12 and 14: Hopper's sm_90a). attention() picks
# them by default only on a GPU where they run (device given and _lib.runs_here), so that the same
# call works on any GPU and is fastest on an H100.
_ARCHITECTURE_SPECIFIC_STAGES = (12, 14)


def default_stage(dtype, head_dim, causal, seq_q=None, device=None):
    """The stage attention() uses: the latest with a backward that supports the problem, else the
    latest that supports its forward. seq_q (the query rows per head), when given, leaves out a stage
    that takes fewer (the decoding stage takes 16). Stages that run on one GPU architecture only (12,
    14) are candidates only where device (a CUDA device index or torch.device) is given and they run
    there: on an H100, stage 14, whose forward is stage 12's (stage 10's at head_dim 32). Raises naming what
    no stage supports."""
    index = getattr(device, "index", device)
    def usable(s):
        if s.number not in _ARCHITECTURE_SPECIFIC_STAGES:
            return True
        return index is not None and _lib.runs_here(s.number, index)
    all_stages = [s for s in _lib.stages() if s.supports(seq_q=seq_q) and usable(s)]
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


def attention(q, k, v, *, causal=False, scale=None, stage=None, deterministic=False):
    """softmax(scale * q k^T) v as a differentiable torch op, so a model trains with it.

    Arguments as in forward(); returns o. stage=None picks the latest stage with a backward that
    supports the dtype, head_dim and causality (or, where none has a backward yet, the latest that
    supports the forward: then the forward works and the backward raises RuntimeError, under
    torch.compile when the graph is compiled): in fp16 and bf16 that is stage 14 on an H100 (whose
    forward is stage 12's, stage 10's at head_dim 32) and stage 11 elsewhere (whose forward is stage 10's); in fp32 stage 07. deterministic is passed to the backward (see backward()). Inputs
    must be contiguous: call .contiguous() on a transposed view first. The operator
    flash_stages::attention (which also returns lse), with flash_stages::backward as its gradient.
    """
    torch = _torch()
    causal = _check_causal(causal)
    deterministic = _check_deterministic(deterministic)
    _check_is_tensor(torch, (("q", q), ("k", k), ("v", v)))
    number = _optional_stage(stage)
    scale = _check_scale(torch, scale)
    if _direct(torch, (q, k, v)):  # no gradient to record: the forward alone
        return run_attention(torch, q, k, v, number, causal, scale, deterministic)[0]
    return _operators(torch).attention(q, k, v, number, causal, scale, deterministic)[0]


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
    stage with a paged entry point. Returns (o, lse): o like q, lse float32 [B, Hq, Nq]. The operator
    flash_stages::decode_paged.
    """
    torch = _torch()
    number = _optional_stage(stage)
    causal = _check_causal(causal)
    _check_is_tensor(torch, (("q", q), ("k_pages", k_pages), ("v_pages", v_pages), ("page_table", page_table),
                             ("cache_lens", cache_lens)))
    scale = _check_scale(torch, scale)
    if _direct(torch, (q, k_pages, v_pages, page_table, cache_lens)):
        return run_decode_paged(torch, q, k_pages, v_pages, page_table, cache_lens, number, causal, scale)
    return _operators(torch).decode_paged(q, k_pages, v_pages, page_table, cache_lens, number, causal, scale)
