"""The half-precision stages against PyTorch by FlashAttention's own test rule: in the same dtype,
a stage's largest error against float64 attention may be at most twice PyTorch's largest error
(SDPA in that dtype) plus 1e-5, over odd lengths, GQA/MQA and the bottom-right causal mask."""

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import flash_stages  # noqa: E402

import attention_truth as truth  # noqa: E402

ABSOLUTE_SLACK = 1e-5  # the rule's "+ 1e-5"
SHAPES = [  # (batch, heads_q, heads_kv, seq_q, seq_kv, head_dim)
    (2, 4, 4, 203, 203, 64),
    (1, 8, 2, 1023, 1023, 128),  # GQA
    (1, 4, 1, 129, 257, 64),  # MQA, seq_q < seq_kv
    (1, 2, 2, 257, 129, 128),  # seq_q > seq_kv: causal rows that see no key
    (1, 3, 3, 1, 2049, 32),  # one query
]
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def cases():
    out = []
    for stage in flash_stages.stages():
        for name in DTYPES:
            for shape in SHAPES:
                for causal in (False, True):
                    if stage.supports(dtype=name, head_dim=shape[-1], causal=causal, seq_q=shape[3]):
                        out.append(pytest.param(stage.number, name, shape, causal,
                                                id=f"stage{stage.number:02d}-{name}-{shape}-{int(causal)}"))
    return out


@pytest.mark.parametrize("stage,dtype_name,shape,causal", cases())
def test_half_stage_within_twice_pytorch_error(stage, dtype_name, shape, causal):
    dtype = DTYPES[dtype_name]
    b, hq, hkv, nq, nk, d = shape
    q, k, v, _ = truth.make_inputs(b, hq, hkv, nq, nk, d, seed=11, device="cuda")
    q, k, v = (t.to(dtype) for t in (q, k, v))  # the rounded inputs are what everyone sees
    scale = d ** -0.5
    exact = truth.sdpa(q.double(), k.double(), v.double(), causal=causal, scale=scale)
    pytorch = truth.sdpa(q, k, v, causal=causal, scale=scale)
    try:
        o, lse = flash_stages.forward(q, k, v, stage=stage, causal=causal)
    except RuntimeError as e:  # stage 12 on a GPU other than Hopper, or a build without its sm_90a code
        if "GPU architecture not supported" in str(e):
            pytest.skip(str(e))
        raise
    assert o.dtype == dtype and lse.dtype == torch.float32
    assert not torch.isnan(o).any()
    ours = (o.double() - exact).abs().max().item()
    theirs = (pytorch.double() - exact).abs().max().item()
    assert ours <= 2 * theirs + ABSOLUTE_SLACK, f"max error {ours:.3e}, PyTorch's {theirs:.3e}"


def test_mixed_dtypes_are_a_type_error():
    q, k, v, _ = truth.make_inputs(1, 2, 2, 16, 16, 64, seed=1, device="cuda")
    half = [s.number for s in flash_stages.stages() if s.supports(dtype="bfloat16")]
    with pytest.raises(TypeError, match="k has dtype"):
        flash_stages.forward(q.bfloat16(), k.half(), v.bfloat16(), stage=half[-1])
    with pytest.raises(TypeError):
        flash_stages.forward(q, k, v, stage=half[-1])  # fp32 into a half stage
