"""What a `--workers` search costs before and after its trials (measured on a 2-GPU H200 host, 2 workers took
0.80x the wall time of one for 60 trials, where the trial loops alone took 0.51x; the rest was start-up and the
finale). On CPU, through the evaluator double's call log: the launcher starts one evaluation child for the whole
run (its device query, then idle until the finale re-times in it), not a second one at the end; workers on GPUs of
one model take the launcher's device query instead of waiting for their own child's answer, and start that child
in the background (it still warms up before their first evaluation); on mixed GPUs each worker asks its own."""
from __future__ import annotations

import json

import pytest

from autotune.search.distributed import shared_device_info
from autotune.search.loop import run_search
from pg_server import pg_server, postgres_url  # noqa: F401  (pytest fixtures)
from test_distributed import double, enqueue, options  # noqa: F401  (double is a fixture)
from test_search import A, B, E


def _children(calls: list[dict]) -> dict:
    """{worker index or None (the launcher): set of evaluation-child pids that warmed up}"""
    out: dict = {}
    for c in calls:
        if c["call"] == "warmup":
            out.setdefault(c["worker"], set()).add(c["pid"])
    return out


def _run(postgres_url, build_cache_dir, double, monkeypatch, mixed: bool):
    monkeypatch.setenv("AUTOTUNE_DOUBLE_DEVICES", "2")
    if mixed:
        monkeypatch.setenv("AUTOTUNE_DOUBLE_MIXED", "1")
    enqueue(postgres_url, [A, B, E])
    lines: list[str] = []
    result = run_search(options(postgres_url, build_cache_dir, trials=3, workers=2), log=lines.append)
    assert result.best is not None and result.record is not None, "\n".join(lines)
    assert any(line.startswith("time: opening the study") for line in lines), "\n".join(lines)
    every_call = [json.loads(line) for line in double.log.read_text().splitlines() if line.strip()]
    return every_call, lines


def test_the_launcher_keeps_one_evaluator_and_workers_reuse_its_device_query(postgres_url, build_cache_dir,
                                                                              double, monkeypatch):
    calls, lines = _run(postgres_url, build_cache_dir, double, monkeypatch, mixed=False)
    children = _children(calls)
    # one child for the launcher: asked for the device at the start, re-timed the winner at the end
    assert len(children.get(None, ())) == 1, children
    launcher = [c["call"] for c in calls if c["worker"] is None]
    assert launcher[0] == "warmup" and "device_info" in launcher and "baselines" in launcher, launcher
    # the workers asked no device query of their own; each still warmed up a child before it evaluated
    assert [c for c in calls if c["worker"] is not None and c["call"] == "device_info"] == []
    for index in {c["worker"] for c in calls if c["worker"] is not None and c["call"] == "evaluate"}:
        first_warmup = next(i for i, c in enumerate(calls) if c["worker"] == index and c["call"] == "warmup")
        first_eval = next(i for i, c in enumerate(calls) if c["worker"] == index and c["call"] == "evaluate")
        assert first_warmup < first_eval


def test_workers_on_mixed_gpus_ask_their_own(postgres_url, build_cache_dir, double, monkeypatch):
    calls, _ = _run(postgres_url, build_cache_dir, double, monkeypatch, mixed=True)
    asked = {c["worker"] for c in calls if c["call"] == "device_info"}
    started = {c["worker"] for c in calls if c["call"] == "warmup" and c["worker"] is not None}
    assert started and started <= asked, (started, asked)


@pytest.mark.parametrize("info, expected", [
    ({"gpu_names": ["H200", "H200"], "archs": ["sm_90", "sm_90"]}, {"gpu_name": "H200", "arch": "sm_90"}),
    ({"gpu_names": ["H200", "H100"], "archs": ["sm_90", "sm_90"]}, None),
    ({"gpu_name": "H200", "arch": "sm_90"}, None),  # an evaluator that does not list the GPUs: each worker asks
])
def test_shared_device_info(info, expected):
    assert shared_device_info(info) == expected
