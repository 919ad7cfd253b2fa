"""Where a campaign's second pass puts its row (autotune/search/campaign_passes.py): over the row an earlier pass
of the same study stored, whatever the figures; not over another study's faster row, and the log says so; and the
repair of storages where older versions let the table keep the first pass's row (from the study attrs, no GPU).
The campaign runs use test_campaign_run.py's set-up (real builds, the evaluator double, SQLite); the repair's
storages are made here from attrs alone."""
from __future__ import annotations

import dataclasses
import datetime as dt

import optuna
import pytest

import search_doubles
from autotune.cli import main
from autotune.search import campaign, campaign_run, campaign_table
from autotune.search import campaign_passes as passes
from autotune.search.loop import SearchOptions
from autotune.store.best_table import BestEntry, BestStore
from test_campaign import RUNNER_UP, WIN
from test_campaign_run import S1, env, entry, opts  # noqa: F401  (env: the pytest fixture)
from test_search import ARCH, DEFAULT

f = search_doubles.fake_tflops
GPU = search_doubles.GPU_NAME


class NoTimeForTheSecondPass(campaign_run.Budget):
    """Shapes run unbounded; the second pass finds nothing left of the budget (it stops before its first shape)."""

    def __init__(self):
        super().__init__(None)

    def left(self) -> float:
        return 0.0


def two_finalists(env):
    return [opts(env, S1, enqueue=(WIN, RUNNER_UP), trials=3, retime_top=2, retime_within=0.0, retime_rounds=2)]


def test_a_resumed_second_pass_replaces_the_faster_first_pass_row_of_its_own_study(env):
    control = env["control"]
    plans = two_finalists(env)
    lines: list[str] = []
    first = campaign_run.run(plans, log=lines.append, budget=NoTimeForTheSecondPass())
    assert first.outcomes[0].state == "finished" and first.outcomes[0].second_pass is None
    assert any(line.startswith("campaign: second pass stopped") for line in lines), lines
    with BestStore(env["url"]) as store:  # stored as the first pass decided, when the run stopped
        row = store.lookup(GPU, ARCH.name, S1)
    assert row.config_key == WIN.key and row.tflops == pytest.approx(f(WIN)) and row.second_pass_tflops is None

    # The next run does the second pass, in a process that measures WIN 20 % slower: RUNNER_UP is best across both
    # passes, and its figure there is below the first-pass figure of WIN that the table holds.
    control.plan({WIN: "damp"})
    lines.clear()
    second = campaign_run.run(plans, log=lines.append)
    result = second.outcomes[0].second_pass
    assert result.shipped.config_key == RUNNER_UP.key and result.first_winner != result.shipped.number
    assert result.shipped.figure < f(WIN)
    assert result.record.action == "replaced" and result.kept_row is None
    name = campaign_run.study_name(plans[0], GPU)
    with BestStore(env["url"]) as store:
        row = store.lookup(GPU, ARCH.name, S1)
        replaced = store.replaced_rows()
    assert (row.config_key, row.study, row.trial) == (RUNNER_UP.key, name, result.shipped.number)
    assert row.tflops == pytest.approx(f(RUNNER_UP))
    assert (row.first_pass_tflops, row.second_pass_tflops) == pytest.approx((f(RUNNER_UP), f(RUNNER_UP)))
    assert row.runner_up_config_key == WIN.key
    assert (row.runner_up_first_tflops, row.runner_up_second_tflops) == pytest.approx((f(WIN), 0.8 * f(WIN)))
    assert row.cubin_hash and row.kernel_source_hash and row.nvcc_version  # what the second pass built and timed
    # nothing lost: the first pass's row is in the replaced table, replaced by the second pass
    assert [(r["config_key"], r["replaced_by"]) for r in replaced] == [
        (WIN.key, f"{name} #{result.shipped.number} (second pass)")]
    said = next(line for line in lines if line.startswith(f"second pass {S1.key}: "))
    assert said.startswith(f"second pass {S1.key}: shipped #{result.shipped.number} ") and "not stored" not in said
    study = optuna.load_study(study_name=name, storage=env["url"])
    assert study.user_attrs[passes.ATTR]["stored"] == "replaced"
    # and the repair that every run starts with finds nothing to do
    assert passes.repair([study], env["url"], log=lines.append) == []


def test_another_studys_faster_row_is_kept_and_the_log_and_the_table_say_so(env):
    with BestStore(env["url"]) as store:
        store.record_best(entry(S1, DEFAULT, 500.0))  # study "elsewhere", faster than anything the double measures
    plans = two_finalists(env)
    lines: list[str] = []
    done = campaign_run.run(plans, log=lines.append)
    result = done.outcomes[0].second_pass
    assert result.shipped is not None and result.record.action == "kept"
    assert (result.kept_row.study, result.kept_row.tflops) == ("elsewhere", 500.0)
    said = next(line for line in lines if line.startswith(f"second pass {S1.key}: "))
    assert said.startswith(f"second pass {S1.key}: chose #{result.shipped.number} ")
    assert said.endswith("; not stored: the table keeps a row of another study at least as fast, elsewhere #0 "
                         "500.0 TFLOPS (another config)"), said
    with BestStore(env["url"]) as store:
        assert store.lookup(GPU, ARCH.name, S1).study == "elsewhere"
    study = campaign_run.load_study(plans[0], GPU)
    attr = study.user_attrs[passes.ATTR]
    assert attr["stored"] == "kept" and attr["kept_row"]["study"] == "elsewhere"
    (row,) = campaign_table.shape_rows(plans, GPU)
    assert row.kept_from == "elsewhere #0"
    assert "(not stored: the table keeps elsewhere #0)" in campaign_table.format_table([row])
    # the repair leaves another study's row alone
    assert passes.repair([study], env["url"], log=lines.append) == []


# -- the repair, on storages made from attrs -------------------------------------------------------------------

SHAPES = [dataclasses.replace(S1, seqlen_q=n, seqlen_k=n) for n in (256, 512, 1024, 2048, 4096)]
CAMPAIGN = ('defaults = { batch = 1, heads = 2, head_dim = 128 }\n'
            'shapes = [' + ", ".join(f"{{ seqlen = {s.seqlen_q} }}" for s in SHAPES) + ']\n')
PASS_DATE = dt.datetime(2026, 12, 2, 4, 0, tzinfo=dt.timezone.utc)


def old_attr(finalists, first_winner: int) -> dict:
    """A second pass recorded as older versions did (no provenance, no store's answer, no cubin hashes), shipping
    the best of `finalists` ((trial, config, first TFLOPS, second TFLOPS)) across both passes."""
    across = tuple(passes.Across(n, c.key, a, b, (a,), (b,)) for n, c, a, b in finalists)
    shipped, _ = passes.choose(across)
    attr = passes.PassResult("", across, first_winner, shipped, None).as_attr()
    attr["date"] = PASS_DATE.isoformat(timespec="seconds")
    for key in ("stored", "kernel_source_hash", "nvcc_version"):
        attr.pop(key, None)
    for x in attr["finalists"]:
        del x["cubin_hash"]
    return attr


def first_pass_row(shape, config, tflops, study, trial, **kw) -> BestEntry:
    values = dict(time_ms=1.0, spread_ms=0.0, study=study, trial=trial, kernel_source_hash="sources-then",
                  nvcc_version="nvcc-then", cubin_hash="c" * 64, created=PASS_DATE - dt.timedelta(hours=2))
    values.update(kw)
    return BestEntry.for_shape(shape, GPU, ARCH.name, config, tflops, **values)


@pytest.fixture
def affected(tmp_path, monkeypatch):
    """A storage as an older campaign left it, one study per shape of CAMPAIGN, each with its second pass recorded:
    0, 1: the table kept the study's first-pass row, faster than the across figure (0: another config shipped);
    2: the pass's own row; 3: another study's faster row; 4: a row of the same study stored after the pass."""
    monkeypatch.delenv("AUTOTUNE_STORAGE", raising=False)
    url = f"sqlite:///{tmp_path / 'old.db'}"
    path = tmp_path / "c.toml"
    path.write_text(CAMPAIGN)
    plans = campaign.plan(campaign.load(path), SearchOptions(shape=SHAPES[0], storage=url))
    names = [campaign_run.study_name(p, GPU) for p in plans]
    passes_of = [
        old_attr([(1, WIN, f(WIN), 0.8 * f(WIN)), (2, RUNNER_UP, f(RUNNER_UP), f(RUNNER_UP))], first_winner=1),
        old_attr([(1, WIN, f(WIN), 0.95 * f(WIN)), (2, RUNNER_UP, f(RUNNER_UP), 0.9 * f(RUNNER_UP))], 1),
        old_attr([(1, WIN, f(WIN), f(WIN)), (2, RUNNER_UP, f(RUNNER_UP), f(RUNNER_UP))], 1),
        old_attr([(1, WIN, f(WIN), f(WIN))], 1),
        old_attr([(1, WIN, f(WIN), 0.8 * f(WIN)), (2, RUNNER_UP, f(RUNNER_UP), f(RUNNER_UP))], 1),
    ]
    for shape, name, attr in zip(SHAPES, names, passes_of):
        study = optuna.create_study(study_name=name, storage=url, direction="maximize")
        for key, value in {"shape": dataclasses.asdict(shape), "arch": ARCH.name, "gpu_name": GPU,
                           "kernel_source_hash": "sources-of-the-study", "nvcc_version": "nvcc-then",
                           passes.ATTR: attr}.items():
            study.set_user_attr(key, value)
    with BestStore(url) as store:
        store.record_best(first_pass_row(SHAPES[0], WIN, f(WIN), names[0], 1))
        store.record_best(first_pass_row(SHAPES[1], WIN, f(WIN), names[1], 1))
        attrs = {"shape": dataclasses.asdict(SHAPES[2]), "arch": ARCH.name, "gpu_name": GPU, passes.ATTR: passes_of[2]}
        store.record_best(passes.recorded_entry(names[2], attrs, SHAPES[2], None))
        store.record_best(first_pass_row(SHAPES[3], DEFAULT, 900.0, "elsewhere", 0))
        store.record_best(first_pass_row(SHAPES[4], DEFAULT, 900.0, names[4], 7,
                                         created=PASS_DATE + dt.timedelta(hours=1)))
    return {"url": url, "file": path, "names": names}


def rows(url) -> dict:
    with BestStore(url) as store:
        return {e.shape: e for e in store.all_rows()}, store.replaced_rows()


def test_the_repair_rerecords_the_rows_the_table_kept_out_and_leaves_the_others(affected):
    url, names = affected["url"], affected["names"]
    before, _ = rows(url)
    lines: list[str] = []
    summaries = campaign_run.recorded_studies(
        campaign.plan(campaign.load(affected["file"]), SearchOptions(shape=SHAPES[0], storage=url)), url)
    assert sorted(s.study_name for s in summaries) == sorted(names)  # found by their attrs' GPU, no GPU here
    done = passes.repair(summaries, url, log=lines.append)
    assert [r.shape_key for r in done] == [SHAPES[0].key, SHAPES[1].key]
    after, replaced = rows(url)
    # 0: another config shipped across both passes, below the first pass's figure that the table held
    row = after[SHAPES[0]]
    assert (row.config_key, row.study, row.trial) == (RUNNER_UP.key, names[0], 2)
    assert row.tflops == pytest.approx(f(RUNNER_UP)) and row.second_pass_tflops == pytest.approx(f(RUNNER_UP))
    assert row.runner_up_config_key == WIN.key and row.runner_up_second_tflops == pytest.approx(0.8 * f(WIN))
    # provenance of the first pass's row (the same study and family); no cubin hash: the first pass's was WIN's
    assert (row.kernel_source_hash, row.nvcc_version, row.cubin_hash) == ("sources-then", "nvcc-then", None)
    # 1: the same config, its figure across both passes; the first pass's cubin (the same trial's) stays with it
    row = after[SHAPES[1]]
    assert (row.config_key, row.trial, row.cubin_hash) == (WIN.key, 1, "c" * 64)
    assert row.tflops == pytest.approx(f(WIN) * 0.95 ** 0.5) and row.first_pass_tflops == pytest.approx(f(WIN))
    assert row.runner_up_config_key == RUNNER_UP.key
    # 2-4 as they were: the pass's own row, another study's faster row, a row stored after the pass
    assert [after[s] for s in SHAPES[2:]] == [before[s] for s in SHAPES[2:]]
    # the replaced rows are kept, each naming the pass that replaced it
    assert [(r["config_key"], r["replaced_by"]) for r in replaced] == [
        (WIN.key, f"{names[0]} #2 (second pass, re-recorded)"), (WIN.key, f"{names[1]} #1 (second pass, re-recorded)")]
    assert lines[0] == (f"campaign: {SHAPES[0].key}: the second pass's row re-recorded, {names[0]} #2 "
                        f"{f(RUNNER_UP):.1f} TFLOPS across both passes (first {f(RUNNER_UP):.1f}, second "
                        f"{f(RUNNER_UP):.1f}); replacing {names[0]} #1 {f(WIN):.1f} TFLOPS (another config)")
    # idempotent: a second repair finds every row as it should be
    assert passes.repair(summaries, url, log=lines.append) == [] and rows(url) == (after, replaced)


def test_campaign_repair_passes_needs_no_gpu_and_runs_alone(affected, capsys):
    args = ["campaign", str(affected["file"]), "--repair-passes", "--storage", affected["url"]]
    assert main(args) == 0  # no --evaluator, no GPU: nothing is measured or built
    out = capsys.readouterr().out
    assert out.count("the second pass's row re-recorded") == 2
    assert out.rstrip().endswith("2 row(s) re-recorded; 5 of the file's 5 shape(s) have a study, 5 a recorded "
                                 "second pass")
    assert main(args) == 0
    assert "0 row(s) re-recorded" in capsys.readouterr().out
    assert main(args + ["--dry-run"]) == 2
    assert "--repair-passes: runs alone" in capsys.readouterr().err
    missing = ["campaign", str(affected["file"]), "--repair-passes", "--storage",
               f"sqlite:///{affected['file'].parent / 'none.db'}"]
    assert main(missing) == 2 and "no such database file" in capsys.readouterr().err
    assert not (affected["file"].parent / "none.db").exists()


def test_a_campaign_repairs_its_shapes_first(affected):
    """The shapes are finished and second-passed: the run repairs their rows and measures nothing."""
    url = affected["url"]
    plans = campaign.plan(campaign.load(affected["file"]), SearchOptions(shape=SHAPES[0], storage=url))
    for p in plans:
        campaign_run.load_study(p, GPU).set_user_attr(campaign_run.RECORD_ATTR, {"finished": True, "seconds": 1.0})
    lines: list[str] = []
    plugs = campaign_run.Plugs(evaluator=None, builder=None, gpu_name=GPU, own=False)  # nothing may be measured
    done = campaign_run.run(plans, log=lines.append, plugs=plugs)
    assert [o.state for o in done.outcomes] == ["finished earlier"] * 5
    assert [line.split(":")[1].strip() for line in lines if "re-recorded" in line] == [SHAPES[0].key, SHAPES[1].key]
    after, _ = rows(url)
    assert after[SHAPES[0]].config_key == RUNNER_UP.key
