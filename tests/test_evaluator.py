"""The evaluation worker: one warm child process; a call that raises, dies or hangs costs one result, never the
caller, and the next call gets a fresh child. Stdlib functions serve as call targets (they run in the child)."""
from __future__ import annotations

import json
import os
import time

import pytest

import space
from autotune.measure.evaluate import Evaluation
from autotune.measure.timing import Timing
from autotune.measure.child_process import EvalOutcome, Evaluator, Worker, WorkerStartError, normalize_evaluation, resolve

SHAPE = space.Shape(batch=1, heads=2, seqlen_q=256, head_dim=128)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie still answers kill(0): look at its state
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture
def worker():
    w = Worker()
    yield w
    w.stop()


def test_calls_run_in_one_warm_child(worker):
    first = worker.call("os:getpid", timeout=30)
    second = worker.call("os:getpid", timeout=30)
    assert first.ok and second.ok
    assert first.value == second.value == worker.pid != os.getpid()
    assert worker.starts == 1
    assert worker.call("operator:add", 2, 3, timeout=30).value == 5


def test_a_call_that_kills_the_child_is_one_crashed_result(worker):
    pid = worker.call("os:getpid", timeout=30).value
    result = worker.call("os:_exit", 139, timeout=30)
    assert result.status == "crashed" and "exit code 139" in result.reason
    assert not _alive(pid)
    again = worker.call("os:getpid", timeout=30)
    assert again.ok and again.value != pid and worker.starts == 2


def test_a_segfault_is_reported_by_signal(worker):
    result = worker.call("signal:raise_signal", 11, timeout=30)
    assert result.status == "crashed" and "SIGSEGV" in result.reason
    assert worker.call("operator:mul", 6, 7, timeout=30).value == 42


def test_a_hanging_call_times_out_and_its_child_is_killed(worker):
    pid = worker.call("os:getpid", timeout=30).value
    t0 = time.monotonic()
    result = worker.call("time:sleep", 600, timeout=1.0)
    assert result.status == "timeout" and "1 s" in result.reason
    assert time.monotonic() - t0 < 30
    assert not _alive(pid)
    assert worker.call("os:getpid", timeout=30).value != pid


def test_an_exception_comes_back_with_its_traceback_and_the_child_is_replaced(worker):
    pid = worker.call("os:getpid", timeout=30).value
    result = worker.call("operator:truediv", 1, 0, timeout=30)
    assert result.status == "error" and "ZeroDivisionError" in result.reason and "Traceback" in result.reason
    assert not _alive(pid)  # after any error the child is not trusted (a CUDA context would be dead)
    assert worker.call("os:getpid", timeout=30).value != pid


def test_submit_and_wait_do_not_block(worker):
    worker.call("os:getpid", timeout=30)  # started
    worker.submit("time:sleep", 0.5, timeout=30)
    assert worker.busy
    assert worker.wait(0) is None              # still running: the caller can do other work
    with pytest.raises(RuntimeError, match="not taken"):
        worker.submit("os:getpid")
    result = worker.wait(None)
    assert result.ok and not worker.busy


def test_warmup_failures_stop_the_caller_with_the_reason():
    with pytest.raises(WorkerStartError, match="ZeroDivisionError"):
        Worker(warmup=("operator:truediv", (1, 0))).start()
    with pytest.raises(WorkerStartError, match="died while starting"):
        Worker(warmup=("os:_exit", (3,))).start()
    with pytest.raises(WorkerStartError, match="did not become ready"):
        w = Worker(warmup=("time:sleep", (60,)), start_timeout=1.0)
        w.start()
    assert w.pid is None  # the hung starter was killed and forgotten


def test_resolve_names_the_problem():
    assert resolve("os.path:join") is os.path.join
    for bad, msg in (("os.path.join", "module:function"), ("os:nope", "no attribute"), (":x", "module:function")):
        with pytest.raises(ValueError, match=msg):
            resolve(bad)
    with pytest.raises(ValueError, match="evaluator"):
        Evaluator("not-a-path")
    with pytest.raises(ValueError, match="eval timeout"):
        Evaluator("search_doubles:evaluate", timeout=0)


# ---- normalizing what the evaluator returns -----------------------------------------------------------------

def test_normalize_a_complete_evaluation():
    ev = Evaluation("complete", "k", SHAPE.key, max_error=1e-3, median_ms=2.0, p20_ms=1.9, p80_ms=2.2,
                    tflops=123.0, blocks_per_sm=2)
    out = normalize_evaluation(ev, SHAPE)
    assert out == EvalOutcome("complete", "", 123.0, 2.0, pytest.approx(0.3), 1e-3, 2, False)
    # without a tflops figure it is derived from the median and the shape
    derived = normalize_evaluation({"ok": True, "status": "complete", "timing": Timing(2.0, 1.9, 2.2, 1.8, 10)}, SHAPE)
    assert derived.tflops == pytest.approx(SHAPE.tflops(2.0e-3)) and derived.spread_ms == pytest.approx(0.3)


def test_normalize_failures():
    wrong = normalize_evaluation(Evaluation("wrong", "k", SHAPE.key, reason="max error 1.5", max_error=1.5), SHAPE)
    assert (wrong.status, wrong.reason, wrong.tflops, wrong.context_lost) == ("wrong", "max error 1.5", None, False)
    crashed = normalize_evaluation(Evaluation("crashed", "k", SHAPE.key, reason="CUDA_ERROR_ILLEGAL_ADDRESS",
                                              context_lost=True), SHAPE)
    assert crashed.status == "crashed" and crashed.context_lost
    odd = normalize_evaluation({"ok": False, "status": "launch_error", "reason": "too many resources"}, SHAPE)
    assert odd.status == "crashed" and odd.reason == "launch_error: too many resources"
    no_time = normalize_evaluation({"ok": True, "status": "complete"}, SHAPE)
    assert no_time.status == "crashed" and "without a time" in no_time.reason


# ---- the Evaluator over the test double ------------------------------------------------------------------------

class _FakeBuild:
    """What the double needs of a BuildResult: a config, a cubin path and hash (picklable)."""

    def __init__(self, config, path):
        self.config, self.cubin_path, self.cubin_hash = config, path, "h"


@pytest.fixture
def double_env(tmp_path, monkeypatch):
    log, plan = tmp_path / "calls.jsonl", tmp_path / "plan.json"
    monkeypatch.setenv("AUTOTUNE_DOUBLE_LOG", str(log))
    monkeypatch.setenv("AUTOTUNE_DOUBLE_PLAN", str(plan))
    plan.write_text("{}")
    cubin = tmp_path / "kernel.cubin"
    cubin.write_bytes(b"\x7fELF")
    return log, plan, cubin


def _calls(log):
    return [json.loads(x) for x in log.read_text().splitlines()] if log.is_file() else []


def test_evaluator_runs_the_injected_function_in_the_child_and_survives_a_crash(double_env):
    import search_doubles

    log, plan, cubin = double_env
    good = space.default_config(SHAPE.problem, space.get_arch("sm_80"))
    bad = good.replace(bc=128)
    plan.write_text(json.dumps({bad.key: "crash"}))
    with Evaluator("search_doubles:evaluate", timeout=30) as ev:
        assert ev.device_info() == {"gpu_name": search_doubles.GPU_NAME, "arch": "sm_80", "device_count": 1,
                                    "gpu_names": [search_doubles.GPU_NAME], "archs": ["sm_80"]}
        first = ev.evaluate(_FakeBuild(good, cubin), SHAPE)
        assert first.status == "complete" and first.tflops == search_doubles.fake_tflops(good)
        crashed = ev.evaluate(_FakeBuild(bad, cubin), SHAPE)
        assert crashed.status == "crashed" and "exit code 139" in crashed.reason
        again = ev.evaluate(_FakeBuild(good, cubin), SHAPE)
        assert again.status == "complete"
        baselines = ev.baselines(SHAPE)
    assert baselines == {"sdpa_flash": pytest.approx(150.0), "sdpa_cudnn": pytest.approx(200.0),
                         "sdpa_efficient": pytest.approx(90.0)}
    calls = _calls(log)
    pids = [c["pid"] for c in calls if c["call"] == "evaluate"]
    assert len(pids) == 3 and pids[0] == pids[1] != pids[2] != os.getpid()  # fresh child after the crash
    assert [c["call"] for c in calls if c["pid"] == pids[0]][0] == "warmup"   # warm-up ran before any request


def test_evaluator_turns_a_hang_and_an_exception_into_outcomes(double_env):
    log, plan, cubin = double_env
    config = space.default_config(SHAPE.problem, space.get_arch("sm_80"))
    hang, boom = config.replace(kv_buffering="double"), config.replace(kv_buffering="shared")
    assert len({config, hang, boom}) == 3  # whatever the default is: the good one must not be planned to hang
    plan.write_text(json.dumps({hang.key: "hang", boom.key: "raise"}))
    with Evaluator("search_doubles:evaluate", timeout=1.5) as ev:
        out = ev.evaluate(_FakeBuild(hang, cubin), SHAPE)
        assert out.status == "timeout" and "--eval-timeout" in out.reason
        out = ev.evaluate(_FakeBuild(boom, cubin), SHAPE)
        assert out.status == "crashed" and "illegal memory access" in out.reason
        assert "Traceback" in out.extra["traceback"]
        assert ev.evaluate(_FakeBuild(config, cubin), SHAPE).status == "complete"
        assert ev.worker.starts == 3
