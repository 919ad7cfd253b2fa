"""`autotune search` as a library call: an Optuna study over the kernel's design space for one shape.

The pipeline (scheduler.Pipeline; ask/tell in batches, the three stages overlap):

    ask a batch of K new valid configs   (invalid ones are told PRUNED/invalid on the spot, never built;
                                          configs the study already judged reuse that result)
    build the batch in the background    (Builder: parallel nvcc, cached)
    judge each built config              (compile error, spill policy, identical cubin → no GPU needed;
                                          else evaluate in the child process, worker.Evaluator)
    → trial.tell (status, user attrs, constraint)

`trials` counts configs actually built in the study (every status but invalid), so a mostly invalid space does
not eat the budget; `max_asks` bounds the asking so it cannot loop forever. At the end the top configs are
re-timed in one evaluator session next to the SDPA baselines, and the winner goes to the best-per-shape store.

Collaborators are injected (builder, evaluator) so tests run the real Builder with a test-double evaluator.
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import space
from space import Arch, Config, Shape

from . import studies, trial as trial_mod, winner
from .sampling import SearchSpace, make_sampler
from .scheduler import Pipeline
from .summary import ProgressPrinter
from .trial import Outcome, SpillPolicy
from .worker import DEFAULT_EVALUATOR, Evaluator

DEFAULT_TRIALS = 60          # ≈ 15-20 minutes on one H200 with 16 build cores; TPE settles after ~40
DEFAULT_EVAL_TIMEOUT = 120.0  # seconds per evaluation (correctness check + timing), worker start excluded
ASKS_PER_TRIAL = 30           # the ask cap: 30 asks per wanted trial (d128 has ~1 valid config in 13) + 200
TOP_N = 5


@dataclass
class SearchOptions:
    shape: Shape
    trials: int = DEFAULT_TRIALS
    timeout: float | None = None           # wall seconds for the trial loop (the finale comes on top)
    sampler: str = "tpe"
    seed: int | None = 0
    storage: str | None = None
    study_name: str | None = None
    arch: str | None = None                # default: the evaluator's GPU
    families: tuple[str, ...] | None = None
    spill_policy: SpillPolicy = field(default_factory=SpillPolicy)
    jobs: int | None = None                # parallel nvcc processes (default: CPU count)
    ahead: int | None = None               # configs per batch (default: jobs, at least 2)
    eval_timeout: float = DEFAULT_EVAL_TIMEOUT
    evaluator: str = DEFAULT_EVALUATOR
    cache_dir: str | None = None
    retime_top: int = 3
    enqueue: tuple[Config, ...] = ()       # configs to try first (the heuristic default always is)
    max_asks: int | None = None
    nvcc_flags: tuple[str, ...] = ()       # extra nvcc flags (experiments, tests); part of the build cache key
    replay: object = None                  # a landscape file (or landscape.Landscape): no nvcc, no GPU, see replay.py

    def check(self) -> None:
        if self.trials < 0:
            raise ValueError(f"--trials: expected a count ≥ 0, got {self.trials}")
        if self.timeout is not None and self.timeout <= 0:
            raise ValueError(f"--timeout: expected seconds > 0, got {self.timeout}")
        if self.jobs is not None and self.jobs < 1:
            raise ValueError(f"--jobs: expected a count ≥ 1, got {self.jobs}")
        if self.ahead is not None and self.ahead < 1:
            raise ValueError(f"--ahead: expected a count ≥ 1, got {self.ahead}")
        if self.eval_timeout <= 0:
            raise ValueError(f"--eval-timeout: expected seconds > 0, got {self.eval_timeout}")
        if self.retime_top < 1:
            raise ValueError(f"retime_top: expected a count ≥ 1, got {self.retime_top}")
        if self.max_asks is not None and self.max_asks < 1:
            raise ValueError(f"max_asks: expected a count ≥ 1, got {self.max_asks}")


@dataclass
class SearchResult:
    study_name: str
    storage: str
    gpu_name: str
    arch: Arch
    shape: Shape
    target: int
    evaluated: int                          # distinct configs built in the study, after this run
    this_run: Counter                       # statuses of trials told in this run
    counts: Counter                         # statuses of every finished trial of the study
    asks: int
    stop_reason: str
    top: list = field(default_factory=list)  # FrozenTrials, best first (up to 5)
    retimed: list = field(default_factory=list)
    record: object | None = None            # store.RecordResult
    baselines: dict = field(default_factory=dict)
    idle_seconds: float = 0.0               # GPU idle while the compiler had its next work
    idle_other_seconds: float = 0.0         # GPU idle otherwise (asking, telling, worker start)
    first_eval_after: float | None = None   # seconds until the first evaluation started
    build_seconds: float = 0.0
    eval_seconds: float = 0.0
    wall_seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def best(self):
        return winner.pick(self.retimed)


@dataclass
class _Pending:
    """An asked trial with a new valid config, on its way through build and evaluation."""

    trial: object
    config: Config
    followers: list = field(default_factory=list)  # later asks of the same config: told when this one is


class _Loop:
    """The search's stages for scheduler.Pipeline: Optuna asks and tells, builds, evaluations."""

    def __init__(self, study, search_space: SearchSpace, builder, evaluator, shape: Shape, policy: SpillPolicy,
                 memory: studies.StudyMemory, progress: ProgressPrinter, target: int, max_asks: int,
                 deadline: float | None):
        self.study, self.space, self.builder, self.evaluator = study, search_space, builder, evaluator
        self.shape, self.problem, self.arch = shape, shape.problem, search_space.arch
        self.policy, self.memory, self.progress = policy, memory, progress
        self.target, self.max_asks, self.deadline = target, max_asks, deadline
        self.in_flight: dict[str, _Pending] = {}  # asked, new, valid configs not told yet
        self.asks = 0
        self.exhausted = False
        self.this_run: Counter = Counter()
        self.eval_seconds = 0.0
        self._eval_started = 0.0

    # -- asking ---------------------------------------------------------------------------------------------

    def time_left(self) -> bool:
        return self.deadline is None or time.monotonic() < self.deadline

    def can_ask(self) -> bool:
        wanted = self.target - self.memory.evaluated - len(self.in_flight)
        return wanted > 0 and not self.exhausted and self.asks < self.max_asks and self.time_left()

    def ask(self) -> _Pending | None:
        """One ask: a new valid config to build, or None when the ask was settled on the spot."""
        t = self.study.ask()
        self.asks += 1
        config = self.space.suggest(t)
        violations = space.violations(config, self.problem, self.arch)
        if violations:  # never reaches nvcc
            self._tell(t, trial_mod.invalid(config, self.problem, violations), config, remember=False)
            return None
        earlier = self.memory.by_config.get(config.key)
        if earlier is not None:  # judged before in this study: reuse, do not build or run again
            self._tell(t, trial_mod.reused(earlier.outcome, trial_mod.DUPLICATE_OF, earlier.number, config,
                                           self.problem), config, remember=False)
            return None
        pending = self.in_flight.get(config.key)
        if pending is not None:  # asked again while on its way: told together with the first ask
            pending.followers.append(t)
            return None
        pending = _Pending(t, config)
        self.in_flight[config.key] = pending
        return pending

    # -- building and judging -------------------------------------------------------------------------------

    def build(self, items: list[_Pending]) -> list:
        return self.builder.build([(p.config, self.problem) for p in items])

    def judge_built(self, pending: _Pending, build) -> bool:
        verdict = trial_mod.after_build(build, self.policy)
        if verdict is None:
            key = studies.cubin_key(build.cubin_hash, pending.config, self.problem)
            twin = self.memory.by_cubin.get(key) if key else None
            if twin is None:
                return False  # evaluate it
            verdict = trial_mod.reused(twin.outcome, trial_mod.SAME_CUBIN_AS, twin.number, pending.config,
                                       self.problem)
        self.finish(pending, verdict)
        return True

    def start_eval(self, pending: _Pending, build) -> None:
        self._eval_started = time.monotonic()
        self.evaluator.submit(build, self.shape)

    def poll_eval(self, block_for: float | None):
        return self.evaluator.wait(block_for)

    def finish_eval(self, pending: _Pending, build, ev) -> None:
        self.eval_seconds += time.monotonic() - self._eval_started
        self.finish(pending, trial_mod.after_eval(build, ev))

    def should_stop(self) -> bool:
        return not self.time_left()

    # -- telling --------------------------------------------------------------------------------------------

    def finish(self, pending: _Pending, outcome: Outcome) -> None:
        self.in_flight.pop(pending.config.key, None)
        self._tell(pending.trial, outcome, pending.config, remember=True)
        original = self.memory.by_config[pending.config.key].number
        for follower in pending.followers:
            self._tell(follower, trial_mod.reused(outcome, trial_mod.DUPLICATE_OF, original, pending.config,
                                                  self.problem), pending.config, remember=False)

    def abandon(self, reason: str) -> int:
        """FAIL every trial asked but not told (they do not count, and their configs may come again)."""
        n = 0
        for pending in list(self.in_flight.values()):
            for t in [pending.trial, *pending.followers]:
                trial_mod.abandon(self.study, t, reason)
                n += 1
        self.in_flight.clear()
        self.this_run["cancelled"] += n
        return n

    def _tell(self, t, outcome: Outcome, config: Config, remember: bool) -> None:
        if trial_mod.tell(self.study, t, outcome):
            self.exhausted = True
        self.this_run[outcome.status] += 1
        if remember:
            self.memory.remember(t.number, config, self.problem, outcome)
        self.progress.told(t.number, config, outcome, self.memory.evaluated)


def run_search(options: SearchOptions, *, builder=None, evaluator=None, log: Callable[[str], None] = print,
               store=None) -> SearchResult:
    """Run (or resume) the study described by `options`; returns what happened. See the module docstring."""
    import optuna

    from . import storage_url

    options.check()
    started = time.monotonic()
    studies.quiet_optuna()
    if options.replay is not None:
        options, builder, evaluator, store = _replay(options, builder, evaluator, store)
    url = storage_url.prepare(storage_url.resolve_storage_url(options.storage))
    own_evaluator = evaluator is None
    evaluator = evaluator or Evaluator(options.evaluator, timeout=options.eval_timeout)
    try:
        info = evaluator.device_info()
        gpu_name = str(info.get("gpu_name") or "unknown-gpu")
        arch = _choose_arch(options.arch, info.get("arch"))
        if builder is None:
            from .build import Builder

            builder = Builder(arch, cache_dir=options.cache_dir, jobs=options.jobs, extra_flags=options.nvcc_flags)
        provenance = winner.provenance(builder)
        search_space = SearchSpace(options.shape.problem, arch, options.families)
        name = options.study_name or studies.default_study_name(gpu_name, options.shape, options.families)
        if options.replay is not None and not options.study_name:
            name = f"replay-{name}"  # never the name of the real study recorded on that GPU
        seed = options.seed
        storage = optuna.storages.RDBStorage(url)
        study = studies.open_study(name, storage, make_sampler(options.sampler, seed), options.shape, arch, gpu_name,
                                   provenance, log=log)
        if seed is not None and study.trials:
            # A resumed run must not replay the first run's random draws (they would all be duplicates).
            study.sampler = make_sampler(options.sampler, seed + len(study.trials))
        studies.fail_stale_running(study, log=log)
        memory = studies.StudyMemory.load(study, options.shape.problem)
        _enqueue(study, search_space, memory, options, arch)

        target = options.trials
        remaining = max(0, target - memory.evaluated)
        max_asks = options.max_asks or ASKS_PER_TRIAL * remaining + 200
        # --timeout bounds the trial loop, from here: worker start-up and study loading are not trials
        deadline = time.monotonic() + options.timeout if options.timeout else None
        progress = ProgressPrinter(target, log=log, best=studies.top_trials(study, 1))
        loop = _Loop(study, search_space, builder, evaluator, options.shape, options.spill_policy, memory, progress,
                     target, max_asks, deadline)
        batch_size = options.ahead or max(2, getattr(builder, "jobs", 2))
        log(f"study {name}: {memory.evaluated} of {target} trials already evaluated; batches of {batch_size}; "
            f"storage {storage_url.describe(url)}")
        stop_reason, pipeline = _run_pipeline(loop, options, batch_size)

        result = SearchResult(
            study_name=name, storage=storage_url.describe(url), gpu_name=gpu_name, arch=arch, shape=options.shape,
            target=target, evaluated=memory.evaluated, this_run=loop.this_run, counts=studies.status_counts(study),
            asks=loop.asks, stop_reason=stop_reason, top=[],
            idle_seconds=pipeline.idle_for_builds, idle_other_seconds=pipeline.idle_other,
            first_eval_after=pipeline.first_eval_after, build_seconds=pipeline.build_seconds,
            eval_seconds=loop.eval_seconds,
        )
        _finale(result, study, builder, evaluator, options, provenance, store or url, log)
        result.wall_seconds = time.monotonic() - started
        return result
    finally:
        if own_evaluator:
            evaluator.close()


def _finale(result: SearchResult, study, builder, evaluator, options: SearchOptions, provenance: dict, store,
            log: Callable[[str], None]) -> None:
    """Re-time the top configs next to the baselines (one worker session), record both on the study, and store
    the winner. `store` is a BestStore or the URL to open one at."""
    from .store import BestStore

    top = studies.top_trials(study, max(TOP_N, options.retime_top))
    result.top = top[:TOP_N]
    result.retimed, result.baselines, result.notes = winner.retime_and_baselines(
        top[:options.retime_top], builder, evaluator, options.shape, log=log)
    study.set_user_attr("baselines", result.baselines)
    study.set_user_attr("retimed", [r.as_attr() for r in result.retimed])
    best = winner.pick(result.retimed)
    if best is None:
        return
    own = isinstance(store, str)
    store = BestStore(store) if own else store
    try:
        result.record = winner.store_best(store, best, options.shape, result.gpu_name, result.arch,
                                          result.study_name, provenance)
    finally:
        if own:
            store.close()


def _run_pipeline(loop: _Loop, options: SearchOptions, batch_size: int) -> tuple[str, Pipeline]:
    """Run the ask → build → evaluate pipeline; returns (why it stopped, the Pipeline with its timings)."""
    pipeline = Pipeline(loop, batch_size)
    try:
        leftovers = pipeline.run()
    except BaseException:
        loop.abandon("interrupted before it was evaluated")
        raise
    if leftovers or loop.in_flight:  # only when should_stop() cut the run short, i.e. --timeout
        loop.abandon("cancelled: the search stopped (--timeout) before it was evaluated")
    if loop.memory.evaluated >= loop.target:
        reason = f"reached {loop.target} evaluated trials"
    elif not loop.time_left():
        reason = f"--timeout {options.timeout:g} s reached"
    elif loop.exhausted:
        reason = "the sampler has explored the whole space"
    else:
        reason = (f"stopped after {loop.asks} asks without enough new valid configs (the valid space may be "
                  "exhausted, or the sampler keeps proposing invalid or repeated ones)")
    return reason, pipeline


def _enqueue(study, search_space: SearchSpace, memory, options: SearchOptions, arch: Arch) -> None:
    """A fresh study starts with the heuristic default of each family (a known-good baseline for the sampler)
    and any configs the caller asked for; configs the study already judged are not queued again."""
    wanted = list(options.enqueue)
    if not study.trials:
        for family in search_space.families:
            try:
                wanted.insert(0, space.default_config(options.shape.problem, arch, family))
            except (KeyError, ValueError):
                pass
    seen = set(memory.by_config)
    for config in wanted:
        if config.key in seen:
            continue
        seen.add(config.key)
        try:
            study.enqueue_trial(search_space.params(config), skip_if_exists=True)
        except ValueError:
            pass  # outside the searched domain (so certainly invalid): nothing to learn from queuing it


def _replay(options: SearchOptions, builder, evaluator, store):
    """Answer builds and evaluations from the landscape (autotune/replay.py). The shape must be the recorded one;
    families default to the recorded ones. Studies go to an in-memory database unless --storage names one (a
    replay must not mix with real studies, $AUTOTUNE_STORAGE included), and no best config is stored: nothing
    new was measured."""
    import dataclasses

    from . import landscape as landscape_mod
    from .replay import NullStore, ReplayBuilder, ReplayEvaluator

    ls = options.replay
    if not isinstance(ls, landscape_mod.Landscape):
        ls = landscape_mod.load(ls)
    if options.shape != ls.shape:
        raise ValueError(f"--replay {ls.path or ls.name}: recorded for shape {ls.shape.key}, not {options.shape.key}")
    families = options.families or ls.families
    outside = [f for f in families if f not in ls.families]
    if outside:
        raise ValueError(f"--family {outside}: the landscape covers only {list(ls.families)}")
    options = dataclasses.replace(options, replay=ls, families=tuple(families),
                                  storage=options.storage or "sqlite:///:memory:")
    return (options, builder or ReplayBuilder(ls, jobs=options.jobs or 1), evaluator or ReplayEvaluator(ls),
            store if store is not None else NullStore())


def _choose_arch(requested: str | None, device_arch: str | None) -> Arch:
    if requested is None:
        if not device_arch:
            raise ValueError("--arch: the evaluator did not report the GPU's arch; pass --arch (e.g. sm_90)")
        return space.get_arch(device_arch)
    arch = space.get_arch(requested)
    if device_arch:
        dev = space.get_arch(device_arch)
        # A cubin runs on its own major version with the same or a newer minor, nowhere else.
        if dev.major != arch.major or dev.minor < arch.minor:
            raise ValueError(f"--arch {arch.name}: its cubins cannot run on this GPU ({dev.name}); "
                             f"leave --arch out or pass --arch {dev.name}")
    return arch


__all__ = ["DEFAULT_EVAL_TIMEOUT", "DEFAULT_TRIALS", "SearchOptions", "SearchResult", "run_search"]
