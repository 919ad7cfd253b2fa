"""The check that a shipped table holds on another day (autotune/search/table_check.py, benchmarks/table_holds.py):
the finalists file, which row the table serves, the verdict, and a check on a synthetic noisy GPU with known
true speeds (tests/finale_doubles.py)."""
from __future__ import annotations

import json
import os
import statistics
from pathlib import Path
from types import SimpleNamespace

import pytest

import finale_doubles as fd
import search_doubles
import space
from autotune.search import table_check

ROOT = Path(__file__).resolve().parent.parent
SHAPE_ATTRS = {"batch": 1, "heads": 2, "kv_heads": 2, "seqlen_q": 256, "seqlen_k": 256, "head_dim": 256,
               "dtype": "fp16", "causal": False, "causal_align": "upper_left"}
A, B, C = (fd.near_default(n).key for n in range(3))


def finalist(trial, key, first, second):
    return {"trial": trial, "config_key": key, "first_tflops": first, "second_tflops": second,
            "first_rounds": [first], "second_rounds": [second] if second else [], "status": "complete"}


def study(name, finalists, shipped):
    attrs = {"shape": SHAPE_ATTRS, "gpu_name": "NVIDIA H200", "arch": "sm_90",
             "second_pass": {"shipped": shipped, "first_winner": 0, "finalists": finalists}}
    return SimpleNamespace(study_name=name, user_attrs=attrs)


def test_the_finalists_are_those_of_both_passes_best_across_them_first_and_a_study_without_a_pass_is_left_out():
    s = study("s1", [finalist(0, A, 100.0, 90.0), finalist(1, B, 96.0, 99.0), finalist(2, C, 101.0, None)], 1)
    none = SimpleNamespace(study_name="s0", user_attrs={"shape": SHAPE_ATTRS})
    (item,) = table_check.from_studies([s, none])
    assert item.shipped == B
    assert [k for _, k, _, _ in item.finalists] == [B, A]  # C failed the second pass: nothing to compare
    assert item.shape == fd.SHAPE


def test_the_finalists_file_round_trips_and_another_file_is_refused_by_name(tmp_path):
    s = study("s1", [finalist(0, A, 100.0, 90.0), finalist(1, B, 96.0, 99.0)], 1)
    items = table_check.from_studies([s])
    path = table_check.write(tmp_path / "f.json", items, "sqlite:///x.db")
    assert table_check.read(path) == items
    other = tmp_path / "table.json"
    other.write_text(json.dumps({"format": "autotune-best", "rows": []}))
    with pytest.raises(ValueError, match="expected a finalists file"):
        table_check.read(other)


def test_write_finalists_with_merge_keeps_the_files_other_shapes_and_replaces_the_retuned_ones(tmp_path,
                                                                                                 monkeypatch):
    import importlib.util

    spec = importlib.util.spec_from_file_location("table_holds", ROOT / "benchmarks" / "table_holds.py")
    table_holds = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table_holds)
    old = table_check.from_studies([study("s1", [finalist(0, A, 100.0, 90.0)], 0),
                                    study("s2", [finalist(0, B, 50.0, 51.0)], 0)])
    path = table_check.write(tmp_path / "f.json", old, "sqlite:///old.db")
    retuned = table_check.from_studies([study("s2", [finalist(3, C, 60.0, 61.0)], 3),
                                        study("s3", [finalist(1, A, 70.0, 71.0)], 1)])
    assert len(retuned) == 2
    monkeypatch.setattr(table_check, "from_storage", lambda url: retuned)
    assert table_holds.main(["--write-finalists", "sqlite:///new.db", "--finalists", str(path), "--merge"]) == 0
    got = table_check.read(path)
    assert [(f.study, f.shipped) for f in got] == [("s1", A), ("s2", C), ("s3", A)]
    assert json.loads(path.read_text())["source"] == "sqlite:///new.db, merged into sqlite:///old.db"
    # without --merge the file is the storage's alone
    assert table_holds.main(["--write-finalists", "sqlite:///new.db", "--finalists", str(path)]) == 0
    assert [f.study for f in table_check.read(path)] == ["s2", "s3"]


def row(study_name, key, **shape):
    fields = {**SHAPE_ATTRS, **shape}
    fields["seqlen"] = fields.pop("seqlen_q")
    return {"gpu_name": "NVIDIA H200", "arch": "sm_90", "study": study_name, "config_key": key, **fields}


def test_the_served_config_is_the_studys_row_else_the_same_shapes_else_none():
    (item,) = table_check.from_studies([study("s1", [finalist(0, A, 100.0, 99.0)], 0)])
    assert table_check.served_config([row("other", C), row("s1", B)], item) == B
    assert table_check.served_config([row("other", C)], item) == C
    assert table_check.served_config([row("s1", B, seqlen_q=512, seqlen_k=512)], item) is None


def test_a_row_holds_within_the_band_and_not_beyond_it_nor_when_its_config_fails():
    assert table_check.judge("s", A, {A: 98.6, B: 100.0}, band=0.015).holds
    assert not table_check.judge("s", A, {A: 98.4, B: 100.0}, band=0.015).holds
    failed = table_check.judge("s", A, {A: None, B: 100.0})
    assert not failed.holds and failed.best == B
    assert not table_check.judge("s", None, {B: 100.0}).holds  # the table has no row for the shape


def check(truths: dict, served: str, sigma: float = 0.002, seed: int = 0):
    item = table_check.ShapeFinalists("s", fd.SHAPE, "NVIDIA H200", "sm_90", served,
                                      tuple((i, k, 1.0, 1.0) for i, k in enumerate(k for k in truths if k != C)))
    gpu = fd.NoisyGPU({fd.near_default(n): truths[k] for n, k in enumerate((A, B, C)) if k in truths}, sigma, seed)
    return table_check.check_shape(item, served, fd.Builder(), gpu, rounds=3, log=lambda _: None), gpu


def test_a_served_config_measurably_behind_its_best_finalist_does_not_hold_and_the_best_one_does():
    slow, _ = check({A: 95.0, B: 100.0}, A)
    assert not slow.holds and slow.best == B and slow.ratio == pytest.approx(0.95, abs=0.01)
    fast, _ = check({A: 95.0, B: 100.0}, B)
    assert fast.holds and fast.best == B


def test_a_served_config_that_is_no_finalist_is_timed_beside_them():
    v, gpu = check({A: 100.0, B: 99.0, C: 99.5}, C)  # C: the table's config, not in the finalists file
    assert set(v.medians) == {A, B, C}
    assert sum(1 for c in gpu.calls if c.key == C) == 3
    assert v.holds


def test_the_shipped_finalists_file_covers_every_second_passed_row_of_the_shipped_table():
    table = json.loads((ROOT / "studies" / "tuned" / "h200.json").read_text())["rows"]
    items = {i.study: i for i in table_check.read(ROOT / "studies" / "finalists" / "h200.json")}
    passed = [r for r in table if r.get("second_pass_tflops")]
    assert passed, "the shipped table has no second-passed row"
    for r in passed:
        item = items.get(r["study"])
        assert item is not None, f"{r['study']}: no finalists in studies/finalists/h200.json (re-run --write-finalists)"
        assert item.shipped == r["config_key"], f"{r['study']}: the table ships another config than its pass"
        assert table_check.served_config(table, item) == r["config_key"]


def test_the_script_checks_the_shipped_table_on_the_fake_gpu_and_writes_its_table(tmp_path):
    import os
    import subprocess
    import sys

    # The fake GPU ranks configs by a formula of its own, not by the H200's figures: the configs the shipped table
    # serves for the two shapes are boosted, so each row holds however the fake would rank the real finalists.
    table = json.loads((ROOT / "studies" / "tuned" / "h200.json").read_text())["rows"]
    items = [i for i in table_check.read(ROOT / "studies" / "finalists" / "h200.json")
             if i.shape.key.startswith("b4-h16-n4096-d128-fp16")]
    assert len(items) == 2
    double = search_doubles.Control(tmp_path)  # keys as the double sees them: today's, every axis named
    double.plan({space.Config.from_key(table_check.served_config(table, i)): "boost" for i in items})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]),
           "AUTOTUNE_DOUBLE_ARCH": "sm_90", **double.env()}
    env.pop("OUT", None)
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "table_holds.py"), "--evaluator",
                           "search_doubles:evaluate", "--fake-builder", "--shapes", "b4-h16-n4096-d128-fp16",
                           "--out-dir", str(tmp_path)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads((tmp_path / "table-holds.json").read_text())
    assert [v["shape"] for v in result["verdicts"]] == ["b4-h16-n4096-d128-fp16-causal", "b4-h16-n4096-d128-fp16-full"]
    assert "2 of 2 row(s) within 1.5 %" in (tmp_path / "table-holds.md").read_text()


def test_the_best_finalist_is_chosen_on_other_rounds_than_those_it_is_compared_on():
    assert table_check.split_medians([100.0, 90.0, 102.0, 91.0]) == (101.0, 90.5)
    assert table_check.split_medians([100.0]) == (100.0, 100.0)
    assert table_check.split_medians([100.0, None]) == (None, None)
    # B drew high on the choosing rounds and not on the comparing ones: the served A holds against B's comparing
    # figure; judged on the rounds that chose B, A would read as 4 % behind
    split = table_check.judge("s", A, {A: 100.0, B: 99.5}, chosen_on={A: 99.0, B: 103.0})
    assert split.best == B and split.holds
    assert not table_check.judge("s", A, {A: 99.0, B: 103.0}).holds


def test_a_table_of_true_winners_holds_more_often_with_the_choice_made_on_other_rounds():
    # five finalists of one true speed: every served config is a true winner, and the check should say so
    keys = [fd.near_default(n) for n in range(5)]
    item = table_check.ShapeFinalists("s", fd.SHAPE, "NVIDIA H200", "sm_90", keys[0].key,
                                      tuple((i, c.key, 1.0, 1.0) for i, c in enumerate(keys)))
    # 400 seeds: a property of the method, not of a few draws (the draws are seeded by the config keys, which an
    # added axis changes; at 40 seeds the margin moved with them)
    split = same = 0
    for seed in range(400):
        gpu = fd.NoisyGPU({c: 100.0 for c in keys}, 0.03, seed)
        v = table_check.check_shape(item, keys[0].key, fd.Builder(), gpu, rounds=6, log=lambda _: None)
        split += v.holds
        pooled = {c.key: statistics.median(o.tflops for o in gpu_rounds(gpu, c)) for c in keys}
        same += table_check.judge("s", keys[0].key, pooled).holds
    assert split >= same + 48, (split, same)  # 12 points; measured 23 (the 2026-12-03 keys)


def gpu_rounds(gpu, config):
    """The figures a NoisyGPU drew for `config`, in order (its draws are reproducible by count)."""
    import math
    import random

    n = sum(1 for c in gpu.calls if c == config)
    out = []
    for i in range(n):
        rng = random.Random(f"{gpu.seed}:{config.key}:{i}")
        out.append(SimpleNamespace(tflops=gpu.truth[config] * math.exp(rng.gauss(0, gpu.sigma))))
    return out


def test_a_check_killed_mid_run_leaves_the_shapes_it_checked(tmp_path, monkeypatch):
    import importlib.util

    spec = importlib.util.spec_from_file_location("table_holds", ROOT / "benchmarks" / "table_holds.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    monkeypatch.setenv("AUTOTUNE_DOUBLE_ARCH", "sm_90")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), str(ROOT / "tests")]))
    real = table_check.check_shape
    calls = []

    def killed_on_the_second(*args, **kwargs):  # what the GPU host's time limit does to a run
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(table_check, "check_shape", killed_on_the_second)
    with pytest.raises(KeyboardInterrupt):
        script.main(["--evaluator", "search_doubles:evaluate", "--fake-builder", "--shapes", "b4-h16-n4096-d128-fp16",
                     "--out-dir", str(tmp_path)])
    result = json.loads((tmp_path / "table-holds.json").read_text())
    assert not result["complete"] and [v["shape"] for v in result["verdicts"]] == ["b4-h16-n4096-d128-fp16-causal"]
    assert result["not_checked"] == ["b4-h16-n4096-d128-fp16-full"]
    assert "not reached yet" in (tmp_path / "table-holds.md").read_text()
