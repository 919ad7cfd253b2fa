"""`autotune sweep`: every valid config gets a row, builds stream into evaluations, resume, caps, bad evaluators.

Most tests use an in-process builder and evaluator double (no nvcc, no GPU, no child process); the last ones run
the command line and the H200 recording script with the real Builder on a handful of configs.
"""
from __future__ import annotations

import hashlib
import time
from pathlib import Path

import pytest

import space
from autotune.landscapes import landscape_file as landscape_mod
from autotune.measure import evaluate as measure
from autotune.landscapes import sweep_eval
from autotune.build.builder import BuildResult
from autotune.cli import main
from autotune.build.ptxas import BuildReport
from autotune.landscapes.sweep import SweepError, SweepOptions, run_sweeps
from autotune.measure.child_process import EvalOutcome
from landscape_fixtures import ARCH, SMALL_SHAPE

CONFIGS = sorted(space.valid_configs(SMALL_SHAPE.problem, ARCH, ("wgmma",)), key=lambda c: c.key)
COMPILE_ERROR, SPILLED = (c.key for c in CONFIGS[:2])
# two configs one cubin could serve: the same launch geometry, so the same scheduler (it sets the grid and smem)
TWIN_A, TWIN_B = [c.key for c in CONFIGS[2:] if c.scheduler == "grid"][:2]
WRONG, CRASHED = [c.key for c in CONFIGS[2:] if c.key not in (TWIN_A, TWIN_B)][:2]


class FakeBuilder:
    jobs = 2
    kernels_dir = None
    nvcc_version = "fake nvcc"

    def __init__(self):
        self.built: list[str] = []

    def build(self, items, progress=None):
        out = []
        for i, (config, problem) in enumerate(items):
            self.built.append(config.key)
            key = TWIN_A if config.key == TWIN_B else config.key  # two configs, one cubin
            spills = 32 if config.key == SPILLED else 0
            ok = config.key != COMPILE_ERROR
            r = BuildResult(config, problem, ARCH, ok=ok, cubin_path=None,
                            report=BuildReport(200, spills, spills, 0, 0, 0.5) if ok else None,
                            error=None if ok else "error: static assertion failed", cached=False, key=config.key,
                            cubin_hash=hashlib.sha256(key.encode()).hexdigest() if ok else None)
            out.append(r)
            if progress:
                progress(i + 1, len(items), r)
        return out


class FakeEvaluator:
    def __init__(self, delay: float = 0.0, crash_all: bool = False):
        self.delay, self.crash_all = delay, crash_all
        self.evaluated: list[str] = []

    def device_info(self):
        return {"gpu_name": "Fake H200", "arch": "sm_90"}

    def baselines(self, shape):
        return {"sdpa_flash": 100.0, "sdpa_cudnn": None}

    def evaluate(self, build, shape):
        self.evaluated.append(build.config.key)
        time.sleep(self.delay)
        if self.crash_all or build.config.key == CRASHED:
            return EvalOutcome("crashed", "CudaError: illegal address", context_lost=True)
        if build.config.key == WRONG:
            return EvalOutcome("wrong", "max error 1.5 > tolerance", max_error=1.5)
        tflops = 100.0 + CONFIGS.index(build.config)
        ms = shape.flops / (tflops * 1e12) * 1e3
        return EvalOutcome("complete", "", tflops, ms, ms * 0.02, 1e-3, 1,
                           extra={"p20_ms": ms * 0.99, "p80_ms": ms * 1.01, "n_reps": 30})

    def close(self):
        pass


def _sweep(tmp_path, evaluator=None, builder=None, **kw):
    options = SweepOptions(shapes=(SMALL_SHAPE,), families=("wgmma",), out=str(tmp_path / "l.json"), **kw)
    (result,) = run_sweeps(options, builder=builder or FakeBuilder(), evaluator=evaluator or FakeEvaluator(),
                           log=lambda _: None)
    return result


def test_every_valid_config_gets_a_row(tmp_path):
    ev = FakeEvaluator()
    r = _sweep(tmp_path, ev)
    ls = landscape_mod.load(r.path)  # valid on disk
    assert set(ls.rows) == {c.key for c in CONFIGS} and ls.header["complete"] is True
    assert ls.header["n_valid"] == len(CONFIGS) and ls.header["families"] == ["wgmma"]
    assert ls.header["gpu_name"] == "Fake H200" and ls.header["baselines"] == {"sdpa_flash": 100.0, "sdpa_cudnn": None}
    # Decided by the build alone, or a twin of a timed cubin: never evaluated.
    assert {COMPILE_ERROR, SPILLED} & set(ev.evaluated) == set()
    assert len({TWIN_A, TWIN_B} & set(ev.evaluated)) == 1
    assert len(ev.evaluated) == len(CONFIGS) - 3 == r.measured
    assert ls.rows[COMPILE_ERROR].status == "compile_error" and "static assertion" in ls.rows[COMPILE_ERROR].reason
    assert ls.rows[SPILLED].status == "spilled" and ls.rows[SPILLED].tflops is None
    assert ls.rows[SPILLED].spill_stores == 32
    twin = ls.rows[TWIN_B] if TWIN_B not in ev.evaluated else ls.rows[TWIN_A]
    assert twin.same_cubin_as in (TWIN_A, TWIN_B) and twin.tflops == ls.rows[twin.same_cubin_as].tflops
    assert ls.rows[WRONG].status == "wrong" and ls.rows[WRONG].max_error == 1.5
    assert ls.rows[CRASHED].status == "crashed" and "illegal address" in ls.rows[CRASHED].reason
    done = ls.rows[CONFIGS[-1].key]
    assert done.status == "complete" and done.n_reps == 30 and done.p20_ms < done.median_ms < done.p80_ms
    assert ls.best.config_key == CONFIGS[-1].key


def test_a_second_run_resumes_and_measures_only_what_is_missing(tmp_path):
    first = _sweep(tmp_path, limit=10)
    assert len(first.landscape.rows) == 10 and first.landscape.header["complete"] is False
    ev, builder = FakeEvaluator(), FakeBuilder()
    second = _sweep(tmp_path, ev, builder)
    assert second.resumed == 10 and len(second.landscape.rows) == len(CONFIGS)
    assert not set(builder.built) & set(first.landscape.rows)
    assert not set(ev.evaluated) & set(first.landscape.rows)


def test_a_file_of_another_gpu_is_not_resumed_without_fresh(tmp_path):
    _sweep(tmp_path, limit=3)

    class Other(FakeEvaluator):
        def device_info(self):
            return {"gpu_name": "Another GPU", "arch": "sm_90"}

    with pytest.raises(SweepError, match="gpu_name.*--fresh"):
        _sweep(tmp_path, Other())
    assert len(_sweep(tmp_path, Other(), fresh=True, limit=2).landscape.rows) == 2


def test_the_time_cap_leaves_configs_missing_and_a_rerun_completes(tmp_path):
    capped = _sweep(tmp_path, FakeEvaluator(delay=0.05), time_cap=0.3)
    ls = capped.landscape
    assert capped.not_measured > 0 and ls.header["complete"] is False
    assert len(ls.rows) == len(CONFIGS) - capped.not_measured
    assert {COMPILE_ERROR, SPILLED} <= set(ls.rows)  # build-decided rows cost no GPU time: always recorded
    assert len(landscape_mod.load(capped.path).missing()) == capped.not_measured
    assert _sweep(tmp_path).landscape.header["complete"] is True


def test_a_broken_evaluator_stops_the_sweep(tmp_path):
    with pytest.raises(SweepError, match="first 5 evaluations all crashed or hung.*illegal address"):
        _sweep(tmp_path, FakeEvaluator(crash_all=True))


def test_check_shapes_keep_the_problem_and_check_the_full_shape_only_when_cheap():
    big = space.Shape(batch=4, heads=32, kv_heads=8, seqlen_q=4096, head_dim=64, causal=True)
    (small,) = sweep_eval.check_shapes(big)
    assert small.problem == big.problem and small.batch == 1 and small.seqlen_q == sweep_eval.CHECK_SEQLEN
    assert small.heads // small.kv_heads == 4 and small.kv_heads == 2  # the GQA ratio survives
    h200_bf16 = space.Shape(batch=1, heads=64, seqlen_q=1024, head_dim=128, dtype="bf16")
    assert sweep_eval.check_shapes(h200_bf16)[-1] == h200_bf16
    odd = space.Shape(batch=1, heads=2, seqlen_q=3000, seqlen_k=6000, head_dim=128)
    assert sweep_eval.check_shapes(odd)[0].seqlen_k == 2000


class _Kernel:
    def blocks_per_sm(self, threads, smem):
        return 1


class _Runner:
    layout = space.Layout(384, 0, 1000, 128)

    def kernel(self):
        return _Kernel()

    def prepare(self, *tensors, causal_align="upper_left"):
        return lambda: None


def _fake_gpu(monkeypatch, check_ok=True, bench_raises=False):
    from autotune.measure import check
    from autotune.launch import loader
    from autotune.measure import timing
    from autotune.measure.timing import Timing

    calls = []

    def fake_check(runner, shape, seed=None):
        calls.append(shape)
        return type("R", (), {"ok": check_ok, "max_error": 1e-3 if check_ok else 0.5, "message": "max error 0.5"})()

    def fake_bench(fn, warmup_ms, rep_ms):
        assert (warmup_ms, rep_ms) == (sweep_eval.WARMUP_MS, sweep_eval.REP_MS)
        if bench_raises:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return Timing(2.0, 1.9, 2.2, 1.8, 20)

    monkeypatch.setattr(loader, "as_runner", lambda build: _Runner())
    monkeypatch.setattr(check, "check", fake_check)
    monkeypatch.setattr(timing, "bench", fake_bench)
    monkeypatch.setattr(sweep_eval, "_timing_inputs", lambda shape: (None,) * 4)
    monkeypatch.setattr(measure, "context_alive", lambda: False)
    return calls


class _Build:
    config = CONFIGS[0]


def test_lean_evaluation_checks_first_then_times(monkeypatch):
    calls = _fake_gpu(monkeypatch)
    shape = space.Shape(batch=1, heads=64, seqlen_q=1024, head_dim=256)
    o = sweep_eval.evaluate(_Build(), shape)
    assert o.status == "complete" and o.time_ms == 2.0 and o.spread_ms == pytest.approx(0.3)
    assert o.tflops == pytest.approx(shape.tflops(2e-3)) and o.extra == {"p20_ms": 1.9, "p80_ms": 2.2, "n_reps": 20}
    assert calls == sweep_eval.check_shapes(shape) and len(calls) == 2


def test_lean_evaluation_reports_wrong_and_crashed(monkeypatch):
    _fake_gpu(monkeypatch, check_ok=False)
    o = sweep_eval.evaluate(_Build(), SMALL_SHAPE)
    assert o.status == "wrong" and o.max_error == 0.5 and "max error 0.5" in o.reason
    _fake_gpu(monkeypatch, bench_raises=True)
    o = sweep_eval.evaluate(_Build(), SMALL_SHAPE)
    assert o.status == "crashed" and "illegal memory access" in o.reason and o.context_lost


def test_sweep_command_line_errors(capsys):
    assert main(["sweep", "--build-only", "--family", "wgmma"]) == 2
    assert "--build-only: pass --arch" in capsys.readouterr().err
    assert main(["sweep", "--build-only", "--arch", "sm_90", "--family", "mma_sync", "--family", "tma"]) == 2
    assert "--family" in capsys.readouterr().err


def test_sweep_command_with_real_builds_and_the_worker(tmp_path, build_cache_dir, monkeypatch, capsys):
    monkeypatch.setenv("AUTOTUNE_DOUBLE_ARCH", "sm_90")
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))  # the worker's child imports search_doubles
    out = tmp_path / "l.json"
    argv = ["sweep", "--seqlen", "256", "--batch", "1", "--heads", "2", "--head-dim", "256", "--family", "wgmma",
            "--limit", "2", "--evaluator", "search_doubles:evaluate", "--cache-dir", str(build_cache_dir),
            "--jobs", "2", "--out", str(out)]
    assert main(argv) == 0
    ls = landscape_mod.load(out)
    assert len(ls.rows) == 2 and ls.header["gpu_name"] == "Test Double GPU"
    assert all(r.status == "complete" and r.registers for r in ls.rows.values())


def test_the_h200_recording_script_runs_build_only(build_cache_dir, capsys, tmp_path, monkeypatch):
    import importlib.util

    script = Path(__file__).resolve().parent.parent / "benchmarks" / "record_landscapes.py"
    spec = importlib.util.spec_from_file_location("record_landscapes", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert [s.key for s in module.SHAPES] == ["b4-h16-n4096-d128-fp16-full", "b4-h16-n4096-d128-fp16-causal",
                                              "b4-h32-n4096-d64-fp16-causal", "b2-h8-n4096-d256-bf16-full",
                                              "b16-h16-n1024-d128-fp16-full", "b1-h32-kv8-n8192-d128-bf16-causal"]
    monkeypatch.setenv("OUT", str(tmp_path))
    assert module.main(["--build-only", "--arch", "sm_90", "--limit", "1", "--cache-dir", str(build_cache_dir),
                        "--jobs", "2"]) == 0
    out = capsys.readouterr().out
    assert out.count("builds {'compiled': 1}") + out.count("builds {'cached': 1}") >= 5
    assert list(tmp_path.iterdir()) == []  # build-only writes nothing


def test_the_h200_recording_script_writes_into_out(build_cache_dir, capsys, tmp_path, monkeypatch):
    """The fake-GPU path of the recording script: files land in $OUT/landscapes with a summary (and, with a
    fake evaluator, never in studies/)."""
    import importlib.util

    script = Path(__file__).resolve().parent.parent / "benchmarks" / "record_landscapes.py"
    spec = importlib.util.spec_from_file_location("record_landscapes", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out, studies = tmp_path / "out", tmp_path / "studies"
    studies.mkdir()
    (studies / "h200-elsewhere.json").write_text("{}")  # another GPU's file: resumed only when names match
    monkeypatch.setattr(module, "STUDIES_DIR", studies)
    monkeypatch.setenv("OUT", str(out))
    monkeypatch.setenv("AUTOTUNE_DOUBLE_ARCH", "sm_90")
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))
    assert module.main(["--evaluator", "search_doubles:evaluate", "--limit", "1", "--cache-dir",
                        str(build_cache_dir), "--jobs", "2", "--budget-s", "60"]) == 0
    names = sorted(f"test-double-gpu-{s.key}-wgmma.json" for s in module.SHAPES)
    for name in names:
        assert len(landscape_mod.load(out / "landscapes" / name).rows) == 1
    assert "best" in (out / "landscapes" / "SUMMARY.txt").read_text()
    assert sorted(f.name for f in studies.iterdir()) == ["h200-elsewhere.json"]  # fake numbers stay out


def test_the_worker_warmup_imports_what_evaluations_need(monkeypatch):
    import torch

    from autotune.launch import loader

    seen = []
    monkeypatch.setattr(torch.cuda, "init", lambda: seen.append("init"))
    monkeypatch.setattr(torch, "empty", lambda *a, **k: seen.append(("empty", k.get("device"))))
    monkeypatch.setattr(loader, "driver", lambda: seen.append("driver"))
    sweep_eval.warmup()
    assert seen == ["init", ("empty", "cuda"), "driver"]


def test_an_arch_the_gpu_cannot_run_is_refused(tmp_path):
    with pytest.raises(ValueError, match="--arch sm_100: its cubins cannot run on this GPU"):
        _sweep(tmp_path, arch="sm_100")
