"""A test double for autotune.measure, used as `--evaluator search_doubles:evaluate`; it runs in the worker's
child process like the real one.

Deterministic fake speed from the config; it checks that the cubin it was handed really exists (the build layer is
real in these tests). Behaviour per config comes from a JSON plan named by $AUTOTUNE_DOUBLE_PLAN: {"<config key>":
"crash" | "hang" | "wrong" | "raise" | "crash_once" | "hang_once" | "slow" | "meet" | "gate" | "boost" | "damp"};
"boost" answers 1.3 × the config's usual figure (a config that another process measures faster), "damp" 0.8 × (one
that it measures slower); "slow" sleeps $AUTOTUNE_DOUBLE_SLOW seconds (default 1) before answering, for tests that
must catch an evaluation in flight; "meet" waits (up to 40 s, well inside the tests' 60 s evaluation timeout) until
another worker process has started an evaluation too, so that a test of several workers does not depend on how fast
the machine starts them; "gate" waits (up to 120 s) until the test opens that config's gate (Control.open_gate), so
a test can act (kill, restart the database, start another process) while the evaluation is known to be in flight.
Tests drive the double through `Control` (the plan, the call log, waiting for a call).
Every call is appended to the file named by $AUTOTUNE_DOUBLE_LOG (one JSON line: pid, parent pid, worker index
and CUDA_VISIBLE_DEVICES of the search process, call, config key, cubin hash; an `evaluated` line with start and
end times when an evaluation answers), so tests can see what ran where and when. $AUTOTUNE_DOUBLE_DEVICES sets
the GPU count device_info reports (default 1; $AUTOTUNE_DOUBLE_MIXED makes the last one another model).
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

GPU_NAME = "Test Double GPU"
DEFAULT_ACTION = "*"  # the plan's entry for configs it does not name (Control.plan's `default`)


class Control:
    """A test's handle on the double: its plan and its call log, files in `directory` that every search
    process and evaluation child finds through the environment (`env()`, for monkeypatch.setenv)."""

    def __init__(self, directory: Path):
        self.log = Path(directory) / "double-calls.jsonl"
        self.plan_path = Path(directory) / "double-plan.json"
        self.plan({})

    def env(self) -> dict[str, str]:
        return {"AUTOTUNE_DOUBLE_LOG": str(self.log), "AUTOTUNE_DOUBLE_PLAN": str(self.plan_path)}

    def plan(self, actions: dict, default: str | None = None) -> None:
        """{Config: action} (module docstring); `default`: the action of every config the dict does not name."""
        plan = {c.key: a for c, a in actions.items()}
        if default is not None:
            plan[DEFAULT_ACTION] = default
        self.plan_path.write_text(json.dumps(plan))

    def calls(self, kind: str = "evaluate") -> list[dict]:
        if not self.log.is_file():
            return []
        return [c for c in map(json.loads, self.log.read_text().splitlines()) if c["call"] == kind]

    def open_gate(self, config) -> None:
        """Let the "gate" evaluations of `config` answer (now, and every later one)."""
        _gate(config.key, self.log).touch()

    def evaluated(self) -> list[str]:
        return [c["config_key"] for c in self.calls()]

    def mark(self) -> int:
        return len(self.calls())

    def wait_for(self, predicate, timeout: float = 120.0) -> dict:
        """The first evaluate call for which predicate(call) holds, waiting for it up to `timeout` seconds."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for c in self.calls():
                if predicate(c):
                    return c
            time.sleep(0.05)
        raise AssertionError(f"the double saw no such evaluation within {timeout} s: {self.calls()}")


def _log(call: str, **fields) -> None:
    path = os.environ.get("AUTOTUNE_DOUBLE_LOG")
    if path:
        who = {"pid": os.getpid(), "ppid": os.getppid(), "worker": os.environ.get("AUTOTUNE_WORKER"),
               "device": os.environ.get("CUDA_VISIBLE_DEVICES")}
        with open(path, "a") as f:
            f.write(json.dumps({**who, "call": call, **fields}) + "\n")
            f.flush()
            os.fsync(f.fileno())  # the next line may be os._exit


def _plan() -> dict:
    path = os.environ.get("AUTOTUNE_DOUBLE_PLAN")
    return json.loads(Path(path).read_text()) if path else {}


def fake_tflops(config) -> float:
    """Any deterministic function of the config will do; this one has a clear optimum per axis."""
    d = config.as_dict()
    score = 100.0 + d.get("br", 64) / 4 + d.get("bc", 64) / 2 + 5 * d.get("warps_m", 1)
    score += 20 if d.get("p_path") == "regs" else 0
    score += 3 * d.get("loader_warps", 0) - 4 * d.get("min_blocks", 1)
    score += {"shared": 0, "separate": 6, "double": 9}.get(d.get("kv_buffering"), 0)
    score += 2 if d.get("q_in_regs") else 0
    score += {"static": 0, "dynamic": 1, "hybrid": 2}.get(d.get("smem_mode"), 0)
    return score


def evaluate(build, shape):
    from autotune.measure.evaluate import Evaluation

    key = build.config.key
    started = time.time()
    _log("evaluate", config_key=key, cubin_hash=build.cubin_hash)
    if build.cubin_path is None or not Path(build.cubin_path).is_file():
        return Evaluation("wrong", key, shape.key, reason=f"double: no cubin at {build.cubin_path}")
    plan = _plan()
    action = plan.get(key, plan.get(DEFAULT_ACTION))
    if action == "crash" or (action == "crash_once" and not _crashed_before(key)):
        os._exit(139)  # what a segfaulting kernel looks like from the parent
    if action == "hang" or (action == "hang_once" and not _crashed_before(key)):
        time.sleep(3600)
    if action == "slow":
        time.sleep(float(os.environ.get("AUTOTUNE_DOUBLE_SLOW", "1")))
    if action == "meet":
        _meet(time.monotonic() + 40)
    if action == "gate":
        gate, deadline = _gate(key, Path(os.environ["AUTOTUNE_DOUBLE_LOG"])), time.monotonic() + 120
        while not gate.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
    if action == "raise":
        raise RuntimeError("CUDA error: an illegal memory access was encountered (double)")
    if action == "wrong":
        return Evaluation("wrong", key, shape.key, reason="double: max error 1.5 > tolerance 0.002", max_error=1.5)
    tflops = fake_tflops(build.config) * {"boost": 1.3, "damp": 0.8}.get(action, 1.0)
    ms = shape.flops / (tflops * 1e12) * 1e3
    _log("evaluated", config_key=key, started=started, ended=time.time())
    return Evaluation("complete", key, shape.key, max_error=1e-3, median_ms=ms, p20_ms=ms * 0.99,
                      p80_ms=ms * 1.01, min_ms=ms * 0.98, n_reps=100, tflops=tflops, blocks_per_sm=1)


def _meet(deadline: float) -> None:
    me = os.environ.get("AUTOTUNE_WORKER")
    path = Path(os.environ.get("AUTOTUNE_DOUBLE_LOG", ""))
    while time.monotonic() < deadline:
        lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.is_file() else []
        if any(x["call"] == "evaluate" and x.get("worker") not in (None, me) for x in lines):
            return
        time.sleep(0.05)


def _gate(key: str, log: Path) -> Path:
    import hashlib

    return log.with_name(f"gate-{hashlib.sha256(key.encode()).hexdigest()[:16]}")


def _crashed_before(key: str) -> bool:
    path = os.environ.get("AUTOTUNE_DOUBLE_LOG")
    if not path or not Path(path).is_file():
        return False
    lines = [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip()]
    return sum(1 for x in lines if x.get("config_key") == key and x["call"] == "evaluate") > 1


def sdpa_baselines(shape):
    from autotune.measure.timing import Timing

    _log("baselines")
    out = {}
    for name, tflops in (("flash", 150.0), ("cudnn", 200.0), ("efficient", 90.0)):
        ms = shape.flops / (tflops * 1e12) * 1e3
        out[name] = Timing(ms, ms * 0.99, ms * 1.01, ms * 0.98, 50)
    return out


def device_info():
    _log("device_info")
    count = int(os.environ.get("AUTOTUNE_DOUBLE_DEVICES", "1"))
    arch = os.environ.get("AUTOTUNE_DOUBLE_ARCH", "sm_80")
    # like the real query: every visible GPU's name and arch too (AUTOTUNE_DOUBLE_MIXED: the last one differs)
    names = [GPU_NAME] * count
    if os.environ.get("AUTOTUNE_DOUBLE_MIXED") and count > 1:
        names[-1] = GPU_NAME + " (other model)"
    return {"gpu_name": GPU_NAME, "arch": arch, "device_count": count, "gpu_names": names, "archs": [arch] * count}


def warmup():
    import autotune.measure  # noqa: F401  (like the real warm-up: imports happen before the first timed request)

    _log("warmup")
