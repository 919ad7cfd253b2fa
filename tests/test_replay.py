"""Replay: the build and the GPU step answered from a landscape, through the search's own code.

The landscape is synthetic (tests/landscape_fixtures.py): real valid configs of space/, made-up numbers, one
config of each failure status. Nothing here compiles or needs a GPU.
"""
from __future__ import annotations

import pytest

import space
from autotune.landscapes import landscape_file as landscape_mod
from autotune.cli import main
from autotune.landscapes.replay import MissingConfigError, NullStore, ReplayBuilder, ReplayError, ReplayEvaluator
from autotune.search.loop import SearchOptions, run_search
from landscape_fixtures import ARCH, SMALL_SHAPE, small_landscape

PROBLEM = SMALL_SHAPE.problem


@pytest.fixture
def landscape():
    # As read back from a file: figures rounded as stored, so comparisons with replayed values are exact.
    return landscape_mod.loads(landscape_mod.dumps(small_landscape()))


@pytest.fixture
def path(tmp_path, landscape):
    return landscape.save(tmp_path / "small.json")


def _by_status(landscape, status):
    return next(r for r in landscape.rows.values() if r.status == status)


def test_builder_returns_the_recorded_builds(landscape):
    b = ReplayBuilder(landscape)
    rows = [_by_status(landscape, s) for s in ("complete", "spilled", "compile_error")]
    done, spilled, failed = b.build([(r.config, PROBLEM) for r in rows])
    assert done.ok and done.report.registers == rows[0].registers and not done.spilled
    assert done.cubin_hash == rows[0].cubin_hash and done.cubin_path is None
    assert spilled.ok and spilled.spilled and spilled.report.spill_stores == rows[1].spill_stores
    assert not failed.ok and failed.status == "compile_error" and failed.error == rows[2].reason


def test_builder_rejects_invalid_configs_like_the_real_one(landscape):
    valid = _by_status(landscape, "complete").config
    invalid = valid.replace(consumer_wgs=3, pingpong=True, overlap=True)
    assert space.violations(invalid, PROBLEM, ARCH)
    r = ReplayBuilder(landscape).build_one(invalid, PROBLEM)
    assert r.status == "invalid" and "pingpong_needs_two_consumers" in r.rejected_by


def test_a_config_missing_from_the_landscape_is_an_error_naming_it(landscape):
    row = _by_status(landscape, "complete")
    del landscape.rows[row.config_key]
    with pytest.raises(MissingConfigError) as err:
        ReplayBuilder(landscape).build_one(row.config, PROBLEM)
    assert row.config_key in str(err.value) and err.value.config_key == row.config_key
    with pytest.raises(MissingConfigError):
        ReplayEvaluator(landscape).outcome(row.config, SMALL_SHAPE)


def test_evaluator_returns_the_recorded_outcomes(landscape):
    ev = ReplayEvaluator(landscape)
    done = _by_status(landscape, "complete")
    o = ev.evaluate(ReplayBuilder(landscape).build_one(done.config, PROBLEM), SMALL_SHAPE)
    assert o.status == "complete" and o.tflops == done.tflops and o.time_ms == done.median_ms
    assert o.spread_ms == pytest.approx(done.p80_ms - done.p20_ms)
    for status in ("wrong", "crashed", "timeout"):
        row = _by_status(landscape, status)
        o = ev.outcome(row.config, SMALL_SHAPE)
        assert o.status == status and o.tflops is None and o.reason == row.reason
    assert ev.device_info() == {"gpu_name": "Synthetic GPU", "arch": "sm_90"}
    assert ev.baselines(SMALL_SHAPE) == landscape.header["baselines"]


def test_evaluator_refuses_what_was_never_timed_and_other_shapes(landscape):
    ev = ReplayEvaluator(landscape)
    spilled = _by_status(landscape, "spilled")
    with pytest.raises(MissingConfigError, match="never timed"):
        ev.outcome(spilled.config, SMALL_SHAPE)
    other = space.Shape(batch=2, heads=2, seqlen_q=256, head_dim=256)
    with pytest.raises(ReplayError, match="recorded for shape"):
        ev.outcome(_by_status(landscape, "complete").config, other)
    with pytest.raises(ReplayError, match="recorded for"):
        ReplayBuilder(landscape).build_one(spilled.config, space.Problem(256, "bf16", False))


def _quiet(_line):
    pass


def test_replay_search_returns_the_recorded_values_and_stores_nothing(path, landscape, tmp_path, monkeypatch):
    db = tmp_path / "must-not-exist.db"
    monkeypatch.setenv("AUTOTUNE_STORAGE", f"sqlite:///{db}")
    import optuna

    captured = {}
    real_create = optuna.create_study

    def spy(*args, **kwargs):
        captured["study"] = real_create(*args, **kwargs)
        return captured["study"]

    monkeypatch.setattr(optuna, "create_study", spy)
    result = run_search(SearchOptions(shape=SMALL_SHAPE, trials=12, sampler="random", seed=1, replay=path), log=_quiet)
    assert not db.exists()  # in-memory storage: a replay never lands in the real studies
    assert result.record is None and result.study_name.startswith("replay-")
    assert result.gpu_name == "Synthetic GPU" and result.arch == ARCH
    trials = [t for t in captured["study"].trials if t.user_attrs.get("status") not in (None, "invalid")]
    assert len({t.user_attrs["config_key"] for t in trials}) == 12
    for t in trials:
        row = landscape.row(t.user_attrs["config_key"])
        assert t.user_attrs["status"] == row.status
        if row.status == "complete":
            assert t.value == pytest.approx(row.tflops)
            assert t.user_attrs["registers"] == row.registers
    assert result.best.outcome.tflops == max(t.value for t in trials if t.value is not None)


def test_brute_force_replay_finds_the_recorded_optimum(path, landscape):
    default = space.default_config(PROBLEM, ARCH, "wgmma")
    assert landscape.best.config_key != default.key  # the search tries the default first: make it earn it
    result = run_search(SearchOptions(shape=SMALL_SHAPE, trials=len(landscape.rows), sampler="brute", seed=0,
                                      replay=path), log=_quiet)
    assert result.evaluated == len(landscape.rows)
    assert result.best.config.key == landscape.best.config_key
    assert result.best.outcome.tflops == pytest.approx(landscape.optimum)


def test_replay_search_errors_on_a_config_the_landscape_lacks(landscape, tmp_path):
    row = _by_status(landscape, "complete")
    del landscape.rows[row.config_key]
    with pytest.raises(MissingConfigError) as err:
        run_search(SearchOptions(shape=SMALL_SHAPE, trials=3, sampler="random", replay=landscape,
                                 enqueue=(row.config,)), log=_quiet)
    assert row.config_key in str(err.value)


def test_cli_replay(path, landscape, tmp_path, capsys):
    assert main(["search", "--replay", str(path), "--trials", "4", "--sampler", "random"]) == 0
    out = capsys.readouterr().out
    assert "replayed from" in out and "nothing was stored" in out and "Synthetic GPU" in out

    assert main(["search", "--replay", str(path), "--seqlen", "512"]) == 2
    assert "recorded, shape b1-h2-n256-d256-fp16-full" in capsys.readouterr().err

    row = _by_status(landscape, "complete")
    del landscape.rows[row.config_key]
    partial = landscape.save(tmp_path / "partial.json")
    assert main(["search", "--replay", str(partial), "--trials", "3", "--enqueue", row.config_key]) == 1
    assert row.config_key in capsys.readouterr().err

    (tmp_path / "bad.json").write_text("{}")
    assert main(["search", "--replay", str(tmp_path / "bad.json")]) == 2
    assert "not an autotune landscape" in capsys.readouterr().err


def test_cli_replay_says_what_a_replay_can_and_cannot_vary(path, capsys):
    # --seqlen alone once became n512 with the file's seqlen_k 256, a shape nobody asked for
    for flags in (["--seqlen", "512"], ["--seqlen-k", "512"], ["--batch", "2"], ["--causal"], ["--dtype", "bf16"],
                  ["--arch", "sm_80"]):
        assert main(["search", "--replay", str(path), *flags]) == 2, flags
        err = capsys.readouterr().err
        assert f"so {' '.join(flags)} cannot be replayed" in err and "b1-h2-n256-d256-fp16-full" in err, err
        assert "A replay can vary --sampler, --seed, --trials" in err
    # flags that repeat the recorded shape are not a change
    assert main(["search", "--replay", str(path), "--seqlen", "256", "--heads", "2", "--head-dim", "256",
                 "--trials", "2", "--sampler", "random"]) == 0
    assert "replayed from" in capsys.readouterr().out


def test_null_store_keeps_nothing():
    assert NullStore().record_best(object()) is None
