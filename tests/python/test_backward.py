"""Backward of every stage that has one, against torch autograd in float64; and attention() as an
autograd.Function.

Truth: autograd through SDPA in float64 (attention_truth.sdpa) on the same fp32-rounded inputs and
the same dO. Tolerance, per gradient: relative L2 at most
    max(2 * PyTorch's own error, 1e-4)
where PyTorch's own error is that of autograd through its fp32 SDPA (TF32 off) against the same
truth, and 1e-4 is the bound stage 07's lesson states for its gradients (kBackwardTolerance in
tests/test_stages_gpu.cpp: sums of seq_kv or seq_q fp32 products of recomputed probabilities).
"""

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: the GPU tests need it")

import flash_stages  # noqa: E402
import attention_truth as truth  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (torch.cuda.is_available() is False)"),
]

BACKWARD_BOUND = 1e-4

BACKWARD_STAGES = [s for s in flash_stages.stages() if s.backward]
NO_BACKWARD = "no stage has a backward yet (stage 07 adds the first)"

SHAPES = [
    (1, 1, 1, 1, 1, 64),
    (2, 3, 3, 7, 7, 32),
    (1, 4, 4, 113, 113, 128),
    (1, 8, 2, 203, 203, 64),  # GQA: dK, dV sum over each group
    (1, 4, 1, 256, 256, 32),  # MQA
    (1, 2, 1, 1023, 1023, 64),
    (2, 4, 2, 7, 203, 128),  # seq_q < seq_kv
    (1, 2, 2, 203, 7, 64),  # seq_q > seq_kv: causal rows that see no key
    (1, 2, 2, 2049, 113, 32),
    (1, 2, 1, 128, 2049, 64),
]


def cases():
    out = []
    for stage in BACKWARD_STAGES:
        for shape in SHAPES:
            for causal in (False, True):
                if stage.supports(dtype="float32", head_dim=shape[-1], causal=causal):
                    b, hq, hkv, nq, nk, d = shape
                    out.append(pytest.param(stage.number, shape, causal,
                                            id=f"stage{stage.number:02d}-b{b}h{hq}kv{hkv}_q{nq}_k{nk}_d{d}"
                                               f"{'-causal' if causal else ''}"))
    if not out:
        out.append(pytest.param(None, None, None, marks=pytest.mark.skip(reason=NO_BACKWARD), id="no-backward"))
    return out


@pytest.fixture(scope="module", autouse=True)
def precise_fp32():
    truth.setup_precise_fp32()


def autograd_grads(q, k, v, do, *, causal, scale):
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    o = truth.sdpa(q, k, v, causal=causal, scale=scale)
    return torch.autograd.grad(o, (q, k, v), do)


@pytest.mark.parametrize("stage, shape, causal", cases())
def test_backward_matches_autograd(stage, shape, causal):
    b, hq, hkv, nq, nk, d = shape
    q, k, v, do = truth.make_inputs(b, hq, hkv, nq, nk, d, seed=11, device="cuda")
    scale = d ** -0.5
    o, lse = flash_stages.forward(q, k, v, stage=stage, causal=causal)
    dq, dk, dv = flash_stages.backward(q, k, v, o, lse, do, stage=stage, causal=causal)
    torch.cuda.synchronize()
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape

    true = autograd_grads(q.double(), k.double(), v.double(), do.double(), causal=causal, scale=scale)
    theirs = autograd_grads(q, k, v, do, causal=causal, scale=scale)
    for name, got, t, p in zip(("dq", "dk", "dv"), (dq, dk, dv), true, theirs):
        assert torch.isfinite(got).all(), f"{name}: non-finite"
        torch_err = truth.rel_l2(p, t)
        tol = max(2 * torch_err, BACKWARD_BOUND)
        err = truth.rel_l2(got, t)
        assert err <= tol, f"{name} rel L2 {err:.3e} > {tol:.3e} (PyTorch fp32: {torch_err:.3e})"


@pytest.mark.skipif(not BACKWARD_STAGES, reason=NO_BACKWARD)
@pytest.mark.parametrize("causal", [False, True])
def test_attention_autograd_matches_backward(causal):
    q, k, v, do = truth.make_inputs(2, 4, 2, 97, 130, 64, seed=12, device="cuda")
    stage = flash_stages.default_stage(q.dtype, 64, causal)
    if not stage.backward:
        pytest.skip(f"no stage with a backward supports causal={causal}")
    q_, k_, v_ = (t.clone().requires_grad_(True) for t in (q, k, v))
    o = flash_stages.attention(q_, k_, v_, causal=causal)
    o.backward(do)
    o_ref, lse = flash_stages.forward(q, k, v, stage=stage.number, causal=causal)
    grads = flash_stages.backward(q, k, v, o_ref, lse, do, stage=stage.number, causal=causal)
    assert torch.equal(o.detach(), o_ref)
    for got, want in zip((q_.grad, k_.grad, v_.grad), grads):
        assert torch.equal(got, want)


@pytest.mark.skipif(not BACKWARD_STAGES, reason=NO_BACKWARD)
def test_attention_takes_non_contiguous_grad_output():
    q, k, v, _ = truth.make_inputs(1, 2, 2, 64, 64, 32, seed=13, device="cuda")
    q.requires_grad_(True)
    o = flash_stages.attention(q, k, v)
    # The gradient of a transpose-then-sum reaches attention as a non-contiguous tensor.
    g = torch.randn(1, 2, 32, 64, device="cuda", dtype=torch.float32)
    (o.transpose(-1, -2) * g).sum().backward()
    expected = torch.autograd.grad(truth.sdpa(q, k, v, causal=False, scale=32 ** -0.5), q,
                                   g.transpose(-1, -2))[0]
    assert truth.rel_l2(q.grad, expected) < 1e-4


def test_attention_backward_on_a_stage_without_one_raises():
    q, k, v, _ = truth.make_inputs(1, 2, 2, 16, 16, 64, seed=14, device="cuda")
    q.requires_grad_(True)
    o = flash_stages.attention(q, k, v, stage=5)  # the forward works
    with pytest.raises(ValueError, match=r"stage = 5 \(warp shuffle\) has no backward"):
        o.sum().backward()
