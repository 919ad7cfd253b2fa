"""The kernel's parameter block (kernels/common/flash_params.h) as a ctypes struct, and the checks that make it safe.

Every family takes `FlashFwdParams` by value. The kernel trusts it completely: a wrong stride or a misaligned
pointer is not an error message there but a fault or silently wrong output. So all the validation lives here,
before launch, and every error names the argument and what was expected. `validate_inputs(..., require_cuda=False)`
runs the same checks on CPU tensors, which is how the tests exercise them.
"""
from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass

from space import CAUSAL_ALIGNS, HEAD_DIMS, Problem

LOG2_E = math.log2(math.e)

# The kernel copies global memory in 16-byte cp.async chunks of 8 fp16/bf16 elements.
ALIGN_BYTES = 16
ALIGN_ELEMS = 8

_DTYPE_NAMES = {"torch.float16": "fp16", "torch.bfloat16": "bf16"}


class FlashFwdParams(ctypes.Structure):
    """Field for field the C struct; tests/test_launch_params.py compares size and offsets with g++'s."""

    _fields_ = [
        ("q", ctypes.c_void_p),
        ("k", ctypes.c_void_p),
        ("v", ctypes.c_void_p),
        ("o", ctypes.c_void_p),
        ("lse", ctypes.c_void_p),
        ("q_batch_stride", ctypes.c_longlong), ("q_head_stride", ctypes.c_longlong), ("q_row_stride", ctypes.c_longlong),
        ("k_batch_stride", ctypes.c_longlong), ("k_head_stride", ctypes.c_longlong), ("k_row_stride", ctypes.c_longlong),
        ("v_batch_stride", ctypes.c_longlong), ("v_head_stride", ctypes.c_longlong), ("v_row_stride", ctypes.c_longlong),
        ("o_batch_stride", ctypes.c_longlong), ("o_head_stride", ctypes.c_longlong), ("o_row_stride", ctypes.c_longlong),
        ("batch", ctypes.c_int),
        ("heads", ctypes.c_int),
        ("kv_heads", ctypes.c_int),
        ("seqlen_q", ctypes.c_int),
        ("seqlen_k", ctypes.c_int),
        ("scale_log2", ctypes.c_float),
        ("causal_offset", ctypes.c_int),
        ("o_partial", ctypes.c_void_p),
        ("lse_partial", ctypes.c_void_p),
        ("seqused_k", ctypes.c_void_p),
        ("tile_counter", ctypes.c_void_p),
        ("tail_full_end", ctypes.c_int),
        ("tail_ctas", ctypes.c_int),
    ]


@dataclass(frozen=True)
class InputShape:
    """What validate_inputs learned from the tensors."""

    batch: int
    heads: int
    kv_heads: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    dtype: str  # "fp16" | "bf16"


def dtype_name(dtype) -> str | None:
    """'fp16' / 'bf16' for torch.float16 / torch.bfloat16, else None."""
    return _DTYPE_NAMES.get(str(dtype))


def _fail(name: str, expected: str, got) -> ValueError:
    return ValueError(f"{name}: expected {expected}, got {got}")


def validate_inputs(q, k, v, o, lse=None, *, problem: Problem | None = None,
                    require_cuda: bool = True) -> InputShape:
    """Check q, k, v, o (and lse) against everything the kernel assumes; raise ValueError naming the argument.

    Layout: q, o are (batch, heads, seqlen_q, head_dim); k, v are (batch, kv_heads, seqlen_k, head_dim). Any
    strides, except that the last dim is contiguous. With `problem`, dtype and head_dim must be the ones the
    cubin was compiled for (a d128 kernel on d64 tensors would read garbage, not fail).
    """
    import torch

    tensors = {"q": q, "k": k, "v": v, "o": o}
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise _fail(name, "a torch.Tensor", type(t).__name__)
    for name, t in tensors.items():
        if require_cuda and t.device.type != "cuda":
            raise _fail(name, "a CUDA tensor", f"a tensor on {t.device}")
        if t.device != q.device:
            raise _fail(name, f"a tensor on q's device {q.device}", f"a tensor on {t.device}")
        if t.dim() != 4:
            raise _fail(name, "a 4-d tensor (batch, heads, seqlen, head_dim)", f"shape {tuple(t.shape)}")
    for name, t in tensors.items():
        if dtype_name(t.dtype) is None:
            raise _fail(name, "dtype torch.float16 or torch.bfloat16", t.dtype)
        if t.dtype != q.dtype:
            raise _fail(name, f"the same dtype as q ({q.dtype})", t.dtype)

    batch, heads, seqlen_q, head_dim = q.shape
    _, kv_heads, seqlen_k, _ = k.shape
    for name, t in tensors.items():
        for dim, size in zip(("batch", "heads", "seqlen", "head_dim"), t.shape):
            if size < 1:
                raise _fail(name, f"a non-empty tensor ({dim} >= 1)", f"shape {tuple(t.shape)}")
    if head_dim not in HEAD_DIMS:
        raise _fail("q", f"head_dim in {HEAD_DIMS}", f"head_dim {head_dim} (shape {tuple(q.shape)})")
    if tuple(k.shape) != (batch, kv_heads, seqlen_k, head_dim):
        raise _fail("k", f"shape (batch={batch}, kv_heads, seqlen_k, head_dim={head_dim}) to match q",
                    f"shape {tuple(k.shape)}")
    if tuple(v.shape) != tuple(k.shape):
        raise _fail("v", f"the shape of k {tuple(k.shape)}", f"shape {tuple(v.shape)}")
    if tuple(o.shape) != tuple(q.shape):
        raise _fail("o", f"the shape of q {tuple(q.shape)}", f"shape {tuple(o.shape)}")
    if heads % kv_heads:
        raise _fail("k", f"a head count that divides q's {heads} heads", f"{kv_heads} kv heads")

    if problem is not None:
        if head_dim != problem.head_dim:
            raise _fail("q", f"head_dim {problem.head_dim} (the kernel was compiled for {problem.key})",
                        f"head_dim {head_dim}")
        if dtype_name(q.dtype) != problem.dtype:
            raise _fail("q", f"dtype {problem.dtype} (the kernel was compiled for {problem.key})", q.dtype)

    for name, t in tensors.items():
        if t.stride(-1) != 1:
            raise _fail(name, "a contiguous last dim (stride 1)", f"strides {tuple(t.stride())}")
        if t.data_ptr() % ALIGN_BYTES:
            raise _fail(name, f"a data pointer aligned to {ALIGN_BYTES} bytes (16-byte cp.async)",
                        f"address {t.data_ptr():#x} (storage offset {t.storage_offset()})")
        for dim in range(3):
            # A size-1 dim is never stepped over, so its stride (which torch leaves arbitrary) does not matter.
            if t.shape[dim] > 1 and t.stride(dim) % ALIGN_ELEMS:
                which = ("batch", "head", "row")[dim]
                raise _fail(name, f"a {which} stride that is a multiple of {ALIGN_ELEMS} elements (16-byte cp.async)",
                            f"strides {tuple(t.stride())}")

    if lse is not None:
        if not isinstance(lse, torch.Tensor):
            raise _fail("lse", "a torch.Tensor or None", type(lse).__name__)
        if lse.device != q.device:
            raise _fail("lse", f"a tensor on q's device {q.device}", f"a tensor on {lse.device}")
        if lse.dtype != torch.float32:
            raise _fail("lse", "dtype torch.float32", lse.dtype)
        if tuple(lse.shape) != (batch, heads, seqlen_q):
            raise _fail("lse", f"shape (batch, heads, seqlen_q) = {(batch, heads, seqlen_q)}", f"shape {tuple(lse.shape)}")
        if not lse.is_contiguous():
            raise _fail("lse", "a contiguous tensor", f"strides {tuple(lse.stride())}")

    for name, value in (("batch", batch), ("heads", heads), ("seqlen_q", seqlen_q), ("seqlen_k", seqlen_k)):
        if value > 2**31 - 1:
            raise _fail("q" if name != "seqlen_k" else "k", f"{name} < 2**31 (an int in the kernel)", value)

    return InputShape(batch, heads, kv_heads, seqlen_q, seqlen_k, head_dim, dtype_name(q.dtype))


def default_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)


def _strides(t) -> tuple[int, int, int]:
    # Size-1 dims get stride 0: the kernel multiplies it only by index 0, and any address it forms for an
    # out-of-range (masked) row then stays at the aligned base instead of wherever torch's stride points.
    return tuple(t.stride(d) if t.shape[d] > 1 else 0 for d in range(3))


def validate_seqused_k(seqused_k, batch: int, device, *, require_cuda: bool = True) -> None:
    """Check a per-batch-row used key length tensor: int32, shape (batch,), contiguous, on q's device. Its values
    are not checked (that needs a sync, which a CUDA graph capture forbids): the kernel clamps them to
    [0, seqlen_k]. ValueError names `seqused_k`."""
    import torch

    if not isinstance(seqused_k, torch.Tensor):
        raise _fail("seqused_k", "a torch.Tensor or None", type(seqused_k).__name__)
    if require_cuda and seqused_k.device.type != "cuda":
        raise _fail("seqused_k", "a CUDA tensor", f"a tensor on {seqused_k.device}")
    if seqused_k.device != device:
        raise _fail("seqused_k", f"a tensor on q's device {device}", f"a tensor on {seqused_k.device}")
    if seqused_k.dtype != torch.int32:
        raise _fail("seqused_k", "dtype torch.int32", seqused_k.dtype)
    if tuple(seqused_k.shape) != (batch,):
        raise _fail("seqused_k", f"shape (batch,) = ({batch},)", f"shape {tuple(seqused_k.shape)}")
    if seqused_k.stride(0) != 1 and batch > 1:
        raise _fail("seqused_k", "a contiguous tensor", f"strides {tuple(seqused_k.stride())}")


def check_seqused_causal(causal: bool, causal_align: str) -> None:
    """A seqused_k call's mask: none, or causal aligned to the end of each row's used keys ("lower_right"); a
    top-left mask has no meaning the kernel gives it there. ValueError names `causal`."""
    if causal and causal_align != "lower_right":
        raise _fail("causal", "False or 'lower_right' with seqused_k (the mask is aligned to each row's used keys)",
                    "True (top-left aligned)" if causal_align == "upper_left" else repr(causal_align))


def make_params(q, k, v, o, lse=None, scale: float | None = None, *, problem: Problem | None = None,
                require_cuda: bool = True, causal_align: str = "upper_left", seqused_k=None) -> FlashFwdParams:
    """Validate the tensors and fill the parameter block. `scale` defaults to 1/sqrt(head_dim). `causal_align`
    (causal builds only): "upper_left" (query i sees keys j <= i, SDPA's is_causal) or "lower_right" (j <= i +
    seqlen_k - seqlen_q: the last query sees every key, as decode and chunked prefill need). `seqused_k`: int32
    (batch,) on q's device, the keys each batch row uses (validate_seqused_k), for builds of a seqused_k problem
    only; causal builds then need "lower_right", aligned to each row's used length.

    The struct holds raw pointers: the caller keeps q, k, v, o, lse (and seqused_k) alive until the kernel has run.
    """
    shape = validate_inputs(q, k, v, o, lse, problem=problem, require_cuda=require_cuda)
    if seqused_k is not None:
        validate_seqused_k(seqused_k, shape.batch, q.device, require_cuda=require_cuda)
        if problem is not None and not problem.seqused_k:
            raise _fail("seqused_k", f"None (the kernel was compiled for {problem.key}, which does not read it)",
                        "a tensor")
        check_seqused_causal(problem is None or problem.causal, causal_align)
    if scale is None:
        scale = default_scale(shape.head_dim)
    try:
        scale = float(scale)
    except (TypeError, ValueError):
        raise _fail("scale", "a finite float", repr(scale)) from None
    if not math.isfinite(scale):
        raise _fail("scale", "a finite float", repr(scale))

    p = FlashFwdParams()
    p.q, p.k, p.v, p.o = q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr()
    p.lse = lse.data_ptr() if lse is not None else None
    p.q_batch_stride, p.q_head_stride, p.q_row_stride = _strides(q)
    p.k_batch_stride, p.k_head_stride, p.k_row_stride = _strides(k)
    p.v_batch_stride, p.v_head_stride, p.v_row_stride = _strides(v)
    p.o_batch_stride, p.o_head_stride, p.o_row_stride = _strides(o)
    p.batch, p.heads, p.kv_heads = shape.batch, shape.heads, shape.kv_heads
    p.seqlen_q, p.seqlen_k = shape.seqlen_q, shape.seqlen_k
    p.scale_log2 = scale * LOG2_E
    p.causal_offset = causal_offset(causal_align, shape.seqlen_q, shape.seqlen_k)
    p.seqused_k = seqused_k.data_ptr() if seqused_k is not None else None
    return p


def causal_offset(align: str, seqlen_q: int, seqlen_k: int) -> int:
    """The parameter block's causal_offset: query row i sees keys j <= i + offset."""
    if align == "upper_left":
        return 0
    if align == "lower_right":
        return seqlen_k - seqlen_q
    raise _fail("causal", f"one of {CAUSAL_ALIGNS}", repr(align))
