"""Bad input raises ValueError or TypeError naming the argument, before anything is launched, and
never takes the interpreter (or the CUDA context) down: a good call still works afterwards.
(The CPU-tensor case runs without a GPU in test_package.py.)"""

import math

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: the GPU tests need it")

import flash_stages  # noqa: E402
import attention_truth as truth  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (torch.cuda.is_available() is False)"),
]

# The fp32 stages: the cases below build fp32 tensors (a half stage would refuse them by dtype first).
FP32_STAGES = [s for s in flash_stages.stages() if s.supports(dtype="float32")]
LAST = FP32_STAGES[-1].number
CAUSAL_STAGE = [s for s in FP32_STAGES if s.causal][-1].number
BACKWARD_STAGES = [s.number for s in FP32_STAGES if s.backward]  # fp32 tensors below; stage 11: test_backward_half


def qkv(b=1, hq=2, hkv=2, nq=16, nk=16, d=64, dtype=torch.float32):
    q, k, v, _ = truth.make_inputs(b, hq, hkv, nq, nk, d, seed=0, device="cuda", dtype=dtype)
    return q, k, v


def misaligned(t):
    """A contiguous view of t's values that starts 4 bytes past a 16-byte boundary."""
    base = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    view = base[1:].view(t.shape)
    view.copy_(t)
    return view


def strided(t):
    """t's values and shape, not contiguous (the last two dims stored transposed)."""
    out = t.transpose(-1, -2).contiguous().transpose(-1, -2)
    assert out.shape == t.shape and not out.is_contiguous()
    return out


def other(**shape):
    return qkv(**shape)


# (id, change: (q, k, v) -> the arguments to replace, exception, pattern naming the argument).
# Tensors are made inside the test, never at collection (which must work without a GPU).
CASES = [
    ("q-cpu", lambda q, k, v: dict(q=q.cpu()), ValueError, r"q must be a CUDA tensor"),
    ("v-cpu", lambda q, k, v: dict(v=v.cpu()), ValueError, r"v must be a CUDA tensor"),
    ("k-not-tensor", lambda q, k, v: dict(k=k.tolist()), TypeError, r"k must be a torch.Tensor"),
    ("q-fp16", lambda q, k, v: dict(q=q.half(), k=k.half(), v=v.half()), TypeError, r"q has dtype torch.float16"),
    ("q-bf16", lambda q, k, v: dict(q=q.bfloat16(), k=k.bfloat16(), v=v.bfloat16()), TypeError,
     r"q has dtype torch.bfloat16"),
    ("q-fp64", lambda q, k, v: dict(q=q.double(), k=k.double(), v=v.double()), TypeError,
     r"q has dtype torch.float64"),
    ("k-other-dtype", lambda q, k, v: dict(k=k.half()), TypeError, r"k has dtype torch.float16 but q has torch.float32"),
    ("q-3d", lambda q, k, v: dict(q=q[0]), ValueError, r"q must be 4-D"),
    ("v-5d", lambda q, k, v: dict(v=v[None]), ValueError, r"v must be 4-D"),
    ("q-not-contiguous", lambda q, k, v: dict(q=q.transpose(1, 2)), ValueError, r"q must be contiguous"),
    ("k-not-contiguous", lambda q, k, v: dict(k=torch.randn(1, 2, 64, 16, device="cuda").transpose(-1, -2)),
     ValueError, r"k must be contiguous"),
    ("v-not-contiguous", lambda q, k, v: dict(v=torch.randn(1, 2, 32, 64, device="cuda")[:, :, ::2]), ValueError,
     r"v must be contiguous"),
    ("q-misaligned", lambda q, k, v: dict(q=misaligned(q)), ValueError, r"q must start on a 16-byte boundary"),
    ("k-batch", lambda q, k, v: dict(k=torch.cat([k, k]), v=torch.cat([v, v])), ValueError,
     r"k has batch 2 but q has 1"),
    ("k-head_dim", lambda q, k, v: dict(zip("kv", other(d=32)[1:])), ValueError, r"k has head_dim 32 but q has 64"),
    ("v-shape", lambda q, k, v: dict(v=v[:, :, :8].contiguous()), ValueError, r"v must have k's shape"),
    ("head_dim-48", lambda q, k, v: dict(zip("qkv", other(d=48))), ValueError, r"head_dim = 48"),
    ("head_dim-256", lambda q, k, v: dict(zip("qkv", other(d=256))), ValueError, r"head_dim = 256"),
    ("heads-3-2", lambda q, k, v: dict(q=other(hq=3)[0]), ValueError, r"heads_q = 3 .* multiple of heads_kv = 2"),
    ("seq_q-0", lambda q, k, v: dict(q=q[:, :, :0]), ValueError, r"seq_q = 0 must be >= 1"),
    ("seq_kv-0", lambda q, k, v: dict(k=k[:, :, :0], v=v[:, :, :0]), ValueError, r"seq_kv = 0 must be >= 1"),
    ("batch-0", lambda q, k, v: dict(q=q[:0], k=k[:0], v=v[:0]), ValueError, r"batch = 0 must be >= 1"),
    ("scale-nan", lambda q, k, v: dict(scale=math.nan), ValueError, r"scale must be finite"),
    ("scale-inf", lambda q, k, v: dict(scale=math.inf), ValueError, r"scale must be finite"),
    ("scale-str", lambda q, k, v: dict(scale="0.1"), TypeError, r"scale must be a float"),
    ("causal-str", lambda q, k, v: dict(causal="yes"), TypeError, r"causal must be a bool"),
    ("stage-99", lambda q, k, v: dict(stage=99), ValueError, r"stage = 99 is not a stage"),
    ("stage-str", lambda q, k, v: dict(stage="6"), TypeError, r"stage must be an int"),
    ("causal-on-stage-3", lambda q, k, v: dict(stage=3, causal=True), ValueError,
     r"causal=True is not supported by stage 03"),
]
# attention() picks its own stage: the stage cases do not apply, fp16 and bf16 have stages of their
# own (08 on), and a dtype no stage supports is named as such.
ATTENTION_CASES = [c for c in CASES
                   if not c[0].startswith("stage-") and c[0] not in ("causal-on-stage-3", "q-fp16", "q-bf16")]


@pytest.mark.parametrize("change, exc, pattern", [pytest.param(*c[1:], id=c[0]) for c in CASES])
def test_forward_rejects(change, exc, pattern):
    q, k, v = qkv()
    args = dict(q=q, k=k, v=v, stage=CAUSAL_STAGE, causal=False, scale=None)
    args.update(change(q, k, v))
    with pytest.raises(exc, match=pattern):
        flash_stages.forward(args.pop("q"), args.pop("k"), args.pop("v"), **args)


@pytest.mark.parametrize("change, exc, pattern", [pytest.param(*c[1:], id=c[0]) for c in ATTENTION_CASES])
def test_attention_rejects(change, exc, pattern):
    q, k, v = qkv()
    args = dict(q=q, k=k, v=v, causal=False, scale=None)
    args.update(change(q, k, v))
    if pattern.startswith("q has dtype"):
        pattern = r"q has dtype .*no stage supports it"
    with pytest.raises(exc, match=pattern):
        flash_stages.attention(args.pop("q"), args.pop("k"), args.pop("v"), **args)


def test_backward_on_a_stage_without_one():
    q, k, v = qkv()
    o, lse = flash_stages.forward(q, k, v, stage=6)
    with pytest.raises(ValueError, match=r"stage = 6 \(causal\) has no backward"):
        flash_stages.backward(q, k, v, o, lse, o, stage=6)


@pytest.mark.skipif(not BACKWARD_STAGES, reason="no stage has a backward yet (stage 07 adds the first)")
def test_backward_rejects():
    stage = BACKWARD_STAGES[-1]
    q, k, v = qkv()
    o, lse = flash_stages.forward(q, k, v, stage=stage)
    do = torch.randn_like(o)
    good = dict(q=q, k=k, v=v, o=o, lse=lse, do=do)
    bad = [
        (dict(o=strided(o)), ValueError, r"o must be contiguous"),
        (dict(o=o[:, :1].contiguous()), ValueError, r"o must have shape"),
        (dict(do=do.cpu()), ValueError, r"do must be a CUDA tensor"),
        (dict(do=do.half()), TypeError, r"do has dtype torch.float16"),
        (dict(do=do[:, :, :8].contiguous()), ValueError, r"do must have shape"),
        (dict(lse=lse.double()), TypeError, r"lse has dtype torch.float64"),
        (dict(lse=lse[..., None].contiguous()), ValueError, r"lse must have shape"),
        (dict(lse=lse[:, :, :8].contiguous()), ValueError, r"lse must have shape"),
        (dict(lse=[0.0]), TypeError, r"lse must be a torch.Tensor"),
        (dict(q=strided(q)), ValueError, r"q must be contiguous"),
    ]
    for change, exc, pattern in bad:
        args = dict(good, **change)
        with pytest.raises(exc, match=pattern):
            flash_stages.backward(args["q"], args["k"], args["v"], args["o"], args["lse"], args["do"], stage=stage)


def test_good_call_still_works_after_every_error():
    q, k, v = qkv(nq=33, nk=65)
    o, lse = flash_stages.forward(q, k, v, stage=LAST, causal=flash_stages.get_stage(LAST).causal)
    torch.cuda.synchronize()
    assert torch.isfinite(o).all()
    o_true = truth.sdpa(q.double(), k.double(), v.double(), causal=flash_stages.get_stage(LAST).causal,
                        scale=64 ** -0.5)
    assert truth.rel_l2(o, o_true) < 1e-5
