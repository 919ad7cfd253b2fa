"""The fp32 reference agrees with torch SDPA's math on CPU, including the cases where conventions differ."""
from __future__ import annotations

import dataclasses
import math

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from autotune.measure.reference import reference_attention  # noqa: E402


def rand(*shape, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


def sdpa(q, k, v, causal, scale=None):
    group = q.shape[1] // k.shape[1]
    kwargs = {"enable_gqa": True} if group > 1 else {}
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, **kwargs)


def lse64(q, k, causal, scale=None):
    """logsumexp of the scores in float64, written independently of the reference (loops over heads)."""
    group = q.shape[1] // k.shape[1]
    scale = scale if scale is not None else 1 / math.sqrt(q.shape[-1])
    out = torch.empty(q.shape[:3], dtype=torch.float64)
    for h in range(q.shape[1]):
        s = q[:, h].double() @ k[:, h // group].double().transpose(-1, -2) * scale
        if causal:
            i = torch.arange(q.shape[2])[:, None]
            j = torch.arange(k.shape[2])[None, :]
            s = s.masked_fill(j > i, -math.inf)
        out[:, h] = torch.logsumexp(s, -1)
    return out


CASES = [
    # (batch, heads, kv_heads, seqlen_q, seqlen_k, head_dim, causal)
    (2, 4, 4, 17, 17, 64, False),
    (2, 4, 4, 17, 17, 64, True),
    (1, 3, 3, 5, 12, 32, True),    # seqlen_q < seqlen_k: top-left, so the last keys are never seen by early rows
    (1, 3, 3, 12, 5, 32, True),    # seqlen_q > seqlen_k: rows >= 5 see every key
    (2, 8, 2, 9, 20, 16, False),   # GQA 4:1
    (2, 8, 2, 20, 9, 16, True),    # GQA and causal, non-square
    (1, 2, 1, 1, 1, 8, True),      # seqlen 1
]


@pytest.mark.parametrize("b,h,hk,nq,nk,d,causal", CASES)
def test_matches_sdpa_math_and_float64_lse(b, h, hk, nq, nk, d, causal):
    q, k, v = rand(b, h, nq, d, seed=1), rand(b, hk, nk, d, seed=2), rand(b, hk, nk, d, seed=3)
    out, lse = reference_attention(q, k, v, causal=causal)
    assert out.dtype == torch.float32 and lse.dtype == torch.float32
    assert out.shape == (b, h, nq, d) and lse.shape == (b, h, nq)
    torch.testing.assert_close(out, sdpa(q, k, v, causal), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse.double(), lse64(q, k, causal), rtol=1e-5, atol=1e-5)


def test_causal_is_top_left_aligned():
    q, k, v = rand(1, 1, 3, 8, seed=4), rand(1, 1, 5, 8, seed=5), rand(1, 1, 5, 8, seed=6)
    out, _ = reference_attention(q, k, v, causal=True)
    torch.testing.assert_close(out[0, 0, 0], v[0, 0, 0])  # query 0 sees key 0 only
    w = torch.softmax(q[0, 0, 2] @ k[0, 0, :3].T / math.sqrt(8), -1)
    torch.testing.assert_close(out[0, 0, 2], w @ v[0, 0, :3])  # query 2 sees keys 0..2, not 3..4


def test_strided_inputs_custom_scale_and_low_precision():
    # (B, N, H, D) storage seen through a transpose, fp16 values: the reference upcasts exactly
    qs, ks, vs = (rand(2, 11, 4, 16, seed=s, dtype=torch.float16) for s in (7, 8, 9))
    q, k, v = (t.transpose(1, 2) for t in (qs, ks, vs))
    out, lse = reference_attention(q, k, v, causal=True, scale=0.3)
    expect, expect_lse = reference_attention(q.float().contiguous(), k.float().contiguous(), v.float().contiguous(),
                                             causal=True, scale=0.3)
    assert torch.equal(out, expect) and torch.equal(lse, expect_lse)
    torch.testing.assert_close(out, sdpa(q.float(), k.float(), v.float(), True, scale=0.3), rtol=1e-5, atol=1e-5)


def test_chunking_does_not_change_the_result():
    q, k, v = rand(3, 4, 10, 8, seed=10), rand(3, 2, 14, 8, seed=11), rand(3, 2, 14, 8, seed=12)
    whole = reference_attention(q, k, v, causal=True)
    one_pair_at_a_time = reference_attention(q, k, v, causal=True, chunk_bytes=1)
    for a, b in zip(whole, one_pair_at_a_time):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_rejects_kv_heads_that_do_not_divide_heads():
    with pytest.raises(ValueError, match="kv_heads 3 must divide heads 4"):
        reference_attention(rand(1, 4, 2, 8), rand(1, 3, 2, 8), rand(1, 3, 2, 8))


def test_sdpa_peers_get_the_shapes_own_mask():
    # What the search times SDPA with (baselines, FlashAttention-4's reference) must be the function the kernel
    # is checked against: a lower-right shape's mask is torch's CausalBias, on CPU through SDPA's math path.
    import space
    from autotune.measure.check import make_inputs, sdpa_mask_kwargs
    from autotune.measure.evaluate import BackendUnavailable, sdpa_baseline

    shape = space.Shape(batch=1, heads=2, seqlen_q=5, seqlen_k=37, head_dim=64, dtype="fp16", causal=True,
                        causal_align="lower_right")
    q, k, v = (t.float() for t in make_inputs(shape, "bhnd", seed=3, device="cpu"))
    want, _ = reference_attention(q, k, v, causal=True, causal_align="lower_right")
    got = torch.nn.functional.scaled_dot_product_attention(q, k, v, **sdpa_mask_kwargs(shape))
    assert (got - want).abs().max() < 1e-4
    upper = dataclasses.replace(shape, causal_align="upper_left")
    assert sdpa_mask_kwargs(upper) == {"is_causal": True}
    with pytest.raises(BackendUnavailable, match="CausalBias"):  # before any tensor: no GPU needed
        sdpa_baseline(shape, "cudnn")


def test_a_chunk_holds_its_scores_and_its_kv_copies_within_the_budget():
    """reference_attention's chunks bound the fp32 K/V it gathers, not only the scores: a decode shape (one query
    row against a long cache) once gathered 64 GiB in one chunk and crashed every trial of its campaign shape."""
    from autotune.measure.reference import DEFAULT_CHUNK_BYTES, pairs_per_chunk

    for nq, nk, d in ((1, 65536, 128), (1, 131072, 256), (4096, 4096, 128), (1, 1, 64), (577, 577, 64)):
        n = pairs_per_chunk(nq, nk, d, DEFAULT_CHUNK_BYTES)
        per_pair = 4 * nq * nk + 8 * nk * d
        assert n >= 1 and (n == 1 or n * per_pair <= DEFAULT_CHUNK_BYTES), (nq, nk, d, n)
    # B32 H64 Nk65536 d128, the shape that crashed: a chunk took 2048 pairs (a 64 GiB fp32 copy of K), now 7 (0.5 GB)
    assert pairs_per_chunk(1, 65536, 128, DEFAULT_CHUNK_BYTES) == 7
