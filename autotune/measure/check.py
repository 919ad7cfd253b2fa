"""Is a build's output right? Compare it to the fp32 reference, with torch's own error as the yardstick.

One check runs our kernel twice on fresh random inputs (randn: zeros would hide scaling and masking bugs):
  1. output (and lse) pre-filled with NaN: an element the kernel forgets to write stays NaN, and the error against
     the fp32 reference is measured on this run;
  2. pre-filled with SENTINEL, a finite value no attention output can take (outputs are convex combinations of
     rows of v ~ N(0, 1)): elements still equal to it were never written; non-finite elements are the kernel's own
     NaN/inf; elements that differ from run 1 reveal a race.
Both buffers carry guard zones before and after the tensor (a block of rows each), so a store to rows >= seqlen_q
or past the last head shows up as `out_of_bounds` instead of silently corrupting a neighbour allocation.

Tolerance: torch's own same-dtype error (SDPA on the same fp16/bf16 inputs, default backend, against the same
reference) sets the bar: pass iff max_error <= 2 × max(torch_error, floor). The floor is one unit in the last
place at magnitude 1 of the dtype (fp16 2^-10, bf16 2^-7): below it errors are rounding of the output itself, and
with seqlen 1 torch can be exact. torch_error is capped at 16 such units, so a broken baseline cannot open the
gate wide. For GQA, torch gets k/v with repeated heads (mathematically identical), so it always runs a fused
kernel rather than the math fallback whose precision differs.
"""
from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass

from space import Shape

from ..launch.loader import KernelRunner, as_runner
from .reference import reference_attention

# bhnd / bnhd: (B, H, N, D) storage or (B, N, H, D) seen through a transpose; cache: q bhnd, k and v a slice of a
# longer preallocated (B, Hkv, N + CACHE_SLACK_ROWS, D) cache starting CACHE_OFFSET_ROWS in, as servers pass them.
LAYOUTS = ("bhnd", "bnhd", "cache")
CACHE_OFFSET_ROWS = 3
CACHE_SLACK_ROWS = 61
ULP_AT_ONE = {"fp16": 2.0**-10, "bf16": 2.0**-7}
TOLERANCE_FACTOR = 2.0
TORCH_ERROR_CAP_ULPS = 16
SENTINEL = 1024.0        # exact in fp16 and bf16, far above any |output| (|v| from randn stays below ~7)
LSE_TOLERANCE = 1e-3     # natural-log units: loose for exp2 approximations, tight for scale or max-term mistakes


@dataclass(frozen=True)
class CheckResult:
    ok: bool
    max_error: float          # max |ours - reference| over the elements ours wrote with finite values
    torch_error: float        # max |torch SDPA - reference|, same inputs and dtype
    tolerance: float
    nan_count: int            # non-finite values the kernel produced
    unwritten: int            # output (and lse) elements the kernel never wrote
    message: str
    out_of_bounds: int = 0    # guard-zone elements the kernel overwrote
    nondeterministic: int = 0 # elements that differ between the two runs
    lse_error: float | None = None
    seed: int = 0
    layout: str = "bhnd"

    def as_dict(self) -> dict:
        return asdict(self)


def torch_dtype(name: str):
    import torch

    return {"fp16": torch.float16, "bf16": torch.bfloat16}[name]


def _physical(batch: int, heads: int, seqlen: int, head_dim: int, layout: str) -> tuple[int, int, int, int]:
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected one of {LAYOUTS}, got {layout!r}")
    return (batch, seqlen, heads, head_dim) if layout == "bnhd" else (batch, heads, seqlen, head_dim)


def _logical(t, layout: str):
    """(B, N, H, D) storage seen as (B, H, N, D): strides become non-standard, no copy."""
    return t.transpose(1, 2) if layout == "bnhd" else t


def make_inputs(shape: Shape, layout: str = "bhnd", seed: int = 0, device=None):
    """Fresh q, k, v ~ N(0, 1) in shape's dtype, logical (B, H, N, D), stored as `layout`."""
    import torch

    device = torch.device(device or "cuda")
    gen = torch.Generator(device=device).manual_seed(seed)
    dtype = torch_dtype(shape.dtype)

    def randn(heads, seqlen):
        phys = _physical(shape.batch, heads, seqlen, shape.head_dim, layout)
        return _logical(torch.randn(phys, generator=gen, device=device, dtype=dtype), layout)

    def cache_slice(heads, seqlen):
        full = torch.randn((shape.batch, heads, seqlen + CACHE_SLACK_ROWS, shape.head_dim), generator=gen,
                           device=device, dtype=dtype)
        return full[:, :, CACHE_OFFSET_ROWS:CACHE_OFFSET_ROWS + seqlen]

    if layout == "cache":
        return (randn(shape.heads, shape.seqlen_q), cache_slice(shape.kv_heads, shape.seqlen_k),
                cache_slice(shape.kv_heads, shape.seqlen_k))
    return randn(shape.heads, shape.seqlen_q), randn(shape.kv_heads, shape.seqlen_k), randn(shape.kv_heads, shape.seqlen_k)


def empty_output(shape: Shape, layout: str = "bhnd", device=None):
    import torch

    phys = _physical(shape.batch, shape.heads, shape.seqlen_q, shape.head_dim, layout)
    return _logical(torch.empty(phys, dtype=torch_dtype(shape.dtype), device=device or "cuda"), layout)


class _Guarded:
    """A tensor inside a larger buffer: `guard` elements on each side, all pre-filled with the poison value."""

    def __init__(self, phys_shape, guard: int, dtype, device, layout: str | None):
        import torch

        numel = math.prod(phys_shape)
        self.guard = guard
        self.buffer = torch.empty(guard + numel + guard, dtype=dtype, device=device)
        inner = self.buffer[guard:guard + numel].view(phys_shape)
        self.tensor = _logical(inner, layout) if layout else inner

    def poison(self, value: float) -> None:
        self.buffer.fill_(value)

    def guard_damage(self, value: float) -> int:
        """Guard elements that no longer hold the poison."""
        import torch

        zones = torch.cat([self.buffer[:self.guard], self.buffer[self.buffer.numel() - self.guard:]])
        intact = torch.isnan(zones) if math.isnan(value) else zones == value
        return int((~intact).sum())


def sdpa_mask_kwargs(shape: Shape) -> dict:
    """SDPA's arguments for the shape's mask: is_causal (top-left), or torch's CausalBias for a lower-right shape
    (which runs FlashAttention's own lower-right mask where it can, else the efficient kernel, without
    materialising a mask; it chooses the kernel itself, whatever sdpa_kernel says)."""
    if shape.lower_right:
        from torch.nn.attention.bias import causal_lower_right

        return {"attn_mask": causal_lower_right(shape.seqlen_q, shape.seqlen_k)}
    return {"is_causal": shape.causal}


def _torch_sdpa(q, k, v, causal: bool, scale: float | None, causal_align: str = "upper_left"):
    import torch
    import torch.nn.functional as F

    # K/V heads go in as they are (enable_gqa): repeating them for a long decode cache would copy it G times
    gqa = q.shape[1] != k.shape[1]
    with torch.no_grad():
        if causal and causal_align == "lower_right":
            nq, nk = q.shape[2], k.shape[2]
            keep = torch.ones(nq, nk, dtype=torch.bool, device=q.device).tril(nk - nq)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=keep, scale=scale, enable_gqa=gqa)
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=gqa)


def check(build, shape: Shape, seed: int | None = None, layout: str = "bhnd", check_lse: bool = False,
          scale: float | None = None, device=None, causal_align: str | None = None) -> CheckResult:
    """Run `build` (a BuildResult or KernelRunner) on `shape` and judge it; see the module docstring.
    `causal_align`: the mask's alignment (default: the shape's own, space.Shape.causal_align).

    `device` defaults to the current CUDA device (another device only makes sense for a test double of the
    runner). Raises on CUDA errors (a fault poisons the context; the caller decides what that means).
    """
    import torch

    runner: KernelRunner = as_runner(build)
    causal_align = causal_align or shape.causal_align
    if runner.problem != shape.problem:
        raise ValueError(f"shape: the build is for {runner.problem.key}, the shape is {shape.problem.key}")
    if seed is None:
        seed = int.from_bytes(os.urandom(4), "little")
    device = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
    q, k, v = make_inputs(shape, layout, seed, device)

    ref_out, ref_lse = reference_attention(q, k, v, causal=shape.causal, scale=scale, causal_align=causal_align)
    torch_out = _torch_sdpa(q, k, v, shape.causal, scale, causal_align)
    # SDPA returns NaN for rows that see no key (lower-right with Nq > Nk); those rows say nothing of its precision
    torch_error = float(torch.nan_to_num((torch_out.float() - ref_out).abs(), nan=0.0).max())
    del torch_out

    # Guard zones one block of query rows long, in either layout's row stride (heads·head_dim covers both).
    rows = runner.layout.rows_per_block
    o_guard = rows * shape.heads * shape.head_dim
    o_buf = _Guarded(_physical(shape.batch, shape.heads, shape.seqlen_q, shape.head_dim, layout), o_guard,
                     torch_dtype(shape.dtype), device, layout)
    lse_buf = (_Guarded((shape.batch, shape.heads, shape.seqlen_q), -(-rows // 4) * 4, torch.float32, device, None)
               if check_lse else None)
    bufs = [b for b in (o_buf, lse_buf) if b is not None]

    def run(poison: float):
        for b in bufs:
            b.poison(poison)
        runner.run(q, k, v, o_buf.tensor, lse_buf.tensor if lse_buf else None, scale, causal_align)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        damage = sum(b.guard_damage(poison) for b in bufs)
        return [b.tensor.clone() for b in bufs], damage

    (out1, *lse1), damage1 = run(float("nan"))
    (out2, *lse2), damage2 = run(SENTINEL)

    written = out2 != SENTINEL
    unwritten = int((~written).sum())
    finite = torch.isfinite(out1) & written
    nan_count = int((written & ~(torch.isfinite(out1) & torch.isfinite(out2))).sum())
    both = finite & torch.isfinite(out2)
    nondeterministic = int((both & (out1 != out2)).sum())
    diff = (out1.float() - ref_out).abs()
    max_error = float(torch.where(finite, diff, torch.zeros_like(diff)).max()) if diff.numel() else 0.0

    lse_error = None
    if check_lse:
        lse_written = lse2[0] != SENTINEL
        unwritten += int((~lse_written).sum())
        # a row that sees no key has lse = -inf in the reference, and must have exactly that in ours
        empty_row = torch.isneginf(ref_lse)
        empty_ok = empty_row & torch.isneginf(lse1[0]) & torch.isneginf(lse2[0])
        nan_count += int((lse_written & ~empty_ok & ~(torch.isfinite(lse1[0]) & torch.isfinite(lse2[0]))).sum())
        lse_ok = torch.isfinite(lse1[0]) & lse_written & ~empty_row
        nondeterministic += int((lse_ok & torch.isfinite(lse2[0]) & (lse1[0] != lse2[0])).sum())
        lse_diff = (lse1[0] - ref_lse).abs()
        lse_error = float(torch.where(lse_ok, lse_diff, torch.zeros_like(lse_diff)).max())

    floor = ULP_AT_ONE[shape.dtype]
    tolerance = TOLERANCE_FACTOR * max(min(torch_error, TORCH_ERROR_CAP_ULPS * floor), floor)
    out_of_bounds = damage1 + damage2

    problems = []
    if unwritten:
        problems.append(f"{unwritten} elements never written")
    if nan_count:
        problems.append(f"{nan_count} non-finite values produced")
    if out_of_bounds:
        problems.append(f"{out_of_bounds} guard elements overwritten (stores out of bounds)")
    if nondeterministic:
        problems.append(f"{nondeterministic} elements differ between two identical runs (race?)")
    if not max_error <= tolerance:
        problems.append(f"max error {max_error:.3g} > tolerance {tolerance:.3g}")
    if lse_error is not None and not lse_error <= LSE_TOLERANCE:
        problems.append(f"lse error {lse_error:.3g} > {LSE_TOLERANCE:g}")
    ok = not problems
    summary = (f"max error {max_error:.3g} vs torch {torch_error:.3g} (tolerance {tolerance:.3g})"
               + (f", lse error {lse_error:.3g}" if lse_error is not None else ""))
    message = summary if ok else "; ".join(problems) + f" [{summary}]"
    return CheckResult(ok, max_error, torch_error, tolerance, nan_count, unwritten, message, out_of_bounds,
                       nondeterministic, lse_error, seed, layout)
