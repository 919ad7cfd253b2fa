"""Benchmark mode: an untuned shape measures a few configs before it settles, like torch.backends.cudnn.benchmark.

Off by default; on with `autotune.set_benchmark_mode(True)` or AUTOTUNE_BENCHMARK=1 in the environment. Then the
first call of a shape whose lookup found no exact row (lookup.py: it got the nearest tuned shape's config or the
heuristic default) times, on that call's own tensors:

  * the lookup's own choice (always, first: it is what runs if nothing else is measured),
  * the configs of the shape's nearest tuned rows (storage and shipped, same GPU, arch and problem; distinct
    configs, nearest first, at most `candidates` of them), and the heuristic default,

each only if its kernel is already built (the build cache: measuring never compiles), within a total of
`budget_ms` of measuring (a candidate that would start after the budget is spent is not timed). The fastest runs
for the rest of the process, and is recorded in the user's storage as that shape's row with the study name
row_order.BENCHMARKED_STUDY ("benchmarked at first use (not searched)"), its median time and the kernel
provenance. One measurement serves the shape's bucket (buckets.py): the other shapes of the bucket reuse the
choice in this process, and the next process finds the row for any shape of the bucket as an exact row (after any
searched row of the shape or its bucket: row_order.py); `autotune best` / `autotune best --explain` show it as
benchmarked. A decode loop whose key count grows every step so measures once per bucket, not once per step. A storage that cannot be written is said once
(StorageWarning) and the choice still holds for the process.

Not measured: calls while a CUDA graph is being captured (they run the lookup's choice, and a later ordinary call
measures). The process's own `autotune.explain` keeps showing the lookup's choice until `clear_caches()`.

Candidates are timed with the call's causal alignment (attention_op passes it through `plan` to each candidate's
`prepare`), and only rows of a fitting alignment lend their configs (store.nearest.alignment_fits).

CPU tests drive `choose` and `measure` with a stand-in timer, and `plan` with stand-ins for the runner and for the
CUDA-event timing (`_time_launch`); `plan` is the GPU glue attention_op calls.
"""
from __future__ import annotations

import math
import os
import statistics
import threading
import time
import warnings
from dataclasses import dataclass, replace
from typing import Callable, Optional

import space
from space import Arch, Config, Shape

from . import lookup, row_order
from .buckets import bucket
from ..store.nearest import alignment_fits, distance

ENV_VAR = "AUTOTUNE_BENCHMARK"
DEFAULT_CANDIDATES = 4
DEFAULT_BUDGET_MS = 50.0
MAX_REPS = 20  # launches timed per candidate (fewer when its share of the budget runs out)


@dataclass
class Settings:
    enabled: bool
    candidates: int = DEFAULT_CANDIDATES
    budget_ms: float = DEFAULT_BUDGET_MS


def env_enabled(value: str | None) -> bool:
    """$AUTOTUNE_BENCHMARK switches the mode on unless empty, 0, false, no or off."""
    return (value or "").strip().lower() not in ("", "0", "false", "no", "off")


settings = Settings(enabled=env_enabled(os.environ.get(ENV_VAR)))


def set_benchmark_mode(enabled: bool = True, *, candidates: int | None = None, budget_ms: float | None = None) -> None:
    """Switch benchmark mode on or off for this process (module docstring); `candidates` bounds the tuned
    neighbours' configs measured besides the lookup's choice and the default, `budget_ms` the measuring time per
    shape."""
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled: expected True or False, got {enabled!r}")
    if candidates is not None and (isinstance(candidates, bool) or not isinstance(candidates, int) or candidates < 0):
        raise ValueError(f"candidates: expected a non-negative integer, got {candidates!r}")
    if budget_ms is not None and (isinstance(budget_ms, bool) or not isinstance(budget_ms, (int, float))
                                  or not math.isfinite(budget_ms) or budget_ms <= 0):
        raise ValueError(f"budget_ms: expected a positive number of milliseconds, got {budget_ms!r}")
    settings.enabled = enabled
    if candidates is not None:
        settings.candidates = candidates
    if budget_ms is not None:
        settings.budget_ms = float(budget_ms)


def needs_measuring(selection: lookup.Selection) -> bool:
    """No exact row of this GPU (nor bucket or benchmarked row): the lookup guessed from a neighbour, another
    GPU's row or the default."""
    return selection.source in ("nearest", "same_arch", "heuristic")


def candidate_configs(shape: Shape, selection: lookup.Selection, rows, arch: Arch, limit: int) -> list[Config]:
    """The lookup's choice, then the configs of the nearest `rows` (lookup.Candidate, nearest first, ties by
    key), then the heuristic default: distinct, valid for this arch and problem, at most `limit` from rows."""
    from ..store.best_table import parse_config_key  # sqlalchemy: only when a row is read

    problem = shape.problem
    out = [selection.config]
    ranked = sorted(rows, key=lambda c: (round(distance(shape, c.shape), 9), c.origin, c.entry.key))
    taken = 0
    for c in ranked:
        if taken >= limit:
            break
        try:
            config = parse_config_key(c.entry.config_key)
        except (ValueError, KeyError):
            continue
        if config in out or space.violations(config, problem, arch):
            continue
        out.append(config)
        taken += 1
    default = space.default_config(problem, arch)
    if default not in out:
        out.append(default)
    return out


@dataclass(frozen=True)
class Measured:
    config: Config
    seconds: Optional[float]  # median of the timed launches; None: not timed
    spread: Optional[float] = None
    why: str = ""             # why not timed


def measure(candidates: list[Config], time_config: Callable[[Config, float], Optional[tuple[float, float]]],
            budget_s: float, clock: Callable[[], float] = time.perf_counter) -> list[Measured]:
    """Time each candidate (time_config(config, its share of the budget) → (median s, spread s), or None when it
    cannot be timed) in order while the budget lasts; the first candidate is always timed."""
    out = []
    start = clock()
    for i, config in enumerate(candidates):
        spent = clock() - start
        if i and spent >= budget_s:
            out.append(Measured(config, None, why=f"budget of {budget_s * 1e3:.0f} ms spent"))
            continue
        share = max(budget_s - spent, 0.0) / (len(candidates) - i)
        timed = time_config(config, share)
        out.append(Measured(config, timed[0], timed[1]) if timed else Measured(config, None, why="not built"))
    return out


def fastest(measured: list[Measured]) -> Optional[Measured]:
    timed = [m for m in measured if m.seconds is not None]
    return min(timed, key=lambda m: m.seconds) if timed else None


# ---- the GPU glue -----------------------------------------------------------------------------------------------

_lock = threading.Lock()
_plans: dict[tuple, lookup.Plan] = {}
_storage_warned: set[str] = set()


def clear() -> None:
    """Forget the choices made in this process (the rows recorded in storage stay)."""
    with _lock:
        _plans.clear()


def is_built(config: Config, problem, arch: Arch) -> bool:
    """Whether the build cache holds (config, problem) for arch: measuring never compiles."""
    b = lookup.builder(arch)
    return (b.entry_dir(b.key(config, problem)) / "meta.json").is_file()


def _rows(shape: Shape, gpu_name: str, arch: Arch, url: str) -> tuple:
    """The tuned rows whose configs are candidates: this GPU, arch and problem, and a causal alignment that fits
    the shape's (store.nearest.alignment_fits: a row timed with the other mask says nothing of this one)."""
    problem = shape.problem
    stored = lookup.storage_candidates(url, gpu_name, arch, problem)
    shipped = tuple(c for c in lookup.shipped_for_problem(lookup.shipped_candidates(lookup.shipped_tables_dir()),
                                                          arch, problem) if c.entry.gpu_name == gpu_name)
    fits = []
    for c in stored + shipped:
        try:
            if alignment_fits(c.shape, shape):
                fits.append(c)
        except ValueError:  # not a valid shape: candidate_configs' own checks leave its config out
            continue
    return tuple(fits)


def _time_launch(launch, device, share_s: float) -> tuple[float, float]:
    """(median s, spread s) of launches of a prepared Launch: CUDA events around each, up to MAX_REPS of them or
    until `share_s` has passed (after a first launch that loads the module and warms it)."""
    import torch

    launch()  # loads the module and warms it
    torch.cuda.synchronize(device)
    times, start = [], time.perf_counter()
    for _ in range(MAX_REPS):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        launch()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end) / 1e3)
        if time.perf_counter() - start >= share_s:
            break
    return statistics.median(times), max(times) - min(times)


def _timer(plan: lookup.Plan, q, k, v, scale, arch: Arch, causal_align: str = "upper_left"):
    """time_config for `measure`: each candidate launched on the call's own tensors, with the call's causal
    alignment (a lower-right decode step must not be timed as the mostly masked upper-left kernel)."""
    import torch

    from ..launch.loader import KernelRunner

    problem = plan.selection.shape.problem
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)

    def time_config(config: Config, share_s: float):
        if config == plan.runner.config:
            runner = plan.runner
        elif is_built(config, problem, arch):
            result = lookup.build(config, problem, arch)
            if not result.ok:
                return None
            runner = KernelRunner(result)
        else:
            return None
        return _time_launch(runner.prepare(q, k, v, o, None, scale, causal_align), q.device, share_s)

    return time_config


def plan(resolved: lookup.Plan, q, k, v, scale, url: str, causal_align: str = "upper_left") -> lookup.Plan:
    """attention_op's hook: `resolved` (lookup.resolve's plan) when the shape has an exact row, else the plan of
    the fastest measured candidate (module docstring), timed with the call's `causal_align`. Memoized per
    (device, bucket, storage) for the process (the bucket holds the alignment: space.Shape.causal_align)."""
    import torch

    selection = resolved.selection
    if not needs_measuring(selection) or (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()):
        return resolved
    shape = selection.shape
    key = (q.device.index, bucket(shape), url)  # one measurement per bucket (row_order.py finds it by bucket too)
    with _lock:
        hit = _plans.get(key)
        if hit is not None:
            return hit
        gpu_name, arch = lookup.device_info(q.device.index)
        configs = candidate_configs(shape, selection, _rows(shape, gpu_name, arch, url), arch, settings.candidates)
        measured = measure(configs, _timer(resolved, q, k, v, scale, arch, causal_align), settings.budget_ms / 1e3)
        best = fastest(measured)
        if best is None or best.config == resolved.runner.config:
            chosen = resolved
            if best is not None:
                chosen = replace(resolved, selection=_record(shape, gpu_name, arch, best, url, selection, measured))
        else:
            from ..launch.loader import KernelRunner

            runner = KernelRunner(lookup.build(best.config, shape.problem, arch))
            chosen = lookup.Plan(_record(shape, gpu_name, arch, best, url, selection, measured), runner,
                                 runner.kernel(q.device.index))
        _plans[key] = chosen
        return chosen


def _record(shape: Shape, gpu_name: str, arch: Arch, best: Measured, url: str, guessed: lookup.Selection,
            measured: list[Measured]) -> lookup.Selection:
    """Store the benchmarked row (keep-the-faster rule of the best table); the Selection it stands for."""
    from ..build.builder import provenance
    from ..store import storage_url
    from ..store.best_table import BestEntry, BestStore

    entry = BestEntry.for_shape(shape, gpu_name, arch.name, best.config, shape.tflops(best.seconds),
                                time_ms=best.seconds * 1e3, spread_ms=(best.spread or 0.0) * 1e3,
                                study=row_order.BENCHMARKED_STUDY, trial=None,
                                **provenance(lookup.builder(arch), [best.config.family]))
    where = storage_url.describe(url)
    timed = sum(m.seconds is not None for m in measured)
    note = (f"benchmarked at first use: fastest of {timed} timed of {len(measured)} candidates (the lookup's "
            f"{guessed.source} choice {guessed.config.key}, tuned neighbours' configs, the default)")
    try:
        with BestStore(url) as store:
            entry = store.record_best(entry, source=row_order.BENCHMARKED_STUDY).entry
    except Exception as e:  # StorageError, SQLAlchemyError, OSError: the choice still holds for this process
        if url not in _storage_warned:
            _storage_warned.add(url)
            warnings.warn(f"autotune: benchmark mode cannot record its choices in {where} ({type(e).__name__}: "
                          f"{e}); they hold for this process only", lookup.StorageWarning, stacklevel=4)
        where = f"{where} (not recorded: {type(e).__name__})"
    return lookup.Selection(best.config, "storage", shape, gpu_name, arch.name, entry, where, 0.0,
                            guessed.notes + (note,), guessed.searched)


__all__ = ["DEFAULT_BUDGET_MS", "DEFAULT_CANDIDATES", "ENV_VAR", "Measured", "Settings", "candidate_configs", "clear",
           "env_enabled",
           "fastest", "is_built", "measure", "needs_measuring", "plan", "set_benchmark_mode", "settings"]
