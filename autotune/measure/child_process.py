"""Evaluation in a child process, so that a faulting or hanging kernel costs one trial, not the study.

Two layers:

* `Worker` — a `multiprocessing` spawn-context child that runs `"module:function"(*args)` calls sent over a
  pipe, one at a time. A call that raises, kills the process (segfault, os._exit) or runs past its timeout
  comes back as one `CallResult` with status error/crashed/timeout; the child is then gone and the next call
  starts a fresh one. Spawn, not fork: the child must not inherit a parent's CUDA state, and a fresh
  interpreter is what a clean retry needs.
* `Evaluator` — the search's view: `evaluate(build, shape)`, `baselines(shape)`, `device_info()`, backed by
  one Worker. The evaluation function is a dotted path (default `autotune.measure.evaluate:evaluate`) resolved *in the
  child*, so tests inject a double that runs there too and can crash or hang on purpose. Companions are
  looked up in the same module: `sdpa_baselines(shape)`, `device_info()` and `warmup()` (all optional; the
  defaults below use torch.cuda).

The child imports torch/CUDA once (warm-up before the first request, whose timeout must not pay for it) and
exits after any exception in a call: after a CUDA error (illegal address, launch failure) the context is dead
and every later launch in that process would fail, and telling CUDA errors from others reliably is not
possible from Python, so any error ends the process and the next request gets a fresh one.
"""
from __future__ import annotations

import importlib
import math
import multiprocessing
import os
import signal
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

from .interrupts import exit_with_parent

DEFAULT_EVALUATOR = "autotune.measure.evaluate:evaluate"
DEFAULT_START_TIMEOUT = 600.0  # importing torch and creating a CUDA context on a busy box can take a while

EVAL_STATUSES = ("complete", "wrong", "crashed", "timeout")


class WorkerStartError(RuntimeError):
    """The child could not start or warm up: every evaluation would fail the same way, so stop the study."""


class EvaluatorError(RuntimeError):
    """A query the search cannot do without (the device's name and arch) failed in the worker."""


def resolve(path: str) -> Callable:
    """'package.module:function' → the function (the module is imported)."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"evaluator: expected 'module:function', got {path!r}")
    module = importlib.import_module(module_name)
    try:
        fn = getattr(module, attr)
    except AttributeError:
        raise ValueError(f"evaluator: module {module_name!r} has no attribute {attr!r}") from None
    if not callable(fn):
        raise ValueError(f"evaluator: {path!r} is not callable")
    return fn


# -- the generic worker --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CallResult:
    status: str           # "ok" | "error" (raised) | "crashed" (process died) | "timeout" (killed)
    value: Any = None
    reason: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def _child_main(conn, warmup: tuple[str, tuple] | None, parent: int | None = None) -> None:
    # Ctrl-C is the parent's to handle: it fails the trial as 'interrupted' and stops us. Left to ourselves, we
    # would die first and the parent could read that as a crash of the kernel being timed.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # likewise SIGTERM (a scheduler signals the whole job)
    # A parent killed with SIGKILL must not leave us holding the GPU. (Linux sends this when the *thread* that
    # started us ends: start Workers from a thread that lives as long as they should, as the search does.)
    exit_with_parent(signal.SIGKILL, parent)
    try:
        if warmup:
            resolve(warmup[0])(*warmup[1])
        conn.send(("ready", os.getpid()))
    except BaseException:
        conn.send(("init_error", traceback.format_exc()))
        return
    cache: dict[str, Callable] = {}
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError, KeyboardInterrupt):
            return  # the parent went away or is stopping us
        if message is None:
            return
        target, args = message
        try:
            fn = cache.get(target) or cache.setdefault(target, resolve(target))
            value = fn(*args)
        except BaseException:
            conn.send(("error", traceback.format_exc()))
            conn.close()
            os._exit(1)  # see the module docstring: a CUDA context cannot be trusted after an error
        try:
            conn.send(("ok", value))
        except Exception as e:  # e.g. the result does not pickle
            conn.send(("error", f"result of {target} could not be sent back: {e!r}"))


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "no exit code"
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1].strip() if lines else text.strip()


class Worker:
    """One child process at a time; started on the first call, replaced after any failure."""

    def __init__(self, warmup: tuple[str, tuple] | None = None, start_timeout: float = DEFAULT_START_TIMEOUT):
        self.warmup = warmup
        self.start_timeout = start_timeout
        self._ctx = multiprocessing.get_context("spawn")
        self._process = None
        self._conn = None
        self._inflight: tuple[float, float | None] | None = None  # (sent at, timeout) of the call in flight
        self._ready = False  # the running child sent "ready" (launch() does not wait for it)
        self.starts = 0  # how many children were started (1 + restarts)

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.is_alive()

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def launch(self) -> None:
        """Start the child without waiting for it: it imports and warms up (torch, a CUDA context) while the
        caller goes on (e.g. builds); the next start(), submit() or call() waits until it is ready."""
        if self.alive:
            return
        self.stop()
        parent_conn, child_conn = self._ctx.Pipe(duplex=True)
        process = self._ctx.Process(target=_child_main, args=(child_conn, self.warmup, os.getpid()), daemon=True,
                                    name="autotune-eval-worker")
        process.start()
        child_conn.close()  # the parent keeps only its end, so EOF shows when the child dies
        self._process, self._conn = process, parent_conn
        self._ready = False
        self.starts += 1

    def start(self) -> None:
        """Start the child if none is running, and wait until it is ready (its warm-up done)."""
        if self.alive and self._ready:
            return
        self.launch()
        process, parent_conn = self._process, self._conn
        if not parent_conn.poll(self.start_timeout):
            self.stop()
            raise WorkerStartError(f"evaluation worker did not become ready within {self.start_timeout:g} s")
        try:
            kind, payload = parent_conn.recv()
        except (EOFError, OSError):
            process.join(5)
            code = process.exitcode
            self.stop()
            raise WorkerStartError(f"evaluation worker died while starting ({_describe_exit(code)})") from None
        if kind != "ready":
            self.stop()
            raise WorkerStartError(f"evaluation worker failed to start:\n{payload}")
        self._ready = True

    @property
    def busy(self) -> bool:
        """A call was submitted and its result not yet taken."""
        return self._inflight is not None

    def submit(self, target: str, *args, timeout: float | None = None) -> None:
        """Send target(*args) to the child; take the result with wait(). One call at a time."""
        if self._inflight is not None:
            raise RuntimeError("Worker.submit: the previous call's result was not taken (wait())")
        self.start()
        try:
            self._conn.send((target, args))
        except (BrokenPipeError, OSError):  # the child died between calls: one fresh start, then try again
            self.stop()
            self.start()
            self._conn.send((target, args))
        self._inflight = (time.monotonic(), timeout)

    def wait(self, block_for: float | None = None) -> CallResult | None:
        """The submitted call's result; None if it is still running after block_for seconds (None: block until
        it finishes or its timeout passes). Never raises for what the call itself did."""
        if self._inflight is None:
            raise RuntimeError("Worker.wait: nothing was submitted")
        t0, timeout = self._inflight
        deadline = t0 + timeout if timeout is not None else None
        wait_s = block_for
        if deadline is not None:
            left = max(0.0, deadline - time.monotonic())
            wait_s = left if wait_s is None else min(wait_s, left)
        if not self._conn.poll(wait_s):
            if deadline is None or time.monotonic() < deadline:
                return None
            self._inflight = None
            self.stop(graceful=False)  # it is stuck: asking it to quit would only add seconds
            return CallResult("timeout", reason=f"no result within {timeout:g} s; worker killed",
                              seconds=time.monotonic() - t0)
        self._inflight = None
        try:
            kind, payload = self._conn.recv()
        except (EOFError, OSError):
            self._process.join(5)
            code = self._process.exitcode
            self.stop()
            return CallResult("crashed", reason=f"evaluation worker died ({_describe_exit(code)})",
                              seconds=time.monotonic() - t0)
        seconds = time.monotonic() - t0
        if kind == "ok":
            return CallResult("ok", value=payload, seconds=seconds)
        self.stop()  # the child exits after an error; reap it
        return CallResult("error", reason=payload, seconds=seconds)

    def call(self, target: str, *args, timeout: float | None = None) -> CallResult:
        """Run target(*args) in the child and wait for it; never raises for what the call itself does."""
        self.submit(target, *args, timeout=timeout)
        return self.wait(None)

    def stop(self, graceful: bool = True) -> None:
        """End the child (politely if graceful and it is idle, then by force) and forget it."""
        process, conn = self._process, self._conn
        graceful = graceful and self._inflight is None
        self._process = self._conn = None
        self._ready = False
        self._inflight = None
        if conn is not None and graceful:
            try:
                if process is not None and process.is_alive():
                    conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        if process is not None:
            if graceful:
                process.join(2)
            if process.is_alive():  # by force: SIGKILL, since the child ignores SIGTERM (_child_main)
                process.kill()
                process.join(5)
        if conn is not None:
            conn.close()

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


# -- the evaluation protocol --------------------------------------------------------------------------------


@dataclass(frozen=True)
class EvalOutcome:
    """What one evaluation produced, in the search's terms (plain data, stable across evaluator versions)."""

    status: str                    # one of EVAL_STATUSES
    reason: str = ""
    tflops: float | None = None
    time_ms: float | None = None   # median
    spread_ms: float | None = None
    max_error: float | None = None
    blocks_per_sm: int | None = None  # measured occupancy, when the evaluator reports it
    context_lost: bool = False     # the evaluating process's CUDA context is dead: replace the worker
    extra: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "complete"


def _get(obj, *names, default=None):
    for name in names:
        value = obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)
        if value is not None:
            return value
    return default


def _finite(x) -> float | None:
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def timing_ms(timing) -> tuple[float | None, float | None]:
    """(median, spread) in ms from a measure.Timing-like object or dict."""
    if timing is None:
        return None, None
    median = _finite(_get(timing, "median_ms", "median", "time_ms"))
    spread = _finite(_get(timing, "spread_ms", "iqr_ms", "std_ms", "stdev_ms", "spread"))
    if spread is None:  # measure.Timing: the 20th-80th percentile range is its spread
        low, high = _finite(_get(timing, "p20_ms")), _finite(_get(timing, "p80_ms"))
        spread = high - low if low is not None and high is not None else None
    return median, spread


def normalize_evaluation(ev, shape) -> EvalOutcome:
    """measure.Evaluation (or a dict with the same names) → EvalOutcome."""
    if isinstance(ev, EvalOutcome):
        return ev
    median, spread = timing_ms(_get(ev, "timing"))
    if median is None:
        median = _finite(_get(ev, "time_ms", "median_ms"))
        spread = spread if spread is not None else _finite(_get(ev, "spread_ms", "time_spread_ms"))
    tflops = _finite(_get(ev, "tflops"))
    if tflops is None and median:
        tflops = shape.tflops(median / 1e3)
    max_error = _finite(_get(ev, "max_error"))
    reason = str(_get(ev, "reason", "error", "message", default=""))
    raw_status = _get(ev, "status")
    ok = _get(ev, "ok", default=raw_status == "complete")
    blocks = _get(ev, "blocks_per_sm", "occupancy")
    blocks = int(blocks) if isinstance(blocks, (int, float)) and not isinstance(blocks, bool) else None
    lost = bool(_get(ev, "context_lost", default=False))
    if ok:
        if not tflops or tflops <= 0:
            return EvalOutcome("crashed", f"evaluator reported success without a time (status {raw_status!r})",
                               max_error=max_error)
        return EvalOutcome("complete", reason, tflops, median, spread, max_error, blocks, lost)
    if raw_status in ("wrong", "crashed", "timeout"):
        status = raw_status
    else:  # a failure the contract has no name for (launch error, out of resources): it did not run correctly
        status = "crashed"
        reason = f"{raw_status}: {reason}" if raw_status else reason
    return EvalOutcome(status, reason or f"evaluation failed ({raw_status})", None, median, spread, max_error, blocks,
                       lost or status == "crashed")


def _companion(spec: str, name: str):
    module = importlib.import_module(spec.partition(":")[0])
    return getattr(module, name, None)


# These run in the child (they are the call targets).

def _child_warmup(spec: str) -> None:
    resolve(spec)  # import the evaluator (and torch with it) before the first timed request
    warm = _companion(spec, "warmup")
    if warm is not None:
        warm()
    else:
        _default_warmup()


def _default_warmup() -> None:
    try:
        import torch
    except ImportError:
        return
    if torch.cuda.is_available():
        torch.cuda.init()
        torch.empty(1, device="cuda")  # creates the context now, not inside the first evaluation's timeout


def _child_evaluate(spec: str, build, shape) -> EvalOutcome:
    # Normalized here so the parent receives plain data it can unpickle without importing the evaluator.
    return normalize_evaluation(resolve(spec)(build, shape), shape)


def _child_baselines(spec: str, shape) -> dict[str, float | None]:
    fn = _companion(spec, "sdpa_baselines")
    if fn is None:
        return {}
    peers = tuple(_companion(spec, "PEERS") or ())
    out: dict[str, float | None] = {}
    for name, timing in dict(fn(shape)).items():
        # SDPA backends get the "sdpa_" prefix; peers outside torch that the evaluator module lists in PEERS
        # (autotune.measure: "fa4") keep their own name.
        key = name if str(name).startswith("sdpa_") or name in peers else f"sdpa_{name}"
        if timing is None:
            out[key] = None
        elif isinstance(timing, (int, float)):
            out[key] = float(timing)  # already TFLOPS
        else:
            median, _ = timing_ms(timing)
            tflops = _finite(_get(timing, "tflops"))
            out[key] = tflops if tflops is not None else (shape.tflops(median / 1e3) if median else None)
    return out


def _child_device_info(spec: str) -> dict[str, Any]:
    fn = _companion(spec, "device_info")
    if fn is not None:
        return dict(fn())
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA GPU visible to the evaluation worker")
    major, minor = torch.cuda.get_device_capability(0)
    count = torch.cuda.device_count()
    return {"gpu_name": torch.cuda.get_device_name(0), "arch": f"sm_{major * 10 + minor}", "device_count": count,
            "gpu_names": [torch.cuda.get_device_name(i) for i in range(count)],
            "archs": ["sm_{}{}".format(*torch.cuda.get_device_capability(i)) for i in range(count)]}


class Evaluator:
    """The search's evaluator: one warm child process, replaced whenever an evaluation kills or hangs it."""

    def __init__(self, spec: str = DEFAULT_EVALUATOR, timeout: float = 120.0,
                 start_timeout: float = DEFAULT_START_TIMEOUT):
        if timeout <= 0:
            raise ValueError(f"eval timeout: expected a positive number of seconds, got {timeout!r}")
        module_name, sep, attr = spec.partition(":")
        if not sep or not module_name or not attr:
            raise ValueError(f"evaluator: expected 'module:function', got {spec!r}")
        self.spec = spec
        self.timeout = timeout
        self.worker = Worker(warmup=("autotune.measure.child_process:_child_warmup", (spec,)), start_timeout=start_timeout)

    def start(self) -> None:
        self.worker.start()

    def prestart(self) -> None:
        """Start the child in the background (see Worker.launch): its torch import and CUDA context overlap
        whatever the caller does before the first evaluation."""
        self.worker.launch()

    def submit(self, build, shape) -> None:
        """Start evaluating `build` on `shape` in the child; take the outcome with wait()."""
        self.worker.submit("autotune.measure.child_process:_child_evaluate", self.spec, build, shape, timeout=self.timeout)

    def wait(self, block_for: float | None = None) -> EvalOutcome | None:
        """The submitted evaluation's outcome, or None while it still runs after block_for seconds."""
        result = self.worker.wait(block_for)
        if result is None:
            return None
        if result.status == "ok":
            outcome: EvalOutcome = result.value
            if outcome.context_lost:
                self.worker.stop()  # the evaluator caught a CUDA error itself: that context is dead
            return outcome
        if result.status == "timeout":
            return EvalOutcome("timeout", f"evaluation took longer than {self.timeout:g} s (--eval-timeout); "
                                          "worker killed and replaced")
        if result.status == "crashed":
            return EvalOutcome("crashed", result.reason + "; worker replaced")
        return EvalOutcome("crashed", f"evaluator raised {_last_line(result.reason)}; worker replaced",
                           extra={"traceback": result.reason[-4000:]})

    def evaluate(self, build, shape) -> EvalOutcome:
        self.submit(build, shape)
        return self.wait(None)

    def baselines(self, shape) -> dict[str, float | None]:
        """SDPA backends' TFLOPS measured in this same worker process ({} when the evaluator has none)."""
        result = self.worker.call("autotune.measure.child_process:_child_baselines", self.spec, shape,
                                  timeout=self.timeout * 4)
        if result.ok:
            return result.value
        raise RuntimeError(f"SDPA baselines failed ({result.status}): {_last_line(result.reason)}")

    def device_info(self) -> dict[str, Any]:
        result = self.worker.call("autotune.measure.child_process:_child_device_info", self.spec, timeout=self.timeout)
        if result.ok:
            return result.value
        raise EvaluatorError(f"device query failed in the evaluation worker ({result.status}): "
                             f"{_last_line(result.reason)}")

    def close(self) -> None:
        self.worker.stop()

    def __enter__(self) -> "Evaluator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


__all__ = ["CallResult", "DEFAULT_EVALUATOR", "EVAL_STATUSES", "EvalOutcome", "Evaluator", "EvaluatorError", "Worker",
           "WorkerStartError", "normalize_evaluation", "resolve", "timing_ms"]
