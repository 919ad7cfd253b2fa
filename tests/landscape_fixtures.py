"""Synthetic landscapes for the replay and comparison tests: real valid configs from space/, made-up numbers.

The numbers are a deterministic function of the config with a single clear optimum, plus a few rows of every
failure status, so tests can assert exactly what a replay must return.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import space
from autotune.landscapes.landscape_file import Landscape, Row, make_header

ARCH = space.get_arch("sm_90")
# fp16 d128: 756 valid wgmma configs on sm_90 (252 per scheduler). A small batch keeps nothing here expensive
# (no GPU is touched).
SHAPE = space.Shape(batch=1, heads=4, seqlen_q=512, head_dim=128)
GPU = "Synthetic GPU"
# head_dim 256: 84 valid wgmma configs (28 per scheduler), small enough to search
# exhaustively in a test.
SMALL_SHAPE = space.Shape(batch=1, heads=2, seqlen_q=256, head_dim=256)


def _jitter(key: str) -> float:
    """A stable pseudo-random number in [0, 1) per config (the landscape is not a clean product of axes)."""
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) / 2**32


def fake_tflops(config: space.Config) -> float:
    d = config.as_dict()
    # The optimum is deliberately not the heuristic default (bc 128, o_store smem), which the search tries first.
    score = 200.0 + 40 * (d["consumer_wgs"] == 2) + 25 * (d["bc"] == 112) + 10 * (d["bc"] in (96, 128))
    score += 15 * d["overlap"] + 12 * (d["pingpong"] and d["overlap"]) + 6 * (d["stages"] == 4)
    score += 4 * (d["o_store"] == "direct") + 3 * d["setmaxnreg"] - 5 * (d["min_blocks"] - 1)
    # Axes added later (the scheduler, o_rescale) keep the landscape as it was: grid configs jitter by their key from before
    # the axis, the other schedulers sit more than the jitter's range below them.
    scheduler = d.get("scheduler", "grid")
    score -= {"grid": 0, "lpt": 25, "persistent": 50}[scheduler]
    score -= {"after": 0, "before": 50, "fused": 60}[d.get("o_rescale", "after")]
    key = _key_before_tail_split(config).removesuffix(",o_rescale=after").removesuffix(",scheduler=grid")
    return round(score + 20 * _jitter(key), 3)


def _key_before_tail_split(config: space.Config) -> str:
    """The config's key as it was before the tail_split axis (added after the decode axes), for a config at its
    default: the jitter, and so the synthetic landscapes, stay what they were."""
    return config.key.replace(",tail_split=0,", ",")


def failure_of(config: space.Config) -> str | None:
    """A few configs of each failure kind, chosen by the jitter so they are spread over the space."""
    j = _jitter("status:" + _key_before_tail_split(config))
    if config.bc == 192 and config.stages == 4:
        return "spilled"
    if j < 0.02:
        return "compile_error"
    if j < 0.04:
        return "wrong"
    if j < 0.05:
        return "crashed"
    if j < 0.055:
        return "timeout"
    return None


def row_for(config: space.Config, shape: space.Shape = SHAPE, status: str | None = None) -> Row:
    status = status or failure_of(config) or "complete"
    if status == "compile_error":
        return Row(config.key, status, reason="flash_fwd.cu(1): error: synthetic compile error")
    report = dict(registers=168, spill_stores=0, spill_loads=0, stack_bytes=0, smem_static=0, compile_seconds=0.7,
                  cubin_hash=hashlib.sha256(config.key.encode()).hexdigest()[:16])
    if status == "spilled":
        return Row(config.key, status, **{**report, "spill_stores": 64, "spill_loads": 64, "registers": 255},
                   reason="spills registers under --spill-policy prune")
    if status in ("wrong", "crashed", "timeout"):
        return Row(config.key, status, max_error=1.5 if status == "wrong" else None, reason=f"synthetic {status}",
                   **report)
    tflops = fake_tflops(config)
    ms = shape.flops / (tflops * 1e12) * 1e3
    return Row(config.key, status, tflops=tflops, median_ms=ms, p20_ms=ms * 0.995, p80_ms=ms * 1.005, n_reps=20,
               max_error=1e-3, blocks_per_sm=1, **report)


def prefill_slice(configs) -> list:
    """The configs with the decode axes at their defaults (one split, heads unpacked), 2-4 stages, the softmax's
    reductions as one chain, every exponential on MUFU and no tail split: the space as it was before those axes, about a tenth of today's. The synthetic
    landscapes hold this slice, which keeps every replay, drill and simulation of the search machinery at the cost
    it had; a replay samples only the axis values its landscape holds, so nothing else is ever asked."""
    return [c for c in configs
            if getattr(c, "kv_splits", 1) == 1 and not getattr(c, "pack_gqa", False) and getattr(c, "stages", 2) <= 4
            and getattr(c, "softmax_reduce", "chain") == "chain" and getattr(c, "exp2_fma", "none") == "none"
            and getattr(c, "o_rescale", "after") != "fused" and not getattr(c, "tail_split", False)]


def synthetic_landscape(shape: space.Shape = SHAPE, families=("wgmma",), limit: int | None = None,
                        path: Path | None = None, statuses: dict | None = None) -> Landscape:
    """Every valid config of `families` in the prefill slice (or the first `limit`), statuses from failure_of
    unless `statuses` ({config key: status}) says otherwise."""
    configs = prefill_slice(space.valid_configs(shape.problem, ARCH, families))
    header = make_header(shape, ARCH, families, gpu_name=GPU, kernel_source_hash="0" * 64, nvcc_version="13.0",
                         n_valid=len(configs), baselines={"sdpa_flash": 150.0, "sdpa_cudnn": 250.0},
                         note="synthetic, made by tests/landscape_fixtures.py")
    landscape = Landscape(header)
    for c in configs[:limit]:
        landscape.add(row_for(c, shape, (statuses or {}).get(c.key)))
    if path is not None:
        landscape.save(path)
    return landscape


def small_landscape(path: Path | None = None) -> Landscape:
    """SMALL_SHAPE, one config of each failure status (the first five by key), every other config complete."""
    keys = sorted(c.key for c in prefill_slice(space.valid_configs(SMALL_SHAPE.problem, ARCH, ("wgmma",))))
    failures = dict(zip(keys, ("compile_error", "spilled", "wrong", "crashed", "timeout")))
    statuses = {k: failures.get(k, "complete") for k in keys}
    return synthetic_landscape(SMALL_SHAPE, path=path, statuses=statuses)
