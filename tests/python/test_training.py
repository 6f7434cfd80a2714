"""Training with flash_stages.attention: a small two-layer causal transformer trains with it and, from
the same initial weights on the same batches, with PyTorch's SDPA.

fp32 (stage 07), 50 steps. Tolerance: at every step the two losses agree to 1e-3 relative. Both runs
are fp32 with TF32 off; they differ only by the attention's rounding (about 1e-7 relative per call for
the stages, 1e-6 for SDPA), which Adam's 50 updates amplify to well under that. The model must also
learn (the last loss under 80% of the first), so that agreement is not that of two models standing
still.

bf16 (on an H100 stage 14's backward and stage 12's forward, elsewhere stage 11's and stage 10's: the
stages attention picks on the GPU), 200 steps under torch.autocast: the weights stay
fp32, the matmuls and the attention run in bf16. Here two correct attentions do not give the same
losses step for step: each rounds to bf16 (2^-9 relative) in its own places, and 200 Adam updates
carry those differences into different (equally good) trajectories. So the tolerance is measured in
the same run, not assumed: SDPA's flash backend is the reference, SDPA's math backend (the same
model, the same batches, another bf16 implementation of the same attention) gives the spread that
rounding alone causes, and flash_stages must stay within 3 times that spread of the reference, with
a floor of 2% relative. Losses are compared as means over windows of 20 steps, which keeps the
comparison about the curves, not the noise of single batches. Both runs must learn: the last window
under half the first.
"""

import copy
import json
import math
import os

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: the GPU tests need it")

import flash_stages  # noqa: E402
import attention_truth as truth  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (torch.cuda.is_available() is False)"),
]

nn = torch.nn
F = torch.nn.functional

VOCAB = 32
SEQ = 64
BATCH = 16
D_MODEL = 128
HEADS = 2  # head_dim 64
LAYERS = 2
STEPS = 50
LOSS_RTOL = 1e-3


class Block(nn.Module):
    def __init__(self, attend):
        super().__init__()
        self.attend = attend
        self.ln1 = nn.LayerNorm(D_MODEL)
        self.qkv = nn.Linear(D_MODEL, 3 * D_MODEL)
        self.proj = nn.Linear(D_MODEL, D_MODEL)
        self.ln2 = nn.LayerNorm(D_MODEL)
        self.mlp = nn.Sequential(nn.Linear(D_MODEL, 4 * D_MODEL), nn.GELU(), nn.Linear(4 * D_MODEL, D_MODEL))

    def forward(self, x):
        b, n, c = x.shape
        qkv = self.qkv(self.ln1(x)).view(b, n, 3, HEADS, c // HEADS).permute(2, 0, 3, 1, 4)
        q, k, v = (t.contiguous() for t in qkv)  # [B, H, N, d] each
        o = self.attend(q, k, v)
        x = x + self.proj(o.transpose(1, 2).reshape(b, n, c))
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    def __init__(self, attend):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, D_MODEL)
        self.pos = nn.Embedding(SEQ, D_MODEL)
        self.blocks = nn.ModuleList(Block(attend) for _ in range(LAYERS))
        self.ln = nn.LayerNorm(D_MODEL)
        self.head = nn.Linear(D_MODEL, VOCAB)

    def forward(self, tokens):
        x = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def batches(device):
    """Seeded sequences that can be learned: each continues with its own stride mod VOCAB."""
    g = torch.Generator(device="cpu").manual_seed(1234)
    out = []
    for _ in range(STEPS):
        start = torch.randint(0, VOCAB, (BATCH, 1), generator=g)
        stride = torch.randint(1, 5, (BATCH, 1), generator=g)
        seq = (start + stride * torch.arange(SEQ + 1)) % VOCAB
        out.append(seq.to(device))
    return out


def train(model, data):
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for seq in data:
        logits = model(seq[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), seq[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def flash_attend(q, k, v):
    return flash_stages.attention(q, k, v, causal=True)


def sdpa_attend(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)  # seq_q == seq_kv: alignment agrees


def test_two_layer_causal_transformer_trains_like_sdpa():
    stage = flash_stages.default_stage(torch.float32, D_MODEL // HEADS, True)
    if not stage.backward:
        pytest.skip(f"no stage has a causal backward for head_dim {D_MODEL // HEADS} yet")
    truth.setup_precise_fp32()
    torch.manual_seed(0)
    flash_model = TinyLM(flash_attend).cuda()
    sdpa_model = copy.deepcopy(flash_model)
    for block in sdpa_model.blocks:
        block.attend = sdpa_attend
    data = batches("cuda")

    flash_losses = train(flash_model, data)
    sdpa_losses = train(sdpa_model, data)

    assert all(math.isfinite(x) for x in flash_losses), flash_losses
    worst = max(abs(a - b) / abs(b) for a, b in zip(flash_losses, sdpa_losses))
    print(f"\n{stage}: loss {flash_losses[0]:.4f} -> {flash_losses[-1]:.4f} (SDPA {sdpa_losses[0]:.4f} -> "
          f"{sdpa_losses[-1]:.4f}); largest relative difference over {STEPS} steps: {worst:.2e}")
    assert flash_losses[-1] < 0.8 * flash_losses[0], f"did not learn: {flash_losses}"
    assert worst <= LOSS_RTOL, (f"loss curves differ by {worst:.2e} relative (> {LOSS_RTOL}):\n"
                                f"flash_stages {flash_losses}\nsdpa         {sdpa_losses}")


# ---------------------------------------------------------------------------------------------
# bf16, 200 steps
# ---------------------------------------------------------------------------------------------

BF16_STEPS = 200
BF16_WINDOW = 20
BF16_SPREAD_FACTOR = 3.0
BF16_FLOOR = 0.02


def train_bf16(model, data):
    """Adam on fp32 weights, forward and backward under bf16 autocast; the loss of every step."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = []
    for seq in data:
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            logits = model(seq[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), seq[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def windows(losses):
    return [sum(losses[i:i + BF16_WINDOW]) / BF16_WINDOW for i in range(0, len(losses), BF16_WINDOW)]


def worst_relative(a, b):
    return max(abs(x - y) / abs(y) for x, y in zip(windows(a), windows(b)))


def sdpa_backend_attend(backend):
    from torch.nn.attention import sdpa_kernel

    def attend(q, k, v):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return attend


def bf16_batches(device):
    """BF16_STEPS batches of the same learnable sequences as batches()."""
    g = torch.Generator(device="cpu").manual_seed(4321)
    out = []
    for _ in range(BF16_STEPS):
        start = torch.randint(0, VOCAB, (BATCH, 1), generator=g)
        stride = torch.randint(1, 5, (BATCH, 1), generator=g)
        out.append(((start + stride * torch.arange(SEQ + 1)) % VOCAB).to(device))
    return out


def test_two_layer_causal_transformer_trains_in_bf16_like_sdpa():
    from torch.nn.attention import SDPBackend

    stage = flash_stages.default_stage(torch.bfloat16, D_MODEL // HEADS, True, device=torch.cuda.current_device())
    if not stage.backward:
        pytest.skip(f"no stage has a bf16 causal backward for head_dim {D_MODEL // HEADS} yet")
    torch.manual_seed(0)
    flash_model = TinyLM(flash_attend).cuda()
    reference = copy.deepcopy(flash_model)
    spread = copy.deepcopy(flash_model)
    for model, backend in ((reference, SDPBackend.FLASH_ATTENTION), (spread, SDPBackend.MATH)):
        for block in model.blocks:
            block.attend = sdpa_backend_attend(backend)
    data = bf16_batches("cuda")

    curves = {"flash_stages": train_bf16(flash_model, data), "sdpa_flash": train_bf16(reference, data),
              "sdpa_math": train_bf16(spread, data)}
    out_dir = os.environ.get("FLASH_TRAINING_OUT")
    if out_dir:  # the curves for the lesson's plot (scripts/device/gpu_check.sh sets it)
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "training_bf16.json"), "w") as f:
            json.dump(dict(stage=stage.number, steps=BF16_STEPS, window=BF16_WINDOW, losses=curves), f, indent=1)

    ours, ref, other = curves["flash_stages"], curves["sdpa_flash"], curves["sdpa_math"]
    assert all(math.isfinite(x) for x in ours), ours
    rounding_spread = worst_relative(other, ref)
    tolerance = max(BF16_SPREAD_FACTOR * rounding_spread, BF16_FLOOR)
    worst = worst_relative(ours, ref)
    print(f"\n{stage} in bf16: loss {ours[0]:.4f} -> {ours[-1]:.4f} (SDPA flash {ref[0]:.4f} -> {ref[-1]:.4f}); "
          f"largest difference of {BF16_WINDOW}-step means: {worst:.2e} relative, SDPA math vs flash "
          f"{rounding_spread:.2e}, allowed {tolerance:.2e}")
    for name, curve in curves.items():
        w = windows(curve)
        assert w[-1] < 0.5 * w[0], f"{name} did not learn: {w}"
    assert worst <= tolerance, (f"loss curves differ by {worst:.2e} relative (> {tolerance:.2e}):\n"
                                f"flash_stages {windows(ours)}\nsdpa flash   {windows(ref)}\n"
                                f"sdpa math    {windows(other)}")
