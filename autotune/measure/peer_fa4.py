"""FlashAttention-4 as a peer to time beside ours: `flash_attn.cute.flash_attn_func` (CuTe DSL). On Hopper its
forward is the FlashAttention-3 design with one fixed config per head dim, the best kernel a user can install
there, so it is the bar our per-shape search has to clear (docs/benchmarks.md).

Optional (`pip install 'autotune[peers]'`): where it does not import, `unavailable()` says why and callers
report the peer as skipped. It takes (batch, seqlen, heads, head_dim) tensors, so it is timed on that layout,
its own; its first call per shape compiles the kernel (JIT), which the warm-up keeps out of the timing. Its
output is checked against torch's SDPA on the same inputs before it is timed: a peer that computes something
else is no bar.
"""
from __future__ import annotations

from space import Shape

from .check import make_inputs, sdpa_mask_kwargs
from .timing import Timing, bench

# A peer's output vs torch SDPA in the same 16-bit dtype: both round P and O to 16 bits, so they differ by a few
# units of the last place; a wrong kernel (bad mask, stale tile) is off by far more.
PEER_TOLERANCE = 2e-2


class PeerUnavailable(RuntimeError):
    """The peer cannot run this shape here (not installed, or a shape it does not take); the message says why."""


def unavailable() -> str | None:
    """None when flash_attn.cute imports, else why not (with the install hint)."""
    try:
        import flash_attn.cute  # noqa: F401
    except Exception as e:  # ImportError, or a broken install raising anything at import time
        return f"flash_attn.cute does not import ({type(e).__name__}: {e}); pip install 'autotune[peers]'"
    return None


def fa4_timing(shape: Shape, warmup_ms: float = 25, rep_ms: float = 100, n_rep: int | None = None) -> Timing:
    """Check FlashAttention-4 on `shape` against torch SDPA, then time it like every other row."""
    import torch

    fn = fa4_checked_call(shape)
    with torch.no_grad():
        return bench(fn, warmup_ms=warmup_ms, rep_ms=rep_ms, n_rep=n_rep)


def fa4_checked_call(shape: Shape):
    """A no-argument call of FlashAttention-4 on fresh inputs of `shape`, checked against torch SDPA first (for
    callers that time it several times, interleaved with other kernels); PeerUnavailable says why not."""
    why = unavailable()
    if why:
        raise PeerUnavailable(f"fa4: {why}")
    if shape.causal and shape.seqlen_q != shape.seqlen_k and not shape.lower_right:
        # FlashAttention aligns the causal mask bottom-right (a lower-right shape is its own convention), SDPA's
        # is_causal top-left: not the same function.
        raise PeerUnavailable("fa4: causal with seqlen_q != seqlen_k is aligned bottom-right there, top-left here")
    import torch
    import torch.nn.functional as F
    from flash_attn.cute import flash_attn_func

    q, k, v = make_inputs(shape, "bnhd", seed=0)     # logical (B, H, N, D) over (B, N, H, D) storage
    qn, kn, vn = (t.transpose(1, 2) for t in (q, k, v))  # contiguous (B, N, H, D): FlashAttention's layout

    def fn():
        out = flash_attn_func(qn, kn, vn, causal=shape.causal)  # bottom-right: right for lower-right shapes
        return out[0] if isinstance(out, tuple) else out

    try:
        with torch.no_grad():
            got = fn().transpose(1, 2)
            if shape.lower_right:  # the reference of the same function (SDPA's CausalBias takes no enable_gqa)
                group = shape.heads // shape.kv_heads
                kr, vr = (t.repeat_interleave(group, dim=1) for t in (k, v))
                want = F.scaled_dot_product_attention(q, kr, vr, **sdpa_mask_kwargs(shape))
            else:
                want = F.scaled_dot_product_attention(q, k, v, is_causal=shape.causal,
                                                      enable_gqa=shape.kv_heads != shape.heads)
    except (RuntimeError, ValueError, TypeError, AssertionError, NotImplementedError) as e:
        raise PeerUnavailable(f"fa4: refused {shape.key}: {type(e).__name__}: {str(e).splitlines()[0]}") from None
    err = ((got.float() - want.float()).norm() / want.float().norm()).item()
    if not err <= PEER_TOLERANCE:  # also catches NaN
        raise PeerUnavailable(f"fa4: output differs from torch SDPA on {shape.key} (relative error {err:.3g})")
    return fn


__all__ = ["PEER_TOLERANCE", "PeerUnavailable", "fa4_checked_call", "fa4_timing", "unavailable"]
