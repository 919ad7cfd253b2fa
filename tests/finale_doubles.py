"""Finalists without nvcc or a GPU, for the finale's tests and benchmarks/finale_rule.py: trials as the finale reads
them, an in-process builder, and a synthetic noisy GPU whose configs have known true speeds.

    NoisyGPU   each evaluation of config c: its true TFLOPS × exp(N(0, σ)), drawn from a generator seeded by
               (seed, c, the how-many-th evaluation of c), so a session is reproducible whatever order it asks in
    sessions   the finale (retime.retime_and_baselines + decide) over many seeded sessions of the same finalists
"""
from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass, field

import space
from autotune.build.builder import BuildResult
from autotune.build.ptxas import BuildReport
from autotune.measure.child_process import EvalOutcome
from autotune.search import retime

ARCH = space.get_arch("sm_90")
SHAPE = space.Shape(batch=1, heads=2, seqlen_q=256, head_dim=256)
DEFAULT = space.default_config(SHAPE.problem, ARCH, "wgmma")
VALID = sorted(space.valid_configs(SHAPE.problem, ARCH, ("wgmma",)), key=lambda c: c.key)


def near_default(n_axes: int) -> space.Config:
    """A valid config that differs from the default in exactly n_axes axes."""
    for c in VALID:
        if retime.default_distance(c, SHAPE, ARCH) == n_axes:
            return c
    raise AssertionError(f"no valid config {n_axes} axes from the default")


def ms(tflops: float) -> float:
    return SHAPE.flops / (tflops * 1e12) * 1e3


@dataclass
class Trial:  # what retime reads of an Optuna FrozenTrial
    number: int
    config: space.Config
    value: float

    @property
    def user_attrs(self) -> dict:
        return {"config_key": self.config.key}


class Builder:
    def build(self, items, progress=None):
        return [BuildResult(c, p, ARCH, ok=True, cubin_path=None, report=BuildReport(168, 0, 0, 0, 0, 0.5),
                            error=None, cached=True, key=c.key, cubin_hash=hashlib.sha256(c.key.encode()).hexdigest())
                for c, p in items]


@dataclass
class NoisyGPU:
    """Module docstring; `calls` lists the configs evaluated, in order."""

    truth: dict
    sigma: float
    seed: int
    calls: list = field(default_factory=list)

    def evaluate(self, build, shape):
        config = build.config
        n = sum(1 for c in self.calls if c == config)
        self.calls.append(config)
        rng = random.Random(f"{self.seed}:{config.key}:{n}")
        tflops = self.truth[config] * math.exp(rng.gauss(0, self.sigma))
        t = ms(tflops)
        return EvalOutcome("complete", "", tflops, t, t * 0.01, 1e-3, 1)

    def baselines(self, shape):
        return {}


def sessions(truths: list[float], sigma: float, seeds: int, max_rounds: int = 8, configs=None, rounds: int = 3):
    """(verdict, gpu, truth by config) for each seeded session of these finalists, trials in rank order."""
    configs = configs or [near_default(n) for n in range(len(truths))]
    truth = dict(zip(configs, truths))
    out = []
    for seed in range(seeds):
        gpu = NoisyGPU(truth, sigma, seed)
        trials = [Trial(i, c, t) for i, (c, t) in enumerate(zip(configs, truths))]
        retimed, _, _ = retime.retime_and_baselines(trials, Builder(), gpu, SHAPE, rounds=rounds,
                                                    max_rounds=max_rounds, arch=ARCH, log=lambda _: None)
        out.append((retime.decide(retimed, max_rounds), gpu, truth))
    return out
