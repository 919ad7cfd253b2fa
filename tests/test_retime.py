"""The search's finale (autotune/search/retime.py): finalists re-timed interleaved in rounds, a winner only when it
is ahead beyond the measured noise, a tie kept as the simplest config, the spread stored with the winner.

An in-process builder and a scripted evaluator (no nvcc, no GPU, no child process): each config's rounds answer
the TFLOPS the test wrote down, so the order of calls and every decision can be asserted exactly.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import pytest

import space
from autotune.build.builder import BuildResult
from autotune.build.ptxas import BuildReport
from autotune.measure.child_process import EvalOutcome
from autotune.search import retime
from autotune.store.best_table import BestStore

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


A, B, C = near_default(3), near_default(1), near_default(2)


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
class Evaluator:
    """Answers each config's next round from `script` ({config: [TFLOPS or a failure status, ...]})."""

    script: dict
    calls: list = field(default_factory=list)

    def evaluate(self, build, shape):
        config = build.config
        answer = self.script[config][sum(1 for c in self.calls if c == config)]
        self.calls.append(config)
        if isinstance(answer, str):
            return EvalOutcome(answer, f"scripted {answer}")
        t = ms(answer)
        return EvalOutcome("complete", "", answer, t, t * 0.01, 1e-3, 1)

    def baselines(self, shape):
        return {"sdpa_flash": 100.0}


def run(script: dict, rounds: int = 3, arch=ARCH):
    trials = [Trial(i, c, float(script[c][0]) if not isinstance(script[c][0], str) else 1.0)
              for i, c in enumerate(script)]
    ev = Evaluator(script)
    retimed, baselines, notes = retime.retime_and_baselines(trials, Builder(), ev, SHAPE, rounds=rounds, arch=arch,
                                                            log=lambda _: None)
    return retimed, ev, notes


def test_finalists_are_timed_round_robin_in_one_session():
    retimed, ev, _ = run({A: [500, 501, 502], B: [480, 481, 482], C: [470, 471, 472]})
    assert ev.calls == [A, B, C, A, B, C, A, B, C]
    assert [len(r.rounds) for r in retimed] == [3, 3, 3]
    a = retimed[0]
    assert a.outcome.tflops == 501 and a.band == (500, 502)
    assert a.outcome.spread_ms == pytest.approx(ms(500) - ms(502))  # slowest minus fastest round, in ms
    assert a.outcome.time_ms == pytest.approx(ms(501))


def test_a_finalist_that_fails_a_round_is_out_and_not_timed_again():
    retimed, ev, notes = run({A: [500, 501, 502], B: [520, "crashed", 520], C: [470, 471, 472]})
    assert ev.calls == [A, B, C, A, B, C, A, C]
    assert retimed[1].outcome.status == "crashed" and not retimed[1].ok
    assert any("#1 failed its re-timing (crashed" in n for n in notes)
    assert retime.pick(retimed).config == A  # B's one fast round does not make it the winner


def test_a_winner_ahead_beyond_noise():
    retimed, _, _ = run({A: [500, 503, 502], B: [495, 497, 499], C: [470, 471, 472]})
    v = retime.decide(retimed)
    assert not v.tie and v.chosen.config == A and v.fastest.config == A and v.runner_up.config == B
    assert v.lead == pytest.approx(502 / 497 - 1)
    text = v.describe()
    assert "winner #0 502.0 TFLOPS (500.0-503.0)" in text and "1.01 % ahead of #1" in text and "beyond noise" in text


def test_overlapping_rounds_are_a_tie_and_the_default_is_kept():
    # A is fastest by its median, but its slowest round (496) is below D's fastest (497): no clear winner.
    retimed, _, _ = run({A: [496, 503, 502], DEFAULT: [495, 497, 496], C: [470, 471, 472]})
    v = retime.decide(retimed)
    assert v.tie and v.fastest.config == A
    assert {r.config for r in v.tied} == {A, DEFAULT}  # C is far below: not tied
    assert v.chosen.config == DEFAULT and retime.pick(retimed).config == DEFAULT
    assert "TIE within noise" in v.describe() and "its family's default" in v.describe()


def test_a_tie_without_the_default_keeps_the_config_nearest_to_it():
    retimed, _, _ = run({A: [500, 504, 503], C: [501, 502, 499], B: [499, 501, 500]})
    v = retime.decide(retimed)
    assert v.tie and len(v.tied) == 3 and v.fastest.config == A
    assert v.chosen.config == B  # one axis from the default; C two, A three
    assert "1 axes from its family's default" in v.describe()


def test_without_the_arch_a_tie_keeps_the_fastest():
    retimed, _, _ = run({A: [500, 504, 503], B: [499, 501, 500]}, arch=None)
    v = retime.decide(retimed)
    assert v.tie and v.chosen.config == A


def test_one_round_uses_the_evaluations_own_spread():
    # one round each: 1 % p20..p80 spread of the reps, medians 0.2 % apart → a tie; 5 % apart → a winner
    close, _, _ = run({A: [500], B: [499]}, rounds=1)
    assert retime.decide(close).tie
    apart, _, _ = run({A: [500], B: [475]}, rounds=1)
    assert not retime.decide(apart).tie


def test_nothing_completes():
    retimed, _, _ = run({A: ["wrong"], B: ["timeout"]})
    v = retime.decide(retimed)
    assert v.chosen is None and retime.pick(retimed) is None and "nothing to store" in v.describe()


def test_the_stored_row_keeps_the_median_and_the_spread_of_the_rounds(tmp_path):
    retimed, _, _ = run({A: [500, 503, 502], B: [470, 471, 472]})
    best = retime.pick(retimed)
    with BestStore(f"sqlite:///{tmp_path / 'best.db'}") as store:
        retime.store_best(store, best, SHAPE, "Fake H200", ARCH, "study", {"kernel_source_hash": "h"})
        row = store.lookup("Fake H200", "sm_90", SHAPE)
    assert row.config_key == A.key and row.tflops == pytest.approx(502)
    assert row.spread_ms == pytest.approx(ms(500) - ms(503))
    assert row.time_ms == pytest.approx(ms(502))


def test_as_attr_records_rounds_and_band():
    retimed, _, _ = run({A: [500, 503, 502], B: [470, "wrong", 472]})
    a, b = (r.as_attr() for r in retimed)
    assert a["rounds_tflops"] == [500, 503, 502] and (a["low_tflops"], a["high_tflops"]) == (500, 503)
    assert a["default_distance"] == 3
    assert b["status"] == "wrong" and b["low_tflops"] is None and b["rounds_tflops"] == [470, None]


def test_rounds_must_be_positive():
    with pytest.raises(ValueError, match="rounds: expected a count ≥ 1"):
        retime.retime_and_baselines([], Builder(), Evaluator({}), SHAPE, rounds=0)
