"""Which calls of the drop-in entry points (runtime/sdpa.py, autotune/integrations/) the tuned kernel can run, and
why not when it cannot. The reasons are the ones fallbacks.py counts and reports.

`unsupported(q, k, v)` looks only at the tensors (device, rank, dtype, head dim, layout, alignment, autograd); the
entry points add their own argument checks (a mask, dropout). `causal_argument` is the one place that decides how a
causal call with seqlen_q != seqlen_k reaches the kernel. `kernel` is what a routed call runs; tests replace it
(and KERNEL_DEVICE_TYPES) with a stand-in to exercise the routing on CPU.
"""
from __future__ import annotations

from typing import Optional

from space import HEAD_DIMS

from ..launch.params import ALIGN_BYTES, dtype_name

KERNEL_DEVICE_TYPES = ("cuda",)
MAX_GRID_YZ = 65535  # heads and batch are grid dims y and z for the `grid` scheduler (launch.loader)
UPPER_LEFT = "upper_left"    # query i sees keys j <= i: SDPA's is_causal, whatever the lengths
LOWER_RIGHT = "lower_right"  # query i sees keys j <= i + seqlen_k - seqlen_q: decode with several new tokens


def causal_argument(seqlen_q: int, seqlen_k: int, alignment: str = UPPER_LEFT):
    """The kernel's `causal` argument for a causal call of `alignment` (autotune.attention's causal=): True for
    equal lengths (both alignments are then one mask) and for UPPER_LEFT (the kernel's causal=True is top-left, as
    SDPA's is_causal), "lower_right" for LOWER_RIGHT. The one place that decides it; returns None (the call goes to
    the stock path, with causal_reason) for nothing today, and stays the switch should an alignment ever lack a
    kernel mode."""
    if alignment not in (UPPER_LEFT, LOWER_RIGHT):
        raise ValueError(f"alignment: expected {UPPER_LEFT!r} or {LOWER_RIGHT!r}, got {alignment!r}")
    if seqlen_q == seqlen_k or alignment == UPPER_LEFT:
        return True
    return LOWER_RIGHT


def causal_reason(seqlen_q: int, seqlen_k: int, alignment: str = UPPER_LEFT) -> str:
    """The fallback reason for a causal call that causal_argument() sends to the stock path."""
    side = "top-left" if alignment == UPPER_LEFT else "bottom-right"
    return f"causal with seqlen_q != seqlen_k ({side} aligned; the kernel has no mode for it)"


def unsupported(q, k, v) -> Optional[str]:
    """Why the kernel cannot run attention on these tensors, or None. Assumes the caller's own argument checks
    passed (tensors on one device, one dtype, matching head dims and sequence lengths where SDPA needs them)."""
    import torch

    if q.device.type not in KERNEL_DEVICE_TYPES:
        return f"tensors on {q.device.type} (the kernel runs on CUDA tensors)"
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return f"{q.dim()}-d query (the kernel takes 4-d (batch, heads, seqlen, head_dim) tensors)"
    if dtype_name(q.dtype) is None:
        return f"dtype {q.dtype} (the kernel takes torch.float16 and torch.bfloat16)"
    head_dim = q.shape[-1]
    if head_dim not in HEAD_DIMS:
        return f"head_dim {head_dim} (the kernel has {', '.join(map(str, HEAD_DIMS))})"
    if v.shape[-1] != head_dim:
        return f"value head_dim {v.shape[-1]} differs from the query's {head_dim}"
    if tuple(v.shape) != tuple(k.shape):
        return f"value shape {tuple(v.shape)} differs from the key's {tuple(k.shape)}"
    if k.shape[0] != q.shape[0]:
        return f"key/value batch {k.shape[0]} broadcast to the query's {q.shape[0]}"
    if k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        return f"{k.shape[1]} key heads for {q.shape[1]} query heads"
    if q.shape[2] == 0 or k.shape[2] == 0:
        return "an empty sequence"
    if q.shape[0] > MAX_GRID_YZ or q.shape[1] > MAX_GRID_YZ:
        return f"batch {q.shape[0]} × heads {q.shape[1]} beyond the kernel's grid ({MAX_GRID_YZ} each)"
    for name, t in (("query", q), ("key", k), ("value", v)):
        if t.stride(-1) != 1:
            return f"{name} with a non-contiguous last dim"
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return "inputs that require grad (the kernel is forward only)"
    if not torch.compiler.is_compiling():  # traced tensors have no address; the op checks it when it runs
        for name, t in (("query", q), ("key", k), ("value", v)):
            if t.data_ptr() % ALIGN_BYTES:
                return f"{name} not {ALIGN_BYTES}-byte aligned"
    return None


def kernel(q, k, v, causal, scale, seqused_k=None):
    """The tuned kernel, as routed calls run it: autotune.attention (out (B, H, Nq, D), laid out like q); seqused_k:
    int32 (B,) used key lengths on the device (the transformers backend's prefix masks)."""
    from .attention_op import attention

    return attention(q, k, v, causal=causal, scale=scale, seqused_k=seqused_k)


__all__ = ["KERNEL_DEVICE_TYPES", "LOWER_RIGHT", "UPPER_LEFT", "causal_argument", "causal_reason", "kernel",
           "unsupported"]
