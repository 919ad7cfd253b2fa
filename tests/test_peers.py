"""FlashAttention-4 as a peer (autotune.measure.peer_fa4), on CPU: it is reported as unavailable with the install hint
rather than failing the baselines; its name survives the evaluator process boundary as "fa4" (not "sdpa_fa4");
the summary and `autotune bench` rate ours against the fastest peer."""
from __future__ import annotations

import builtins
import dataclasses
import sys
import types

import pytest

import space
from autotune.measure import child_process as worker
from autotune.measure import evaluate as measure
from autotune.measure import peer_fa4
from autotune.commands import bench_cmd

SHAPE = space.Shape(batch=1, heads=2, seqlen_q=256, head_dim=128)


@pytest.fixture
def no_flash_attn(monkeypatch):
    real_import = builtins.__import__

    def refuse(name, *args, **kwargs):
        if name == "flash_attn.cute" or name.startswith("flash_attn"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "flash_attn", raising=False)
    monkeypatch.delitem(sys.modules, "flash_attn.cute", raising=False)
    monkeypatch.setattr(builtins, "__import__", refuse)


def test_missing_peer_is_a_reason_not_an_error(no_flash_attn):
    assert "pip install 'autotune[peers]'" in peer_fa4.unavailable()
    reasons = {}
    out = measure.sdpa_baselines(SHAPE, ("fa4",), reasons=reasons)
    assert out == {"fa4": None}
    assert reasons["fa4"].startswith("fa4: flash_attn.cute does not import")


def test_causal_with_unequal_lengths_is_refused_before_any_gpu_work(monkeypatch):
    # FlashAttention aligns such a mask bottom-right: a different function from ours, so no comparison.
    monkeypatch.setattr(peer_fa4, "unavailable", lambda: None)
    shape = space.Shape(batch=1, heads=2, seqlen_q=100, seqlen_k=300, head_dim=128, causal=True)
    with pytest.raises(peer_fa4.PeerUnavailable, match="bottom-right"):
        peer_fa4.fa4_timing(shape)


def test_peer_names_cross_the_process_boundary_unprefixed(monkeypatch):
    module = types.ModuleType("fake_evaluator")
    module.PEERS = ("fa4",)
    module.sdpa_baselines = lambda shape: {"flash": 300.0, "cudnn": None, "fa4": 620.0}
    monkeypatch.setitem(sys.modules, "fake_evaluator", module)
    assert worker._child_baselines("fake_evaluator:evaluate", SHAPE) == {
        "sdpa_flash": 300.0, "sdpa_cudnn": None, "fa4": 620.0}
    del module.PEERS  # an evaluator that declares no peers: every name is an SDPA backend, as before
    assert "sdpa_fa4" in worker._child_baselines("fake_evaluator:evaluate", SHAPE)


def test_measure_declares_what_it_times():
    assert set(measure.PEERS) <= set(measure.DEFAULT_BASELINES)
    assert set(bench_cmd.BAR) <= set(bench_cmd.BACKENDS)


def test_summary_rates_the_winner_against_the_fastest_peer():
    from autotune.search.progress import format_result

    class Outcome:
        tflops, status = 600.0, "complete"

    class Best:
        number, outcome = 7, Outcome()
        config = types.SimpleNamespace(key="wgmma:x")

    from autotune.search.options import SearchResult

    # Every field of the real result at its default (so the stand-in follows the dataclass), then this case's values.
    defaults = {f.name: f.default if f.default is not dataclasses.MISSING
                else f.default_factory() if f.default_factory is not dataclasses.MISSING else None
                for f in dataclasses.fields(SearchResult)}
    r = types.SimpleNamespace(**defaults)
    r.__dict__.update(
        study_name="s", gpu_name="g", arch=space.get_arch("sm_90"), shape=SHAPE, stop_reason="done", evaluated=1,
        target=1, asks=1, this_run={}, counts={}, idle_seconds=0.0, idle_other_seconds=0.0, first_eval_after=None,
        build_seconds=0.0, eval_seconds=0.0, wall_seconds=1.0, workers=[], top=[], retimed=[], notes=[],
        interrupted=False, best=Best(), record=None, storage="x",
        baselines={"sdpa_flash": 300.0, "sdpa_cudnn": 580.0, "sdpa_efficient": 170.0, "fa4": 625.0})
    try:
        text = format_result(r)
    except AttributeError as e:  # the summary reads a field this stand-in lacks: say which
        pytest.fail(f"stand-in SearchResult is missing {e}")
    assert "fa4" in text
    assert "600.0 TFLOPS = 2.00× sdpa_flash, 0.96× fa4" in text


def test_bench_table_has_the_best_peer_column():
    rows = [{"name": "fa4", "median_ms": 1.0, "tflops": 600.0, "vs_flash": 2.0, "vs_cudnn": 1.05, "vs_fa4": 1.0,
             "vs_best": 1.0, "status": "complete"}]
    head = bench_cmd.table(rows).splitlines()[0]
    assert "vs FA4" in head and "vs best" in head
