"""Replay with noise (autotune/landscapes/replay_noise.py): each replayed evaluation draws its figure from the
landscape's recorded re-measurement sessions, seeded, so the finale can tie as on a GPU.

Synthetic landscape (tests/landscape_fixtures.py) with two made-up sessions recorded on its two best configs.
"""
from __future__ import annotations

import math
import statistics

import pytest

from autotune.landscapes import landscape_file as landscape_mod
from autotune.landscapes import noise
from autotune.landscapes.replay import ReplayBuilder, ReplayEvaluator
from autotune.landscapes.replay_noise import ReplayNoise
from autotune.measure.child_process import EvalOutcome
from autotune.search import retime
from autotune.search.loop import SearchOptions, run_search
from finale_doubles import Trial
from landscape_fixtures import SMALL_SHAPE, small_landscape


def outcome(tflops: float) -> EvalOutcome:
    ms = SMALL_SHAPE.flops / (tflops * 1e12) * 1e3
    return EvalOutcome("complete", "", tflops, ms, ms * 0.01, 1e-3, 1)


def with_sessions(rounds_by_rank: list[list[list[float]]]):
    """The small landscape with len(rounds_by_rank[0]) sessions: the k-th best row gets rounds_by_rank[k][s] in
    session s (TFLOPS as a fraction of the best row's recorded figure)."""
    ls = landscape_mod.loads(landscape_mod.dumps(small_landscape()))
    top = noise.top_rows(ls, len(rounds_by_rank))
    for s in range(len(rounds_by_rank[0])):
        sid = noise.new_session(ls, gpu_name="Fake H200", kernel_source_hash="s" * 64, nvcc_version="13.0",
                                evaluator="fake", rounds=3)["id"]
        for row, sessions in zip(top, rounds_by_rank):
            noise.record(ls, sid, row.config_key, [outcome(top[0].tflops * f) for f in sessions[s]])
    return landscape_mod.loads(landscape_mod.dumps(ls)), top


# each row: its rounds in session 1, in session 2 (the best row's recorded figure = 1)
OVERLAPPING = [[[1.00, 0.98, 1.02], [0.99, 1.01, 0.97]],
               [[0.99, 1.01, 0.985], [1.00, 0.975, 1.015]]]
APART = [[[1.00, 0.995, 1.005], [1.00, 1.004, 0.996]],
         [[0.93, 0.935, 0.925], [0.93, 0.934, 0.926]]]


def retimed_top(ls, rows, evaluator, max_rounds=8):
    trials = [Trial(i, r.config, r.tflops) for i, r in enumerate(rows)]
    retimed, _, _ = retime.retime_and_baselines(trials, ReplayBuilder(ls), evaluator, ls.shape, rounds=3,
                                                max_rounds=max_rounds, log=lambda _: None)
    return retime.decide(retimed, max_rounds)


def test_replay_with_noise_ties_when_the_recorded_sessions_overlap():
    ls, top = with_sessions(OVERLAPPING)
    assert top[1].tflops < top[0].tflops  # recorded once, the runner-up is behind: a noiseless replay separates
    plain = retimed_top(ls, top, ReplayEvaluator(ls))
    assert plain.separated and plain.rounds == 3  # every round the one recorded figure: σ 0, never a tie
    # The draws are seeded by config key, so which seeds tie moves when the keys do (a new axis): over 40 seeds
    # 32 tied with today's keys; a noiseless replay ties none, and sessions apart (the next test) tie none either.
    verdicts = [retimed_top(ls, top, ReplayEvaluator(ls, ReplayNoise(ls, seed))) for seed in range(40)]
    ties = [v for v in verdicts if v.tie]
    assert len(ties) >= 28, [v.describe() for v in verdicts if not v.tie]
    assert all(v.rounds == 8 for v in ties)  # the round budget spent trying to separate them
    assert all(len(set(r.figures)) > 1 for v in ties for r in v.tied)


def test_replay_with_noise_separates_when_the_sessions_do_not_overlap():
    ls, top = with_sessions(APART)
    for seed in range(5):
        v = retimed_top(ls, top, ReplayEvaluator(ls, ReplayNoise(ls, seed)))
        assert v.separated and v.chosen.config.key == top[0].config_key and v.rounds == 3


def test_draws_come_from_the_recorded_rounds_divided_by_the_session_level():
    ls, top = with_sessions(OVERLAPPING)
    n = ReplayNoise(ls, 0)
    assert list(n.levels) == [s["id"] for s in ls.sessions]
    allowed = []
    for s, (sid, level) in enumerate(n.levels.items()):
        # the level: the median over the session's configs of their session median / recorded figure
        ratios = [statistics.median(OVERLAPPING[k][s]) * top[0].tflops / top[k].tflops for k in range(2)]
        assert level == pytest.approx(statistics.median(ratios), rel=1e-3)
        allowed += [top[0].tflops * f / level for f in OVERLAPPING[0][s]]
    draws = {n.tflops(top[0], i) for i in range(50)}
    assert len(draws) > 3
    assert all(any(math.isclose(d, a, rel_tol=1e-3) for a in allowed) for d in draws)


def test_rows_without_sessions_draw_from_the_recorded_spread():
    ls, top = with_sessions(OVERLAPPING)
    n = ReplayNoise(ls, 3)
    assert n.spread.source == "sessions" and n.spread.within > 0
    other = next(r for r in ls.complete_rows() if r not in top and not r.sessions)
    logs = [math.log(n.tflops(other, i) / other.tflops) for i in range(2000)]
    assert statistics.mean(logs) == pytest.approx(0, abs=3 * n.spread.total / math.sqrt(2000))
    assert statistics.stdev(logs) == pytest.approx(n.spread.total, rel=0.1)
    bare = landscape_mod.loads(landscape_mod.dumps(small_landscape()))  # no session: the rows' p20..p80
    assert ReplayNoise(bare, 0).spread.source == "reps"


def test_noise_is_seeded_and_independent_of_the_order_of_asking():
    ls, top = with_sessions(OVERLAPPING)
    rows = ls.complete_rows()[:6]

    def figures(seed, order):
        ev = ReplayEvaluator(ls, ReplayNoise(ls, seed))
        out = {}
        for r in order:
            out.setdefault(r.config_key, []).append(ev.outcome(r.config, ls.shape).tflops)
        return out

    twice = rows + rows
    assert figures(1, twice) == figures(1, list(reversed(twice)))
    assert figures(1, twice) != figures(2, twice)
    noiseless = ReplayEvaluator(ls)
    assert all(noiseless.outcome(r.config, ls.shape).tflops == r.tflops for r in rows)


def test_a_noisy_replay_search_says_so_and_its_finale_draws_every_round(tmp_path):
    ls, top = with_sessions(OVERLAPPING)
    path = ls.save(tmp_path / "noisy.json")
    result = run_search(SearchOptions(shape=SMALL_SHAPE, trials=10, sampler="random", seed=1, replay=path,
                                      replay_noise=7, enqueue=tuple(r.config for r in top)), log=lambda _: None)
    assert "replay noise, seed 7" in result.replay
    rounds = [r.figures for r in result.retimed if r.ok]
    assert rounds and all(len(set(f)) > 1 for f in rounds)
    with pytest.raises(ValueError, match="--replay-noise: only with --replay"):
        SearchOptions(shape=SMALL_SHAPE, replay_noise=1).check()


def test_the_sampler_comparison_under_noise_tells_draws_and_counts_recorded_figures():
    from autotune.search import sampler_comparison

    ls, top = with_sessions(OVERLAPPING)
    plain = sampler_comparison.simulate(ls, "random", 0, 12, lag=2, stop_fraction=None)
    noisy = sampler_comparison.simulate(ls, "random", 0, 12, lag=2, stop_fraction=None, noise=True)
    again = sampler_comparison.simulate(ls, "random", 0, 12, lag=2, stop_fraction=None, noise=True)
    recorded = {r.tflops for r in ls.complete_rows()}
    assert all(v is None or v in recorded for v in noisy.values)  # the run counts recorded figures
    assert noisy.values == again.values  # seeded
    assert plain.values and len(noisy.values) == len(plain.values)
