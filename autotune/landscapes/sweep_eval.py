"""The lean evaluation `autotune sweep` runs in the worker's child process: same discipline, less GPU time.

A sweep measures every valid config of a shape (hundreds), so each evaluation must cost a fraction of a second
of GPU time. Compared with measure.evaluate (the search's, ~0.3-1 s per config):

* correctness: autotune.measure.check on a small problem with the same compile-time Problem (batch 1, at most 2 KV
  heads, seqlen ≤ CHECK_SEQLEN and not a multiple of any tile, so the tail masking is exercised), plus the full
  shape when its fp32 reference is cheap (B·H·Nq·Nk ≤ FULL_CHECK_MAX_SCORES). Kernels are compiled for the
  Problem, not the shape, so a config that is right on the small problem differs on the full one only through
  grid size and sequence length — which the search's own full-shape check covers for the configs it keeps.
* timing: autotune.measure.timing.bench as everywhere (warm-up, L2 flush before each rep, CUDA events, median and
  p20/p80), with WARMUP_MS / REP_MS instead of 25 / 100 ms; the spread (p80 - p20) is recorded per row so a
  reader sees how much each figure can be trusted. Inputs are allocated once per shape and reused.

Returns an autotune.measure.child_process.EvalOutcome whose `extra` carries p20_ms, p80_ms and n_reps for the landscape.
"""
from __future__ import annotations

import zlib

from space import Shape

from ..launch import loader
from ..measure import check, timing
from ..measure import evaluate as measure
from ..measure.child_process import EvalOutcome

WARMUP_MS = 10.0
REP_MS = 40.0
CHECK_SEQLEN = 1000            # not a multiple of 64/80/96/112/128/176/192: partial tiles get checked
FULL_CHECK_MAX_SCORES = 1 << 26  # the reference's fp32 score matrix B·H·Nq·Nk ≤ 256 MiB: check the full shape too

MEASUREMENT = {
    "evaluator": "autotune.landscapes.sweep_eval:evaluate",
    "check": f"autotune.measure.check (fp32 reference, NaN/sentinel-poisoned output, guard zones) on batch 1, ≤ 2 KV "
             f"heads, seqlen ≤ {CHECK_SEQLEN}; plus the full shape when B·H·Nq·Nk ≤ {FULL_CHECK_MAX_SCORES}",
    "timing": "autotune.measure.timing.bench: warm-up, L2 flushed before every rep, CUDA events per rep; median and "
              "p20/p80 of the reps",
    "warmup_ms": WARMUP_MS,
    "rep_ms": REP_MS,
}


def check_shapes(shape: Shape) -> list[Shape]:
    """The shapes a config is checked on: a small one of the same Problem, then the full one if cheap."""
    group = shape.heads // shape.kv_heads
    kv = min(shape.kv_heads, 2)
    n = min(shape.seqlen_q, CHECK_SEQLEN)
    nk = max(1, round(shape.seqlen_k * n / shape.seqlen_q))  # keeps Nq:Nk (causal alignment depends on it)
    small = Shape(batch=1, heads=group * kv, kv_heads=kv, seqlen_q=n, seqlen_k=nk, head_dim=shape.head_dim,
                  dtype=shape.dtype, causal=shape.causal)
    out = [small]
    if shape != small and shape.batch * shape.heads * shape.seqlen_q * shape.seqlen_k <= FULL_CHECK_MAX_SCORES:
        out.append(shape)
    return out


_inputs: dict = {}


def _timing_inputs(shape: Shape):
    """q, k, v, o for timing, allocated once per shape (one shape at a time is kept)."""
    if shape not in _inputs:
        _inputs.clear()
        q, k, v = check.make_inputs(shape, "bhnd", seed=1)
        _inputs[shape] = (q, k, v, check.empty_output(shape, "bhnd"))
    return _inputs[shape]


def evaluate(build, shape: Shape):
    key = build.config.key
    blocks = None
    try:
        runner = loader.as_runner(build)
        lay = runner.layout
        kernel = runner.kernel()
        blocks = kernel.blocks_per_sm(lay.threads, lay.smem_dynamic)
        max_error = 0.0
        seed = zlib.crc32(key.encode())  # reproducible, and different inputs for different configs
        for s in check_shapes(shape):
            result = check.check(runner, s, seed=seed)  # with s.causal_align, check()'s default
            max_error = max(max_error, result.max_error)
            if not result.ok:
                return EvalOutcome("wrong", f"{s.key}: {result.message}", max_error=result.max_error,
                                   blocks_per_sm=blocks)
        q, k, v, o = _timing_inputs(shape)
        t = timing.bench(runner.prepare(q, k, v, o, causal_align=shape.causal_align), warmup_ms=WARMUP_MS, rep_ms=REP_MS)
        return EvalOutcome("complete", "", shape.tflops(t.median_ms / 1e3), t.median_ms, t.p80_ms - t.p20_ms,
                           max_error, blocks, extra={"p20_ms": t.p20_ms, "p80_ms": t.p80_ms, "n_reps": t.n})
    except Exception as e:  # a bad kernel is a result, not an exception
        _inputs.clear()
        return EvalOutcome("crashed", f"{type(e).__name__}: {e}", blocks_per_sm=blocks,
                           context_lost=not measure.context_alive())


def warmup() -> None:
    """Run by the worker before its first request: imports and the CUDA context are paid here, not inside the
    first evaluation's (short) timeout."""
    import importlib

    import torch

    for name in ("measure.check", "launch.loader", "measure.timing", "launch.tma"):  # what evaluate() and the
        importlib.import_module(f"autotune.{name}")                                 # kernels' launches import

    torch.cuda.init()
    torch.empty(1, device="cuda")
    loader.driver()


def sdpa_baselines(shape: Shape):
    """torch SDPA's flash, cuDNN and memory-efficient backends, timed the same lean way (None when refused)."""
    # SDPA only: a landscape's header compares configs with torch; FlashAttention-4 (a JIT compile per shape) is
    # timed by `autotune bench`, the search's finale and benchmarks/peers_table.py.
    return measure.sdpa_baselines(shape, ("flash", "cudnn", "efficient"), warmup_ms=WARMUP_MS, rep_ms=REP_MS)


__all__ = ["CHECK_SEQLEN", "FULL_CHECK_MAX_SCORES", "MEASUREMENT", "REP_MS", "WARMUP_MS", "check_shapes",
           "evaluate", "sdpa_baselines", "warmup"]
