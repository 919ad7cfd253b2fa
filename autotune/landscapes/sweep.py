"""`autotune sweep` as a library call: measure every valid config of one or more shapes and save each landscape.

    valid configs of the shape (chosen families), in a seeded random order
      → one Builder.build of every (config, problem) in a background thread (parallel nvcc, cached); results
        stream out as each compile finishes
      → per config, in the order built: compile error / spilled (under the spill policy) / identical cubin of
        a config already timed → a row without GPU work; else the same Evaluator (worker child process) the
        search uses, with the lean sweep evaluation (sweep_eval.py): correctness first, then timing
      → a row per config in the landscape file (landscape.py), saved every SAVE_EVERY rows and at the end

Several shapes share one build (so shape n+1 compiles while shape n is timed) and one warm worker process.
The random order means a sweep cut short by its time cap leaves an unbiased sample, and running it again
resumes: rows already in the file are kept, only the missing configs are built (cache hits) and measured.
"""
from __future__ import annotations

import dataclasses
import queue
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import space
from space import Arch, Config, Shape

from ..build.builder import Builder, cubin_key, provenance
from ..build.spill_policy import SpillPolicy
from ..measure.child_process import Evaluator
from . import landscape_file as landscape_mod
from .landscape_file import Landscape, Row
from .sweep_eval import MEASUREMENT

SWEEP_EVALUATOR = "autotune.landscapes.sweep_eval:evaluate"
# An evaluation takes ~0.1-0.3 s of GPU time (worker start-up is not counted): a kernel still running after 10 s
# hangs, and each one costs this plus a worker restart out of the sweep's budget.
DEFAULT_EVAL_TIMEOUT = 10.0
SAVE_EVERY = 25
# When the first evaluations of a sweep all crash or hang, the evaluator (or the machine) is broken, not the configs:
# stop before the whole GPU budget goes into rows that say so.
BROKEN_AFTER = 5
# Header fields that must agree for a file's rows to be resumed into (anything else is another landscape).
RESUME_KEYS = ("shape", "arch", "gpu_name", "families", "kernel_source_hash", "nvcc_version")


class SweepError(RuntimeError):
    """A sweep cannot go on (an incompatible file to resume, the build machinery failing)."""


@dataclass
class SweepOptions:
    shapes: tuple[Shape, ...]
    families: tuple[str, ...] | None = None   # default: every family of the arch
    arch: str | None = None                   # default: the evaluator's GPU (required with build_only)
    out: str | None = None                    # landscape file (one shape only); default out_dir/<name>.json
    out_dir: str | None = None                # default: studies/landscapes/ of the checkout (or cwd)
    jobs: int | None = None                   # parallel nvcc processes (default: CPU count)
    cache_dir: str | None = None
    evaluator: str = SWEEP_EVALUATOR
    eval_timeout: float = DEFAULT_EVAL_TIMEOUT
    time_cap: float | None = None             # seconds of measuring per shape
    budget: float | None = None               # seconds of measuring for all shapes, shared by config count
    spill_policy: SpillPolicy = field(default_factory=SpillPolicy)
    seed: int = 0                             # measuring order
    fresh: bool = False                       # overwrite an existing file instead of resuming it
    replace_stale: bool = False               # overwrite a file recorded with other RESUME_KEYS (or unreadable now)
    build_only: bool = False                  # build and report; measure and write nothing (no GPU)
    limit: int | None = None                  # first N configs (of the seeded order) per shape: smoke tests
    nvcc_flags: tuple[str, ...] = ()

    def check(self) -> None:
        if not self.shapes:
            raise ValueError("shape: expected at least one shape")
        if self.out and len(self.shapes) > 1:
            raise ValueError("--out: names one file, so it needs exactly one shape")
        if self.jobs is not None and self.jobs < 1:
            raise ValueError(f"--jobs: expected a count ≥ 1, got {self.jobs}")
        for name in ("eval_timeout", "time_cap", "budget"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"--{name.replace('_', '-')}: expected seconds > 0, got {value}")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"--limit: expected a count ≥ 1, got {self.limit}")
        if self.build_only and not self.arch:
            raise ValueError("--build-only: pass --arch (there is no GPU to ask)")


@dataclass
class ShapeResult:
    shape: Shape
    path: Path | None
    landscape: Landscape | None       # None with build_only
    configs: int                      # valid configs of the shape (after --limit)
    resumed: int = 0                  # rows kept from an earlier run
    measured: int = 0                 # evaluations run now
    not_measured: int = 0             # left out by the time cap
    build_counts: dict = field(default_factory=dict)
    seconds: float = 0.0


@dataclass
class _ShapeWork:
    shape: Shape
    configs: list[Config]
    todo: set[str]                     # config keys still without a row
    landscape: Landscape | None
    path: Path | None
    results: "queue.Queue" = field(default_factory=queue.Queue)
    outcome: ShapeResult | None = None


class _BuildStream:
    """Every (config, problem) built in one background Builder.build; each result is handed to the queues of
    the shapes that wait for it as soon as its compile finishes."""

    END = object()

    def __init__(self, builder, work: list[_ShapeWork]):
        self.builder = builder
        self.by_problem: dict = {}
        items: list = []
        for w in work:  # shape order first, so the first shape's builds come first
            self.by_problem.setdefault(w.shape.problem, []).append(w)
            items += [(c, w.shape.problem) for c in w.configs if c.key in w.todo]
        self.items = list(dict.fromkeys(items))
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="autotune-sweep-build", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.builder.build(self.items, progress=self._deliver)
        except BaseException as e:  # handed to the consumer, which raises it
            self.error = e
        finally:
            for waiting in self.by_problem.values():
                for w in waiting:
                    w.results.put(self.END)

    def _deliver(self, done: int, total: int, result) -> None:
        for w in self.by_problem.get(result.problem, ()):
            if result.config.key in w.todo:
                w.results.put(result)


def run_sweeps(options: SweepOptions, *, builder=None, evaluator=None,
               log: Callable[[str], None] = print) -> list[ShapeResult]:
    """Sweep every shape of `options`; returns one ShapeResult per shape (see the module docstring)."""
    options.check()
    started = time.monotonic()
    own_evaluator = evaluator is None and not options.build_only
    if own_evaluator:
        evaluator = Evaluator(options.evaluator, timeout=options.eval_timeout)
    try:
        gpu_name, arch = _device(options, evaluator)
        if builder is None:
            builder = Builder(arch, cache_dir=options.cache_dir, jobs=options.jobs, extra_flags=options.nvcc_flags)
        families = _families(options.families, arch)
        prov = provenance(builder, families)
        work = [_prepare(shape, options, arch, families, gpu_name, prov, log) for shape in options.shapes]
        log(f"sweep on {gpu_name} ({arch.name}), families {'+'.join(families)}: "
            + "; ".join(f"{w.shape.key} {len(w.todo)} to do of {len(w.configs)}" for w in work)
            + f"; {getattr(builder, 'jobs', '?')} build jobs")
        stream = _BuildStream(builder, work)
        health = _Health()
        results = []
        for i, w in enumerate(work):
            cap = _time_cap(options, work[i:], started)
            results.append(_sweep_shape(w, stream, evaluator, options, cap, health, log))
        return results
    finally:
        if own_evaluator and evaluator is not None:
            evaluator.close()


def _device(options: SweepOptions, evaluator) -> tuple[str, Arch]:
    if options.build_only:
        return "build-only", space.get_arch(options.arch)
    info = evaluator.device_info()
    device = info.get("arch")
    if not device and not options.arch:
        raise ValueError("--arch: the evaluator did not report the GPU's arch; pass --arch (e.g. sm_90)")
    arch = space.get_arch(options.arch or device)
    # The search's rule (search.loop.choose_arch), not imported: a sweep sits below the search;
    # a cubin runs on its own major version with the same or a newer minor, nowhere else.
    if device and options.arch:
        dev = space.get_arch(device)
        if dev.major != arch.major or dev.minor < arch.minor:
            raise ValueError(f"--arch {arch.name}: its cubins cannot run on this GPU ({dev.name})")
    return str(info.get("gpu_name") or "unknown-gpu"), arch


def _families(requested, arch: Arch) -> tuple[str, ...]:
    available = tuple(f for f in arch.families if f in space.FAMILIES)
    if not requested:
        return available
    unknown = [f for f in requested if f not in available]
    if unknown:
        raise ValueError(f"--family: {unknown} not available on {arch.name}; expected some of {list(available)}")
    return tuple(f for f in available if f in requested)


def _prepare(shape: Shape, options: SweepOptions, arch: Arch, families, gpu_name: str, prov: dict,
             log) -> _ShapeWork:
    """The shape's configs in measuring order, and its landscape (resumed from the file when compatible)."""
    configs = space.valid_configs(shape.problem, arch, families)
    n_valid = len(configs)
    random.Random(f"{options.seed}-{shape.key}").shuffle(configs)
    configs = configs[:options.limit] if options.limit else configs
    if options.build_only:
        return _ShapeWork(shape, configs, {c.key for c in configs}, None, None)
    measurement = MEASUREMENT if options.evaluator == SWEEP_EVALUATOR else {"evaluator": options.evaluator}
    header = landscape_mod.make_header(
        shape, arch, families, gpu_name=gpu_name, kernel_source_hash=prov.get("kernel_source_hash", "unknown"),
        nvcc_version=prov.get("nvcc_version", "unknown"), n_valid=n_valid,
        exhaustive=f"every config of {'+'.join(families)} that space/ holds valid for this shape on {arch.name}",
        measurement={**measurement, "spill_policy": str(options.spill_policy), "order_seed": options.seed},
    )
    path = Path(options.out) if options.out else (
        Path(options.out_dir) / landscape_mod.default_path(shape, gpu_name, families).name if options.out_dir
        else landscape_mod.default_path(shape, gpu_name, families))
    landscape = Landscape(header, path=path)
    resumed = 0
    old = None
    if path.exists() and not options.fresh:
        try:
            old = landscape_mod.load(path)
        except landscape_mod.LandscapeError as e:
            if not options.replace_stale:
                raise
            log(f"{shape.key}: {path} cannot be read against today's space ({e}); recording it afresh")
    if old is not None:
        differ = [k for k in RESUME_KEYS if old.header.get(k) != header.get(k)]
        if differ and options.replace_stale:
            log(f"{shape.key}: {path} was recorded with another {', '.join(differ)}; recording it afresh "
                "(the old file is in the repository's history)")
            old = None
    if old is not None:
        differ = [k for k in RESUME_KEYS if old.header.get(k) != header.get(k)]
        if differ:
            def show(h, k):
                return h.get("shape_key") if k == "shape" else h.get(k)
            raise SweepError(f"{path}: recorded with another {', '.join(differ)} ("
                             + "; ".join(f"{k}: {show(old.header, k)!r}, now {show(header, k)!r}" for k in differ)
                             + "); pass --fresh to overwrite it, or --out another file")
        wanted = {c.key for c in configs}
        for row in old.rows.values():
            if row.config_key in wanted:
                landscape.add(row)
                resumed += 1
        landscape.header["baselines"] = old.header.get("baselines")
        log(f"{shape.key}: resuming {path} ({resumed} rows kept)")
    todo = {c.key for c in configs if c.key not in landscape.rows}
    return _ShapeWork(shape, configs, todo, landscape, path,
                      outcome=ShapeResult(shape, path, landscape, len(configs), resumed=resumed))


def _time_cap(options: SweepOptions, remaining: list[_ShapeWork], started: float) -> float | None:
    """This shape's measuring time: --time-cap, and its share (by configs to do) of what --budget has left."""
    caps = []
    if options.time_cap:
        caps.append(options.time_cap)
    if options.budget:
        left = max(0.0, options.budget - (time.monotonic() - started))
        total = sum(len(w.todo) for w in remaining) or 1
        caps.append(left * len(remaining[0].todo) / total)
    return min(caps) if caps else None


class _Health:
    """Counts the sweep's first evaluations: BROKEN_AFTER crashes or timeouts before any success means a broken
    evaluator."""

    def __init__(self):
        self.crashes = self.completes = 0

    def broken(self, row: Row) -> bool:
        self.completes += row.status == "complete"
        failed = row.status in ("crashed", "timeout")
        self.crashes = self.crashes + 1 if failed and not self.completes else 0
        return self.crashes >= BROKEN_AFTER


def _sweep_shape(w: _ShapeWork, stream: _BuildStream, evaluator, options: SweepOptions, cap: float | None,
                 health: _Health, log) -> ShapeResult:
    t0 = time.monotonic()
    result = w.outcome or ShapeResult(w.shape, None, None, len(w.configs))
    ls = w.landscape
    deadline = t0 + cap if cap else None
    if ls is not None and not ls.header.get("baselines"):
        ls.header["baselines"] = _baselines(evaluator, w.shape, log)
    timed: dict = {}  # cubin key → the row that timed it: identical cubins are timed once
    if ls is not None:
        for row in ls.rows.values():
            key = cubin_key(row.cubin_hash, row.config, w.shape.problem)
            if key and row.status not in ("spilled", "compile_error") and not row.same_cubin_as:
                timed.setdefault(key, row)
    cap_text = f", {cap:.0f} s to measure" if cap else ""
    log(f"{w.shape.key}: {len(w.todo)} configs to build and measure{cap_text}")
    pending, since_save, best = len(w.todo), 0, ls.best if ls is not None else None
    while pending:
        build = w.results.get()
        if build is _BuildStream.END:
            if stream.error is not None:
                raise SweepError(f"the build failed: {stream.error}") from stream.error
            break
        pending -= 1
        result.build_counts[build.status] = result.build_counts.get(build.status, 0) + 1
        if ls is None:  # build only
            continue
        row = _row_from_build(build, options.spill_policy)
        if row is None:
            key = cubin_key(build.cubin_hash, build.config, build.problem)
            twin = timed.get(key) if key else None
            if twin is not None:
                row = dataclasses.replace(twin, config_key=build.config.key, same_cubin_as=twin.config_key,
                                          **_report_fields(build))
            elif deadline is not None and time.monotonic() > deadline:
                result.not_measured += 1
                continue
            else:
                row = _row_from_eval(build, evaluator.evaluate(build, w.shape))
                result.measured += 1
                if health.broken(row):
                    ls.save()
                    raise SweepError(f"the first {health.crashes} evaluations all crashed or hung, the last with: "
                                     f"{row.reason}; the evaluator or the GPU is broken, stopping")
                if key:
                    timed.setdefault(key, row)
        ls.add(row)
        since_save += 1
        if row.status == "complete" and (best is None or row.tflops > best.tflops):
            best = row
        if row.status in ("wrong", "crashed", "timeout"):
            log(f"  {row.status}: {row.config_key}: {row.reason}")
        if since_save >= SAVE_EVERY:
            ls.save()
            since_save = 0
            log(f"  {len(ls.rows)}/{len(w.configs)} rows, {time.monotonic() - t0:.0f} s; best "
                + (f"{best.tflops:.1f} TFLOPS {best.config_key}" if best else "none yet"))
    result.seconds = time.monotonic() - t0
    if ls is not None:
        ls.header["complete"] = len(ls.rows) == ls.header["n_valid"]
        ls.header["seconds"] = round(result.seconds + float(ls.header.get("seconds") or 0), 1)
        ls.save()
        if result.not_measured:
            log(f"{w.shape.key}: time cap reached: {result.not_measured} configs not measured (run the same "
                "command again to resume)")
        log(ls.summary())
    else:
        log(f"{w.shape.key}: builds {dict(sorted(result.build_counts.items()))}")
    return result


def _baselines(evaluator, shape: Shape, log) -> dict:
    try:
        out = evaluator.baselines(shape)
    except Exception as e:  # context, not the result: the landscape is still worth having
        log(f"{shape.key}: SDPA baselines failed: {e}")
        return {}
    log(f"{shape.key}: SDPA " + ", ".join(f"{k} {v:.1f}" if v else f"{k} n/a" for k, v in out.items()) + " TFLOPS")
    return {k: (round(v, 2) if v else None) for k, v in out.items()}


def _report_fields(build) -> dict:
    r = build.report
    if r is None:
        return {}
    return {"registers": r.registers, "spill_stores": r.spill_stores, "spill_loads": r.spill_loads,
            "stack_bytes": r.stack_bytes, "smem_static": r.smem_static,
            "compile_seconds": round(r.compile_seconds, 2), "cubin_hash": landscape_mod.short_hash(build.cubin_hash)}


def _row_from_build(build, policy: SpillPolicy) -> Row | None:
    """The row a build alone decides (compile error, spill under the policy), or None: measure it."""
    if build.status == "invalid":  # the Builder's rule check disagrees with valid_configs: a bug, say so
        raise SweepError(f"{build.config.key}: the Builder rejected a config space/ listed as valid: {build.error}")
    if not build.ok:
        return Row(build.config.key, "compile_error", reason=landscape_mod.short_reason(build.error),
                   **_report_fields(build))
    pruned = policy.prunes(build.report)
    if pruned:
        return Row(build.config.key, "spilled", reason=landscape_mod.short_reason(pruned), **_report_fields(build))
    return None


def _row_from_eval(build, ev) -> Row:
    """ev: a child_process.EvalOutcome; the lean evaluator adds p20/p80/n_reps in `extra`."""
    extra = ev.extra or {}
    row = Row(build.config.key, ev.status, max_error=ev.max_error, blocks_per_sm=ev.blocks_per_sm,
              **_report_fields(build))
    if ev.status == "complete":
        row.tflops, row.median_ms = ev.tflops, ev.time_ms
        row.p20_ms, row.p80_ms, row.n_reps = extra.get("p20_ms"), extra.get("p80_ms"), extra.get("n_reps")
    else:
        row.reason = landscape_mod.short_reason(ev.reason) or ev.status
    return row


__all__ = ["DEFAULT_EVAL_TIMEOUT", "SWEEP_EVALUATOR", "ShapeResult", "SweepError", "SweepOptions", "run_sweeps"]
