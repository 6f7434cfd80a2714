"""flash_stages' custom operators without a GPU: registration, the fake implementations (shapes,
dtypes, the same argument checks as the real ones) and torch.compile(fullgraph=True) tracing, all on
meta tensors, which take the fake implementations. Needs PyTorch only; test_compile.py runs the
operators on the GPU."""

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: these tests need it")

import flash_stages  # noqa: E402

OPS = torch.ops.flash_stages
HALF_STAGE = 11    # bf16/fp16 backward (forward: stage 10's)
DECODE_STAGE = 13  # decoding: up to 16 query rows, contiguous or paged cache


def meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, device="meta", dtype=dtype)


def test_operators_are_registered():
    for name in ("forward", "backward", "attention", "decode_paged"):
        schema = str(getattr(OPS, name).default._schema)
        assert schema.startswith(f"flash_stages::{name}("), schema
    assert "int? stage" in str(OPS.attention.default._schema)
    assert "float? scale" in str(OPS.forward.default._schema)


def test_fake_implementations_give_shapes_and_dtypes():
    q, k = meta(2, 8, 5, 64), meta(2, 2, 33, 64)
    o, lse = flash_stages.forward(q, k, k, stage=HALF_STAGE, causal=True)
    assert (o.shape, o.dtype, o.stride()) == (q.shape, q.dtype, q.stride())
    assert (lse.shape, lse.dtype, lse.is_contiguous()) == ((2, 8, 5), torch.float32, True)
    dq, dk, dv = flash_stages.backward(q, k, k, o, lse, o, stage=HALF_STAGE, causal=True)
    assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, k.shape)
    q1, pages = meta(3, 8, 2, 128), meta(10, 16, 2, 128)
    o, lse = flash_stages.decode_paged(q1, pages, pages, meta(3, 4, dtype=torch.int32), meta(3, dtype=torch.int32))
    assert o.shape == q1.shape and lse.shape == (3, 8, 2)


def test_fake_implementations_check_like_the_real_ones():
    q, k = meta(1, 2, 4, 64), meta(1, 2, 4, 64)
    with pytest.raises(ValueError, match=r"head_dim = 48"):
        flash_stages.forward(meta(1, 2, 4, 48), meta(1, 2, 4, 48), meta(1, 2, 4, 48), stage=HALF_STAGE)
    with pytest.raises(ValueError, match=r"heads_q = 3 .* multiple of heads_kv = 2"):
        flash_stages.forward(meta(1, 3, 4, 64), k, k, stage=HALF_STAGE)
    with pytest.raises(TypeError, match=r"q has dtype torch.float32"):
        flash_stages.forward(q.float(), k.float(), k.float(), stage=HALF_STAGE)
    with pytest.raises(ValueError, match=r"q must be contiguous"):
        flash_stages.forward(meta(1, 4, 2, 64).transpose(1, 2), k, k, stage=HALF_STAGE)
    with pytest.raises(ValueError, match=r"stage = 6 \(causal\) has no backward"):
        flash_stages.backward(q, k, k, q, meta(1, 2, 4, dtype=torch.float32), q, stage=6)
    with pytest.raises(ValueError, match=r"seq_q = 17"):
        flash_stages.forward(meta(1, 2, 17, 64), k, k, stage=DECODE_STAGE)


def test_compiled_trace_without_a_gpu():
    """fullgraph=True through the wrappers, forward and backward, on meta tensors (aot_eager runs the
    joint graph through the fake implementations)."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return torch._dynamo.backends.debugging.aot_eager(gm, example_inputs)

    def f(q, k, v):
        return flash_stages.attention(q, k, v, causal=True).float().sum()

    q = meta(2, 4, 16, 64).requires_grad_(True)
    k = meta(2, 2, 16, 64)
    compiled = torch.compile(f, fullgraph=True, backend=backend)
    compiled(q, k, k).backward()
    assert q.grad.shape == q.shape
    assert "flash_stages.attention" in graphs[0].code, graphs[0].code


def test_scale_as_a_compiled_argument():
    """A float argument of a compiled function turns symbolic on its second value: the wrapper must
    not need it concrete."""
    f = torch.compile(lambda q, k, s: flash_stages.forward(q, k, k, stage=HALF_STAGE, scale=s)[0],
                      fullgraph=True, backend="eager")
    q = meta(1, 2, 8, 64)
    for scale in (0.5, 0.25, 0.125):
        assert f(q, q, scale).shape == q.shape
