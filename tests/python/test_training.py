"""Training with flash_stages.attention: a small two-layer causal transformer trains 50 steps with it
and, from the same initial weights on the same batches, with PyTorch's SDPA.

Tolerance: at every step the two losses agree to 1e-3 relative. Both runs are fp32 with TF32 off;
they differ only by the attention's rounding (about 1e-7 relative per call for the stages, 1e-6 for
SDPA), which Adam's 50 updates amplify to well under that. The model must also learn (the last
loss under 80% of the first), so that agreement is not that of two models standing still.
"""

import copy
import math

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
