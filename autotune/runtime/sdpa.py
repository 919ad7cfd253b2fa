"""`autotune.scaled_dot_product_attention`: torch.nn.functional.scaled_dot_product_attention's signature and
semantics, running the tuned kernel where it can and PyTorch's own function everywhere else.

Routed to the kernel (routing.py): 4-d CUDA fp16/bf16 tensors with head_dim 64, 128 or 256 (the value's too), no
attn_mask, dropout_p == 0, the same batch for q, k and v, k/v heads equal to q's or, with enable_gqa=True, dividing
them (GQA goes in as it is, no repeat), a contiguous last dim, 16-byte aligned data, no autograd, a finite scale,
and is_causal with any lengths (top-left aligned, as PyTorch's; routing.causal_argument). Every other call runs PyTorch's function
with the same arguments (what the caller would have got without autotune), and is counted and reported once per
reason (fallbacks.py).

Errors are PyTorch's: the exception type torch raises for the same mistake (TypeError for an argument of the wrong
type, RuntimeError for shapes, dtypes and devices that do not go together), with a message naming the argument.
A call PyTorch would accept is never rejected here; it runs on the kernel or falls back.

`patch_sdpa()` is a context manager that puts this function in place of
`torch.nn.functional.scaled_dot_product_attention` (for timm / diffusers style code that calls it through
`F.`) and restores whatever was there on exit, also when the block raises. It is process-wide while active (every
thread sees it); code that imported the function by name before the block (`from torch.nn.functional import
scaled_dot_product_attention`) keeps the original.
"""
from __future__ import annotations

import contextlib
import math
import threading

import torch
import torch.nn.functional as F

from . import fallbacks, routing

WHERE = "autotune.scaled_dot_product_attention"
STOCK = "torch.nn.functional.scaled_dot_product_attention"
# PyTorch's function as torch defines it: what fallbacks run, even while patch_sdpa() has replaced the attribute.
_torch_sdpa = torch._C._nn.scaled_dot_product_attention


def _type_error(name: str, position: int | None, expected: str, value) -> TypeError:
    where = f"argument '{name}'" + (f" (position {position})" if position else "")
    return TypeError(f"scaled_dot_product_attention(): {where} must be {expected}, not {type(value).__name__}")


def _broadcast_shapes(*shapes) -> torch.Size:
    """torch.broadcast_shapes' result and its RuntimeError, in plain Python: torch's goes through torch._refs and
    cost ~30 µs a call, on every attention call of a model (measured: benchmarks/models_host_profile.py)."""
    out = [1] * max(len(s) for s in shapes)
    for s in shapes:
        for i, d in enumerate(s, start=len(out) - len(s)):
            if d == 1:
                continue
            if out[i] == 1:
                out[i] = d
            elif out[i] != d:
                raise RuntimeError(f"shape mismatch: shapes {[tuple(x) for x in shapes]} do not broadcast")
    return torch.Size(out)


def check_arguments(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa) -> None:
    """Raise what PyTorch raises for these arguments (the same exception type), with a message naming the
    argument. Only mistakes PyTorch rejects on every backend are checked here: anything else that is odd (a scale
    given as a tensor, a mask of a rank PyTorch may not take) goes to PyTorch's function, which decides. Shapes
    follow SDPA: (..., L, E) query, (..., S, E) key, (..., S, Ev) value, leading dims broadcast."""
    for position, (name, t) in enumerate((("query", query), ("key", key), ("value", value)), start=1):
        if not isinstance(t, torch.Tensor):
            raise _type_error(name, position, "Tensor", t)
    if attn_mask is not None and not isinstance(attn_mask, torch.Tensor):
        raise _type_error("attn_mask", None, "Tensor", attn_mask)
    for name, flag in (("is_causal", is_causal), ("enable_gqa", enable_gqa)):
        if not isinstance(flag, bool):
            raise _type_error(name, None, "bool", flag)
    if isinstance(dropout_p, str) or isinstance(scale, str):
        raise _type_error("dropout_p" if isinstance(dropout_p, str) else "scale", None, "float",
                          dropout_p if isinstance(dropout_p, str) else scale)

    tensors = (("query", query), ("key", key), ("value", value))
    if query.dtype != key.dtype or query.dtype != value.dtype:
        odd = "key" if key.dtype != query.dtype else "value"
        raise RuntimeError(f"{odd}: expected query, key, and value to have the same dtype, but got query.dtype: "
                           f"{query.dtype}, key.dtype: {key.dtype} and value.dtype: {value.dtype} instead.")
    if query.device.type != key.device.type or query.device.type != value.device.type:
        odd = "key" if key.device.type != query.device.type else "value"
        raise RuntimeError(f"{odd}: expected query, key, and value to have the same device type, but got "
                           f"query.device: {query.device}, key.device: {key.device} and value.device: "
                           f"{value.device} instead.")
    if min(t.dim() for _, t in tensors) < 2:
        odd = next(n for n, t in tensors if t.dim() < 2)
        raise RuntimeError(f"{odd}: expected query, key, and value to all be at least 2 dimensional, but got "
                           f"query.dim: {query.dim()}, key.dim: {key.dim()} and value.dim: {value.dim()} instead.")
    if key.shape[-1] != query.shape[-1]:
        raise RuntimeError(f"key: expected the query's embedding size {query.shape[-1]} as its last dim, got shape "
                           f"{tuple(key.shape)} for query shape {tuple(query.shape)}")
    # Leading dims broadcast; with enable_gqa the head dim (-3) is PyTorch's own check, which names the heads.
    lead = -3 if enable_gqa else -2
    for name, t in (("key", key), ("value", value)):
        try:
            if t.shape[:lead] != query.shape[:lead]:  # the usual case, equal, needs no broadcast
                _broadcast_shapes(query.shape[:lead], t.shape[:lead])
        except RuntimeError:
            dims = "batch dims" if enable_gqa else "batch and head dims"
            raise RuntimeError(f"{name}: expected {dims} that broadcast with the query's {tuple(query.shape[:lead])}, "
                               f"got shape {tuple(t.shape)} for query shape {tuple(query.shape)}") from None
    if attn_mask is not None:
        if attn_mask.dtype not in (torch.bool, torch.float32, query.dtype):
            raise RuntimeError(f"attn_mask: expected dtype bool or float or to match query dtype, but got "
                               f"attn_mask.dtype: {attn_mask.dtype} and query.dtype: {query.dtype} instead.")
        front = query.shape[:-2] if enable_gqa else _broadcast_shapes(query.shape[:-2], key.shape[:-2])
        scores = torch.Size((*front, query.shape[-2], key.shape[-2]))
        try:
            fits = _broadcast_shapes(attn_mask.shape, scores) == scores
        except RuntimeError:
            fits = False
        if not fits:
            raise RuntimeError(f"attn_mask: expected a shape that broadcasts to the attention scores {tuple(scores)}, "
                               f"got shape {tuple(attn_mask.shape)}")


def _route(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    """(the kernel's causal argument, None) for a call the kernel runs, else (None, the fallback reason)."""
    if attn_mask is not None:
        return None, "an explicit attn_mask (the kernel takes none)"
    if type(dropout_p) not in (int, float) or dropout_p != 0:
        return None, "dropout_p > 0 (the kernel has no dropout)"
    if scale is not None and (type(scale) not in (int, float) or not math.isfinite(scale)):
        return None, f"scale {scale!r} (the kernel takes a finite Python float)"
    reason = routing.unsupported(query, key, value)
    if reason:
        return None, reason
    if key.shape[1] != query.shape[1] and not enable_gqa:
        return None, f"{key.shape[1]} key heads broadcast to {query.shape[1]} query heads without enable_gqa"
    if not is_causal:
        return False, None
    causal = routing.causal_argument(query.shape[2], key.shape[2], routing.UPPER_LEFT)
    if causal is None:
        return None, routing.causal_reason(query.shape[2], key.shape[2], routing.UPPER_LEFT)
    return causal, None


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False):
    """torch.nn.functional.scaled_dot_product_attention, on the tuned kernel where it can run (module docstring)."""
    check_arguments(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    causal, reason = _route(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    if reason is None:
        return routing.kernel(query, key, value, causal, None if scale is None else float(scale))
    fallbacks.record(WHERE, reason, STOCK)
    return _torch_sdpa(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                       enable_gqa=enable_gqa)


_patch_lock = threading.Lock()


@contextlib.contextmanager
def patch_sdpa():
    """Route `torch.nn.functional.scaled_dot_product_attention` through scaled_dot_product_attention inside the
    block; the function that was there is put back on exit, also on an exception. Nested blocks are fine (the
    inner one restores the outer one's patch)."""
    with _patch_lock:
        previous = F.scaled_dot_product_attention
        F.scaled_dot_product_attention = scaled_dot_product_attention
    try:
        yield scaled_dot_product_attention
    finally:
        with _patch_lock:
            F.scaled_dot_product_attention = previous


__all__ = ["STOCK", "WHERE", "check_arguments", "patch_sdpa", "scaled_dot_product_attention"]
