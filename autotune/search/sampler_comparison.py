"""Samplers compared on recorded landscapes: how many trials each needs to come near the optimum.

Each (landscape, sampler, seed) is one simulated search. It drives the search's own trial logic (loop.TrialLoop:
the same parameters, validity check before building, reuse of repeated configs and identical cubins, the same
outcome → tell with constraints, the heuristic default enqueued first) with the build and the evaluation
answered by the replay (autotune/landscapes/replay.py). Only the scheduling differs: pipeline.Pipeline overlaps
stages in real time, which would make a replay's order depend on thread timing; here a deterministic driver keeps
`lag` new configs asked but not yet told whenever the sampler is asked again, as the real pipeline does while
the GPU works through earlier batches (measured: 16-24 configs in flight with 16 build jobs, ~1 s per batch
build and ~0.4 s per evaluation). lag 0 is a strictly sequential search.

Counting is the search's: a trial is a distinct config built (every status but invalid), as `--trials` counts.
A run stops at `trials`, when the sampler has exhausted the space, or — to save time — once it has both
reached `stop_fraction` of the optimum and run `min_trials` (the default budget, whose best is reported).
"""
from __future__ import annotations

import functools
import math
import warnings
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Sequence

from ..build.spill_policy import SpillPolicy
from ..landscapes import landscape_file as landscape_mod
from ..landscapes.landscape_file import Landscape
from ..landscapes.replay import ReplayBuilder, ReplayEvaluator, recorded_configs
from ..landscapes.replay_noise import ReplayNoise
from . import study as studies
from .loop import TrialLoop, enqueue_first
from .options import DEFAULT_TRIALS, SearchOptions
from .sampling import NoSampler, SearchSpace, make_sampler, shadow_sampler
from .verdicts import DUPLICATE_OF

THRESHOLDS = (0.95, 0.98, 0.99)
DEFAULT_LAG = 16
DEFAULT_SEEDS = 20
# The search allows 30 asks per wanted trial (options.ASKS_PER_TRIAL); a simulated sampler that needs more than
# this many is stopped and reported ("N asks"): some TPE settings keep re-proposing the enqueued default, which
# the search tells again as a complete copy, and every ask costs more as the study grows (quadratic in total).
ASKS_PER_TRIAL = 10


# -- samplers -----------------------------------------------------------------------------------------------


def _tpe(**kwargs) -> Callable:
    def make(seed, built):  # Optuna's start (finished trials), as the search's (sampling.START_COUNTS_BUILT)
        import optuna

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.TPESampler(seed=seed, **kwargs)
    return make


def _search_default(name: str, count_built: bool | None = None) -> Callable:
    """The search's sampler (sampling.shadow_sampler); count_built overrides which start it has."""
    def make(seed, built):
        if count_built is None:
            return shadow_sampler(name, seed, built)
        return make_sampler(name, seed, built if count_built else None)
    return make


def _cmaes(seed, built):
    import optuna

    # Every parameter here is categorical: CMA-ES models only float/int parameters, so Optuna samples all of
    # ours with its independent sampler (random). Listed so the table shows that, not because it can win.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False)


@dataclass(frozen=True)
class SamplerVariant:
    name: str
    description: str
    make: Callable  # (seed, built) -> optuna sampler; built() counts the configs built so far


VARIANTS = {v.name: v for v in (
    SamplerVariant("tpe", "`autotune search`'s TPE: multivariate, group, constant_liar, 10 startup trials "
                          "(Optuna's start: finished trials, invalid proposals included)", _search_default("tpe")),
    SamplerVariant("tpe-startup-built", "the search's TPE, random until 10 configs are built (sampling.BuiltStartup)",
                   _search_default("tpe", count_built=True)),
    SamplerVariant("tpe-optuna", "Optuna 5's TPESampler defaults (multivariate, constant_liar, no group)", _tpe()),
    SamplerVariant("tpe-independent", "TPE, one density per parameter (multivariate=False)",
                   _tpe(multivariate=False, constant_liar=True)),
    SamplerVariant("tpe-no-liar", "the search's TPE without constant_liar", _tpe(multivariate=True, group=True,
                                                                                  constant_liar=False)),
    SamplerVariant("tpe-startup5", "the search's TPE, 5 startup trials", _tpe(multivariate=True, group=True,
                                                                              constant_liar=True, n_startup_trials=5)),
    SamplerVariant("tpe-startup30", "the search's TPE, 30 startup trials",
                   _tpe(multivariate=True, group=True, constant_liar=True, n_startup_trials=30)),
    SamplerVariant("gp", "Optuna's GPSampler (`--sampler gp`)", _search_default("gp")),
    SamplerVariant("cmaes", "CmaEsSampler: all our parameters are categorical, so it falls back to its "
                            "independent (random) sampler for every one", _cmaes),
    SamplerVariant("random", "RandomSampler (`--sampler random`)", _search_default("random")),
    SamplerVariant("brute", "BruteForceSampler (`--sampler brute`): exhaustive, in random order",
                   _search_default("brute")),
)}
# GP is left out by default only for time: with a few hundred mostly invalid trials per run, each ask refits the
# GP (~0.3-1 s on one core), so one simulated search takes minutes. tpe-independent stalls on re-proposing the
# enqueued default until the ask cap; tpe-optuna equals tpe when a landscape has one family (group is moot).
DEFAULT_SAMPLERS = ("tpe", "tpe-no-liar", "tpe-startup5", "tpe-startup30", "cmaes", "random", "brute")
BUDGET_MULTIPLE = 4  # default cap per run: 4 × the reported budget (or every config, if fewer)


def variant(name: str) -> SamplerVariant:
    try:
        return VARIANTS[name]
    except KeyError:
        raise ValueError(f"--samplers: expected some of {list(VARIANTS)}, got {name!r}") from None


# -- one simulated search -----------------------------------------------------------------------------------


@dataclass
class Run:
    """One simulated search: the value of each trial in order (TFLOPS, or None when it produced no speed)."""

    sampler: str
    seed: int
    values: list = field(default_factory=list)
    asks: int = 0         # trials asked in the (in-memory) stored study
    proposals: int = 0    # the sampler's proposals, invalid and repeated ones included
    unjudged: int = 0     # asked (in flight, up to the lag) when the run stopped: never judged
    stop_reason: str = ""

    def best_after(self, n: int) -> float | None:
        done = [v for v in self.values[:n] if v is not None]
        return max(done) if done else None

    def trials_to(self, target: float) -> int | None:
        """Trials until the best so far reaches `target` (None: not within this run)."""
        for i, v in enumerate(self.values, 1):
            if v is not None and v >= target:
                return i
        return None


class _Recorder:
    """Takes the place of progress.ProgressPrinter: keeps each trial's value in the order the search counts.
    With `recorded` (a noisy replay) the value kept is the config's recorded figure, not the draw the sampler
    was told: trials to 98 % then count until the search has tried a config that good, not one that measured
    lucky once."""

    def __init__(self, run: Run, recorded: Landscape | None = None):
        self.run = run
        self.best = -math.inf
        self.recorded = recorded

    def skipped(self, invalid, repeated) -> None:
        pass

    def told(self, number, config, outcome, evaluated) -> None:

        if outcome.status == "invalid" or DUPLICATE_OF in outcome.attrs:
            return  # not a trial by the search's count
        value = outcome.value
        if value is not None and self.recorded is not None:
            value = self.recorded.row(config).tflops
        self.run.values.append(value)
        if value is not None:
            self.best = max(self.best, value)


def simulate(landscape: Landscape, sampler: str, seed: int, trials: int, lag: int = DEFAULT_LAG,
             enqueue_default: bool = True, stop_fraction: float | None = max(THRESHOLDS),
             min_trials: int = 0, asks_per_trial: int = ASKS_PER_TRIAL, noise: bool = False) -> Run:
    """One simulated search. `noise`: every evaluation draws its figure from the landscape's recorded sessions
    (landscapes/replay_noise.py, seeded by `seed`), the sampler learns from the draws, the run counts recorded
    figures (_Recorder)."""
    import optuna


    studies.quiet_optuna()
    shape, arch = landscape.shape, landscape.arch
    run = Run(sampler, seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # experimental-feature and independent-sampling notes, once per run
        study = optuna.create_study(direction="maximize", sampler=NoSampler())
    search_space = SearchSpace(shape.problem, arch, landscape.families, within=recorded_configs(landscape))
    memory = studies.StudyMemory()
    options = SearchOptions(shape=shape, trials=trials, families=landscape.families)
    if enqueue_default:
        enqueue_first(study, search_space, memory, options, arch)
    recorder = _Recorder(run, landscape if noise else None)
    evaluator = ReplayEvaluator(landscape, ReplayNoise(landscape, seed) if noise else None)
    loop = TrialLoop(study, search_space, ReplayBuilder(landscape), evaluator, shape,
                        SpillPolicy(), memory, recorder, trials,
                        max_asks=asks_per_trial * trials + 200, deadline=None,
                        sampler=functools.partial(variant(sampler).make, seed))
    stop_at = stop_fraction * landscape.optimum if stop_fraction else math.inf
    queue: deque = deque()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        while True:
            if recorder.best >= stop_at and len(run.values) >= min_trials:
                run.stop_reason = f"reached {stop_fraction:.0%} of the optimum"
                break
            if loop.can_ask() and len(queue) <= lag:
                pending = loop.ask()
                if pending is not None:
                    queue.append(pending)
                continue
            if not queue:
                break
            _judge(loop, queue.popleft())
    if not run.stop_reason:
        run.stop_reason = ("sampler exhausted the space" if loop.exhausted else
                           f"{trials} trials" if memory.evaluated >= trials else f"{loop.proposals} proposals")
    run.asks, run.proposals, run.unjudged = loop.asks, loop.proposals, len(queue)
    return run


def _judge(loop, pending) -> None:
    """Build (replayed), then evaluate (replayed) unless the build decides: the search's order of judgement."""
    built = loop.build([pending])[0]
    if not loop.judge_built(pending, built):
        loop.start_eval(pending, built)
        loop.finish_eval(pending, built, loop.poll_eval(None))


# -- statistics over seeds ----------------------------------------------------------------------------------


def _quantile(xs: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile; inf (a seed that never got there) sorts last and stays inf."""
    xs = sorted(xs)
    pos = (len(xs) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    if lo == hi:
        return xs[lo]
    if math.isinf(xs[hi]):
        return math.inf
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass(frozen=True)
class Spread:
    median: float
    p25: float
    p75: float
    reached: int   # seeds that got there within the run
    seeds: int

    @classmethod
    def of(cls, xs: Sequence[float | None]) -> "Spread":
        vals = [math.inf if x is None else float(x) for x in xs]
        return cls(_quantile(vals, 0.5), _quantile(vals, 0.25), _quantile(vals, 0.75),
                   sum(1 for x in xs if x is not None), len(vals))


@dataclass
class SamplerResult:
    sampler: str
    runs: list[Run]
    to_threshold: dict[float, Spread]   # trials to reach each fraction of the optimum
    best_at: dict[int, Spread]          # best found within n trials (the budget and --best-at), / optimum
    curve_trials: list[int]             # 1..max trials
    curve_median: list[float]           # median over seeds of best-so-far / optimum after n trials
    curve_p25: list[float]
    curve_p75: list[float]


@dataclass
class LandscapeResult:
    name: str
    header: dict
    optimum: float
    best_key: str
    n_rows: int                      # configs a search can build (exhaustive search needs this many trials)
    n_complete: int
    within: dict[float, int]         # configs within each fraction of the optimum
    random_order: dict[float, float]  # exact expected trials to each fraction for a uniformly random order
    runner_up: float | None           # the second-best config as a fraction of the optimum
    spread: tuple[float, float] | None  # (median, max) over complete rows of (p80 - p20) / median: timing noise
    default_key: str | None
    default_fraction: float | None   # the heuristic default (enqueued first) as a fraction of the optimum
    samplers: dict[str, SamplerResult]
    cap: int                         # trials a run could take at most


@dataclass
class Comparison:
    landscapes: list[LandscapeResult]
    seeds: int
    trials: int | None
    budget: int
    best_at: tuple[int, ...]            # trial counts whose best is reported (the budget among them)
    lag: int
    enqueue_default: bool
    thresholds: tuple[float, ...] = THRESHOLDS
    noise: bool = False                 # evaluations drawn from the recorded sessions (simulate)


def sampler_result(name: str, runs: list[Run], optimum: float, best_at: tuple[int, ...]) -> SamplerResult:
    to = {f: Spread.of([r.trials_to(f * optimum) for r in runs]) for f in THRESHOLDS}
    best = {n: Spread.of([(r.best_after(n) or 0.0) / optimum for r in runs]) for n in best_at}
    longest = max((len(r.values) for r in runs), default=0)
    med, p25, p75 = [], [], []
    for n in range(1, longest + 1):
        # A run that stopped early (target reached) keeps its best: the curve is what a longer run would show.
        fr = [(r.best_after(n) or 0.0) / optimum for r in runs]
        med.append(_quantile(fr, 0.5))
        p25.append(_quantile(fr, 0.25))
        p75.append(_quantile(fr, 0.75))
    return SamplerResult(name, runs, to, best, list(range(1, longest + 1)), med, p25, p75)


def expected_random_order(n: int, good: int, default_good: bool | None) -> float:
    """Expected trials until the first of `good` configs among `n`, visited in uniformly random order (as
    BruteForceSampler does): (n+1)/(good+1). With the default tried first (default_good not None), 1 if it is
    good, else 1 + n/(good+1) over the other n-1."""
    if default_good is None:
        return (n + 1) / (good + 1)
    return 1.0 if default_good else 1 + n / (good + 1)


def landscape_result(landscape: Landscape, runs_by_sampler: dict[str, list[Run]], best_at: tuple[int, ...],
                     cap: int | None = None, enqueue_default: bool = True) -> LandscapeResult:
    import space

    optimum = landscape.optimum
    done = landscape.complete_rows()
    default_key = default_fraction = None
    try:
        default = space.default_config(landscape.shape.problem, landscape.arch, landscape.families[0])
        default_key = default.key
        row = landscape.row(default)
        if row is not None and row.status == "complete":
            default_fraction = row.tflops / optimum
    except (KeyError, ValueError):
        pass
    within = {f: sum(1 for r in done if r.tflops >= f * optimum) for f in THRESHOLDS}
    ranked = sorted((r.tflops for r in done), reverse=True)
    spreads = sorted(r.spread_ms / r.median_ms for r in done if r.spread_ms is not None and r.median_ms)
    default_tried = enqueue_default and default_key in landscape.rows
    return LandscapeResult(
        name=landscape.name, header=landscape.header, optimum=optimum, best_key=landscape.best.config_key,
        n_rows=len(landscape.rows), n_complete=len(done), within=within,
        random_order={f: expected_random_order(len(landscape.rows), within[f],
                                               (default_fraction or 0) >= f if default_tried else None)
                      for f in THRESHOLDS},
        runner_up=ranked[1] / optimum if len(ranked) > 1 else None,
        spread=(_quantile(spreads, 0.5), spreads[-1]) if spreads else None,
        default_key=default_key, default_fraction=default_fraction,
        samplers={name: sampler_result(name, runs, optimum, best_at) for name, runs in runs_by_sampler.items()},
        cap=min(cap or len(landscape.rows), len(landscape.rows)),
    )


# -- the whole comparison -----------------------------------------------------------------------------------


def _cap(trials: int | None, budget: int, landscape: Landscape) -> int:
    return min(trials or BUDGET_MULTIPLE * budget, len(landscape.rows))


def _job(args) -> Run:
    path, sampler, seed, trials, lag, enqueue_default, budget, noise = args
    ls = _cached_landscape(path)
    cap = _cap(trials, budget, ls)
    return simulate(ls, sampler, seed, cap, lag, enqueue_default, max(THRESHOLDS), min(budget, cap), noise=noise)


_LANDSCAPES: dict = {}


def _cached_landscape(path) -> Landscape:

    if isinstance(path, Landscape):
        return path
    if path not in _LANDSCAPES:
        _LANDSCAPES[path] = landscape_mod.load(path)
    return _LANDSCAPES[path]


def compare(landscapes: Sequence, samplers: Sequence[str] = DEFAULT_SAMPLERS, seeds: int = DEFAULT_SEEDS,
            trials: int | None = None, budget: int | None = None, best_at: Sequence[int] = (), lag: int = DEFAULT_LAG,
            enqueue_default: bool = True, jobs: int = 1, log: Callable[[str], None] = print,
            noise: bool = False) -> Comparison:
    """Simulate every (landscape, sampler, seed); `landscapes` are paths (or loaded Landscapes).

    trials: the cap per run (default: BUDGET_MULTIPLE × budget, at most every config of the landscape);
    budget: the trial count whose best is reported (default: `autotune search`'s default --trials); runs go on
    at least this far. best_at: more trial counts (≤ budget) whose best is reported too. noise: evaluations
    draw from each landscape's recorded sessions, seeded by the run's seed (simulate).
    """

    for s in samplers:
        variant(s)
    if seeds < 1:
        raise ValueError(f"--seeds: expected a count ≥ 1, got {seeds}")
    if trials is not None and trials < 1:
        raise ValueError(f"--trials: expected a count ≥ 1, got {trials}")
    if lag < 0:
        raise ValueError(f"--lag: expected a count ≥ 0, got {lag}")
    budget = budget or DEFAULT_TRIALS
    if any(not 1 <= n <= budget for n in best_at):
        raise ValueError(f"--best-at: expected trial counts from 1 to --budget ({budget}), got {list(best_at)}")
    counts = tuple(sorted({*best_at, budget}))
    loaded = [_cached_landscape(p) for p in landscapes]
    for ls in loaded:
        ls.optimum  # noqa: B018  (raises, naming the file, when nothing completed)
    work = [(key, s, seed, trials, lag, enqueue_default, budget, noise) for key in landscapes for s in samplers
            for seed in range(seeds)]
    log(f"compare-samplers: {len(loaded)} landscape(s) × {len(samplers)} sampler(s) × {seeds} seed(s) = "
        f"{len(work)} simulated searches (lag {lag}, {'default enqueued' if enqueue_default else 'cold start'}"
        f"{', evaluations drawn from the recorded sessions' if noise else ''})")
    results: list[Run] = []
    if jobs > 1 and len(work) > 1:
        import multiprocessing

        with multiprocessing.get_context("spawn").Pool(jobs) as pool:
            for i, run in enumerate(pool.imap(_job, work, chunksize=1), 1):
                results.append(run)
                _progress(log, i, len(work), work[i - 1], run)
    else:
        for i, w in enumerate(work, 1):
            run = _job(w)
            results.append(run)
            _progress(log, i, len(work), w, run)
    out = []
    it = iter(results)
    for ls in loaded:
        by_sampler = {s: [next(it) for _ in range(seeds)] for s in samplers}
        out.append(landscape_result(ls, by_sampler, counts, _cap(trials, budget, ls), enqueue_default))
    return Comparison(out, seeds, trials, budget, counts, lag, enqueue_default, noise=noise)


def _progress(log, i: int, total: int, work, run: Run) -> None:
    path, sampler, seed = work[0], work[1], work[2]
    name = path.name if isinstance(path, Landscape) else str(path).rsplit("/", 1)[-1]
    log(f"  [{i}/{total}] {name} {sampler} seed {seed}: {len(run.values)} trials, {run.stop_reason}")


__all__ = ["Comparison", "DEFAULT_LAG", "DEFAULT_SAMPLERS", "LandscapeResult", "Run", "SamplerResult",
           "SamplerVariant", "Spread", "THRESHOLDS", "VARIANTS", "compare", "landscape_result", "sampler_result",
           "simulate", "variant"]
