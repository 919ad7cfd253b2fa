"""`autotune search / best / export / import` from the command line (in-process, through autotune.cli.main).

The search runs with the real Builder on the session's shared kernel cache and the evaluator test double; the
configs are those of tests/test_search.py (already in the cache when both modules run).
"""
from __future__ import annotations

import json

import pytest

import search_doubles
from autotune.cli import main
from test_search import A, DEFAULT, E, INVALID

SHAPE_ARGS = ["--seqlen", "256", "--batch", "1", "--heads", "2", "--head-dim", "128"]


@pytest.fixture
def env(tmp_path, monkeypatch, build_cache_dir):
    log = tmp_path / "double-calls.jsonl"
    monkeypatch.setenv("AUTOTUNE_DOUBLE_LOG", str(log))
    monkeypatch.delenv("AUTOTUNE_DOUBLE_PLAN", raising=False)
    monkeypatch.delenv("AUTOTUNE_STORAGE", raising=False)
    monkeypatch.delenv("AUTOTUNE_DOUBLE_ARCH", raising=False)
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    common = ["--evaluator", "search_doubles:evaluate", "--arch", "sm_80", "--storage", url,
              "--cache-dir", str(build_cache_dir), "--jobs", "2", "--sampler", "random"]
    return {"url": url, "common": common, "log": log, "tmp": tmp_path}


def test_search_without_a_gpu_points_to_compile_only_work(capsys, monkeypatch):
    import autotune.launch.gpu_arch as gpu_arch

    def no_gpu(device: int = 0):
        raise gpu_arch.NoGpuError(gpu_arch.NO_GPU_MESSAGE)

    monkeypatch.setattr(gpu_arch, "detect_arch", no_gpu)  # CI has none; a dev box might
    assert main(["search", *SHAPE_ARGS]) == 2
    err = capsys.readouterr().err
    assert "needs a CUDA GPU" in err and "autotune space --compile" in err


def test_search_best_export_import_round_trip(env, capsys):
    args = ["search", *SHAPE_ARGS, *env["common"], "--trials", "3", "--enqueue", INVALID.key, "--enqueue", A.key,
            "--enqueue", E.key, "--retime", "2"]
    assert main(args) == 0
    out = capsys.readouterr().out
    # a fresh study starts with the heuristic default (it does not spill: evaluated like the rest), then the
    # --enqueue'd configs (the invalid one is not built)
    assert "study test-double-gpu-b1-h2-n256-d128-fp16-full: 0 of 3 trials already evaluated" in out
    assert "[3/3]" in out and "trials by status:" in out and "invalid 1" in out
    assert "pruned for register spills:" in out and "GPU idle waiting for builds:" in out
    assert "sdpa_flash" in out and "sdpa_cudnn" in out
    evaluated = [json.loads(x)["config_key"] for x in env["log"].read_text().splitlines()
                 if json.loads(x)["call"] == "evaluate"]
    assert INVALID.key not in evaluated and {DEFAULT.key, A.key, E.key} <= set(evaluated)
    # the double's figures decide the winner and the two re-timed at the end
    first, second = sorted((DEFAULT, A, E), key=search_doubles.fake_tflops, reverse=True)[:2]
    assert f"best: trial #" in out and first.key in out and "stored: inserted in autotune_best" in out

    assert main(["best", "--storage", env["url"], "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 1 and rows[0]["config_key"] == first.key and rows[0]["seqlen"] == 256
    assert rows[0]["tflops"] == pytest.approx(search_doubles.fake_tflops(first))
    assert rows[0]["study"] == "test-double-gpu-b1-h2-n256-d128-fp16-full"

    assert main(["best", "--storage", env["url"], "--gpu", "double", "--head-dim", "128", "--no-causal"]) == 0
    table = capsys.readouterr().out
    assert first.key in table and "1 row(s)" in table
    assert main(["best", "--storage", env["url"], "--seqlen", "4096", "--gpu", "double"]) == 0
    assert "no stored or shipped rows match" in capsys.readouterr().out

    path = env["tmp"] / "shipped" / "table.json"
    path.parent.mkdir()  # export creates no directories
    assert main(["export", str(path), "--storage", env["url"], "--dtype", "fp16"]) == 0
    assert "wrote 1 row(s)" in capsys.readouterr().out
    other = f"sqlite:///{env['tmp'] / 'other.db'}"
    assert main(["import", str(path), "--storage", other]) == 0
    assert "1 inserted, 0 replaced" in capsys.readouterr().out
    assert main(["import", str(path), "--storage", other]) == 0
    assert "0 inserted, 0 replaced by faster rows, 1 kept" in capsys.readouterr().out
    assert main(["best", "--storage", other, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == rows

    # the same command again resumes the finished study: nothing new is built or run, the row is kept
    before = len(env["log"].read_text().splitlines())
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "3 of 3 trials already evaluated" in out and "stored: kept the existing row, as fast or faster" in out
    new_calls = [json.loads(x) for x in env["log"].read_text().splitlines()[before:]]
    # re-timing only: the two finalists interleaved, three rounds
    assert [c["config_key"] for c in new_calls if c["call"] == "evaluate"] == [first.key, second.key] * 3


def test_storage_comes_from_the_environment(env, capsys, monkeypatch):
    path = env["tmp"] / "t.json"
    src = f"sqlite:///{env['tmp'] / 'src.db'}"
    from autotune.store.best_table import BestEntry, BestStore
    import space

    with BestStore(src) as s:
        s.record_best(BestEntry.for_shape(space.Shape(), "NVIDIA H200", "sm_90", DEFAULT, 321.0, study="x", trial=1))
        s.export_json(path)
    monkeypatch.setenv("AUTOTUNE_STORAGE", env["url"])
    assert main(["import", str(path)]) == 0
    assert env["url"].split("///")[1] in capsys.readouterr().out
    assert main(["best", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["tflops"] == 321.0


@pytest.mark.parametrize("extra,message", [
    (["--spill-policy", "sometimes"], "--spill-policy: expected prune, allow or max-bytes=N"),
    (["--kv-heads", "5"], "--kv-heads: must divide heads"),
    (["--seqlen", "0"], "--seqlen: expected a positive integer"),
    (["--trials", "-1"], "--trials: expected a count"),
    (["--eval-timeout", "0"], "--eval-timeout: expected seconds > 0"),
    (["--enqueue", "mma_sync:br=7"], "--enqueue mma_sync:br=7"),
    (["--arch", "sm_99"], "sm_99"),
])
def test_search_argument_errors_name_the_argument(env, capsys, extra, message):
    assert main(["search", *SHAPE_ARGS, *env["common"], *extra]) == 2
    assert message in capsys.readouterr().err


def test_search_refuses_an_arch_the_gpu_cannot_run(env, capsys, monkeypatch):
    monkeypatch.setenv("AUTOTUNE_DOUBLE_ARCH", "sm_90")  # the double's "GPU" is a Hopper; we asked for sm_80
    assert main(["search", *SHAPE_ARGS, *env["common"], "--trials", "1"]) == 2
    assert "--arch sm_80: its cubins cannot run on this GPU (sm_90)" in capsys.readouterr().err


def test_import_and_export_errors(env, capsys, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "autotune-best", "schema_version": 1, "rows": [{"gpu_name": "x"}]}))
    assert main(["import", str(bad), "--storage", env["url"]]) == 1  # the row is skipped, nothing else to import
    assert "rows[0]: missing field(s)" in capsys.readouterr().err
    assert main(["import", str(tmp_path / "none.json"), "--storage", env["url"]]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert main(["best", "--storage", env["url"], "--arch", "sm_7"]) == 2
    assert "arch" in capsys.readouterr().err


def test_causal_lower_right_is_a_shape_of_its_own_and_causal_alone_is_upper_left():
    import argparse

    import space
    from autotune.commands import search_cmd

    parser = argparse.ArgumentParser()
    search_cmd.add_shape_arguments(parser)
    decode = ["--seqlen", "4", "--seqlen-k", "4096", "--kv-heads", "4"]
    for flags, causal, align in ((["--causal"], True, "upper_left"), (["--causal", "upper_left"], True, "upper_left"),
                                 (["--causal", "lower_right"], True, "lower_right"), ([], False, "upper_left")):
        shape = search_cmd.shape_from_args(parser.parse_args(decode + flags))
        assert (shape.causal, shape.causal_align) == (causal, align), flags
    # --causal before another flag takes no value from it
    shape = search_cmd.shape_from_args(parser.parse_args(["--causal", *decode]))
    assert (shape.causal, shape.causal_align, shape.seqlen_q) == (True, "upper_left", 4)
    lower_right = search_cmd.shape_from_args(parser.parse_args(decode + ["--causal", "lower_right"]))
    assert lower_right.key == "b4-h16-kv4-n4-k4096-d128-fp16-causal-lower-right"
    from autotune.search.study import default_study_name

    assert default_study_name("NVIDIA H200", lower_right).endswith("-causal-lower-right")
    square = search_cmd.shape_from_args(parser.parse_args(["--seqlen", "512", "--causal", "lower_right"]))
    assert square == space.Shape(seqlen_q=512, causal=True)  # one mask: one shape, one study


def test_a_misspelt_alignment_is_an_error_naming_causal(env, capsys):
    with pytest.raises(SystemExit) as done:
        main(["search", *SHAPE_ARGS, *env["common"], "--causal", "bottom_right"])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert "argument --causal" in err and "'bottom_right'" in err and "lower_right" in err


def test_a_replay_refuses_another_alignment_naming_causal(capsys):
    landscape = sorted(__import__("pathlib").Path("studies/landscapes").glob("*causal*.json"))[0]
    assert main(["search", "--replay", str(landscape), "--causal", "lower_right", "--seqlen-k", "64"]) == 2
    err = capsys.readouterr().err
    assert "--causal lower_right" in err and "cannot be replayed" in err
