"""A small, realistic study for the report tests, written with Optuna directly (no GPU, no search pipeline).

Configs come from space/ (the mma_sync axes and their domains, d128 fp16 on sm_90); outcomes and attrs follow
docs/CONTRACTS.md and autotune/search/verdicts.py: `invalid` configs are PRUNED with the rules they break, builds whose
accumulators exceed the launch-bounds register cap are `spilled`, a few built configs are `wrong`, `crashed`
or `timeout`, the rest `complete` with value = TFLOPS, and a few trials repeat an earlier config
(`duplicate_of`, result copied). Everything is a deterministic function of the seed; `build` returns what the
tests check against.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import random

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState, create_trial

import space
from space.mma_sync import accumulator_registers, register_cap

SHAPE = space.Shape(batch=4, heads=16, seqlen_q=4096, head_dim=128, dtype="fp16", causal=False)
ARCH = space.get_arch("sm_90")
BASELINES = {"sdpa_flash": 342.0, "sdpa_cudnn": 588.0, "sdpa_efficient": 173.0}
FAILURES = {"wrong": "max error 0.31 > tolerance 0.02", "crashed": "CUDA error: an illegal memory access",
            "timeout": "no result within 120 s"}
STUDY_NAME = "report-fixture-b4-h16-n4096-d128-fp16-full"
REPEATS = 3  # trials at the end that repeat earlier configs


def fake_ptxas(config: space.Config, problem: space.Problem) -> tuple[int, int]:
    """(registers, spill bytes each way) a build would plausibly report: accumulators plus some overhead,
    spilling what does not fit under the __launch_bounds__ cap."""
    lay = space.layout(config, problem)
    need = accumulator_registers(config, problem) + 40  # addresses, softmax state, loop counters
    cap = register_cap(lay.threads, config.min_blocks)
    return min(need, cap), max(0, need - cap) * 8


def _sample(family, problem, rng, n_valid, n_invalid) -> list[tuple[space.Config, bool]]:
    """Distinct random points of the cross product (enumerating all ~47k of them would take seconds)."""
    picks: dict[space.Config, bool] = {}
    want = {True: n_valid, False: n_invalid}
    while want[True] or want[False]:
        config = space.Config.make(family.name, **{a.name: rng.choice(a.values) for a in family.axes})
        ok = space.is_valid(config, problem, ARCH)
        if config not in picks and want[ok]:
            picks[config] = ok
            want[ok] -= 1
    return list(picks.items())


def _tflops(config: space.Config, rng: random.Random) -> float:
    """A made-up but plausible landscape: big Br, Bc 64, P in registers and one min block win."""
    base = 180.0 + 0.5 * config.br + {32: 10.0, 64: 60.0, 128: 30.0}[config.bc]
    base += 40.0 if config.p_path == "regs" else 0.0
    base -= 15.0 * (config.min_blocks - 1) + 5.0 * config.loader_warps
    return round(base + rng.uniform(-10.0, 10.0), 3)


def _outcome(config: space.Config, ok: bool, clean_builds: int, rng: random.Random) -> tuple[str, dict, float | None]:
    problem = SHAPE.problem
    lay = space.layout(config, problem)
    attrs = {"config_key": config.key, "threads": lay.threads, "smem_bytes": lay.smem_total}
    if not ok:
        return "invalid", {**attrs, "reason": ", ".join(v.rule for v in space.violations(config, problem, ARCH))}, None
    registers, spill = fake_ptxas(config, problem)
    attrs.update(registers=registers, spill_stores=spill, spill_loads=spill, stack_bytes=spill,
                 compile_seconds=round(rng.uniform(2, 9), 2), cubin_hash=hashlib.sha256(config.key.encode()).hexdigest())
    if spill:
        return "spilled", {**attrs, "reason": f"spills registers ({spill} B stores, {spill} B loads, {registers} "
                                              "registers) under --spill-policy prune"}, None
    if clean_builds % 3 == 0:  # every third clean build fails, in turn wrong / crashed / timeout
        status = tuple(FAILURES)[(clean_builds // 3 - 1) % 3]
        return status, {**attrs, "reason": FAILURES[status]}, None
    value = _tflops(config, rng)
    time_ms = SHAPE.flops / (value * 1e12) * 1e3
    attrs.update(tflops=value, time_ms=round(time_ms, 5), time_spread_ms=round(time_ms * 0.01, 5), max_error=1e-3,
                 blocks_per_sm=config.min_blocks, reason="")
    return "complete", attrs, value


def build(storage: str, name: str = STUDY_NAME, n_valid: int = 40, n_invalid: int = 12, seed: int = 7,
          shape: space.Shape = SHAPE) -> dict:
    """Write the study into `storage`; returns the figures the tests expect."""
    rng = random.Random(seed)
    family = space.get_family("mma_sync")
    picks = _sample(family, SHAPE.problem, rng, n_valid, n_invalid)

    study = optuna.create_study(storage=storage, study_name=name, direction="maximize")
    for key, value in {"shape": dataclasses.asdict(shape), "arch": ARCH.name, "gpu_name": "NVIDIA H200",
                       "baselines": BASELINES, "kernel_source_hash": "0" * 64, "nvcc_version": "13.0"}.items():
        study.set_user_attr(key, value)

    dists = {"family": CategoricalDistribution((family.name,))}
    dists.update({a.name: CategoricalDistribution(a.values) for a in family.axes})
    start = dt.datetime(2026, 11, 29, 12, 0, 0)
    expected = {"status": {}, "complete": {}, "registers": {}, "threads": {}, "params": {}, "repeats": {}}
    trials, clean_builds = [], 0

    def add(number, params, status, attrs, value):
        state = {"complete": TrialState.COMPLETE}.get(status, TrialState.PRUNED)  # as autotune/search/verdicts.py tells
        t0 = start + dt.timedelta(seconds=30 * number)
        trial = create_trial(params=params, distributions=dists, value=value, state=state,
                             user_attrs={**attrs, "status": status})
        trial.datetime_start, trial.datetime_complete = t0, t0 + dt.timedelta(seconds=20)
        trials.append(trial)

    for number, (config, ok) in enumerate(picks):
        if ok and not fake_ptxas(config, SHAPE.problem)[1]:
            clean_builds += 1
        status, attrs, value = _outcome(config, ok, clean_builds, rng)
        add(number, config.as_dict(), status, attrs, value)
        expected["status"][number] = status
        expected["params"][number] = config.as_dict()
        if value is not None:
            expected["complete"][number] = value
        if "registers" in attrs:
            expected["registers"][number] = attrs["registers"]
            expected["threads"][number] = attrs["threads"]
    # The sampler proposing configs it already tried: the search copies the earlier result (trial.reused).
    complete, spilled = sorted(expected["complete"]), [n for n, s in expected["status"].items() if s == "spilled"]
    for original in complete[:REPEATS - 1] + spilled[:1]:
        number = len(trials)
        earlier = trials[original]
        add(number, dict(earlier.params), earlier.user_attrs["status"],
            {**earlier.user_attrs, "duplicate_of": original}, earlier.value)
        expected["repeats"][number] = original
    study.add_trials(trials)
    expected.update(name=name, n_trials=len(trials), baselines=BASELINES, first=start,
                    last=start + dt.timedelta(seconds=30 * (len(trials) - 1) + 20))
    return expected
