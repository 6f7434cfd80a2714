"""Every stage's forward against torch.nn.functional.scaled_dot_product_attention.

Truth is SDPA in float64 on the same (fp32-rounded) inputs, with the course's conventions
(attention_truth.py: bottom-right causal mask, zero rows for queries that see no key).

Tolerance, per case: the stage's relative L2 error in O may be at most
    max(2 * PyTorch's own error, 1e-5)
where PyTorch's own error is that of its fp32 SDPA (default backend, TF32 off) against the same
float64 truth, and 1e-5 is the fp32 bound the course's C++ tests state for every stage
(kFp32Tolerance in tests/test_stages_gpu.cpp). lse is held to 1e-5 relative L2 over the rows that
see a key, and must be -inf exactly on the rows that see none.

The sweep is a sample, not the full product: each listed shape runs on every stage that supports
it, once without and once with causal (causal only on the stages that have it).
"""

import math

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: the GPU tests need it")

import flash_stages  # noqa: E402
import attention_truth as truth  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (torch.cuda.is_available() is False)"),
]

FP32_BOUND = 1e-5

# (batch, heads_q, heads_kv, seq_q, seq_kv, head_dim): odd lengths, seq_q != seq_kv both ways,
# MHA, GQA and MQA, every head_dim.
SHAPES = [
    (1, 1, 1, 1, 1, 64),
    (2, 3, 3, 7, 7, 32),
    (1, 4, 4, 113, 113, 128),
    (2, 2, 2, 128, 128, 64),
    (1, 8, 2, 203, 203, 64),  # GQA
    (1, 4, 1, 256, 256, 128),  # MQA
    (1, 2, 2, 1023, 1023, 32),
    (1, 2, 1, 2049, 2049, 64),  # MQA, longest
    (2, 4, 2, 7, 203, 128),  # seq_q < seq_kv, GQA
    (1, 2, 2, 203, 7, 64),  # seq_q > seq_kv: causal rows that see no key
    (1, 3, 3, 1, 2049, 32),  # one query, many keys
    (1, 4, 4, 2049, 113, 64),  # seq_q > seq_kv
    (1, 2, 2, 113, 1023, 128),
    (2, 8, 1, 128, 256, 32),  # MQA, seq_q < seq_kv
    (1, 6, 3, 256, 1, 64),  # one key
]


def latest_fp32_stage():
    return [s for s in flash_stages.stages() if s.supports(dtype="float32")][-1].number


def shape_id(shape):
    b, hq, hkv, nq, nk, d = shape
    return f"b{b}h{hq}kv{hkv}_q{nq}_k{nk}_d{d}"


def cases():
    out = []
    for stage in flash_stages.stages():
        for shape in SHAPES:
            for causal in (False, True):
                if stage.supports(dtype="float32", head_dim=shape[-1], causal=causal):
                    out.append(pytest.param(stage.number, shape, causal,
                                            id=f"stage{stage.number:02d}-{shape_id(shape)}{'-causal' if causal else ''}"))
    return out


@pytest.fixture(scope="module", autouse=True)
def precise_fp32():
    truth.setup_precise_fp32()


def check_forward(stage, shape, causal, scale=None, seed=0):
    b, hq, hkv, nq, nk, d = shape
    q, k, v, _ = truth.make_inputs(b, hq, hkv, nq, nk, d, seed=seed, device="cuda")
    s = scale if scale is not None else 1.0 / math.sqrt(d)

    o, lse = flash_stages.forward(q, k, v, stage=stage, causal=causal, scale=scale)
    torch.cuda.synchronize()
    assert o.shape == q.shape and o.dtype == q.dtype and o.device == q.device
    assert lse.shape == (b, hq, nq) and lse.dtype == torch.float32

    o_true = truth.sdpa(q.double(), k.double(), v.double(), causal=causal, scale=s)
    o_torch = truth.sdpa(q, k, v, causal=causal, scale=s)
    torch_err = truth.rel_l2(o_torch, o_true)
    tol = max(2 * torch_err, FP32_BOUND)
    assert torch.isfinite(o).all(), "non-finite output"
    err = truth.rel_l2(o, o_true)
    assert err <= tol, f"O rel L2 {err:.3e} > {tol:.3e} (PyTorch fp32: {torch_err:.3e})"

    lse_true = truth.lse(q, k, causal=causal, scale=s)
    seen = torch.isfinite(lse_true)
    assert torch.equal(torch.isneginf(lse), ~seen), "lse must be -inf exactly on the rows that see no key"
    if seen.any():
        lse_err = truth.rel_l2(lse[seen], lse_true[seen])
        assert lse_err <= FP32_BOUND, f"lse rel L2 {lse_err:.3e}"
    if causal and nq > nk:
        empty = ~seen[0, 0]
        assert empty.any() and (o[:, :, empty] == 0).all(), "rows that see no key must be zeros"
    return o, lse


@pytest.mark.parametrize("stage, shape, causal", cases())
def test_forward_matches_sdpa(stage, shape, causal):
    check_forward(stage, shape, causal)


@pytest.mark.parametrize("scale", [0.05, 0.5])
def test_explicit_scale(scale):
    latest = [s for s in flash_stages.stages() if s.causal and s.supports(dtype="float32")][-1]
    check_forward(latest.number, (1, 4, 2, 129, 257, 64), True, scale=scale, seed=3)
    check_forward(latest.number, (1, 4, 2, 129, 257, 64), False, scale=scale, seed=3)


def test_runs_on_the_current_stream():
    # The inputs are written on a side stream after a ~10 ms sleep; a forward that is not ordered
    # on that stream (the legacy default stream, say) would read them before they are written.
    stage = latest_fp32_stage()
    q_src, k, v, _ = truth.make_inputs(1, 4, 4, 256, 256, 64, seed=5, device="cuda")
    expected, _ = flash_stages.forward(q_src, k, v, stage=stage)
    q = torch.zeros_like(q_src)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(20_000_000)
        q.copy_(q_src)
        o, _ = flash_stages.forward(q, k, v, stage=stage)
    torch.cuda.synchronize()
    assert torch.equal(o, expected)


def test_inputs_that_require_grad_are_fine():
    q, k, v, _ = truth.make_inputs(1, 2, 2, 33, 33, 32, seed=1, device="cuda")
    q.requires_grad_(True)
    o, lse = flash_stages.forward(q, k, v, stage=latest_fp32_stage())
    assert not o.requires_grad and not lse.requires_grad
    torch.cuda.synchronize()


def test_attention_forward_matches_forward():
    q, k, v, _ = truth.make_inputs(2, 4, 2, 100, 130, 64, seed=2, device="cuda")
    for causal in (False, True):
        stage = flash_stages.default_stage(q.dtype, 64, causal)
        o_ref, _ = flash_stages.forward(q, k, v, stage=stage.number, causal=causal)
        with torch.no_grad():
            o = flash_stages.attention(q, k, v, causal=causal)
        assert torch.equal(o, o_ref)
        # An explicit stage is honoured, with or without a backward.
        o3 = flash_stages.attention(q, k, v, stage=3)
        o3_ref, _ = flash_stages.forward(q, k, v, stage=3)
        assert torch.equal(o3, o3_ref)
