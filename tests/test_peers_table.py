"""benchmarks/peers_table.py's rounds, on CPU: kernels are timed interleaved, round after round, and a column keeps
its best round (a slow stretch of the GPU must land on every column, not on one)."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import peers_table  # noqa: E402


def test_rounds_interleave_rotate_and_keep_each_columns_best():
    order = []
    rates = {"ours": iter([90.0, 100.0, 95.0]), "fa4": iter([80.0, 70.0, 75.0])}

    def measure(name):
        order.append(name)
        return next(rates[name])

    best, spread, samples = peers_table.interleaved_best(["ours", "fa4"], 3, measure)
    assert order == ["ours", "fa4", "fa4", "ours", "ours", "fa4"]  # each round starts one kernel further on
    assert best == {"ours": 100.0, "fa4": 80.0}
    assert spread["ours"] == pytest.approx(0.10) and spread["fa4"] == pytest.approx(0.125)
    assert samples == {"ours": [90.0, 100.0, 95.0], "fa4": [80.0, 70.0, 75.0]}


def test_rounds_must_be_positive():
    with pytest.raises(SystemExit):
        peers_table.main(["--rounds", "0"])


def test_table_names_where_each_rows_config_came_from():
    # on an H100 a row may run the H200's row (same_arch): the table must say so, not only the config
    row = {"shape": "b4-h16-n4096-d128-fp16-full", "tflops": {"ours": 630.0, "fa4": 620.0}, "best_peer": 620.0,
           "ours_vs_best": 630.0 / 620.0, "notes": {}, "rounds": 1,
           "config": "b4-h16-n4096-d128-fp16-full on NVIDIA H100 80GB HBM3 (sm_90): wgmma-...",
           "source": "  source: same_arch — tuned on NVIDIA H200, another GPU of sm_90, exact shape, from h200.json"}
    text = peers_table.markdown([row])
    assert "| 630 |" in text and "1.02×" in text
    assert "\n  - source: same_arch — tuned on NVIDIA H200" in text
