"""The sweep decision (autotune/search/exhaustive.py): when every valid config fits in the trial budget, the search
queues them all instead of sampling; a replay of a synthetic landscape shows it end to end on the CPU."""
from __future__ import annotations

import math

from types import SimpleNamespace

import optuna
import pytest

import space
from autotune.search import exhaustive, verdicts
from autotune.search.loop import SearchOptions, plan_sweep, run_search
from autotune.search.sampling import NoSampler, SearchSpace
from landscape_fixtures import ARCH, SMALL_SHAPE, small_landscape

# head_dim 256: 3656 valid wgmma configs on sm_90 (the decode axes, softmax_reduce, exp2_fma, o_rescale=fused and
# tail_split included)
PROBLEM = SMALL_SHAPE.problem
WGMMA = ("wgmma",)
N_VALID = len(space.valid_configs(PROBLEM, ARCH, WGMMA))


def test_the_decision_sweeps_only_what_fits_in_the_budget():
    assert N_VALID == 3656  # the figure the docs quote: change both together
    fits = exhaustive.decide(PROBLEM, ARCH, WGMMA, 4000)
    assert fits.sweep and len(fits.configs) == N_VALID
    assert fits.message == "sweeping all 3656 valid configs of wgmma: no more than the budget of 4000 trials"
    exact = exhaustive.decide(PROBLEM, ARCH, WGMMA, N_VALID)
    assert exact.sweep
    over = exhaustive.decide(PROBLEM, ARCH, WGMMA, N_VALID - 1)
    assert not over.sweep and over.configs == ()
    assert over.message == "sampling: wgmma has more valid configs than the budget of 3655 trials"


def test_counting_stops_once_past_the_budget(monkeypatch):
    seen = []
    real = space.is_valid
    monkeypatch.setattr(space, "is_valid", lambda c, p, a: seen.append(c) or real(c, p, a))
    assert exhaustive.valid_up_to(space.Problem(128, "fp16", False), ARCH, ("mma_sync", "wgmma"), 60) is None
    # d128: 1.5M points in the two families' cross products; 60 valid ones lie within the first 2 % of mma_sync's
    # (its last axis, kv_splits, turns fastest, so the first rows of its product hold few distinct tiles)
    points = sum(math.prod(len(a.values) for a in space.get_family(f).axes) for f in ("mma_sync", "wgmma"))
    assert len(seen) < 0.02 * points


def test_the_sweep_order_starts_at_the_default_and_moves_away_from_it():
    ordered = exhaustive.sweep_order(space.valid_configs(PROBLEM, ARCH, WGMMA), PROBLEM, ARCH)
    assert ordered[0] == space.default_config(PROBLEM, ARCH, "wgmma")
    distances = [exhaustive.distance_to_default(c, PROBLEM, ARCH) for c in ordered]
    assert distances == sorted(distances) and distances[0] == 0


def test_queueing_leaves_out_judged_and_already_waiting_configs():
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize")
    ss = SearchSpace(PROBLEM, ARCH, WGMMA)
    configs = exhaustive.sweep_order(space.valid_configs(PROBLEM, ARCH, WGMMA), PROBLEM, ARCH)[:6]
    study.enqueue_trial(ss.params(configs[1]))
    assert exhaustive.queue_sweep(study, ss, configs, skip={configs[2].key}) == 4
    waiting = [ss.config_of(t.system_attrs["fixed_params"]) for t in study.trials]
    assert waiting == [configs[1], configs[0], *configs[3:]]  # each config once, in the sweep's order
    assert exhaustive.queue_sweep(study, ss, configs, skip={configs[2].key}) == 0  # all waiting or judged now


def test_plan_sweep_sets_the_budget_to_the_valid_configs_and_idles_the_sampler():
    session = SimpleNamespace(arch=ARCH, search_space=SearchSpace(PROBLEM, ARCH, WGMMA), sweep=(),
                              study=SimpleNamespace(sampler=NoSampler()))
    said: list[str] = []
    options = plan_sweep(session, SearchOptions(shape=SMALL_SHAPE, trials=4000, sampler="tpe"), said.append)
    assert (options.trials, options.sampler) == (N_VALID, "random")  # nothing else to try; every value is queued
    assert isinstance(session.study.sampler, NoSampler)  # the stored study's tells stay one transaction each
    assert len(session.sweep) == N_VALID and session.sweep[0] == space.default_config(PROBLEM, ARCH, "wgmma")
    assert said == ["sweeping all 3656 valid configs of wgmma: no more than the budget of 4000 trials"]
    session.sweep = ()
    unchanged = SearchOptions(shape=SMALL_SHAPE, trials=150, sweep=False)
    assert plan_sweep(session, unchanged, said.append) is unchanged and session.sweep == ()


def test_a_small_space_is_swept_whole_with_one_ask_per_config(tmp_path, monkeypatch):
    path = tmp_path / "small.json"
    landscape = small_landscape(path)
    n = len(landscape.rows)  # a replay searches the configs its landscape holds: the prefill slice, 120
    lines: list[str] = []
    one_transaction: dict = {}  # per study, per tell: written in one transaction (storage_writes.finish_trial)?
    finish = verdicts.finish_trial

    def finish_and_count(study, *args, **kw):
        done = finish(study, *args, **kw)
        one_transaction.setdefault(study.study_name, []).append(done)
        return done
    monkeypatch.setattr(verdicts, "finish_trial", finish_and_count)
    result = run_search(SearchOptions(shape=SMALL_SHAPE, trials=150, sampler="tpe", seed=0, replay=path,
                                      retime_top=2, retime_rounds=1, storage=f"sqlite:///{tmp_path / 's.db'}"),
                        log=lines.append)
    # a sweep's tells are one transaction each, like the sampler's (the stored study keeps its NoSampler)
    stored = one_transaction[result.study_name]
    assert len(stored) >= n and all(stored)
    assert n == 120 and "sweeping all 120 valid configs of wgmma: no more than the budget of 150 trials" in lines
    assert any(line.startswith("sweep: queued ") for line in lines)
    assert result.target == n and result.evaluated == n
    assert result.stop_reason == f"reached {n} evaluated trials"
    assert result.asks == n  # no invalid and no repeated asks
    assert "invalid" not in result.this_run and "repeated" not in result.this_run
    assert result.best.config.key == landscape.best.config_key


def test_no_sweep_when_the_budget_is_smaller_or_when_asked_not_to(tmp_path):
    path = tmp_path / "small.json"
    small_landscape(path)
    for options in (dict(trials=10), dict(trials=150, sweep=False, max_asks=40)):
        lines: list[str] = []
        result = run_search(SearchOptions(shape=SMALL_SHAPE, sampler="random", seed=0, replay=path, retime_top=1,
                                          retime_rounds=1, **options), log=lines.append)
        assert not any(line.startswith("sweep") for line in lines)
        assert result.target == options["trials"]
        assert result.evaluated < N_VALID


def test_the_decision_counts_only_the_search_spaces_axis_values():
    # a replay's search space holds only the values its landscape recorded (here the prefill slice): the sweep
    # decision counts those configs, not the whole space's (3656 at d256, more than the budget of 150)
    domains = {"wgmma": {"kv_splits": (1,), "pack_gqa": (False,), "stages": (2, 3, 4), "softmax_reduce": ("chain",),
                       "exp2_fma": ("none",), "o_rescale": ("after", "before"), "tail_split": (False,)}}
    sliced = exhaustive.decide(PROBLEM, ARCH, WGMMA, 150, domains)
    assert sliced.sweep and len(sliced.configs) == 120
    assert all(c.kv_splits == 1 and not c.pack_gqa and c.stages <= 4 for c in sliced.configs)
    assert not exhaustive.decide(PROBLEM, ARCH, WGMMA, 150).sweep
