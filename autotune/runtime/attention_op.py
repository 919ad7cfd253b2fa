"""`autotune.attention(q, k, v)`: the tuned FlashAttention forward as a torch op.

Semantics are those of `torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale,
enable_gqa=True)` for the cases supported:
  * q (B, H, Nq, D), k and v (B, Hkv, Nk, D) with Hkv dividing H (GQA: query head h reads kv head h // (H/Hkv));
  * fp16 or bf16, D in space.HEAD_DIMS, all tensors on one CUDA device;
  * any strides as long as the last dim is contiguous and the data is 16-byte aligned: a (B, N, H, D) tensor
    passed as `.transpose(1, 2)` runs without a copy. Inputs that break this are NOT copied (a hidden copy would
    eat the speed-up): the ValueError names the argument and what was expected; `.contiguous()` gives a copy that
    runs;
  * causal=True (or "upper_left") aligns the mask top-left (query i sees keys j <= i), like SDPA's is_causal;
    causal="lower_right" aligns it bottom-right (query i sees keys j <= i + Nk - Nq: the last query sees every key),
    PyTorch's `causal_lower_right`, which decode with several new tokens and chunked prefill need. The two agree
    when Nq == Nk. A query row that sees no key (lower_right with Nq > Nk) returns zeros and lse = -inf;
  * seqused_k: an int32 CUDA tensor of shape (batch,) on q's device, the number of keys each batch row uses
    (FlashAttention's seqused_k / cache_seqlens): row b attends to keys [0, seqused_k[b]) of k and v, and a row
    that uses none returns zeros and lse = -inf. It is read on the device, never on the host, so a CUDA graph may
    advance it between replays; values are not checked (that would need a sync) but clamped to [0, seqlen_k] in
    the kernel. causal must then be False or "lower_right" (aligned to each row's used length). The config is the
    one looked up for the tensors' seqlen_k, built for seqused_k (a build of its own);
  * forward only (no backward: autograd raises if one is attempted through the op).
Returns out (B, H, Nq, D) in q's dtype, laid out in memory like q (as SDPA's cuDNN backend returns it): when q's
heads are interleaved within a row, a (B, Nq, H, D) tensor passed as `.transpose(1, 2)` (transformers, timm), out is
one too, so the caller's `out.transpose(1, 2).reshape(B, Nq, H * D)` is a view rather than a copy of the whole
output; otherwise out is contiguous. With return_lse also lse (B, H, Nq), fp32, contiguous, natural log.

The op is registered as `autotune::flash_attention_fwd` (torch.library.custom_op) with a fake implementation, so
`torch.compile(fullgraph=True)` traces through it. In plain eager mode on plain tensors `attention` calls the
implementation directly instead of through the dispatcher (the op's own ~8 µs): same code, same results.

Per call, a memo keyed by everything the input checks depend on except the data pointers (shapes, strides,
dtypes, devices, flags, storage URL) holds the validated launch (a loader.Relaunch); a warm call re-checks only
pointer alignment, allocates the outputs, and the Relaunch writes the new pointers into its parameter block (and
tensor maps) and launches. The config
choice comes from autotune.runtime (see its docstring for the lookup order).
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from space import HEAD_DIMS, Shape

from . import lookup as runtime
from . import benchmark_mode, capture  # models: benchmark mode and shape capture, hooked below
from ..launch.loader import Relaunch
from ..launch.params import (ALIGN_BYTES, CAUSAL_ALIGNS, InputShape, check_seqused_causal, dtype_name,
                             validate_inputs, validate_seqused_k)

OP_NAME = "autotune::flash_attention_fwd"


# ---- argument checks --------------------------------------------------------------------------------------

CAUSAL_VALUES = (False, True) + CAUSAL_ALIGNS


def causal_mode(causal) -> tuple[bool, str]:
    """(masked, alignment) of attention's `causal` argument: False, True (= "upper_left") or "lower_right"."""
    if isinstance(causal, bool):
        return causal, "upper_left"
    if isinstance(causal, str) and causal in CAUSAL_ALIGNS:
        return True, causal
    raise TypeError(f"causal: expected one of {CAUSAL_VALUES}, got {causal!r}")


def check_flags(causal, scale, return_lse) -> Optional[float]:
    """Validate the non-tensor arguments; returns scale as a float (or None for 1/sqrt(head_dim))."""
    causal_mode(causal)
    if not isinstance(return_lse, bool):
        raise TypeError(f"return_lse: expected True or False, got {return_lse!r}")
    if scale is None:
        return None
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale: expected a float or None, got {scale!r}")
    if not math.isfinite(scale):
        raise ValueError(f"scale: expected a finite float, got {scale!r}")
    return float(scale)


def check_inputs(q, k, v, *, require_cuda: bool = True) -> InputShape:
    """Every check the kernel needs on q, k, v, with errors naming the argument; runs on CPU and meta tensors
    with require_cuda=False (this is the entry point tests use without a GPU)."""
    # The output is allocated later with q's shape, dtype and device: validating q as the output checks nothing
    # new, so errors always name q, k or v.
    return validate_inputs(q, k, v, q, require_cuda=require_cuda)


def check_meta(q, k, v) -> None:
    """The checks that need no data pointer, for the fake implementation (FakeTensors have no address and may have
    symbolic sizes). Same messages as launch_params.validate_inputs; alignment is checked when the op runs."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.device.type != "cuda":
            raise ValueError(f"{name}: expected a CUDA tensor, got a tensor on {t.device}")
        if t.device != q.device:
            raise ValueError(f"{name}: expected a tensor on q's device {q.device}, got a tensor on {t.device}")
        if t.dim() != 4:
            raise ValueError(f"{name}: expected a 4-d tensor (batch, heads, seqlen, head_dim), got shape {tuple(t.shape)}")
        if dtype_name(t.dtype) is None:
            raise ValueError(f"{name}: expected dtype torch.float16 or torch.bfloat16, got {t.dtype}")
        if t.dtype != q.dtype:
            raise ValueError(f"{name}: expected the same dtype as q ({q.dtype}), got {t.dtype}")
        if any(size < 1 for size in t.shape):
            raise ValueError(f"{name}: expected a non-empty tensor, got shape {tuple(t.shape)}")
    batch, heads, _, head_dim = q.shape
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"q: expected head_dim in {HEAD_DIMS}, got head_dim {head_dim} (shape {tuple(q.shape)})")
    if k.shape[0] != batch or k.shape[3] != head_dim:
        raise ValueError(f"k: expected shape (batch={batch}, kv_heads, seqlen_k, head_dim={head_dim}) to match q, "
                         f"got shape {tuple(k.shape)}")
    if tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"v: expected the shape of k {tuple(k.shape)}, got shape {tuple(v.shape)}")
    if heads % k.shape[1]:
        raise ValueError(f"k: expected a head count that divides q's {heads} heads, got {k.shape[1]} kv heads")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name}: expected a contiguous last dim (stride 1), got strides {tuple(t.stride())}")


def shape_of(inputs: InputShape, causal: bool, causal_align: str = "upper_left") -> Shape:
    """The call's shape, its mask's alignment included (a lower-right call looks up lower-right rows)."""
    return Shape(batch=inputs.batch, heads=inputs.heads, seqlen_q=inputs.seqlen_q, seqlen_k=inputs.seqlen_k,
                 head_dim=inputs.head_dim, dtype=inputs.dtype, causal=causal, kv_heads=inputs.kv_heads,
                 causal_align=causal_align)


# ---- launching --------------------------------------------------------------------------------------------

def output_strides(q) -> tuple:
    """out's strides for q (B, H, Nq, D): (B, Nq, H, D) memory order when q's head stride is below its row stride
    (a transposed (B, N, H, D) tensor, as models pass), else contiguous (B, H, Nq, D). The kernel writes O through
    its own three strides, so either costs it nothing; the layout saves the caller's transpose-back copy."""
    b, h, n, d = q.shape
    if h > 1 and n > 1 and q.stride(1) < q.stride(2):
        return (n * h * d, d, h * d, 1)
    return (h * n * d, n * d, d, 1)


def empty_output(q):
    """An uninitialised out for q: q's shape and dtype, output_strides(q)."""
    return torch.empty_strided(q.shape, output_strides(q), dtype=q.dtype, device=q.device)


class _Launcher:
    """One validated (layout, flags, storage) combination: a warm call allocates the outputs and hands the data
    pointers to the loader's Relaunch, which holds everything else ready (parameter block, kernelParams array,
    tensor-map encoders, the combine's launch)."""

    __slots__ = ("plan", "relaunch", "out_shape", "out_strides", "lse_shape", "dtype", "device")

    def __init__(self, plan: runtime.Plan, relaunch, out_shape, out_strides: tuple, lse_shape, dtype, device):
        self.plan, self.relaunch = plan, relaunch
        # out's strides are those the Relaunch's parameter block was prepared with (the memo key holds q's strides)
        self.out_shape, self.out_strides, self.lse_shape = out_shape, out_strides, lse_shape
        self.dtype, self.device = dtype, device

    def __call__(self, q, k, v, seqused_k=None):
        qp, kp, vp = q.data_ptr(), k.data_ptr(), v.data_ptr()
        if (qp | kp | vp) % ALIGN_BYTES:
            check_inputs(q, k, v)  # raises, naming the argument
        o = torch.empty_strided(self.out_shape, self.out_strides, dtype=self.dtype, device=self.device)
        lse = torch.empty(self.lse_shape, dtype=torch.float32, device=self.device) if self.lse_shape else None
        self.relaunch(qp, kp, vp, o.data_ptr(), None if lse is None else lse.data_ptr(),
                      None if seqused_k is None else seqused_k.data_ptr())
        return o, lse


_launchers: dict[tuple, _Launcher] = {}


def _seqused_key(seqused_k) -> tuple | None:
    """What the memo key holds of a seqused_k tensor: its metadata (the values live on the device)."""
    if seqused_k is None:
        return None
    return (seqused_k.dtype, seqused_k.shape, seqused_k.stride(), seqused_k.device)


def _memo_key(q, k, v, causal, scale, return_lse, url, seqused_k=None) -> tuple:
    return (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.dtype, k.dtype, v.dtype,
            q.device, k.device, v.device, causal, scale, return_lse, url, _seqused_key(seqused_k))


def check_seqused(q, causal, seqused_k, *, require_cuda: bool = True) -> None:
    """attention's seqused_k argument against q and causal (ValueError naming the argument); None passes."""
    if seqused_k is None:
        return
    validate_seqused_k(seqused_k, q.shape[0] if q.dim() else 0, q.device, require_cuda=require_cuda)
    check_seqused_causal(*causal_mode(causal))


def _new_launcher(q, k, v, causal, scale, return_lse: bool, url: str, seqused_k=None) -> _Launcher:
    masked, align = causal_mode(causal)
    inputs = check_inputs(q, k, v)
    check_seqused(q, causal, seqused_k)
    seqused = seqused_k is not None
    shape = shape_of(inputs, masked, align)
    plan = runtime.resolve(q.device.index, shape, url, seqused_k=True) if seqused else \
        runtime.resolve(q.device.index, shape, url)
    if benchmark_mode.settings.enabled and not seqused:  # models: an untuned shape times a few built configs first
        plan = benchmark_mode.plan(plan, q, k, v, scale, url, align)  # timed with the call's own mask
    o = empty_output(q)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device) if return_lse else None
    # the loader's own full validation, once
    relaunch = Relaunch(plan.runner.prepare(q, k, v, o, lse, scale, align,
                                            *(() if seqused_k is None else (seqused_k,))))
    return _Launcher(plan, relaunch, tuple(q.shape), tuple(o.stride()), tuple(q.shape[:3]) if return_lse else None,
                     q.dtype, q.device)


def forward(q, k, v, causal, scale: Optional[float], return_lse: bool, seqused_k=None):
    """Run the kernel: (out, lse or None). No dispatcher, no flag checks: callers check flags first.
    `causal`: False, True, "upper_left" or "lower_right" (causal_mode). `seqused_k`: None or the int32 (batch,)
    CUDA tensor of used key lengths (checked once per memo key: only its metadata, never its values)."""
    url = runtime.storage_key()  # an env read when warm; an env change takes effect
    key = _memo_key(q, k, v, causal, scale, return_lse, url, seqused_k)
    launcher = _launchers.get(key)
    if launcher is None:
        launcher = _launchers[key] = _new_launcher(q, k, v, causal, scale, return_lse, url, seqused_k)
    out = launcher(q, k, v) if seqused_k is None else launcher(q, k, v, seqused_k)
    if capture.recording:  # models: count this call's shape bucket into the capture file
        capture.record(q, k, causal)
    return out


def clear_caches() -> None:
    """Forget prepared launches and (through runtime.clear_caches) selections, builds and loaded kernels."""
    _launchers.clear()
    runtime.clear_caches()
    benchmark_mode.clear()  # models


# ---- the torch op -----------------------------------------------------------------------------------------

@torch.library.custom_op(OP_NAME, mutates_args=())
def flash_attention_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: Optional[float],
                        return_lse: bool, causal_align: str = "upper_left",
                        seqused_k: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse); lse is an empty fp32 tensor when return_lse is False (an op cannot return None).
    causal_align: "upper_left" or "lower_right" (only read when causal). seqused_k: as attention's."""
    scale = check_flags(causal, scale, return_lse)
    _check_align(causal_align)
    out, lse = forward(q, k, v, causal_align if causal else False, scale, return_lse, seqused_k)
    return out, (lse if lse is not None else torch.empty(0, dtype=torch.float32, device=q.device))


@flash_attention_fwd.register_fake
def _flash_attention_fwd_fake(q, k, v, causal, scale, return_lse, causal_align="upper_left", seqused_k=None):
    check_flags(causal, scale, return_lse)
    _check_align(causal_align)
    check_meta(q, k, v)
    check_seqused(q, causal_align if causal else False, seqused_k)
    out = empty_output(q)  # the real output's strides
    lse = q.new_empty(q.shape[:3] if return_lse else (0,), dtype=torch.float32)
    return out, lse


def _probe(name: str):
    fn = getattr(torch._C, name, None)
    return fn if callable(fn) else (lambda: True)  # unknown torch: report "active", i.e. use the dispatcher


_dispatch_modes = _probe("_len_torch_dispatch_stack")
_function_modes = _probe("_is_torch_function_mode_enabled")
_functorch = _probe("_are_functorch_transforms_active")


def _direct(q, k, v) -> bool:
    """True when calling the implementation directly is indistinguishable from calling the op: eager, plain
    tensors, no autograd to record, no torch_function/dispatch mode or functorch transform that should see it."""
    if torch.compiler.is_compiling():
        return False
    if type(q) is not torch.Tensor or type(k) is not torch.Tensor or type(v) is not torch.Tensor:
        return False
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return False
    return not (_dispatch_modes() or _function_modes() or _functorch())


def _check_align(causal_align) -> None:
    if causal_align not in CAUSAL_ALIGNS:
        raise ValueError(f"causal_align: expected one of {CAUSAL_ALIGNS}, got {causal_align!r}")


def attention(q, k, v, causal: bool | str = False, scale: Optional[float] = None, return_lse: bool = False,
              seqused_k: Optional[torch.Tensor] = None):
    """Attention with the fastest known config for this GPU and shape; see the module docstring.
    causal: False, True (= "upper_left", SDPA's is_causal) or "lower_right" (the last query sees every key).
    seqused_k: None, or int32 (batch,) on q's device: the keys each batch row uses, read on the device (clamped
    to [0, seqlen_k] there), with causal False or "lower_right"."""
    scale = check_flags(causal, scale, return_lse)
    masked, align = causal_mode(causal)
    if seqused_k is not None:
        if not isinstance(seqused_k, torch.Tensor):  # before the dispatcher, whose schema error names no argument
            raise ValueError(f"seqused_k: expected a torch.Tensor or None, got {type(seqused_k).__name__}")
        check_seqused_causal(masked, align)
    if _direct(q, k, v) and (seqused_k is None or type(seqused_k) is torch.Tensor):
        out, lse = forward(q, k, v, causal, scale, return_lse, seqused_k)
    else:
        for name, t in (("q", q), ("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor):  # before the dispatcher, whose schema error names no argument
                raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        # (seqused_k only when given: the op's traced calls stay what they were without it)
        out, lse = flash_attention_fwd(q, k, v, masked, scale, return_lse, align,
                                       *(() if seqused_k is None else (seqused_k,)))
    return (out, lse) if return_lse else out


def explain(q, k, v, causal: bool | str = False, *, storage: str | None = None, gpu_name: str | None = None,
            arch=None) -> str:
    """Which config attention(q, k, v, causal) would run and why: source, row provenance, distance.

    On CUDA tensors the GPU is q's; pass gpu_name and arch (e.g. "NVIDIA H200", "sm_90") to ask about another
    GPU, which also accepts CPU or meta tensors. Building and loading are not attempted: if the chosen config then
    fails to build, attention() warns and falls back to the heuristic default.
    """
    check_flags(causal, None, False)
    offline = gpu_name is not None and arch is not None
    if not offline and (gpu_name is not None or arch is not None):
        raise ValueError("gpu_name, arch: pass both (to explain for another GPU) or neither (q's GPU)")
    inputs = check_inputs(q, k, v, require_cuda=not offline)
    if not offline:
        gpu_name, arch = runtime.device_info(q.device.index)
    selection = runtime.select_config(shape_of(inputs, *causal_mode(causal)), gpu_name, arch, storage)
    return selection.explain()


__all__ = ["CAUSAL_VALUES", "OP_NAME", "attention", "causal_mode", "check_flags", "check_inputs", "check_meta",
           "check_seqused", "clear_caches", "empty_output", "explain", "output_strides",
           "flash_attention_fwd", "forward"]
