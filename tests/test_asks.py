"""Wasted asks cost nothing and teach nothing wrong: proposals in an in-memory shadow study, stored
trials created and told in one transaction each, a start that counts built configs, the time split, and a replay
that searches only what its landscape recorded. CPU only: the GPU step and the builds are replayed from synthetic
landscapes (tests/landscape_fixtures.py).
"""
from __future__ import annotations

import dataclasses
from collections import Counter

import optuna
import pytest
import sqlalchemy
from optuna.trial import TrialState

import space
from autotune.landscapes.landscape_file import Landscape
from autotune.search import storage_writes
from autotune.search import verdicts as trial_mod
from autotune.search.loop import SearchOptions, run_search
from autotune.search.options import SearchResult
from autotune.search.progress import format_result
from autotune.search.sampling import BuiltStartup, NoSampler, SearchSpace
from landscape_fixtures import ARCH, SHAPE, synthetic_landscape

PROBLEM = SHAPE.problem


@pytest.fixture(scope="module")
def landscape():
    return synthetic_landscape(SHAPE)  # every valid wgmma config of fp16 d128: ~1 in 10 of the product


def _quiet(_line):
    pass


def _search(landscape, tmp_path, **kw):
    opts = dict(shape=SHAPE, trials=15, sampler="tpe", seed=3, replay=landscape,
                storage=f"sqlite:///{tmp_path / 'replay.db'}")
    opts.update(kw)
    return run_search(SearchOptions(**opts), log=_quiet)


def _stored(tmp_path, name):
    return optuna.load_study(study_name=name, storage=f"sqlite:///{tmp_path / 'replay.db'}").trials


# -- valid-only, new-only proposals -----------------------------------------------------------------------------

def test_only_new_valid_configs_reach_the_stored_study(landscape, tmp_path):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    result = _search(landscape, tmp_path)
    trials = _stored(tmp_path, result.study_name)
    keys = [t.user_attrs["config_key"] for t in trials]
    # The sampler did propose invalid and repeated configs (else this test could not fail) ...
    assert result.proposals_invalid > 0 and result.proposals > result.asks
    # ... and none of them was stored: every stored trial is a distinct valid config that was built.
    assert all(space.is_valid(space.Config.from_key(k), PROBLEM, ARCH) for k in keys)
    assert len(keys) == len(set(keys)) == result.asks == result.evaluated == 15
    assert not [t for t in trials if t.user_attrs.get("status") == "invalid"
                or trial_mod.DUPLICATE_OF in t.user_attrs]
    assert all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials)
    text = format_result(result)
    assert f"15 trials stored from {result.proposals} proposals ({result.proposals_invalid} invalid" in text


def test_a_resumed_search_teaches_the_sampler_what_the_study_holds(landscape, tmp_path):
    first = _search(landscape, tmp_path, trials=8)
    second = _search(landscape, tmp_path, trials=14)
    keys = [t.user_attrs["config_key"] for t in _stored(tmp_path, second.study_name)]
    # The second run's proposals of the first run's configs were repeats told to the shadow, never stored again.
    assert len(keys) == len(set(keys)) == 14 and second.asks == 6 and first.asks == 8


def test_queued_configs_are_still_judged_in_the_stored_study(landscape, tmp_path):
    valid = landscape.best.config
    invalid = valid.replace(consumer_wgs=3, pingpong=True, overlap=True)
    assert space.violations(invalid, PROBLEM, ARCH)
    result = _search(landscape, tmp_path, trials=3, enqueue=(invalid, valid))
    trials = _stored(tmp_path, result.study_name)
    by_key = {t.user_attrs["config_key"]: t for t in trials}
    # a config the caller queued is a stored trial already: it is told there (invalid, never built)
    assert by_key[invalid.key].user_attrs["status"] == "invalid"
    assert by_key[valid.key].state == TrialState.COMPLETE and result.evaluated == 3


def test_a_new_config_is_asked_only_after_a_fresh_count_of_the_other_processes(landscape, tmp_path, monkeypatch):
    # The view of the other processes is refreshed at most every 0.5 s while polling; a stand-in whose throttled
    # view stays stale while a fresh (forced) count finds 3 configs started elsewhere since. The budget of 6 is the
    # study's: only 3 may be asked here. Without the fresh count before each new config, all 6 would be.
    from autotune.search import coordination

    class OthersStartedSinceTheLastLook(coordination.Solo):
        forced = 0

        def refresh(self, force=False):
            if force:
                type(self).forced += 1
                self.running_elsewhere = 3

    monkeypatch.setattr(coordination, "for_storage", lambda rdb, url, log=print: OthersStartedSinceTheLastLook(rdb, log))
    result = _search(landscape, tmp_path, trials=6)
    assert result.asks == result.evaluated == 3
    assert OthersStartedSinceTheLastLook.forced >= result.asks


# -- one transaction per tell -----------------------------------------------------------------------------------

class WriteTransactions:
    """Counts the transactions that wrote something on an engine (SQLAlchemy events)."""

    def __init__(self, engine):
        self.count = 0
        self._dirty: set = set()
        sqlalchemy.event.listen(engine, "before_cursor_execute", self._statement)
        sqlalchemy.event.listen(engine, "commit", self._commit)

    def _statement(self, conn, cursor, statement, parameters, context, executemany):
        if statement.lstrip().split()[0].upper() in ("INSERT", "UPDATE", "DELETE"):
            self._dirty.add(id(conn))

    def _commit(self, conn):
        if id(conn) in self._dirty:
            self._dirty.discard(id(conn))
            self.count += 1


def _stored_study(tmp_path):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'tx.db'}", sampler=NoSampler(),
                                direction="maximize")
    return study, WriteTransactions(study._storage._backend.engine)


def test_a_trial_is_stored_with_its_params_in_one_transaction(tmp_path):
    study, writes = _stored_study(tmp_path)
    search_space = SearchSpace(PROBLEM, ARCH)
    config = space.default_config(PROBLEM, ARCH, "wgmma")
    params = search_space.params(config)
    distributions = {"family": optuna.distributions.CategoricalDistribution(list(search_space.families))}
    distributions.update({search_space.param_name("wgmma", axis): optuna.distributions.CategoricalDistribution(
        list(domain)) for axis, domain in search_space.domains["wgmma"].items()})
    t = storage_writes.create_trial(study, params, distributions)
    assert writes.count == 1
    assert search_space.config_of(study.trials[t.number].params) == config


def test_a_told_trial_is_one_transaction_whatever_its_attrs(tmp_path):
    study, writes = _stored_study(tmp_path)
    config = space.default_config(PROBLEM, ARCH, "wgmma")
    for outcome in (trial_mod.Outcome("complete", "", {**trial_mod.config_attrs(config, PROBLEM), "tflops": 512.5,
                                                     "registers": 168, "time_ms": 0.25, "time_spread_ms": 0.01,
                                                     "cubin_hash": "ab" * 32, "status": "complete"}),
                    trial_mod.Outcome("spilled", "spills", {**trial_mod.config_attrs(config, PROBLEM),
                                                            "spill_stores": 64, "status": "spilled"})):
        t = storage_writes.create_trial(study, {"x": 1}, {"x": optuna.distributions.CategoricalDistribution([1])})
        before = writes.count
        trial_mod.tell(study, t, outcome)
        assert writes.count - before == 1  # 12-20 attrs, the constraint, the value and the state: one transaction
        told = study.trials[t.number]
        assert told.state == (TrialState.COMPLETE if outcome.status == "complete" else TrialState.PRUNED)
        assert told.value == outcome.value
        assert {k: v for k, v in told.user_attrs.items() if k != trial_mod.CONSTRAINT_ATTR} == \
               {k: v for k, v in outcome.attrs.items() if v is not None}
        assert told.user_attrs[trial_mod.CONSTRAINT_ATTR] == [outcome.constraint]
        assert told.constraints == {trial_mod.CONSTRAINT_NAME: outcome.constraint}  # what samplers read


def test_a_trial_failed_under_the_tell_keeps_its_result_as_a_late_trial(tmp_path):
    study, _ = _stored_study(tmp_path)
    t = storage_writes.create_trial(study, {"x": 1}, {"x": optuna.distributions.CategoricalDistribution([1])})
    study.tell(t, state=TrialState.FAIL)  # e.g. the heartbeat check failed it while this process was stalled
    config = space.default_config(PROBLEM, ARCH, "wgmma")
    outcome = trial_mod.Outcome("complete", "", {**trial_mod.config_attrs(config, PROBLEM), "tflops": 300.0})
    trial_mod.tell(study, t, outcome)
    lost, late = study.trials
    assert lost.state == TrialState.FAIL and not lost.user_attrs  # nothing half-written on the failed trial
    assert late.value == 300.0 and late.user_attrs[trial_mod.LATE_FOR] == lost.number


# -- the start counts built configs ---------------------------------------------------------------------------

class SpySampler(optuna.samplers.RandomSampler):
    def __init__(self):
        super().__init__(seed=0)
        self.relative_calls = 0

    def sample_relative(self, study, trial, search_space):
        self.relative_calls += 1
        return super().sample_relative(study, trial, search_space)


def test_the_start_counts_built_configs_not_finished_trials():
    built = {"n": 0}
    inner = SpySampler()
    study = optuna.create_study(sampler=BuiltStartup(inner, lambda: built["n"], seed=0, startup=10))
    dist = {"x": optuna.distributions.CategoricalDistribution([0, 1, 2])}
    for _ in range(30):  # thirty invalid proposals, told as pruned: Optuna's own start would be over
        study.add_trial(optuna.trial.create_trial(state=TrialState.PRUNED, params={"x": 0}, distributions=dist))
    built["n"] = 9
    study.ask(dist)
    assert inner.relative_calls == 0  # still random: 9 configs built
    built["n"] = 10
    study.ask(dist)
    assert inner.relative_calls == 1


# -- replay: the recorded axis values only ----------------------------------------------------------------------

def test_replay_searches_only_the_axis_values_its_landscape_recorded(landscape, tmp_path):
    # As a landscape recorded before the scheduler and o_rescale axes holds them: at their defaults only.
    old = Landscape(dict(landscape.header))
    for row in landscape.rows.values():
        d = row.config.as_dict()
        if d["scheduler"] == "grid" and d["o_rescale"] == "after":
            old.add(row)
    assert len(SearchSpace(PROBLEM, ARCH, ("wgmma",)).domains["wgmma"]["scheduler"]) > 1
    result = _search(old, tmp_path, trials=20, sampler="random")  # without the restriction: MissingConfigError
    stored = {t.user_attrs["config_key"] for t in _stored(tmp_path, result.study_name)}
    assert len(stored) == 20 and stored <= set(old.rows)


# -- the time split ---------------------------------------------------------------------------------------------

def _result(**kw) -> SearchResult:
    base = dict(study_name="s", storage="sqlite:///x.db", gpu_name="G", arch=ARCH, shape=SHAPE, target=5,
                evaluated=5, this_run=Counter(), counts=Counter(complete=5), asks=5, stop_reason="done",
                idle_seconds=2.0, idle_other_seconds=0.5, build_seconds=7.0, eval_seconds=6.0, ask_seconds=0.75,
                tell_seconds=0.25, loop_seconds=10.0, wall_seconds=12.0, proposals=40, proposals_invalid=30,
                proposals_repeated=5)
    base.update(kw)
    return SearchResult(**base)


def test_the_summary_splits_building_evaluating_waiting_and_asking():
    text = format_result(_result())
    line = next(x for x in text.splitlines() if "trial loop" in x)
    for part in ("trial loop 10.0 s", "evaluating 6.0 s", "GPU idle waiting for builds: 2.0 s (20%)",
                 "idle otherwise 0.5 s", "asking 0.8 s", "telling 0.2 s", "building 7.0 s"):
        assert part in line, part
    assert "40 proposals (30 invalid and 5 repeated" in text


def test_a_replay_reports_no_gpu_and_what_it_stored():
    text = format_result(_result(replay="ls.json", storage="sqlite:///%3Amemory%3A"))
    assert "GPU idle" not in text and "no GPU" in text and "nothing was stored" in text
    text = format_result(_result(replay="ls.json", storage="sqlite:////tmp/r.db (/tmp/r.db)"))
    assert "stored as study s at sqlite:////tmp/r.db" in text and "no best config was stored" in text
    text = format_result(_result(replay="ls.json", simulated="1 s per build batch, 0.4 s per evaluation"))
    assert "simulated GPU idle waiting for builds: 2.0 s" in text and "simulated GPU host: 1 s per build" in text


def test_a_paced_replay_measures_where_the_loop_time_went(landscape, tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOTUNE_REPLAY_BUILD_SECONDS", "0.3")
    monkeypatch.setenv("AUTOTUNE_REPLAY_SECONDS", "0.05")
    result = _search(landscape, tmp_path, trials=6, ahead=2)
    assert result.simulated and result.loop_seconds > 0
    assert result.build_seconds >= 0.3 * 3  # three batches of two, each paced
    assert result.eval_seconds >= 0.05 * 5  # at most one of six decided from its build (a failure row)
    assert result.idle_seconds > 0.2        # the first batch: nothing to evaluate while it builds
    assert result.ask_seconds > 0 and result.tell_seconds > 0
    # the GPU's time is evaluating or idle; asking and telling happen while it evaluates or idles
    assert result.eval_seconds + result.idle_seconds + result.idle_other_seconds <= result.loop_seconds + 0.05
