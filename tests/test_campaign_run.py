"""Running a campaign (autotune/search/campaign_run.py): resuming across runs, the budget, shared builds and
evaluator, the closing table; and the shipped H200 matrix file. Real builds of tests/test_search.py's configs (the
session's kernel cache), the evaluator double in its child process, SQLite."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

import search_doubles
from autotune.cli import main
from autotune.search import campaign, campaign_run, campaign_table
from autotune.search.loop import SearchOptions
from autotune.store.best_table import BestStore
from space import Shape
from test_campaign import RUNNER_UP, WIN
from test_search import ARCH, DEFAULT, SHAPE, SpyBuilder

REPO = Path(__file__).resolve().parents[1]
MATRIX = REPO / "studies" / "campaigns" / "h200-matrix.toml"
S1 = SHAPE                                               # b1-h2-n256-d128-fp16-full
S2 = dataclasses.replace(SHAPE, seqlen_q=512, seqlen_k=512)


@pytest.fixture
def env(tmp_path, monkeypatch, build_cache_dir):
    control = search_doubles.Control(tmp_path)
    for k, v in control.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("AUTOTUNE_DOUBLE_SLOW", "12")
    monkeypatch.delenv("AUTOTUNE_STORAGE", raising=False)
    return {"url": f"sqlite:///{tmp_path / 'c.db'}", "cache": str(build_cache_dir), "tmp": tmp_path,
            "control": control}


def opts(env, shape, **kw) -> SearchOptions:
    base = dict(shape=shape, trials=2, storage=env["url"], arch="sm_80", evaluator="search_doubles:evaluate",
                sampler="random", seed=0, eval_timeout=60, cache_dir=env["cache"], jobs=2, retime_top=1)
    base.update(kw)
    return SearchOptions(**base)


class ScriptedBudget(campaign_run.Budget):
    """A budget whose trial-loop limits are given in order, one per shape started (None: unbounded; 0: stop)."""

    def __init__(self, limits):
        super().__init__(None)
        self.limits = list(limits)

    def trial_loop_s(self):
        return self.limits.pop(0)


def evaluated_trials(env, shape) -> list[str]:
    """Config keys of the shape's evaluated (built, not repeated) trials, in trial order."""
    import optuna

    name = campaign_run.study_name(opts(env, shape), search_doubles.GPU_NAME)
    study = optuna.load_study(study_name=name, storage=env["url"])
    return [t.user_attrs["config_key"] for t in sorted(study.trials, key=lambda t: t.number)
            if t.state.name in ("COMPLETE", "PRUNED") and t.user_attrs.get("status") not in (None, "invalid")
            and "duplicate_of" not in t.user_attrs]


def test_a_shape_cut_by_the_budget_resumes_and_finished_shapes_are_skipped(env):
    control = env["control"]
    # S1's first trial (the heuristic default, queued first) takes 12 s, past the 6 s its trial loop is given
    control.plan({DEFAULT: "slow"})
    plans = [opts(env, S1, enqueue=(WIN,)), opts(env, S2, enqueue=(WIN,))]
    lines: list[str] = []
    first = campaign_run.run(plans, log=lines.append, budget=ScriptedBudget([6.0, 0.0]))
    assert [o.state for o in first.outcomes] == ["cut by the budget", "not reached"]
    assert first.stopped.startswith("budget: ") and first.stopped.endswith(f"continues from {S2.key}")
    assert evaluated_trials(env, S1) == [DEFAULT.key]  # the slow evaluation finished; WIN's trial was cancelled
    assert any(line.startswith(f"campaign [1/2] {S1.key}: ") and "[cut by the budget]" in line for line in lines)
    first_rows = campaign_table.shape_rows(plans, first.gpu_name)
    assert [r.state for r in first_rows] == ["unfinished", "not started"]
    with BestStore(env["url"]) as store:  # held for a second pass it did not get (unfinished): stored at the end
        assert store.lookup(search_doubles.GPU_NAME, "sm_80", S1).config_key == DEFAULT.key
    assert first.outcomes[0].second_pass is None

    control.plan({})
    mark = control.mark()
    lines.clear()
    second = campaign_run.run(plans, log=lines.append, budget=ScriptedBudget([None, None]))
    assert [o.state for o in second.outcomes] == ["finished", "finished"]
    # S1 resumed: its judged trial stays; WIN, cancelled by the cut, is queued again and evaluated, then re-timed
    assert any("1 of 2 trials already evaluated" in line for line in lines), lines
    assert evaluated_trials(env, S1) == [DEFAULT.key, WIN.key]
    assert f"campaign: {S1.key}: the configs the last run cancelled are queued again" in lines
    assert control.evaluated()[mark:mark + 2] == [WIN.key, WIN.key]
    rows = campaign_table.shape_rows(plans, second.gpu_name)
    assert [r.state for r in rows] == ["finished", "finished"] and rows[0].trials == 2
    assert rows[0].config_key == WIN.key and rows[0].seconds > first_rows[0].seconds  # seconds of both runs

    mark = control.mark()
    lines.clear()
    third = campaign_run.run(plans, log=lines.append, budget=ScriptedBudget([]))
    assert [o.state for o in third.outcomes] == ["finished earlier", "finished earlier"]
    assert "campaign: 2 of 2 shape(s) finished in earlier runs, skipped" in lines
    assert control.evaluated()[mark:] == []


def test_the_budget_stops_the_run_before_a_shape_it_cannot_fit(env, capsys):
    path = env["tmp"] / "c.toml"
    path.write_text(f'defaults = {{ batch = 1, heads = 2, head_dim = 128, trials = 1, enqueue = ["{WIN.key}"] }}\n'
                    "shapes = [{ seqlen = 256 }, { seqlen = 512 }]\n")
    common = ["--storage", env["url"], "--evaluator", "search_doubles:evaluate", "--arch", "sm_80",
              "--cache-dir", env["cache"], "--jobs", "2", "--sampler", "random"]
    # 25 s: less than the 20 s reserve + 10 s of trial loop that a shape needs, so nothing starts
    snapshot, table = env["tmp"] / "snap.db", env["tmp"] / "table.md"
    assert main(["campaign", str(path), *common, "--budget-s", "25", "--snapshot", str(snapshot),
                 "--markdown", str(table)]) == 1
    out = capsys.readouterr().out
    assert "campaign: budget: " in out and "continues from b1-h2-n256-d128-fp16-full" in out
    assert "== campaign" not in out and out.count("not started") == 2
    assert env["control"].evaluated() == []
    assert table.read_text().splitlines()[2] == "| b1-h2-n256-d128-fp16-full | not started | - | - | - | 0 | - |"
    import sqlite3

    with sqlite3.connect(snapshot) as db:  # a copy of the storage, with Optuna's tables in it
        assert ("studies",) in db.execute("select name from sqlite_master where type = 'table'").fetchall()
    assert main(["campaign", str(path), *common, "--reserve-s", "5"]) == 2
    assert "--reserve-s: only means something with --budget-s" in capsys.readouterr().err


def test_budget_arithmetic():
    assert campaign_run.Budget(None).trial_loop_s() is None
    loop = campaign_run.Budget(100, reserve_s=20).trial_loop_s()
    assert 79 < loop <= 80
    assert campaign_run.Budget(29, reserve_s=20).trial_loop_s() == 0.0  # under MIN_TRIAL_LOOP_S left
    with pytest.raises(ValueError, match="--budget-s"):
        campaign_run.Budget(0)


def test_every_binary_is_built_once_per_campaign(env):
    spy = SpyBuilder(env["cache"])
    evaluator = campaign_run.Evaluator("search_doubles:evaluate", timeout=60)
    plugs = campaign_run.Plugs(evaluator, campaign_run.SharedBuilder(spy), search_doubles.GPU_NAME)
    # both shapes try WIN and RUNNER_UP (S2 also warm-starts from S1), and each re-times its winner at the end
    plans = [opts(env, S1, enqueue=(WIN, RUNNER_UP), trials=3), opts(env, S2, enqueue=(WIN, RUNNER_UP), trials=3)]
    done = campaign_run.run(plans, log=lambda _: None, plugs=plugs)
    assert [o.state for o in done.outcomes] == ["finished", "finished"]
    asked = [key for call in spy.calls for key in call]
    assert sorted(asked) == sorted(set(asked)) and {WIN.key, RUNNER_UP.key, DEFAULT.key} <= set(asked)


def test_the_second_pass_retimes_the_finalists_in_another_process_and_ships_the_best_across_both(env):
    control = env["control"]
    plans = [opts(env, S1, enqueue=(WIN, RUNNER_UP), trials=3, retime_top=2, retime_within=0.0, retime_rounds=2)]
    seen = {}

    def log(line: str) -> None:
        if line.startswith("== campaign second pass"):
            seen["mark"] = control.mark()
            with BestStore(env["url"]) as store:  # the first pass's winner is held, not stored yet
                seen["stored before"] = store.lookup(search_doubles.GPU_NAME, "sm_80", S1)
            control.plan({RUNNER_UP: "boost"})  # the later process measures the runner-up 30 % faster

    done = campaign_run.run(plans, log=log)
    assert seen["stored before"] is None
    first, second = control.calls()[:seen["mark"]], control.calls()[seen["mark"]:]
    assert {c["config_key"] for c in second} == {WIN.key, RUNNER_UP.key} and len(second) == 4  # 2 finalists × 2
    assert {c["pid"] for c in second}.isdisjoint({c["pid"] for c in first})  # another evaluator process
    result = done.outcomes[0].second_pass
    f = search_doubles.fake_tflops
    assert result.shipped.config_key == RUNNER_UP.key and result.first_winner != result.shipped.number
    assert result.shipped.figure == pytest.approx((f(RUNNER_UP) * 1.3 * f(RUNNER_UP)) ** 0.5)
    assert result.shipped.figure > (f(WIN) * f(WIN)) ** 0.5  # the best across both passes
    with BestStore(env["url"]) as store:
        row = store.lookup(search_doubles.GPU_NAME, "sm_80", S1)
    assert row.config_key == RUNNER_UP.key and row.tflops == pytest.approx(result.shipped.figure)
    # the row itself records both passes, the shipped config's and the runner-up's
    assert (row.first_pass_tflops, row.second_pass_tflops) == pytest.approx((f(RUNNER_UP), 1.3 * f(RUNNER_UP)))
    assert row.runner_up_config_key == WIN.key
    assert (row.runner_up_first_tflops, row.runner_up_second_tflops) == pytest.approx((f(WIN), f(WIN)))
    export = env["tmp"] / "tuned.json"
    assert main(["export", str(export), "--storage", env["url"]]) == 0
    (exported,) = json.loads(export.read_text())["rows"]
    assert exported["second_pass_tflops"] == pytest.approx(1.3 * f(RUNNER_UP))
    assert exported["runner_up_config_key"] == WIN.key
    import optuna

    study = optuna.load_study(study_name=campaign_run.study_name(plans[0], done.gpu_name), storage=env["url"])
    attr = study.user_attrs["second_pass"]
    by_key = {x["config_key"]: x for x in attr["finalists"]}
    assert by_key[WIN.key]["first_tflops"] == pytest.approx(f(WIN))
    assert by_key[WIN.key]["second_tflops"] == pytest.approx(f(WIN))
    assert by_key[RUNNER_UP.key]["second_tflops"] == pytest.approx(1.3 * f(RUNNER_UP))
    (table_row,) = campaign_table.shape_rows(plans, done.gpu_name)  # the table shows what was stored
    assert table_row.config_key == RUNNER_UP.key and table_row.passes == pytest.approx(
        (f(RUNNER_UP), 1.3 * f(RUNNER_UP)))
    # the doubles' baselines: flash 150, cudnn 200 TFLOPS; the table compares with the fastest unless asked
    assert (table_row.peer, table_row.peer_tflops) == ("sdpa_cudnn", pytest.approx(200.0))
    (flash_row,) = campaign_table.shape_rows(plans, done.gpu_name, versus="sdpa_flash")
    assert (flash_row.peer, flash_row.peer_tflops) == ("sdpa_flash", pytest.approx(150.0))
    assert flash_row.versus_peer == pytest.approx(table_row.tflops / 150.0)
    (fa4_row,) = campaign_table.shape_rows(plans, done.gpu_name, versus="fa4")  # not measured here
    assert fa4_row.peer == "fa4" and fa4_row.peer_tflops is None and fa4_row.versus_peer is None
    mark = control.mark()
    again = campaign_run.run(plans, log=lambda _: None)  # finished, second pass done: nothing runs again
    assert control.mark() == mark and again.outcomes[0].state == "finished earlier"


def test_the_closing_table_text_and_markdown():
    rows = [campaign_table.ShapeRow(S1, "finished", WIN.key, 512.25, "sdpa_cudnn", 500.0, 12, 17.5, (510.0, 514.5)),
            campaign_table.ShapeRow(S2, "unfinished", RUNNER_UP.key, 400.0, "fa4", 500.0, 5, 9.0),
            campaign_table.ShapeRow(dataclasses.replace(S1, causal=True), "not started")]
    text = campaign_table.format_table(rows)
    lines = text.splitlines()
    assert lines[0].split() == ["shape", "best", "config", "TFLOPS", "passes", "vs", "best", "peer", "trials",
                                "seconds"]
    first = lines[2]
    assert first.startswith(f"  {S1.key}") and first.split()[-8:] == ["512.2", "510.0", "/", "514.5", "1.02×",
                                                                     "sdpa_cudnn", "12", "17.5"]
    assert "(unfinished)" in lines[3] and "0.80× fa4" in lines[3]
    assert lines[4].split()[1:] == ["not", "started", "-", "-", "-", "0", "-"]
    assert lines[-1] == "  1 of 3 shape(s) finished; 17.5 s per finished shape on average (18 s); vs best peer 0.80-1.02×"
    md = campaign_table.format_table(rows, markdown=True).splitlines()
    assert md[0] == "| shape | best config | TFLOPS | passes | vs best peer | trials | seconds |"
    assert md[1] == "|---|---|---|---|---|---|---|"
    assert md[2] == (f"| {S1.key} | {campaign_table.short_config(WIN.key)} | 512.2 | 510.0 / 514.5 | 1.02× sdpa_cudnn "
                     "| 12 | 17.5 |")
    # the axes added after o_rescale at their defaults
    assert campaign_table.short_config("wgmma:consumer_wgs=2,bc=128,stages=3,setmaxnreg=1,overlap=1,pingpong=0,"
                                       "o_store=smem,min_blocks=1,scheduler=grid,o_rescale=after") == \
        "wgmma cw2 bc128 st3 se1 ov1 pi0 os=smem mb1 sc=grid or=after sr=chain ef=none ts0 ks1 pg0"


def test_the_closing_table_against_a_named_peer():
    rows = [campaign_table.ShapeRow(S1, "finished", WIN.key, 330.0, "sdpa_flash", 300.0, 12, 17.5),
            campaign_table.ShapeRow(S2, "finished", RUNNER_UP.key, 310.0, "sdpa_flash", None, 5, 9.0)]
    md = campaign_table.format_table(rows, markdown=True, versus="sdpa_flash").splitlines()
    assert md[0] == "| shape | best config | TFLOPS | passes | vs sdpa_flash | trials | seconds |"
    assert "| 1.10× sdpa_flash |" in md[2] and "| sdpa_flash not measured |" in md[3]
    assert md[-1].endswith("; vs sdpa_flash 1.10-1.10×")
    assert campaign_table.format_table(rows, versus="sdpa_flash").splitlines()[0].split()[5:7] == ["vs", "sdpa_flash"]


def test_campaign_versus_names_a_peer_the_search_measures(capsys):
    with pytest.raises(SystemExit):
        main(["campaign", str(MATRIX), "--dry-run", "--versus", "flash"])
    assert "--versus: invalid choice: 'flash'" in capsys.readouterr().err


def test_neighbour_order_grows_each_group_from_its_first_shape():
    def plan(seqlen, **kw):
        return SearchOptions(shape=Shape(seqlen_q=seqlen, batch=16384 // seqlen, heads=16, **kw))

    plans = [plan(4096), plan(512), plan(16384), plan(4096, causal=True), plan(2048), plan(1024, causal=True),
             plan(8192)]
    ordered = campaign.neighbour_order(plans)
    assert [(p.shape.seqlen_q, p.shape.causal) for p in ordered] == [
        (4096, False), (2048, False), (8192, False), (16384, False), (512, False), (4096, True), (1024, True)]


PEER_SHAPES = [Shape(4, 16, 4096, head_dim=128), Shape(4, 16, 4096, head_dim=128, causal=True),
               Shape(4, 32, 4096, head_dim=64), Shape(4, 16, 4096, head_dim=128, dtype="bf16"),
               Shape(1, 64, 1024, head_dim=128), Shape(16, 16, 512, head_dim=64),
               Shape(2, 8, 4096, head_dim=256, dtype="bf16")]


def test_the_h200_matrix_file():
    entries = campaign.load(MATRIX)
    shapes = [e.shape for e in entries]
    assert 36 <= len(shapes) <= 48
    assert all(s in shapes for s in PEER_SHAPES), [s.key for s in PEER_SHAPES if s not in shapes]
    problems = {(s.dtype, s.head_dim, s.causal) for s in shapes}
    assert problems == {(t, d, c) for t in ("fp16", "bf16") for d in (64, 128, 256) for c in (False, True)}
    for problem in problems:
        seqlens = {s.seqlen_q for s in shapes if (s.dtype, s.head_dim, s.causal) == problem}
        assert {512, 4096, 16384} <= seqlens, problem
    assert all(e.options == {"trials": 12, "warm_start": 8, "families": ("wgmma",), "retime_top": 3} for e in entries)
    # every group starts at its seqlen-4096 shape, whatever the order inside the file
    ordered = campaign.neighbour_order(campaign.plan(entries, SearchOptions(shape=shapes[0])))
    firsts = [p.shape for i, p in enumerate(ordered) if i == 0 or p.shape.problem != ordered[i - 1].shape.problem]
    assert len(firsts) == 12 and all(s.seqlen_q == 4096 for s in firsts)
    # every shape is valid for the wgmma family on sm_90 (its heuristic default exists)
    import space

    for s in shapes:
        assert space.is_valid(space.default_config(s.problem, space.get_arch("sm_90"), "wgmma"), s.problem,
                              space.get_arch("sm_90")), s.key


def entry(shape, config, tflops):
    """A best-per-shape row of the double's GPU."""
    from autotune.store.best_table import BestEntry

    return BestEntry.for_shape(shape, search_doubles.GPU_NAME, ARCH.name, config, tflops, time_ms=1.0,
                               spread_ms=0.0, study="elsewhere", trial=0)


def shipped_table(path):
    """A shipped table (export of a storage) holding WIN for S1 and RUNNER_UP for S2, at `path`."""
    from autotune.store.best_table import BestStore

    with BestStore(f"sqlite:///{path.with_suffix('.db')}") as store:
        store.record_best(entry(S1, WIN, 300.0))
        store.record_best(entry(S2, RUNNER_UP, 300.0))
        store.export_json(path)
    return path


def test_shipped_rows_warm_start_a_fresh_storage_and_the_storage_wins(tmp_path):
    from autotune.search.warm_start import WarmStore, neighbour_configs
    from autotune.store.best_table import BestStore

    shipped = shipped_table(tmp_path / "shipped.json")
    url = f"sqlite:///{tmp_path / 'new.db'}"
    store = WarmStore.open(url, [shipped])
    try:
        # the shipped row of the very shape comes first (distance 0), then the neighbour's
        assert neighbour_configs(store, None, S1, search_doubles.GPU_NAME, ARCH, 2, log=lambda _: None) == [
            WIN, RUNNER_UP]
        store.record_best(entry(S1, DEFAULT, 200.0))  # the storage's own row of S1 replaces the shipped one
        assert neighbour_configs(store, None, S1, search_doubles.GPU_NAME, ARCH, 2, log=lambda _: None) == [
            DEFAULT, RUNNER_UP]
    finally:
        store.close()
    assert len(BestStore(url).all_rows()) == 1  # storing never copies the shipped rows in
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="--warm-from: .*bad.json"):
        WarmStore.open(url, [tmp_path / "bad.json"])


def test_export_merge_keeps_the_rows_of_shapes_the_campaign_did_not_tune(tmp_path, capsys):
    from autotune.store.best_table import BestStore, read_export

    table = shipped_table(tmp_path / "gpu.json")
    campaign_db = f"sqlite:///{tmp_path / 'campaign.db'}"
    with BestStore(campaign_db) as retuned:
        retuned.record_best(entry(S1, DEFAULT, 250.0))  # retuned today: slower figure, still the newer row
    assert main(["export", str(table), "--merge", "--storage", campaign_db]) == 0
    assert "wrote 2 row(s)" in capsys.readouterr().out
    rows = {e.shape: e for e in read_export(table).entries}
    assert rows[S1].config_key == DEFAULT.key and rows[S2].config_key == RUNNER_UP.key
    assert main(["export", str(table), "--storage", campaign_db]) == 0  # without --merge: the storage's rows only
    assert [e.shape for e in read_export(table).entries] == [S1]
