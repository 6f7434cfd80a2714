"""The half-precision backward (stage 11) against autograd, by FlashAttention's own test rule.

Truth: autograd through attention written out in float64 (attention_truth.composite) on the same
inputs, already rounded to the dtype, and the same dO. PyTorch's side: autograd through the same
composite attention in the dtype itself (matmuls and softmax in bf16 / fp16, every stored tensor
rounded, as FlashAttention's tests' reference with upcast off). The rule, per gradient:

    max |ours - truth| <= 2 * max |PyTorch's - truth| + ABSOLUTE_SLACK

ABSOLUTE_SLACK = 1e-4 (reference::kHalfGradientSlack in the C++ tests): where a gradient is exactly
zero (one visible key: P = 1 and dS = dP - D = 0) PyTorch's rounded computation is exact too, while a
kernel keeps the fp32 rounding of dP - D (about 1e-6 per element, summed over up to a few thousand
rows into dK). Both modes of the stage are held to it: the default (dQ by fp32 atomics) and
deterministic=True.
"""

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: the GPU tests need it")

import flash_stages  # noqa: E402
import attention_truth as truth  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (torch.cuda.is_available() is False)"),
]

ABSOLUTE_SLACK = 1e-4
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
# The half-precision backwards that run on this GPU (stage 14's sm_90a code runs on an H100 only).
HALF_BACKWARD = [s for s in flash_stages.stages() if s.backward and
                 any(s.supports(dtype=name) for name in DTYPES) and
                 torch.cuda.is_available() and flash_stages.runs_here(s.number, torch.cuda.current_device())]
NO_HALF_BACKWARD = "no stage has a half-precision backward (stage 11 adds it)"

SHAPES = [  # (batch, heads_q, heads_kv, seq_q, seq_kv, head_dim)
    (1, 1, 1, 1, 1, 64),  # one key: zero dq and dk
    (2, 3, 3, 7, 7, 32),
    (2, 4, 4, 203, 203, 64),
    (1, 8, 2, 1023, 1023, 128),  # GQA: dK, dV sum over each group
    (1, 4, 1, 129, 257, 64),  # MQA, seq_q < seq_kv
    (1, 2, 2, 257, 129, 128),  # seq_q > seq_kv: causal rows that see no key
    (1, 2, 1, 2049, 113, 32),
    (1, 2, 1, 128, 2049, 64),
]


def cases():
    out = []
    for stage in HALF_BACKWARD:
        for name in DTYPES:
            for shape in SHAPES:
                for causal in (False, True):
                    if stage.supports(dtype=name, head_dim=shape[-1], causal=causal):
                        b, hq, hkv, nq, nk, d = shape
                        out.append(pytest.param(stage.number, name, shape, causal,
                                                id=f"stage{stage.number:02d}-{name}-b{b}h{hq}kv{hkv}_q{nq}_k{nk}_d{d}"
                                                   f"{'-causal' if causal else ''}"))
    if not out:
        out.append(pytest.param(None, None, None, None, marks=pytest.mark.skip(reason=NO_HALF_BACKWARD),
                                id="no-half-backward"))
    return out


def grads(q, k, v, do, *, causal, scale):
    """dq, dk, dv by autograd through attention_truth.composite in q's dtype."""
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    o = truth.composite(q, k, v, causal=causal, scale=scale)
    return torch.autograd.grad(o, (q, k, v), do)


@pytest.mark.parametrize("stage, dtype_name, shape, causal", cases())
def test_half_backward_within_twice_pytorch_error(stage, dtype_name, shape, causal):
    dtype = DTYPES[dtype_name]
    b, hq, hkv, nq, nk, d = shape
    q, k, v, do = (t.to(dtype) for t in truth.make_inputs(b, hq, hkv, nq, nk, d, seed=11, device="cuda"))
    scale = d ** -0.5
    true = grads(q.double(), k.double(), v.double(), do.double(), causal=causal, scale=scale)
    theirs = grads(q, k, v, do, causal=causal, scale=scale)
    o, lse = flash_stages.forward(q, k, v, stage=stage, causal=causal)
    for deterministic in (False, True):
        dq, dk, dv = flash_stages.backward(q, k, v, o, lse, do, stage=stage, causal=causal,
                                           deterministic=deterministic)
        torch.cuda.synchronize()
        assert dq.dtype == dtype and dk.shape == k.shape and dv.shape == v.shape
        for name, got, t, p in zip(("dq", "dk", "dv"), (dq, dk, dv), true, theirs):
            assert torch.isfinite(got).all(), f"{name}: non-finite ({'deterministic' if deterministic else 'default'})"
            ours = (got.double() - t).abs().max().item()
            pytorch = (p.double() - t).abs().max().item()
            bound = 2 * pytorch + ABSOLUTE_SLACK
            assert ours <= bound, (f"{name} ({'deterministic' if deterministic else 'default'} mode): max error "
                                   f"{ours:.3e} > {bound:.3e} (PyTorch in {dtype_name}: {pytorch:.3e})")


@pytest.mark.skipif(not HALF_BACKWARD, reason=NO_HALF_BACKWARD)
@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_deterministic_mode_is_bit_for_bit(dtype_name):
    dtype = DTYPES[dtype_name]
    stage = HALF_BACKWARD[-1].number
    q, k, v, do = (t.to(dtype) for t in truth.make_inputs(2, 8, 2, 1000, 1024, 64, seed=15, device="cuda"))
    o, lse = flash_stages.forward(q, k, v, stage=stage, causal=True)
    first = flash_stages.backward(q, k, v, o, lse, do, stage=stage, causal=True, deterministic=True)
    second = flash_stages.backward(q, k, v, o, lse, do, stage=stage, causal=True, deterministic=True)
    for name, a, b in zip(("dq", "dk", "dv"), first, second):
        assert torch.equal(a, b), f"{name} differs between two deterministic runs"
    # The default mode sums dq in another order: the same up to fp32 rounding before the final one.
    default = flash_stages.backward(q, k, v, o, lse, do, stage=stage, causal=True)
    assert torch.equal(default[1], first[1]) and torch.equal(default[2], first[2]), "dk, dv have one writer"
    assert truth.rel_l2(default[0], first[0]) < 1e-3


@pytest.mark.skipif(not HALF_BACKWARD, reason=NO_HALF_BACKWARD)
@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("causal", [False, True])
def test_attention_uses_the_latest_backward_here_and_matches_it(dtype_name, causal):
    dtype = DTYPES[dtype_name]
    q, k, v, do = (t.to(dtype) for t in truth.make_inputs(2, 4, 2, 97, 130, 64, seed=12, device="cuda"))
    stage = flash_stages.default_stage(q.dtype, 64, causal, seq_q=97, device=q.device)
    # Stage 14 (forward: stage 12's) on an H100, stage 11 (forward: stage 10's) elsewhere.
    assert stage.number == HALF_BACKWARD[-1].number and stage.backward
    q_, k_, v_ = (t.clone().requires_grad_(True) for t in (q, k, v))
    o = flash_stages.attention(q_, k_, v_, causal=causal, deterministic=True)
    o.backward(do)
    o_ref, lse = flash_stages.forward(q, k, v, stage=stage.number, causal=causal)
    assert torch.equal(o.detach(), o_ref), f"attention's forward in a half dtype is {stage}'s"
    want = flash_stages.backward(q, k, v, o_ref, lse, do, stage=stage.number, causal=causal, deterministic=True)
    for got, w in zip((q_.grad, k_.grad, v_.grad), want):
        assert torch.equal(got, w)


@pytest.mark.skipif(not HALF_BACKWARD, reason=NO_HALF_BACKWARD)
def test_backward_deterministic_must_be_a_bool():
    q, k, v, do = (t.bfloat16() for t in truth.make_inputs(1, 2, 2, 16, 16, 64, seed=1, device="cuda"))
    o, lse = flash_stages.forward(q, k, v, stage=HALF_BACKWARD[-1].number)
    with pytest.raises(TypeError, match="deterministic must be a bool"):
        flash_stages.backward(q, k, v, o, lse, do, stage=HALF_BACKWARD[-1].number, deterministic="yes")
    with pytest.raises(TypeError, match="dtype"):  # fp32 tensors into the half stage
        flash_stages.backward(q.float(), k.float(), v.float(), o.float(), lse, do.float(),
                              stage=HALF_BACKWARD[-1].number)
