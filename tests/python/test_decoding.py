"""Stage 13 (decoding) from PyTorch: flash_stages.forward(stage=13) with 1 to 16 query rows against
SDPA, by FlashAttention's half-precision rule (the largest error against float64 attention at most twice
PyTorch's own in the same dtype, plus 1e-5); and flash_stages.decode_paged against the contiguous path
and the same truth, over a batch of sequences of different lengths in shuffled pages whose unowned
slots hold NaN."""

import math

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: the GPU tests need it")

import flash_stages  # noqa: E402
import attention_truth as truth  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (torch.cuda.is_available() is False)"),
]

STAGE = 13
ABSOLUTE_SLACK = 1e-5  # the rule's "+ 1e-5"
LSE_BOUND = 1e-4       # relative L2 of lse over the rows that see a key (fp32 sums, ex2.approx)
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}

# (batch, heads_q, heads_kv, seq_q, seq_kv, head_dim)
SHAPES = [
    (1, 32, 8, 1, 4097, 128),   # one new token, GQA 4 (the decode shape, shorter)
    (2, 8, 8, 16, 255, 64),     # 16 new tokens, MHA
    (3, 16, 1, 5, 1000, 128),   # MQA, odd query rows
    (1, 4, 2, 7, 7, 64),        # the cache is the new tokens
    (2, 8, 2, 16, 3, 64),       # seq_q > seq_kv: causal rows that see no key
    (1, 2, 2, 1, 1, 128),       # one key
]


def shape_id(shape):
    b, hq, hkv, nq, nk, d = shape
    return f"b{b}h{hq}kv{hkv}_q{nq}_k{nk}_d{d}"


def check_against_truth(o, lse, q, k, v, causal, scale):
    """o and lse against float64 SDPA by the half-precision rule; returns (ours, PyTorch's) max error."""
    exact = truth.sdpa(q.double(), k.double(), v.double(), causal=causal, scale=scale)
    pytorch = truth.sdpa(q, k, v, causal=causal, scale=scale)
    assert torch.isfinite(o).all(), "non-finite output"
    ours = (o.double() - exact).abs().max().item()
    theirs = (pytorch.double() - exact).abs().max().item()
    assert ours <= 2 * theirs + ABSOLUTE_SLACK, f"max error {ours:.3e}, PyTorch's {theirs:.3e}"
    lse_true = truth.lse(q, k, causal=causal, scale=scale)
    seen = torch.isfinite(lse_true)
    assert torch.equal(torch.isneginf(lse), ~seen), "lse must be -inf exactly on the rows that see no key"
    if seen.any():
        err = truth.rel_l2(lse[seen], lse_true[seen])
        assert err <= LSE_BOUND, f"lse rel L2 {err:.3e}"
    return ours, theirs


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_forward_matches_sdpa(shape, dtype_name, causal):
    b, hq, hkv, nq, nk, d = shape
    q, k, v, _ = truth.make_inputs(b, hq, hkv, nq, nk, d, seed=13, device="cuda", dtype=DTYPES[dtype_name])
    o, lse = flash_stages.forward(q, k, v, stage=STAGE, causal=causal)
    torch.cuda.synchronize()
    assert o.shape == q.shape and o.dtype == q.dtype and lse.shape == (b, hq, nq) and lse.dtype == torch.float32
    check_against_truth(o, lse, q, k, v, causal, d ** -0.5)


def test_every_seq_q_up_to_16():
    for nq in range(1, 17):
        q, k, v, _ = truth.make_inputs(1, 8, 2, nq, 300, 64, seed=nq, device="cuda", dtype=torch.bfloat16)
        o, lse = flash_stages.forward(q, k, v, stage=STAGE, causal=True)
        check_against_truth(o, lse, q, k, v, True, 64 ** -0.5)


def test_more_than_16_query_rows_is_refused_by_name():
    q, k, v, _ = truth.make_inputs(1, 2, 2, 17, 64, 64, seed=0, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"seq_q = 17 \(q.shape\[2\]\) is more than stage 13"):
        flash_stages.forward(q, k, v, stage=STAGE)
    # attention() leaves the decoding stage out where it cannot run the problem.
    with torch.no_grad():
        o = flash_stages.attention(q, k, v)
    assert o.shape == q.shape


# ------------------------------------------------------------------------------------------------
# The paged cache
# ------------------------------------------------------------------------------------------------

LENGTHS = [1, 7, 300, 0, 4097, 2]  # 0: a sequence with no key; 2 < seq_q: causal rows that see none


def build_pages(ks, vs, lengths, page_size, generator):
    """k_pages, v_pages [P, page_size, Hkv, d], page_table [B, max_pages] and cache_lens [B] from each
    sequence's contiguous k, v [1, Hkv, N, d]: pages in a shuffled order, every slot no sequence owns NaN,
    every table entry past a sequence's pages -1 (never read)."""
    heads_kv, d = ks[0].shape[1], ks[0].shape[3]
    pages_of = [math.ceil(n / page_size) for n in lengths]
    max_pages = max(pages_of) + 1
    num_pages = sum(pages_of) + 3
    order = torch.randperm(num_pages, generator=generator).tolist()
    k_pages = torch.full((num_pages, page_size, heads_kv, d), math.nan, dtype=ks[0].dtype, device="cuda")
    v_pages = torch.full_like(k_pages, math.nan)
    table = torch.full((len(lengths), max_pages), -1, dtype=torch.int32)
    used = 0
    for b, (k, v, n) in enumerate(zip(ks, vs, lengths)):
        for p in range(pages_of[b]):
            page = order[used]
            used += 1
            table[b, p] = page
            first, last = p * page_size, min(n, (p + 1) * page_size)
            k_pages[page, :last - first] = k[0, :, first:last].transpose(0, 1)
            v_pages[page, :last - first] = v[0, :, first:last].transpose(0, 1)
    return k_pages, v_pages, table.cuda(), torch.tensor(lengths, dtype=torch.int32, device="cuda")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("page_size", [16, 64, 256])
@pytest.mark.parametrize("heads", [(8, 2, 128), (8, 1, 64)], ids=["gqa4_d128", "mqa_d64"])
def test_decode_paged_matches_contiguous_and_sdpa(heads, page_size, dtype_name, causal):
    hq, hkv, d = heads
    nq = 3
    dtype = DTYPES[dtype_name]
    g = torch.Generator().manual_seed(page_size)
    qs, ks, vs = [], [], []
    for b, n in enumerate(LENGTHS):
        q, k, v, _ = truth.make_inputs(1, hq, hkv, nq, max(n, 1), d, seed=100 + b, device="cuda", dtype=dtype)
        qs.append(q)
        ks.append(k)
        vs.append(v)
    k_pages, v_pages, table, lens = build_pages(ks, vs, LENGTHS, page_size, g)
    q_all = torch.cat(qs).contiguous()
    o, lse = flash_stages.decode_paged(q_all, k_pages, v_pages, table, lens, causal=causal)
    torch.cuda.synchronize()
    assert o.shape == q_all.shape and lse.shape == (len(LENGTHS), hq, nq)
    for b, n in enumerate(LENGTHS):
        if n == 0:
            assert (o[b] == 0).all() and torch.isneginf(lse[b]).all(), "a sequence with no key: zeros and -inf"
            continue
        o_ref, lse_ref = flash_stages.forward(qs[b], ks[b], vs[b], stage=STAGE, causal=causal)
        # Splits planned for the cache's capacity, not this length: another summation order.
        tolerance = 1e-2 if dtype == torch.bfloat16 else 2e-3
        assert truth.rel_l2(o[b:b + 1], o_ref) <= tolerance, f"sequence {b} (length {n}): paged vs contiguous"
        check_against_truth(o[b:b + 1], lse[b:b + 1], qs[b], ks[b], vs[b], causal, d ** -0.5)


def test_decode_paged_refuses_bad_inputs_by_name():
    q, k, v, _ = truth.make_inputs(2, 4, 2, 1, 64, 128, seed=0, device="cuda", dtype=torch.bfloat16)
    k_pages, v_pages, table, lens = build_pages([k[:1], k[1:]], [v[:1], v[1:]], [64, 30], 16,
                                                torch.Generator().manual_seed(0))
    with pytest.raises(TypeError, match="page_table must be torch.int32"):
        flash_stages.decode_paged(q, k_pages, v_pages, table.long(), lens)
    with pytest.raises(TypeError, match="v_pages has dtype torch.float16"):
        flash_stages.decode_paged(q, k_pages, v_pages.half(), table, lens)
    with pytest.raises(ValueError, match=r"page_size = 24 \(k_pages.shape\[1\]\) must be a power of two"):
        flash_stages.decode_paged(q, k_pages[:, :12].repeat(1, 2, 1, 1).contiguous(),
                                  v_pages[:, :12].repeat(1, 2, 1, 1).contiguous(), table, lens)
    with pytest.raises(ValueError, match="cache_lens .* must have q's batch 2 rows"):
        flash_stages.decode_paged(q, k_pages, v_pages, table, lens[:1].contiguous())
    with pytest.raises(ValueError, match="has no paged entry point"):
        flash_stages.decode_paged(q, k_pages, v_pages, table, lens, stage=10)
    q17 = torch.zeros(2, 4, 17, 128, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="seq_q = 17"):
        flash_stages.decode_paged(q17, k_pages, v_pages, table, lens)
    # A good call still works afterwards.
    o, _ = flash_stages.decode_paged(q, k_pages, v_pages, table, lens)
    torch.cuda.synchronize()
    assert torch.isfinite(o).all()
