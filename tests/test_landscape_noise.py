"""Landscape re-measurement sessions (autotune/landscapes/noise.py, benchmarks/landscape_noise.py): the file format
keeps old files readable, the top rows are re-timed interleaved, each session is recorded, and the noise band
across sessions is computed from what was recorded.

In-process builder and evaluator doubles (no nvcc, no GPU) except the last test, which runs the script with the
real Builder and the search's test double in the worker's child process.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import pytest

from autotune.build.builder import BuildResult
from autotune.build.ptxas import BuildReport
from autotune.landscapes import landscape_file
from autotune.landscapes import noise
from autotune.measure.child_process import EvalOutcome
from landscape_fixtures import ARCH, SMALL_SHAPE, small_landscape

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "landscape_noise.py"


class FakeBuilder:
    jobs = 1

    def __init__(self, fail: set[str] = frozenset()):
        self.fail = fail

    def build(self, items, progress=None):
        return [BuildResult(c, p, ARCH, ok=c.key not in self.fail, cubin_path=None,
                            report=BuildReport(168, 0, 0, 0, 0, 0.5), error="synthetic" if c.key in self.fail else None,
                            cached=True, key=c.key, cubin_hash=hashlib.sha256(c.key.encode()).hexdigest())
                for c, p in items]


class ScaledEvaluator:
    """This session's figure of a config: its recorded TFLOPS × scale[key] (default 1) × the round's factor."""

    def __init__(self, landscape, scale: dict | None = None, rounds=(1.0, 1.01, 0.99)):
        self.landscape, self.scale, self.rounds = landscape, scale or {}, rounds
        self.calls: list[str] = []

    def evaluate(self, build, shape):
        key = build.config.key
        n = self.calls.count(key)
        self.calls.append(key)
        tflops = self.landscape.row(key).tflops * self.scale.get(key, 1.0) * self.rounds[n % len(self.rounds)]
        ms = shape.flops / (tflops * 1e12) * 1e3
        return EvalOutcome("complete", "", tflops, ms, ms * 0.01, 1e-3, 1)


def session(landscape, evaluator, builder=None, top=5, rounds=3, source="s" * 64):
    return noise.remeasure(landscape, builder or FakeBuilder(), evaluator, gpu_name="Fake H200",
                           kernel_source_hash=source, nvcc_version="13.0", evaluator_name="fake", top=top,
                           rounds=rounds, log=lambda _: None)


def test_top_rows_are_the_fastest_complete_ones_one_per_cubin(tmp_path):
    ls = small_landscape()
    top = noise.top_rows(ls, 5)
    done = sorted((r for r in ls.complete_rows()), key=lambda r: -r.tflops)
    assert [r.config_key for r in top] == [r.config_key for r in done[:5]]
    twin = landscape_file.Row(**{**top[1].__dict__, "config_key": done[-1].config_key,
                                 "same_cubin_as": top[1].config_key, "tflops": top[0].tflops + 1})
    ls.add(twin)  # a copy of another row's timing, now the fastest on paper: not timed twice
    assert twin.config_key not in [r.config_key for r in noise.top_rows(ls, 5)]


def test_a_session_times_the_top_interleaved_and_is_recorded(tmp_path):
    ls = small_landscape(tmp_path / "l.json")
    top = [r.config_key for r in noise.top_rows(ls, 3)]
    ev = ScaledEvaluator(ls)
    s = session(ls, ev, top=3)
    assert ev.calls == top * 3  # A B C, A B C, A B C
    assert ls.sessions == [s] and s["rounds"] == 3 and s["gpu_name"] == "Fake H200"
    entry = ls.row(top[0]).sessions[0]
    recorded = ls.row(top[0]).tflops
    assert entry["session"] == s["id"] and entry["tflops"] == pytest.approx(recorded, abs=0.01)
    assert entry["rounds"] == pytest.approx([recorded, recorded * 1.01, recorded * 0.99], abs=0.01)
    assert entry["spread"] == pytest.approx(0.02, abs=1e-4)
    assert ls.row(noise.top_rows(ls, 4)[3].config_key).sessions is None  # outside the top 3: untouched

    again = landscape_file.load(ls.save())  # the file keeps it, and reads back valid
    assert again.sessions == [s] and again.row(top[0]).sessions == [entry]


def test_a_failed_build_or_round_is_recorded_as_such():
    ls = small_landscape()
    first, second = (r.config_key for r in noise.top_rows(ls, 2))

    class Crashy(ScaledEvaluator):
        def evaluate(self, build, shape):
            if build.config.key == second and self.calls.count(second) == 1:
                self.calls.append(second)
                return EvalOutcome("crashed", "illegal address")
            return super().evaluate(build, shape)

    s = session(ls, Crashy(ls), top=2)
    assert ls.row(second).sessions == [{"session": s["id"], "status": "crashed", "reason": "illegal address"}]
    s2 = session(ls, ScaledEvaluator(ls), builder=FakeBuilder(fail={first}), top=2)
    assert ls.row(first).sessions[-1] == {"session": s2["id"], "status": "compile_error", "reason": "synthetic"}
    landscape_file.loads(landscape_file.dumps(ls))  # still a valid file


def test_the_table_shows_the_rank_changes():
    ls = small_landscape()
    a, b, c = (r.config_key for r in noise.top_rows(ls, 3))
    s = session(ls, ScaledEvaluator(ls, {c: 1.5}), top=3)  # the third is now far ahead
    table = {r.config_key: r for r in noise.session_table(ls, s["id"])}
    assert (table[c].recorded_rank, table[c].rank, table[c].rank_change) == (3, 1, 2)
    assert (table[a].rank, table[a].rank_change) == (2, -1)
    lines = noise.format_table(ls, s["id"])
    assert lines[0].endswith(s["id"]) and len(lines) == 2 + 3 and any("+2" in line and c in line for line in lines)


def test_the_noise_band_across_sessions_of_the_same_sources():
    ls = small_landscape()
    top = [r.config_key for r in noise.top_rows(ls, 4)]
    with pytest.raises(ValueError, match="no re-measurement session"):
        noise.noise_band(ls)
    session(ls, ScaledEvaluator(ls), top=4)
    with pytest.raises(ValueError, match="1 session"):
        noise.noise_band(ls)
    session(ls, ScaledEvaluator(ls, {top[0]: 1.04, top[1]: 1.02, top[2]: 0.98, top[3]: 1.0}), top=4)
    b = noise.noise_band(ls)
    assert (b.sessions, b.configs) == (2, 4)
    # per config (max - min) / median of its two session medians: 4 %, 2 %, 2 %, 0 % (around 1.02, 1.01, ...)
    spreads = sorted([0.04 / 1.02, 0.02 / 1.01, 0.02 / 0.99, 0.0])
    assert b.band == pytest.approx((spreads[1] + spreads[2]) / 2, rel=1e-3)
    assert b.worst == pytest.approx(spreads[3], rel=1e-3)
    assert b.within == pytest.approx(0.02, abs=1e-3)
    assert "noise band" in b.describe() and "2 sessions" in b.describe()
    # a session of other kernel sources starts a new comparison: the band needs two of the latest sources
    session(ls, ScaledEvaluator(ls), top=4, source="t" * 64)
    with pytest.raises(ValueError, match="1 session"):
        noise.noise_band(ls)


def test_old_files_read_as_before_and_bad_sessions_are_refused(tmp_path):
    for path in sorted((Path(__file__).resolve().parent.parent / "studies" / "landscapes").glob("*.json")):
        ls = landscape_file.load(path)  # the shipped files load, and round-trip unchanged
        text = landscape_file.dumps(ls)
        same = landscape_file.dumps(landscape_file.loads(text)) == text
        assert same  # a bool: pytest's diff of two 100 kB texts would take minutes
    ls = small_landscape()
    assert ls.sessions == [] and '"sessions"' not in landscape_file.dumps(ls)  # a file without sessions writes none
    key = noise.top_rows(ls, 1)[0].config_key
    session(ls, ScaledEvaluator(ls), top=1)
    data = json.loads(landscape_file.dumps(ls))
    row = next(r for r in data["rows"] if r["config_key"] == key)
    row["sessions"][0]["session"] = "another"
    with pytest.raises(landscape_file.LandscapeError, match="names no session of the header"):
        landscape_file.loads(json.dumps(data))
    row["sessions"][0] = {"session": ls.sessions[0]["id"], "tflops": 500.0, "rounds": [500.0, -1]}
    with pytest.raises(landscape_file.LandscapeError, match="positive TFLOPS"):
        landscape_file.loads(json.dumps(data))
    data["header"]["sessions"].append(dict(data["header"]["sessions"][0]))
    with pytest.raises(landscape_file.LandscapeError, match="share an id"):
        landscape_file.loads(json.dumps(data))


def _script():
    spec = importlib.util.spec_from_file_location("landscape_noise", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_script_prints_the_band_on_the_cpu(tmp_path, capsys):
    ls = small_landscape(tmp_path / "two.json")
    for scale in (1.0, 1.03):
        session(ls, ScaledEvaluator(ls, {r.config_key: scale for r in noise.top_rows(ls, 2)[:1]}), top=2)
    ls.save()
    one = small_landscape(tmp_path / "one.json")
    assert _script().main(["--band", str(tmp_path / "two.json")]) == 0
    assert "two: noise band" in capsys.readouterr().out
    assert _script().main(["--band", str(one.path)]) == 1
    assert "no re-measurement session" in capsys.readouterr().out


def test_the_script_with_real_builds_and_the_worker(tmp_path, build_cache_dir, monkeypatch, capsys):
    """The fake-GPU path: real nvcc builds of the top config, the search's double timing it in the worker's child
    process, the updated file and the table written under $OUT, the input file left as it was."""
    source = tmp_path / "in" / "small.json"
    small_landscape(source)
    before = source.read_text()
    out = tmp_path / "out"
    monkeypatch.setenv("OUT", str(out))
    monkeypatch.setenv("AUTOTUNE_DOUBLE_ARCH", "sm_90")
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))  # the worker's child imports search_doubles
    assert _script().main(["--evaluator", "search_doubles:evaluate", "--top", "1", "--rounds", "2", "--jobs", "2",
                           "--cache-dir", str(build_cache_dir), str(source)]) == 0
    assert source.read_text() == before
    ls = landscape_file.load(out / "landscapes" / "small.json")
    (s,) = ls.sessions
    assert s["gpu_name"] == "Test Double GPU" and s["rounds"] == 2 and s["evaluator"] == "search_doubles:evaluate"
    (entry,) = [e for r in ls.rows.values() for e in r.sessions or ()]
    assert len(entry["rounds"]) == 2 and entry["spread"] == 0.0  # the double answers the same figure each time
    text = (out / "landscape_noise.txt").read_text()
    assert "small: session" in text and "no noise band yet" in text and "total" in text
