"""The fp32 reference every kernel output is judged against.

Deliberately naive: upcast, explicit scores, masked softmax, P·V. Causal masking is top-left aligned, exactly
like `torch.nn.functional.scaled_dot_product_attention(is_causal=True)`: query i sees keys j <= i (so no row is
ever fully masked, even when seqlen_q > seqlen_k). GQA repeats each kv head for heads/kv_heads consecutive query
heads, like SDPA's `enable_gqa=True` (repeat_interleave). Work is chunked over (batch, head) pairs so that a
4096² problem at batch·heads = 64 needs well under 2 GB at a time.
"""
from __future__ import annotations

import contextlib
import math

DEFAULT_CHUNK_BYTES = 512 << 20  # fp32 scores + K/V copies per chunk; logsumexp briefly holds twice the scores


@contextlib.contextmanager
def _full_fp32_matmul():
    """TF32 would make the reference less precise than the fp16 kernels it judges: force IEEE fp32 matmuls."""
    import torch

    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


def pairs_per_chunk(seqlen_q: int, seqlen_k: int, head_dim: int, chunk_bytes: int) -> int:
    """(batch, head) pairs reference_attention takes at once: their fp32 scores and their fp32 copies of K and V
    together within chunk_bytes (at least one pair). The copies count: a decode shape's scores are tiny, and sizing
    by them alone gathered 64 GiB of K/V for B32 H64 Nk65536 (an out-of-memory crash of every trial of that shape in
    the 2026-12-02 decode campaign)."""
    per_pair = 4 * seqlen_q * seqlen_k + 2 * 4 * seqlen_k * head_dim
    return max(1, chunk_bytes // per_pair)


def reference_attention(q, k, v, causal: bool = False, scale: float | None = None,
                        chunk_bytes: int = DEFAULT_CHUNK_BYTES, causal_align: str = "upper_left"):
    """q (B, H, Nq, D), k/v (B, Hk, Nk, D), any dtype and strides -> (out fp32 (B, H, Nq, D), lse fp32 (B, H, Nq)).

    lse is the natural-log logsumexp of the scaled (and masked) scores of each query row. Causal masks hide key j
    from query i when j > i (causal_align "upper_left") or j > i + Nk - Nq ("lower_right"); a row that sees no key
    gets out = 0 and lse = -inf (the kernels' convention; SDPA returns NaN there).
    """
    import torch

    batch, heads, seqlen_q, head_dim = q.shape
    kv_heads, seqlen_k = k.shape[1], k.shape[2]
    if heads % kv_heads:
        raise ValueError(f"k: kv_heads {kv_heads} must divide heads {heads}")
    group = heads // kv_heads
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim)

    out = torch.empty((batch, heads, seqlen_q, head_dim), dtype=torch.float32, device=q.device)
    lse = torch.empty((batch, heads, seqlen_q), dtype=torch.float32, device=q.device)
    masked = None
    if causal:  # key j is hidden from query i when j > i + offset (0 top-left, Nk - Nq bottom-right)
        if causal_align not in ("upper_left", "lower_right"):
            raise ValueError(f"causal_align: expected 'upper_left' or 'lower_right', got {causal_align!r}")
        offset = seqlen_k - seqlen_q if causal_align == "lower_right" else 0
        masked = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=q.device).triu(1 + offset)

    pairs = batch * heads
    per_chunk = pairs_per_chunk(seqlen_q, seqlen_k, head_dim, chunk_bytes)
    with _full_fp32_matmul(), torch.no_grad():
        for start in range(0, pairs, per_chunk):
            ids = torch.arange(start, min(pairs, start + per_chunk), device=q.device)
            b, h = ids // heads, ids % heads
            qc = q[b, h].float()                 # (n, Nq, D)
            kc = k[b, h // group].float()        # (n, Nk, D)
            vc = v[b, h // group].float()
            scores = torch.matmul(qc, kc.transpose(-1, -2)).mul_(scale)
            if masked is not None:
                scores.masked_fill_(masked, float("-inf"))
            row_lse = torch.logsumexp(scores, dim=-1)              # (n, Nq)
            probs = scores.sub_(row_lse.unsqueeze(-1)).exp_()      # softmax, in place
            if masked is not None:
                probs.nan_to_num_(nan=0.0)  # rows with every key masked: -inf - -inf
            out[b, h] = torch.matmul(probs, vc)
            lse[b, h] = row_lse
            del scores, probs
    return out, lse
