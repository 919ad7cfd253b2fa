"""Campaigns: the file formats, and warm starts from tuned neighbours (SQLite, real builds of the configs of
tests/test_search.py — the same problem at every seqlen, so the session's kernel cache serves them all — and the
evaluator double)."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

import search_doubles
from autotune.search import campaign, campaign_run, campaign_table
from autotune.search import study as studies
from autotune.cli import main
from autotune.search.loop import SearchOptions, run_search
from space import Shape
from test_search import ARCH, B, DEFAULT, PROBLEM, SHAPE

# A fresh study evaluates the heuristic default first, and it does not spill: the neighbours' winners must beat it
# under the double's figures for the warm starts below to be told apart from it.
WIN = DEFAULT.replace(warps_m=8)                    # the nearest neighbour's winner
# (kv_buffering=double would score between them, but at 128x64 d128 on sm_80 it spills 20 B and is never timed)
RUNNER_UP = DEFAULT.replace(loader_warps=1)          # the farther neighbour's

NEAR = dataclasses.replace(SHAPE, seqlen_q=512, seqlen_k=512)   # distance 1 from SHAPE
FAR = dataclasses.replace(SHAPE, seqlen_q=8192, seqlen_k=8192)  # distance 5


@pytest.fixture
def env(tmp_path, monkeypatch, build_cache_dir):
    monkeypatch.setenv("AUTOTUNE_DOUBLE_LOG", str(tmp_path / "double-calls.jsonl"))
    monkeypatch.delenv("AUTOTUNE_DOUBLE_PLAN", raising=False)
    monkeypatch.delenv("AUTOTUNE_STORAGE", raising=False)
    return {"url": f"sqlite:///{tmp_path / 'c.db'}", "cache": str(build_cache_dir), "tmp": tmp_path}


def opts(env, shape, **kw) -> SearchOptions:
    base = dict(shape=shape, trials=2, storage=env["url"], arch="sm_80", evaluator="search_doubles:evaluate",
                sampler="random", seed=0, eval_timeout=60, cache_dir=env["cache"], jobs=2, retime_top=1)
    base.update(kw)
    return SearchOptions(**base)


def first_evaluated(url: str, name: str) -> str:
    import optuna

    study = optuna.load_study(study_name=name, storage=url)
    built = [t for t in sorted(study.trials, key=lambda t: t.number)
             if t.user_attrs.get("status") not in (None, "invalid")]
    return built[0].user_attrs["config_key"]


def test_the_winners_beat_the_default():
    import space

    f = search_doubles.fake_tflops
    assert f(WIN) > f(RUNNER_UP) > f(DEFAULT) > f(B)
    assert all(space.is_valid(c, PROBLEM, ARCH) for c in (WIN, RUNNER_UP))


def test_the_winners_compile_without_spills(build_cache_dir):
    """A spilling build is pruned before it is timed, so a spilling WIN or RUNNER_UP could never win its study."""
    from autotune.build.builder import Builder

    results = Builder(ARCH, cache_dir=build_cache_dir).build([(c, PROBLEM) for c in (WIN, RUNNER_UP)])
    assert [(r.config.key, r.ok and not r.spilled) for r in results] == [(WIN.key, True), (RUNNER_UP.key, True)]


def test_a_new_shape_starts_from_its_nearest_tuned_neighbours_best(env):
    far = run_search(opts(env, FAR, enqueue=(RUNNER_UP,)), log=lambda _: None)         # FAR's best: RUNNER_UP
    near = run_search(opts(env, SHAPE, trials=3, enqueue=(B, WIN)), log=lambda _: None)  # SHAPE's best: WIN
    assert near.best.config == WIN and far.best.config == RUNNER_UP

    lines: list[str] = []
    warm = run_search(opts(env, NEAR, warm_start=2), log=lines.append)
    # the nearest neighbour's winner first, then the farther one's: before the heuristic default
    assert first_evaluated(env["url"], warm.study_name) == WIN.key
    assert any(line.startswith("warm start: 2 config(s)") and SHAPE.key in line and FAR.key in line
               for line in lines), lines
    import optuna

    study = optuna.load_study(study_name=warm.study_name, storage=env["url"])
    assert studies.trials_to_best(study) == 1
    queued = [t.user_attrs.get("config_key") for t in sorted(study.trials, key=lambda t: t.number)][:2]
    assert queued == [WIN.key, RUNNER_UP.key]

    cold = run_search(opts(env, NEAR, study_name="cold", trials=1), log=lambda _: None)
    assert first_evaluated(env["url"], cold.study_name) == DEFAULT.key  # without warm start: the heuristic


def test_campaign_runs_shapes_in_order_and_warm_starts_the_later_ones(env, capsys):
    path = env["tmp"] / "c.toml"
    path.write_text(f"""
[defaults]
batch = 1
heads = 2
head_dim = 128
trials = 2
enqueue = ["{WIN.key}"]

[[shapes]]
seqlen = 256

[[shapes]]
seqlen = 512
enqueue = []
""")
    common = ["--storage", env["url"], "--evaluator", "search_doubles:evaluate", "--arch", "sm_80",
              "--cache-dir", env["cache"], "--jobs", "2", "--sampler", "random"]
    assert main(["campaign", str(path), *common, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "1. b1-h2-n256-d128-fp16-full: 2 trials, sampler random, warm start 4" in out
    assert "2. b1-h2-n512-d128-fp16-full" in out

    assert main(["campaign", str(path), *common]) == 0
    out = capsys.readouterr().out
    assert "== campaign 2/2: b1-h2-n512-d128-fp16-full" in out and "warm start: " in out
    assert "campaign [2/2] b1-h2-n512-d128-fp16-full: " in out and "done 2/2" in out
    table = out[out.index("campaign: 2 shape(s)"):]
    assert "b1-h2-n256-d128-fp16-full" in table and campaign_table.short_config(WIN.key) in table
    n512 = [line for line in table.splitlines() if "n512" in line][0]
    assert "2" in n512.split()[-2:-1]  # 2 trials evaluated
    # the evaluator (one child process, one warm-up) served every shape of the campaign; the second pass has its
    # own (campaign_passes.py: the finalists re-timed in another process)
    calls = [json.loads(x) for x in (env["tmp"] / "double-calls.jsonl").read_text().splitlines()]
    assert sum(c["call"] == "warmup" for c in calls) == 2
    pids = [c["pid"] for c in calls if c["call"] == "evaluate"]
    assert len(set(pids)) == 2 and "== campaign second pass: 2 shape(s)" in out
    first_pass = pids[:pids.index(pids[-1])]
    assert len(set(first_pass)) == 1  # every shape's search on one evaluator process


def test_campaign_files_toml_json_yaml_and_their_errors(tmp_path):
    shapes = [{"seqlen": 1024}, {"seqlen": 4096, "causal": True, "trials": 60, "family": "mma_sync"}]
    doc = {"defaults": {"head_dim": 64, "trials": 10, "warm_start": 2}, "shapes": shapes}
    (tmp_path / "c.json").write_text(json.dumps(doc))
    (tmp_path / "c.yaml").write_text("defaults: {head_dim: 64, trials: 10, warm_start: 2}\nshapes:\n"
                                     "  - seqlen: 1024\n  - {seqlen: 4096, causal: true, trials: 60, family: mma_sync}\n")
    (tmp_path / "c.toml").write_text('[defaults]\nhead_dim = 64\ntrials = 10\nwarm_start = 2\n[[shapes]]\nseqlen = 1024\n'
                                     '[[shapes]]\nseqlen = 4096\ncausal = true\ntrials = 60\nfamily = "mma_sync"\n')
    expected = [campaign.Entry(Shape(seqlen_q=1024, head_dim=64), {"trials": 10, "warm_start": 2}),
                campaign.Entry(Shape(seqlen_q=4096, head_dim=64, causal=True),
                               {"trials": 60, "warm_start": 2, "families": ("mma_sync",)})]
    for name in ("c.json", "c.yaml", "c.toml"):
        assert campaign.load(tmp_path / name) == expected, name
    assert campaign.parse([{"seqlen": 128}]) == [campaign.Entry(Shape(seqlen_q=128))]  # a bare list of shapes
    (finale,) = campaign.plan(campaign.parse([{"retime": 3, "retime_rounds": 2}]), SearchOptions(shape=SHAPE))
    assert (finale.retime_top, finale.retime_rounds) == (3, 2)  # --retime and --retime-rounds

    base = SearchOptions(shape=SHAPE, trials=99, sampler="random")
    plans = campaign.plan(expected, base)
    assert [(p.shape, p.trials, p.sampler, p.warm_start) for p in plans] == [
        (expected[0].shape, 10, "random", 2), (expected[1].shape, 60, "random", 2)]

    for bad, message in ((["x"], r"shapes\[0\]: expected a table"), ({"shapes": []}, "non-empty"),
                         ([{"seqlen": 4, "seqlen_k": 64, "causal": "bottom_right"}],
                          r"shapes\[0\]: causal: expected true, false or one of 'upper_left', 'lower_right'"),
                         ([{"causal": 1}], r"shapes\[0\]: causal: expected"),
                         ([{"seqlen": 1, "speed": 2}], r"unknown key\(s\) \['speed'\]"),
                         ([{"seqlen": 0}], r"shapes\[0\]: seqlen_q: expected a positive integer"),
                         ([{"trials": "many"}], r"shapes\[0\]: trials: expected an integer"),
                         ([{"enqueue": ["nope"]}], r"shapes\[0\]: enqueue"),
                         ([{"seqlen": 64}, {"seqlen": 64}], r"shapes\[1\] repeats shapes\[0\]"),
                         ({"shape": []}, "unknown top-level")):
        with pytest.raises(campaign.CampaignError, match=message):
            campaign.parse(bad)
    (tmp_path / "c.txt").write_text("")
    with pytest.raises(campaign.CampaignError, match="expected a .toml"):
        campaign.load(tmp_path / "c.txt")
    (tmp_path / "broken.toml").write_text("[defaults\n")
    with pytest.raises(campaign.CampaignError, match="not valid TOML"):
        campaign.load(tmp_path / "broken.toml")


def test_search_with_several_seqlens_is_a_campaign(env, capsys):
    common = ["--batch", "1", "--heads", "2", "--head-dim", "128", "--storage", env["url"], "--evaluator",
              "search_doubles:evaluate", "--arch", "sm_80", "--cache-dir", env["cache"], "--jobs", "2", "--sampler",
              "random", "--trials", "2", "--retime", "1"]
    assert main(["search", "--seqlen", "256", "512", "--enqueue", WIN.key, *common]) == 0
    out = capsys.readouterr().out
    assert "== campaign 1/2: b1-h2-n256-d128-fp16-full (2 trials, warm start 4)" in out
    # n256's two evaluated configs (WIN and the default, which does not spill) warm-start n512
    assert "warm start: 2 config(s) from tuned neighbour(s) b1-h2-n256-d128-fp16-full" in out
    assert "campaign: 2 shape(s)" in out
    assert main(["search", "--seqlen", "256", "256", *common]) == 2
    assert "repeated" in capsys.readouterr().err
    assert main(["search", "--seqlen", "256", "512", "--study", "x", *common]) == 2
    assert "--study names one study" in capsys.readouterr().err


def test_a_campaign_shape_takes_causal_as_attention_does():
    toml = ('[[shapes]]\nseqlen = 4\nseqlen_k = 4096\ncausal = "lower_right"\n'
            '[[shapes]]\nseqlen = 4\nseqlen_k = 4096\ncausal = true\n'
            '[[shapes]]\nseqlen = 4\nseqlen_k = 4096\ncausal = "upper_left"\n')
    import tomllib

    with pytest.raises(campaign.CampaignError, match=r"shapes\[2\] repeats shapes\[1\]"):  # one mask, one shape
        campaign.parse(tomllib.loads(toml))
    lr, ul = (e.shape for e in campaign.parse(tomllib.loads(toml.rsplit("[[shapes]]", 1)[0])))
    assert (lr.causal, lr.causal_align, ul.causal, ul.causal_align) == (True, "lower_right", True, "upper_left")
    square = campaign.parse([{"seqlen": 64, "causal": "lower_right"}])[0].shape
    assert square == Shape(seqlen_q=64, causal=True)


def test_the_decode_campaign_tunes_its_speculative_rows_lower_right():
    entries = campaign.load(Path(__file__).parents[1] / "studies" / "campaigns" / "h200-decode.toml")
    few = [e.shape for e in entries if e.shape.seqlen_q > 1]
    assert few and all(s.causal and s.causal_align == "lower_right" for s in few)
    assert all(not e.shape.causal for e in entries if e.shape.seqlen_q == 1)  # one query: every key, no mask


@pytest.mark.parametrize("path", sorted((Path(__file__).parents[1] / "studies" / "campaigns").glob("h200-*.toml")),
                         ids=lambda p: p.name)
def test_every_shipped_h200_campaign_enqueues_configs_of_its_own_family_valid_for_its_shape(path):
    from space import config as space_config
    from space.arch import get_arch

    entries = campaign.load(path)
    assert entries
    for e in entries:
        families = e.options.get("families")
        for config in e.options.get("enqueue", ()):
            assert families is None or config.family in families, (path.name, e.shape.key, config.key)
            problems = space_config.violations(config, e.shape.problem, get_arch("sm_90"))
            assert not problems, (path.name, e.shape.key, config.key, problems)
