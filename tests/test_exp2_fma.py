"""The wgmma family's exp2 on the FMA pipe (kernels/sm90/ptx.cuh exp2_fma, axis exp2_fma): its steps evaluated in
float32 on the CPU, with the coefficients read from the kernel source, over every input the kernel gives it."""
from __future__ import annotations

import functools
import re
from pathlib import Path

import numpy as np
import pytest

import space

PTX = Path(__file__).resolve().parent.parent / "kernels" / "sm90" / "ptx.cuh"
F32 = np.float32


@functools.lru_cache(maxsize=None)
def coefficients() -> tuple[F32, F32, F32]:
    text = PTX.read_text()
    found = dict(re.findall(r"kExp2(C[123]) = ([0-9.eE+-]+)f", text))
    assert set(found) == {"C1", "C2", "C3"}, f"{PTX}: kExp2C1..3 not found"
    return F32(found["C1"]), F32(found["C2"]), F32(found["C3"])


def fmaf(a, b, c):
    """One rounding, as the FFMA: the float32 product is exact in float64, the sum rounds once more to float32
    (a double rounding that can differ from the FFMA's in the last bit, far below the tolerances here)."""
    return (a.astype(np.float64) * b + c).astype(F32)


def exp2_fma(x: np.ndarray) -> np.ndarray:
    c1, c2, c3 = coefficients()
    shifter = F32(12582912.0)
    x = np.maximum(x.astype(F32), F32(-126.0))
    t = (x + shifter).astype(F32)
    f = (x - (t - shifter).astype(F32)).astype(F32)
    p = fmaf(fmaf(fmaf(np.full_like(f, c3), f, c2), f, c1), f, F32(1.0))
    bits = (t.view(np.uint32).astype(np.uint64) << np.uint64(23)) + p.view(np.uint32)
    return (bits % (1 << 32)).astype(np.uint32).view(F32)


def test_relative_error_over_the_whole_range_is_below_half_an_fp16_rounding():
    x = np.concatenate([np.linspace(-126.0, 0.0, 4_000_001, dtype=F32),
                        F32([0.0, -0.0, -1e-30, -0.5, -0.49999997, -0.5000001, -1.5, -125.5, -126.0])])
    got = exp2_fma(x).astype(np.float64)
    want = np.exp2(x.astype(np.float64))
    rel = np.abs(got - want) / want
    assert rel.max() < 1.25e-4  # fp16's rounding of P: 2^-12 = 2.4e-4
    assert np.all(np.isfinite(got)) and np.all(got > 0)


def test_the_row_max_gives_exactly_one_and_the_results_are_monotonic():
    assert exp2_fma(F32([0.0]))[0] == F32(1.0)
    x = np.linspace(-20.0, 0.0, 200_001, dtype=F32)
    assert np.all(np.diff(exp2_fma(x).astype(np.float64)) >= 0)


def test_scores_far_below_the_max_stay_tiny_and_a_small_positive_rounding_stays_near_one():
    # below -126 the input is clamped: about 2^-126 where MUFU.EX2 (ftz) gives 0, nothing a row sum of >= 1 notices
    assert exp2_fma(F32([-1000.0, -127.0]))[0] <= F32(2.0 ** -125)
    # fmaf(score, scale, -max) can land a hair above 0 for the max element
    assert exp2_fma(F32([1e-7]))[0] == pytest.approx(1.0, abs=1e-6)


def test_the_axis_sets_every_fourth_exponential_or_none():
    problem = space.Problem(head_dim=128, dtype="fp16", causal=False)
    base = space.default_config(problem, space.get_arch("sm_90"))
    assert base.exp2_fma == "none"
    assert space.defines(base, problem)["AT_EXP2_FMA_EVERY"] == 0
    assert space.defines(base.replace(exp2_fma="quarter"), problem)["AT_EXP2_FMA_EVERY"] == 4
