"""The statistics and repetition planning behind autotune.measure.timing.bench (the CUDA-event loop itself is GPU-only)."""
from __future__ import annotations

import pytest

from autotune.measure.timing import MAX_REPS, plan_reps, summarize


def test_summarize_reports_median_percentiles_and_min():
    t = summarize([5.0, 1.0, 3.0, 2.0, 4.0, 100.0])  # one outlier must not move the median much
    assert t.median_ms == pytest.approx(3.5)
    assert t.p20_ms == pytest.approx(2.0)
    assert t.p80_ms == pytest.approx(5.0)
    assert t.min_ms == 1.0 and t.n == 6


def test_summarize_needs_a_sample():
    with pytest.raises(ValueError, match="at least one"):
        summarize([])


def test_plan_reps_scales_with_the_estimate():
    assert plan_reps(estimate_ms=1.0, warmup_ms=25, rep_ms=100) == (25, 100)
    assert plan_reps(estimate_ms=50.0, warmup_ms=25, rep_ms=100) == (1, 2)  # slow kernels: at least one each
    assert plan_reps(estimate_ms=1e-6, warmup_ms=25, rep_ms=100) == (MAX_REPS, MAX_REPS)  # capped
    assert plan_reps(estimate_ms=1.0, warmup_ms=25, rep_ms=100, n_rep=7) == (25, 7)
    with pytest.raises(ValueError, match="n_rep"):
        plan_reps(1.0, 25, 100, n_rep=0)


def test_bench_flushes_outside_the_timed_region_and_times_each_rep(monkeypatch):
    """The CUDA-event loop, with torch.cuda replaced by recorders: the order of work on the stream is the point."""
    torch = pytest.importorskip("torch")
    from autotune.measure import timing

    stream: list[str] = []

    class Event:
        count = 0

        def __init__(self, enable_timing=False):
            assert enable_timing
            Event.count += 1
            self.id = Event.count

        def record(self):
            stream.append(f"event{self.id}")
            self.at = len(stream)

        def elapsed_time(self, end):
            return 2.0  # ms per rep, so the plan is warmup 25/2 -> 12, timed 100/2 -> 50

    class Flush:
        def zero_(self):
            stream.append("flush")

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: stream.append("sync"))
    monkeypatch.setattr(timing, "_flush_buffer", lambda device: Flush())
    result = timing.bench(lambda: stream.append("fn"), device=0)

    assert result.n == 50 and result.median_ms == 2.0
    assert stream.count("fn") == 1 + timing.ESTIMATE_REPS + 12 + 50  # cold call, estimate, warm-up, timed
    timed = [i for i, op in enumerate(stream) if op == "fn"][-50:]
    for i in timed:  # flush, start event, fn, end event: the flush is enqueued before the start event
        assert stream[i - 2] == "flush" and stream[i - 1].startswith("event") and stream[i + 1].startswith("event")
    assert stream[-1] == "sync"
