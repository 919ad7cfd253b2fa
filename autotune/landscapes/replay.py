"""The GPU step answered from a recorded landscape: a builder and an evaluator with the search's interfaces.

`ReplayBuilder.build` returns, for each config, the BuildResult the recording saw (ptxas report, compile error,
cubin hash), and `ReplayEvaluator` returns the recorded outcome (TFLOPS, median, spread, wrong/crashed/timeout).
Nothing is compiled or run, so sampler behaviour can be studied on a CPU with exactly the search's code.
Without noise every evaluation of a config answers its one recorded figure; with a ReplayNoise (replay_noise.py)
each draws one from the landscape's recorded re-measurement sessions, seeded, so the finale can tie as on a GPU.

A config the landscape has no row for is an error naming the config (MissingConfigError), never a guess: a
replay that silently invented values would make any comparison meaningless. The same goes for asking the
replay to time a config the recording did not time (a spilling build, skipped under the recording's spill
policy), and for a shape or arch other than the recorded one.

$AUTOTUNE_REPLAY_SECONDS makes each replayed evaluation take that long (default 0: answered at once), so that
fault drills (benchmarks/faults.py) can kill a process or restart its database while a trial is in flight;
$AUTOTUNE_REPLAY_BUILD_SECONDS makes each build call (one batch, built in parallel by the real Builder) take that
long. With both, a replay is a simulated GPU host: the search's loop timing (asking, waiting for builds) can be
measured on a CPU.
"""
from __future__ import annotations

import os
import time
from typing import Any, Sequence

import space
from space import Config, Problem, Shape

from ..build.builder import BuildResult
from .landscape_file import BUILD_FIELDS, Landscape, Row
from .replay_noise import ReplayNoise
from ..build.ptxas import BuildReport
from ..measure.child_process import EvalOutcome


class ReplayError(ValueError):
    """The replay was asked something the landscape does not record."""


class MissingConfigError(ReplayError):
    def __init__(self, config_key: str, landscape: Landscape, what: str = "has no row for"):
        self.config_key = config_key
        super().__init__(f"replay: landscape {landscape.path or landscape.name} {what} config {config_key} "
                         f"(it was not measured; a replay never guesses)")


def _report(row: Row) -> BuildReport | None:
    if not row.has_report:
        return None
    return BuildReport(**{f: getattr(row, f) or 0 for f in BUILD_FIELDS})


class ReplayBuilder:
    """Builder-shaped: `build([(config, problem), ...]) -> [BuildResult]`, answered from the landscape."""

    kernels_dir = None  # winner.provenance: no sources are hashed, the landscape's provenance is what counts

    def __init__(self, landscape: Landscape, jobs: int = 1):
        self.landscape = landscape
        self.arch = landscape.arch
        self.problem = landscape.shape.problem
        self.jobs = jobs  # the search sizes its batches by this; replay has no compiler to keep busy
        self.nvcc_version = landscape.header.get("nvcc_version")
        self.calls = 0
        self.pace = float(os.environ.get(BUILD_PACE_ENV) or 0)  # seconds per build call (module docstring)

    def build_one(self, config: Config, problem: Problem) -> BuildResult:
        return self.build([(config, problem)])[0]

    def build(self, items: Sequence[tuple[Config, Problem]], progress=None) -> list[BuildResult]:
        self.calls += 1
        if self.pace and items:
            time.sleep(self.pace)  # a simulated parallel nvcc batch: nothing to wait on but the clock
        out = []
        for i, (config, problem) in enumerate(items):
            result = self._one(config, problem)
            out.append(result)
            if progress:
                progress(i + 1, len(items), result)
        return out

    def _one(self, config: Config, problem: Problem) -> BuildResult:
        if problem != self.problem:
            raise ReplayError(f"replay: the landscape was recorded for {self.problem.key}, not {problem.key}")
        rejected = space.violations(config, problem, self.arch)
        if rejected:  # like the real Builder: never "compiled"
            return BuildResult(config, problem, self.arch, ok=False, cubin_path=None, report=None,
                               error="rejected by space rules, not compiled: " + "; ".join(map(str, rejected)),
                               cached=False, key=None, rejected_by=tuple(v.rule for v in rejected))
        row = self.landscape.row(config)
        if row is None:
            raise MissingConfigError(config.key, self.landscape)
        ok = row.status != "compile_error"
        return BuildResult(config, problem, self.arch, ok=ok, cubin_path=None, report=_report(row),
                           error=None if ok else (row.reason or "compile error (recorded)"), cached=True,
                           key=f"replay:{config.key}", cubin_hash=row.cubin_hash)


PACE_ENV = "AUTOTUNE_REPLAY_SECONDS"
BUILD_PACE_ENV = "AUTOTUNE_REPLAY_BUILD_SECONDS"


class ReplayEvaluator:
    """Evaluator-shaped (submit/wait/evaluate/baselines/device_info/close), answered from the landscape; with
    `noise` (replay_noise.ReplayNoise), each complete row's figure is drawn from the recorded sessions."""

    def __init__(self, landscape: Landscape, noise: ReplayNoise | None = None):
        self.landscape = landscape
        self.noise = noise
        self.times: dict[str, int] = {}  # evaluations per config so far: which draw of the noise is next
        self.shape = landscape.shape
        self._pending: EvalOutcome | None = None
        self._ready = 0.0  # monotonic time the pending outcome is answered (module docstring: pacing)
        self.pace = float(os.environ.get(PACE_ENV) or 0)
        self.evaluations = 0

    def device_info(self) -> dict[str, Any]:
        return {"gpu_name": self.landscape.header["gpu_name"], "arch": self.landscape.header["arch"]}

    def outcome(self, config: Config, shape: Shape) -> EvalOutcome:
        if shape != self.shape:
            raise ReplayError(f"replay: the landscape was recorded for shape {self.shape.key}, not {shape.key}")
        row = self.landscape.row(config)
        if row is None:
            raise MissingConfigError(config.key, self.landscape)
        if row.status in ("spilled", "compile_error"):
            raise MissingConfigError(config.key, self.landscape,
                                     what=f"never timed ({row.status} when recorded; the recording's spill policy "
                                          "skipped it) the")
        spread = row.spread_ms
        if row.status == "complete":
            tflops, median_ms = row.tflops, row.median_ms
            if self.noise is not None:
                n = self.times.get(row.config_key, 0)
                self.times[row.config_key] = n + 1
                tflops = self.noise.tflops(row, n)
                scale = row.tflops / tflops  # the time moves against the speed; the reps' spread with it
                median_ms = median_ms * scale if median_ms else median_ms
                spread = spread * scale if spread else spread
            return EvalOutcome("complete", row.reason or "", tflops, median_ms, spread, row.max_error,
                               row.blocks_per_sm)
        return EvalOutcome(row.status, row.reason or row.status, None, row.median_ms, spread, row.max_error,
                           row.blocks_per_sm)

    def submit(self, build, shape: Shape) -> None:
        if self._pending is not None:
            raise RuntimeError("ReplayEvaluator.submit: the previous outcome was not taken (wait())")
        self._pending = self.outcome(build.config, shape)
        self._ready = time.monotonic() + self.pace
        self.evaluations += 1

    def wait(self, block_for: float | None = None) -> EvalOutcome | None:
        if self._pending is None:
            raise RuntimeError("ReplayEvaluator.wait: nothing was submitted")
        left = self._ready - time.monotonic()
        if left > 0:
            time.sleep(left if block_for is None else min(left, block_for))
            if time.monotonic() < self._ready:
                return None
        outcome, self._pending = self._pending, None
        return outcome

    def evaluate(self, build, shape: Shape) -> EvalOutcome:
        self.submit(build, shape)
        return self.wait()

    def baselines(self, shape: Shape) -> dict[str, float | None]:
        return dict(self.landscape.header.get("baselines") or {})

    def close(self) -> None:
        pass


def replay_pacing(builder, evaluator) -> str | None:
    """What a paced replay simulates (for the summary), or None when builds and evaluations answer at once."""
    build, evaluate = getattr(builder, "pace", 0) or 0, getattr(evaluator, "pace", 0) or 0
    if not (isinstance(builder, ReplayBuilder) or isinstance(evaluator, ReplayEvaluator)) or not (build or evaluate):
        return None
    return f"{build:g} s per build batch (${BUILD_PACE_ENV}), {evaluate:g} s per evaluation (${PACE_ENV})"


def recorded_configs(landscape: Landscape) -> list[Config]:
    """The configs the landscape has a row for: what a replay may search. A landscape recorded before an axis
    existed holds that axis at its default only (landscape_file.upgrade_key), so a replay's search space is cut
    down to these (sampling.SearchSpace's `within`) rather than asking for configs that were never measured."""
    return [row.config for row in landscape.rows.values()]


class NullStore:
    """A best-per-shape store that keeps nothing: a replay re-reads old measurements, it does not make new ones,
    so it must not put a row in the table the runtime serves from."""

    def record_best(self, entry):
        return None

    def close(self) -> None:
        pass


__all__ = ["MissingConfigError", "NullStore", "ReplayBuilder", "ReplayError", "ReplayEvaluator", "recorded_configs",
           "replay_pacing"]
