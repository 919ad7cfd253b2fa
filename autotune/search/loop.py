"""The search, top to bottom: open the study → queue the first configs → ask / build / evaluate / tell →
re-time the top configs and store the winner. `run_search` reads in that order.

The trial loop (TrialLoop, driven by pipeline.Pipeline; ask/tell in batches, the three stages overlap):

    ask a batch of K new valid configs   (the sampler proposes in an in-memory shadow study: invalid and
                                          known configs are told there only; a new valid config is stored as
                                          a trial with its params, proposals.py. Queued configs are stored
                                          already: invalid ones are told PRUNED/invalid, known ones reuse)
    build the batch in the background    (the builder: parallel nvcc, cached)
    judge each built config              (compile error, spill policy, identical cubin → no GPU needed;
                                          else the evaluator, in its child process)
    → verdicts.tell (status, user attrs, constraint)

`trials` counts configs actually built in the study (every status but invalid), so a mostly invalid space does
not eat the budget; `max_asks` bounds the proposals so it cannot loop forever. At the end the top configs are
re-timed in one evaluator session next to the SDPA baselines, and the winner goes to the best-per-shape store.

Runs differ only in what is plugged in:

    one process     the Builder (nvcc) and the Evaluator (measure/child_process.py); the trials run here
    --workers N     the same, but the trials run in N worker processes (distributed.run_workers), each of them
                    `run_worker`: open the study, then the same trial loop; the launcher queues and re-times
    --replay FILE   ReplayBuilder and ReplayEvaluator answer from a recorded landscape (landscapes/replay.py),
                    the study lives in memory and nothing is stored (NullStore)

Tests plug in the real Builder with a test-double evaluator the same way (run_search's keyword arguments).
"""
from __future__ import annotations

import dataclasses
import functools
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import space
from space import Arch, Config, Shape

from ..build.builder import Builder, cubin_key, provenance
from ..build.spill_policy import SpillPolicy
from ..landscapes import landscape_file
from ..landscapes.replay import NullStore, ReplayBuilder, ReplayEvaluator, recorded_configs, replay_pacing
from ..landscapes.replay_noise import ReplayNoise
from ..measure import interrupts
from ..measure.child_process import Evaluator
from ..store import storage_url
from ..store.best_table import BestStore
from ..store.claims import Claims
from . import coordination as peers
from . import deaths
from . import distributed
from . import exhaustive
from . import retime as winner
from . import study as studies
from . import verdicts as trial_mod
from . import warm_start
from .options import (ASKS_PER_TRIAL, DEFAULT_EVAL_TIMEOUT, DEFAULT_TRIALS, TOP_N, WAIT_SECONDS, SearchInterrupted,
                      SearchOptions, SearchResult)
from . import storage_writes
from .pipeline import Pipeline
from .progress import ProgressPrinter
from .proposals import Proposer
from .sampling import NoSampler, SearchSpace, make_sampler, shadow_sampler
from .verdicts import Outcome


# -- the search, top to bottom ---------------------------------------------------------------------------------

def run_search(options: SearchOptions, *, builder=None, evaluator=None, log: Callable[[str], None] = print,
               store=None) -> SearchResult:
    """Run (or resume) the study described by `options`; returns what happened. See the module docstring.

    Ctrl-C or SIGTERM raises SearchInterrupted (a KeyboardInterrupt) carrying the result so far, after failing
    the trials in flight (SIGTERM: within interrupts.term_grace()). `options.workers > 1` runs that many worker
    processes on the study (distributed.py)."""
    options.check()
    studies.quiet_optuna()
    if options.replay is not None:
        options, builder, evaluator, store = plug_replay(options, builder, evaluator, store)
    trials = _trials_in_workers if options.workers > 1 else _trials_here
    with interrupts.deferred_interrupts():  # the launcher too: a scheduler's SIGTERM may reach it alone
        return _search(options, builder, evaluator, store, log, trials=trials)


def _search(options: SearchOptions, builder, evaluator, store, log: Callable[[str], None], trials) -> SearchResult:
    """Open the study, run its trials (`trials`: here, or in worker processes; each queues the first configs
    where it must), then re-time the top configs next to the baselines and store the winner."""
    started = time.monotonic()
    url = storage_url.prepare(storage_url.resolve_storage_url(options.storage))
    if options.workers > 1:
        distributed.refuse_sqlite(url, options.workers)
    session = open_session(options, url, builder=builder, evaluator=evaluator, log=log)
    options = plan_sweep(session, options, log)
    opened = time.monotonic()
    try:
        result = trials(session, options, store, log)
        result.wall_seconds = time.monotonic() - started
        if options.replay is not None:  # here, not in run_trials: --workers results are merged from the workers'
            result.replay = str(options.replay.path) if options.replay.path else options.replay.name
            noise = getattr(session.evaluator, "noise", None)
            if noise is not None:
                result.replay += f" ({noise.describe()})"
            result.simulated = replay_pacing(session.builder, session.evaluator)
        trials_seconds = time.monotonic() - opened
        if result.interrupted:
            raise SearchInterrupted(result)
        finale_started = time.monotonic()
        finale(result, session, options, store or url, log)
        result.wall_seconds = time.monotonic() - started
        # Where the wall time went, coarsely (the summary splits the trials further).
        log(f"time: opening the study {opened - started:.1f} s, trials {trials_seconds:.1f} s, re-timing and storing "
            f"{time.monotonic() - finale_started:.1f} s; {result.wall_seconds:.1f} s in all")
        return result
    finally:
        session.close()


def _trials_here(session: Session, options: SearchOptions, store, log: Callable[[str], None]) -> SearchResult:
    """One process: the trial loop here, after queuing the first configs."""
    return run_trials(session, options, log, queue=lambda memory: queue_first(session, memory, options, store, log))


def _trials_in_workers(session: Session, options: SearchOptions, store, log: Callable[[str], None]) -> SearchResult:
    """--workers N: queue the first configs (so that workers do not race to), then N worker processes run the
    trial loop (`run_worker`) on the study until its budget is met; their figures merged into one result."""
    # The launcher's evaluator stays up, idle, for the finale's re-timing: an idle CUDA context costs the workers
    # nothing, and starting a fresh one at the end cost the launcher seconds (torch import, context).
    started = time.monotonic()
    queue_first(session, studies.StudyMemory.load(session.study, options.shape.problem), options, store, log)
    Claims(session.url).close()  # create the table once, before the workers race to
    devices = distributed.assign(options.workers, distributed.visible_devices(options.gpus, session.device_count))
    per_host = max(1, (os.cpu_count() or 1) // options.workers)
    worker_options = dataclasses.replace(options, workers=1, jobs=options.jobs or per_host, study_name=session.name)
    log(f"study {session.name}: {options.workers} workers on GPU(s) {', '.join(sorted(set(devices)))}, "
        f"{worker_options.jobs} nvcc job(s) each; storage {storage_url.describe(session.url)}")
    summaries, died, interrupted = distributed.run_workers(run_worker, worker_options, devices, log,
                                                           distributed.shared_device_info(session.device_info))
    log(f"workers ended after {time.monotonic() - started:.1f} s (queueing included)")
    if died and not interrupted:
        distributed.sweep_stale(session.study, options, log)
    result = distributed.merge(session, options, summaries, died, interrupted)
    errors = [payload for kind, payload in summaries.values() if kind == "error"]
    if not interrupted and errors and len(errors) == len(devices):  # every worker failed: nothing ran, say why
        exc, text = errors[0]
        raise exc if exc is not None else RuntimeError(f"every worker failed; the first said:\n{text}")
    return result


def run_worker(options: SearchOptions, role: distributed.WorkerRole, log: Callable[[str], None]) -> SearchResult:
    """One of the --workers processes (distributed.run_workers starts it): open the study the launcher created
    and queued, run the trial loop until the study's budget is met; the launcher re-times and stores."""
    started = time.monotonic()
    studies.quiet_optuna()  # again: a worker is a fresh process
    builder = evaluator = None
    if options.replay is not None:
        options, builder, evaluator, _ = plug_replay(options, None, None, None)
    url = storage_url.prepare(storage_url.resolve_storage_url(options.storage))
    session = open_session(options, url, builder=builder, evaluator=evaluator, log=log, worker=role)
    try:
        result = run_trials(session, options, log, worker=role)
        result.wall_seconds = time.monotonic() - started
        if result.interrupted:
            raise SearchInterrupted(result)
        return result
    finally:
        session.close()


# -- opening the study -----------------------------------------------------------------------------------------

@dataclass
class Session:
    """What every search process sets up before it asks (a single search, a worker, the --workers launcher)."""

    url: str
    evaluator: object
    own_evaluator: bool
    gpu_name: str
    arch: Arch
    device_count: int | None
    builder: object
    provenance: dict
    search_space: SearchSpace
    name: str
    storage: object  # optuna RDBStorage (coordination.make_storage)
    study: object
    device_info: dict = field(default_factory=dict)  # the evaluator's answer (or the launcher's, in a worker)
    lock: object = None  # coordination.StudyLock of a SQLite study, held until the search ends
    sampler: Callable = None  # built → the shadow study's sampler (sampling.make_sampler, seeded for this process)
    sweep: tuple = ()  # every valid config, in queue order, when the search sweeps them all (plan_sweep)

    def close(self) -> None:
        if self.own_evaluator:
            self.evaluator.close()
        if self.lock is not None:
            self.lock.release()


def open_session(options: SearchOptions, url: str, *, builder=None, evaluator=None, log=print,
                 worker=None) -> Session:
    """The evaluator's device, the arch, the builder, and the study (created or loaded, attrs checked)."""
    own_evaluator = evaluator is None
    lock = None
    evaluator = evaluator or Evaluator(options.evaluator, timeout=options.eval_timeout)
    try:
        handed_down = worker.device_info if worker is not None else None
        if handed_down and hasattr(evaluator, "prestart"):
            # The launcher asked a GPU of the same model: start our evaluator in the background, so that its
            # torch import and CUDA context overlap the first builds instead of preceding them.
            info = dict(handed_down)
            evaluator.prestart()
        else:
            info = evaluator.device_info()
        gpu_name = str(info.get("gpu_name") or "unknown-gpu")
        arch = choose_arch(options.arch, info.get("arch"))
        if builder is None:
            builder = Builder(arch, cache_dir=options.cache_dir, jobs=options.jobs, extra_flags=options.nvcc_flags)
        # A replay searches what its landscape recorded (axes added since: their default value only)
        within = recorded_configs(options.replay) if options.replay is not None else None
        search_space = SearchSpace(options.shape.problem, arch, options.families, within=within)
        prov = provenance(builder, search_space.families)
        name = options.study_name or studies.default_study_name(gpu_name, options.shape, options.families)
        if options.replay is not None and not options.study_name:
            # Named after the landscape's file, not the shape: never the name of the real study recorded on that
            # GPU, nor that of another recording of the same shape replayed into the same storage.
            ls, families = options.replay, options.families or options.replay.families
            name = f"replay-{ls.name}" + ("" if set(families) == set(ls.families) else "-" + "+".join(families))
        seed = options.seed
        # SQLite: refuse a second search process on this study before touching it (coordination.StudyLock)
        lock = peers.lock_study(url, name) if worker is None else None
        storage = peers.make_storage(url, options.heartbeat, options.grace)
        make_sampler(options.sampler, seed)  # an unknown or unavailable --sampler fails here, before any trial
        # The stored study never samples: proposals come from the shadow study (proposals.py).
        study = studies.open_study(name, storage, NoSampler(), options.shape, arch, gpu_name, prov, log=log)
        if seed is not None and (study.trials or worker is not None):
            # A resumed run must not replay the first run's random draws (they would all be duplicates), nor
            # may workers started together draw the same sequence.
            seed += len(study.trials) + (7919 * worker.index if worker is not None else 0)
        sampler = functools.partial(shadow_sampler, options.sampler, seed)
    except BaseException:
        if own_evaluator:
            evaluator.close()
        if lock is not None:
            lock.release()
        raise
    count = info.get("device_count")
    return Session(url, evaluator, own_evaluator, gpu_name, arch, count if isinstance(count, int) else None, builder,
                   prov, search_space, name, storage, study, info, lock, sampler)


def plan_sweep(session: Session, options: SearchOptions, log) -> SearchOptions:
    """When the searched families have no more valid configs than --trials, sweep them all (exhaustive.py): the
    budget becomes their number, the proposals' sampler a random one (every value is queued), and queue_first
    queues them."""
    if not options.sweep:
        return options
    decision = exhaustive.decide(options.shape.problem, session.arch, session.search_space.families, options.trials,
                                 session.search_space.domains)
    log(decision.message)
    if not decision.sweep:
        return options
    session.sweep = tuple(exhaustive.sweep_order(decision.configs, options.shape.problem, session.arch))
    # The stored study keeps its NoSampler: queued configs carry every param, and its tells stay one transaction
    # each (storage_writes); the shadow study's sampler is the one made "random" here, with nothing left to learn.
    return dataclasses.replace(options, trials=len(decision.configs), sampler="random")


def queue_first(session: Session, memory, options: SearchOptions, store, log) -> None:
    """A fresh study's first trials: the best configs of tuned neighbour shapes (--warm-start), the heuristic
    default of each family, then --enqueue; when sweeping, every other valid config after them."""
    warm: list[Config] = []
    if options.warm_start and not session.study.trials:
        warm = warm_start.neighbour_configs(store or session.url, session.storage, options.shape, session.gpu_name,
                                           session.arch, options.warm_start, log=log)
    enqueue_first(session.study, session.search_space, memory, options, session.arch, warm)
    if session.sweep:
        started = time.monotonic()
        n = exhaustive.queue_sweep(session.study, session.search_space, session.sweep, memory.by_config)
        log(f"sweep: queued {n} config(s) in {time.monotonic() - started:.1f} s "
            f"({len(session.sweep) - n} judged or queued already)")


def enqueue_first(study, search_space: SearchSpace, memory, options: SearchOptions, arch: Arch,
             warm: list[Config] = ()) -> None:
    """A fresh study starts with `warm` (neighbours' best configs), the heuristic default of each family (a
    known-good baseline for the sampler) and any configs the caller asked for; configs the study already judged
    are not queued again."""
    wanted = list(options.enqueue)
    if not study.trials:
        for family in search_space.families:
            try:
                wanted.insert(0, space.default_config(options.shape.problem, arch, family))
            except (KeyError, ValueError):
                pass
    wanted = list(warm) + wanted
    seen = set(memory.by_config)
    for config in wanted:
        if config.key in seen:
            continue
        seen.add(config.key)
        try:
            study.enqueue_trial(search_space.params(config), skip_if_exists=True)
        except ValueError:
            pass  # outside the searched domain (so certainly invalid): nothing to learn from queuing it


# -- the trial loop --------------------------------------------------------------------------------------------

def run_trials(session: Session, options: SearchOptions, log: Callable[[str], None], *, queue=None,
               worker: distributed.WorkerRole | None = None) -> SearchResult:
    """The trial loop of one process on an open study: ask / build / evaluate / tell until the budget (the
    study's: every process's trials count), --timeout or Ctrl-C. `queue(memory)` queues the first configs once
    this process has joined the study; `worker` makes it one of several (its GPU lock, no queuing)."""
    study, builder, evaluator = session.study, session.builder, session.evaluator
    coordination = peers.for_storage(session.storage, session.url, log)
    try:
        memory = studies.StudyMemory.load(study, options.shape.problem)
        coordination.start(study, memory, session.search_space)
        if queue is not None:
            queue(memory)

        target = options.trials
        remaining = max(0, target - memory.evaluated)
        max_asks = options.max_asks or ASKS_PER_TRIAL * remaining + 200
        # --timeout bounds the trial loop, from here: worker start-up and study loading are not trials
        deadline = time.monotonic() + options.timeout if options.timeout else None
        progress = ProgressPrinter(target, log=log, best=studies.top_trials(study, 1))
        loop = TrialLoop(study, session.search_space, builder, evaluator, options.shape, options.spill_policy,
                         memory, progress, target, max_asks, deadline, coordination, worker.lock if worker else None,
                         sampler=session.sampler)
        batch_size = options.ahead or max(2, getattr(builder, "jobs", 2))
        log(f"study {session.name}: {memory.evaluated} of {target} trials already evaluated; batches of "
            f"{batch_size}; storage {storage_url.describe(session.url)}")
        stop_reason, pipeline, interrupted = _run_pipeline(loop, options, batch_size)

        result = SearchResult(
            study_name=session.name, storage=storage_url.describe(session.url), gpu_name=session.gpu_name,
            arch=session.arch, shape=options.shape, target=target, evaluated=memory.evaluated,
            this_run=loop.this_run, counts=studies.status_counts(study), asks=loop.asks, stop_reason=stop_reason,
            top=[], idle_seconds=pipeline.idle_for_builds, idle_other_seconds=pipeline.idle_other,
            first_eval_after=pipeline.first_eval_after, build_seconds=pipeline.build_seconds,
            eval_seconds=loop.eval_seconds, ask_seconds=loop.ask_seconds, tell_seconds=loop.tell_seconds,
            loop_seconds=pipeline.seconds, proposals=loop.proposals, proposals_invalid=loop.proposer.invalid,
            proposals_repeated=loop.proposer.repeated, interrupted=interrupted, batch_sizes=pipeline.batch_sizes,
            in_flight_at_ask=pipeline.in_flight_at_ask,
        )

        if interrupted:
            result.top = studies.top_trials(study, TOP_N)
        return result
    finally:
        coordination.close()


def _run_pipeline(loop: TrialLoop, options: SearchOptions, batch_size: int) -> tuple[str, Pipeline, bool]:
    """Run the ask → build → evaluate pipeline; returns (why it stopped, the Pipeline with its timings,
    whether Ctrl-C stopped it)."""
    pipeline = Pipeline(loop, batch_size)
    try:
        leftovers = pipeline.run()
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM (interrupts.py)
        why = interrupts.cause()
        n = abandon_through_interrupts(loop, f"interrupted ({why}) before it was evaluated")
        return (f"interrupted ({why}): {n} trial(s) in flight marked failed; run the same command again to "
                "resume", pipeline, True)
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
        reason = (f"stopped after {loop.proposals} proposals without enough new valid configs (the valid space "
                  "may be exhausted, or the sampler keeps proposing invalid or repeated ones)")
    return reason, pipeline, False


def abandon_through_interrupts(loop: TrialLoop, reason: str) -> int:
    """loop.abandon(reason), finished even when another Ctrl-C lands before it starts (a launcher forwards
    SIGINT to workers that the terminal signalled too); abandon itself runs as one critical section."""
    before = loop.this_run["cancelled"]
    while True:
        try:
            loop.abandon(reason)
            return loop.this_run["cancelled"] - before
        except KeyboardInterrupt:
            if not loop.in_flight:  # raised as abandon's critical section ended: the work is done
                return loop.this_run["cancelled"] - before


@dataclass
class _Pending:
    """An asked trial with a new valid config, on its way through build and evaluation."""

    trial: object
    config: Config
    shadow: object = None  # its twin in the shadow study (proposals.py)
    followers: list = field(default_factory=list)  # later stored asks of the same config: told when this one is
    shadow_followers: list = field(default_factory=list)  # later proposals of it: told to the shadow likewise


class TrialLoop:
    """The search's stages for pipeline.Pipeline: Optuna asks and tells, builds, evaluations."""

    def __init__(self, study, search_space: SearchSpace, builder, evaluator, shape: Shape, policy: SpillPolicy,
                 memory: studies.StudyMemory, progress: ProgressPrinter, target: int, max_asks: int,
                 deadline: float | None, coordination=None, gpu_lock=None, *, sampler: Callable | None = None):
        """`sampler(built)`: the shadow study's sampler (sampling.make_sampler's `built`; default: the search's
        TPE, unseeded); `max_asks` bounds the proposals (the sampler's and the stored queue's)."""
        sampler = sampler or functools.partial(shadow_sampler, "tpe", None)
        self.study, self.space, self.builder, self.evaluator = study, search_space, builder, evaluator
        self.shape, self.problem, self.arch = shape, shape.problem, search_space.arch
        self.policy, self.memory, self.progress = policy, memory, progress
        self.target, self.max_asks, self.deadline = target, max_asks, deadline
        self.in_flight: dict[str, _Pending] = {}  # asked, new, valid configs not told yet
        self.proposer = Proposer(sampler, search_space, self.problem, max_asks)
        self.proposer.mirror(study.get_trials(deepcopy=False))  # a resumed study: the sampler knows its trials
        self._mirrored_seen = len(memory.seen)
        self._shown = (0, 0)  # proposals settled in the shadow that the progress lines have counted
        self._queue_may_hold = True  # the stored study's queue (enqueued configs, retries), until found empty
        self.asks = 0            # trials asked in the stored study (queued ones, and proposals worth building)
        self.ask_seconds = 0.0   # in ask(): the sampler's proposals and the stored trial
        self.tell_seconds = 0.0  # telling outcomes (stored study and shadow)
        self.this_run: Counter = Counter()
        self.eval_seconds = 0.0
        self._eval_started = 0.0
        # The other processes on this study (coordination.Solo for SQLite: nobody), and this GPU's evaluation
        # turn when several workers share it (distributed.GpuLock).
        self.peers = coordination or peers.Solo(None)
        self.gpu_lock = gpu_lock

    # -- asking ---------------------------------------------------------------------------------------------

    def time_left(self) -> bool:
        return self.deadline is None or time.monotonic() < self.deadline

    def can_ask(self) -> bool:
        self.peers.refresh()  # throttled; other processes' results and running configs count here too
        if len(self.memory.seen) != self._mirrored_seen:  # other processes told trials: the sampler learns them
            self._mirrored_seen = len(self.memory.seen)
            self.proposer.mirror(self.study.get_trials(deepcopy=False))
        return self._wanted() > 0 and self.proposer.can_propose() and self.time_left()

    def _wanted(self) -> int:
        """How many more configs the budget (--trials, the study's) allows, by this process's view of the others."""
        return self.target - self.memory.evaluated - self.peers.running_elsewhere - len(self.in_flight)

    @property
    def exhausted(self) -> bool:
        """The sampler has proposed every point of the space (BruteForceSampler)."""
        return self.proposer.exhausted

    @property
    def proposals(self) -> int:
        return self.proposer.proposals

    def ask(self) -> _Pending | None:
        """One ask: a new valid config to build, or None when the ask was settled on the spot.

        The stored study's queue first (enqueued configs, retries of dead trials: stored already, judged as they
        come); else the sampler, in the shadow study (proposals.py), until it names a new valid config, which is
        then stored as a trial with its params in one transaction."""
        started = time.monotonic()
        try:
            # Critical: once the trial exists in the storage, a Ctrl-C must find it told or in flight (interrupts.py).
            with interrupts.critical():
                queued = self._from_queue()
                if queued is None:
                    # A new config adds to the study's budget; can_ask counted the other processes' trials at its
                    # throttled refresh, which may predate the last of them starting: count again, fresh, so the
                    # budget is overshot only by processes asking at the very same moment (docs/distributed.md).
                    # That refresh may also re-queue a dead process's trial (fail_stale_trials): its retry comes
                    # before any new config, else the budget fills with sampled ones and the retry is stranded
                    # WAITING when the search stops.
                    self.peers.refresh(force=True)
                    queued = self._from_queue()
                if queued is not None:
                    t, config = queued
                    shadow = self.proposer.follow(t.params)
                else:
                    if self._wanted() <= 0:
                        return None
                    proposal = self.proposer.propose(self.memory.by_config, self.in_flight)
                    if proposal is None:
                        return None
                    shadow, config = proposal
                    frozen = self.proposer.shadow._storage.get_trial(shadow._trial_id)
                    t = storage_writes.create_trial(self.study, frozen.params, frozen.distributions)
                self.peers.held(t)  # first heartbeat (shared storages)
                self.asks += 1
                return self._place(t, config, shadow)
        finally:
            self.ask_seconds += time.monotonic() - started

    def _from_queue(self):
        """(trial, config) popped from the stored study's queue, or None when it is empty."""
        if (not self._queue_may_hold and not self.peers.waiting) or not self.proposer.can_propose():
            return None
        trial_id = self.study._pop_waiting_trial_id()  # Optuna's own pop: safe against other processes
        if trial_id is None:
            self._queue_may_hold = False  # only other processes (shared storages: peers.waiting) add to it now
            return None
        import optuna

        t = optuna.Trial(self.study, trial_id)
        self.proposer.proposals += 1  # a proposal too: the cap bounds queued configs and the sampler's together
        return t, self.space.suggest(t)  # its params are fixed: no sampler is asked

    def _place(self, t, config: Config, shadow) -> _Pending | None:
        violations = space.violations(config, self.problem, self.arch)
        if violations:  # never reaches nvcc (only a queued config can be invalid here)
            self._tell(t, trial_mod.invalid(config, self.problem, violations), config, remember=False, shadow=shadow)
            return None
        earlier = self.memory.by_config.get(config.key)
        if earlier is not None:  # judged before in this study: reuse, do not build or run again
            self._tell(t, trial_mod.reused(earlier.outcome, trial_mod.DUPLICATE_OF, earlier.number, config,
                                           self.problem), config, remember=False, shadow=shadow)
            return None
        pending = self.in_flight.get(config.key)
        if pending is not None:  # asked again while on its way: told together with the first ask
            pending.followers.append(t)
            pending.shadow_followers.append(shadow)
            return None
        verdict = self.peers.claim(t, config)  # shared storages: is another process on it, or done with it?
        if verdict.kind == "judged":
            self._tell(t, trial_mod.reused(verdict.outcome, trial_mod.DUPLICATE_OF, verdict.number, config,
                                           self.problem), config, remember=False, shadow=shadow)
            return None
        if verdict.kind == "running":
            trial_mod.defer(self.study, t, config, verdict.number)
            self.proposer.abandon(shadow)
            self.peers.released(t)
            self.this_run["deferred"] += 1
            return None
        pending = _Pending(t, config, shadow)
        self.in_flight[config.key] = pending
        return pending

    # -- building and judging -------------------------------------------------------------------------------

    def build(self, items: list[_Pending]) -> list:
        return self.builder.build([(p.config, self.problem) for p in items])

    def judge_built(self, pending: _Pending, build) -> bool:
        verdict = trial_mod.after_build(build, self.policy)
        if verdict is None:
            key = cubin_key(build.cubin_hash, pending.config, self.problem)
            twin = self.memory.by_cubin.get(key) if key else None
            if twin is None:
                return False  # evaluate it
            verdict = trial_mod.reused(twin.outcome, trial_mod.SAME_CUBIN_AS, twin.number, pending.config,
                                       self.problem)
        self.finish(pending, verdict)
        return True

    def start_eval(self, pending: _Pending, build) -> None:
        if self.gpu_lock is not None:
            self.gpu_lock.acquire()  # another worker may be timing on this GPU: wait for its turn to end
        deaths.mark_evaluating(self.study, pending.trial)  # a death from here on may be the config's doing
        self._eval_started = time.monotonic()
        self.evaluator.submit(build, self.shape)

    def poll_eval(self, block_for: float | None):
        return self.evaluator.wait(block_for)

    def finish_eval(self, pending: _Pending, build, ev) -> None:
        if self.gpu_lock is not None:
            self.gpu_lock.release()
        self.eval_seconds += time.monotonic() - self._eval_started
        self.finish(pending, trial_mod.after_eval(build, ev))

    def should_stop(self) -> bool:
        return not self.time_left()

    def wait_for_others(self) -> bool:
        """Nothing is left to ask, build or run here. On a shared storage, other processes' running trials may
        still finish (the budget is met) or die (their retries come back to be asked): wait a little and say
        True while that can happen; False ends the loop."""
        if self.memory.evaluated >= self.target or not self.proposer.can_propose() or not self.time_left():
            return False
        self.peers.refresh(force=True)
        if not self.peers.others_active():
            return False
        time.sleep(WAIT_SECONDS)
        return True

    # -- telling --------------------------------------------------------------------------------------------

    def finish(self, pending: _Pending, outcome: Outcome) -> None:
        with interrupts.critical():  # told, then out of in_flight: an interrupt never finds it half-way
            # One write first: a kill during the tell's writes then costs no measurement (deaths.py re-tells it).
            deaths.store_measurement(self.study, pending.trial, outcome)
            self._tell(pending.trial, outcome, pending.config, remember=True, shadow=pending.shadow)
            original = self.memory.by_config[pending.config.key].number
            copy = trial_mod.reused(outcome, trial_mod.DUPLICATE_OF, original, pending.config, self.problem)
            for follower in pending.followers:
                self._tell(follower, copy, pending.config, remember=False)
            for s in pending.shadow_followers:
                self.proposer.tell(s, copy, pending.config)
            self.in_flight.pop(pending.config.key, None)

    def abandon(self, reason: str) -> int:
        """FAIL every trial asked but not told (they do not count, and their configs may come again)."""
        n = 0
        with interrupts.critical():
            if self.in_flight:
                peers.reset_connections(getattr(self.peers, "rdb", None))  # an interrupt may have cut a query short
            if self.gpu_lock is not None:
                self.gpu_lock.release()
            for pending in list(self.in_flight.values()):
                for t in [pending.trial, *pending.followers]:
                    trial_mod.abandon(self.study, t, reason)
                    self.peers.released(t)
                    n += 1
                for s in [pending.shadow, *pending.shadow_followers]:
                    self.proposer.abandon(s)
            self.in_flight.clear()
            self.this_run["cancelled"] += n
        return n

    def _tell(self, t, outcome: Outcome, config: Config, remember: bool, shadow=None) -> None:
        started = time.monotonic()
        if trial_mod.tell(self.study, t, outcome):
            self.proposer.exhausted = True
        self.proposer.mirrored.add(t.number)  # the shadow learns it from its twin, told here
        if shadow is not None:
            self.proposer.tell(shadow, outcome, config)
        self.peers.released(t)
        self.this_run[outcome.status] += 1
        if remember:
            self.memory.remember(t.number, config, self.problem, outcome)
        self.tell_seconds += time.monotonic() - started
        shown, self._shown = self._shown, (self.proposer.invalid, self.proposer.repeated)
        self.progress.skipped(self._shown[0] - shown[0], self._shown[1] - shown[1])
        self.progress.told(t.number, config, outcome, self.memory.evaluated)


# -- re-timing and storing -------------------------------------------------------------------------------------

def finale(result: SearchResult, session: Session, options: SearchOptions, store,
           log: Callable[[str], None]) -> None:
    """Re-time the finalists interleaved, in rounds, next to the baselines (one worker session; retime.py
    chooses them, adds rounds while the leader is not separated, and keeps the fastest median), record both on the
    study, and store the winner. `store` is a BestStore or the
    URL to open one at."""
    study, builder, evaluator = session.study, session.builder, session.evaluator
    top = studies.top_trials(study, max(TOP_N, options.retime_top, options.retime_cap))
    result.top = top[:TOP_N]
    result.retimed, result.baselines, result.notes = winner.retime_and_baselines(
        winner.finalists(top, options.retime_top, options.retime_within, options.retime_cap), builder, evaluator,
        options.shape, rounds=options.retime_rounds, max_rounds=options.retime_max_rounds, arch=session.arch, log=log)
    verdict = winner.decide(result.retimed, winner.round_budget(options.retime_rounds, options.retime_max_rounds))
    if result.retimed:
        result.notes.append(verdict.describe())
        log(verdict.describe())
    study.set_user_attr("baselines", result.baselines)
    study.set_user_attr("retimed", [{**r.as_attr(), "chosen": r is verdict.chosen,
                                     "tied": any(r is x for x in verdict.tied)} for r in result.retimed])
    best = verdict.chosen
    if best is None:
        return
    own = isinstance(store, str)
    store = BestStore(store) if own else store
    try:
        # the stored row's source hash is that of the winner's family, not of every family searched
        row_provenance = {**session.provenance, **provenance(builder, (best.config.family,))}
        result.record = winner.store_best(store, best, options.shape, result.gpu_name, result.arch,
                                          result.study_name, row_provenance)
    finally:
        if own:
            store.close()


# -- plugs -----------------------------------------------------------------------------------------------------

def plug_replay(options: SearchOptions, builder, evaluator, store):
    """Answer builds and evaluations from the landscape (landscapes/replay.py). The shape must be the recorded one;
    families default to the recorded ones. Studies go to an in-memory database unless --storage names one (a
    replay must not mix with real studies, $AUTOTUNE_STORAGE included), and no best config is stored: nothing
    new was measured. `replay_noise` (a seed) draws each evaluation from the landscape's sessions."""
    ls = options.replay
    if not isinstance(ls, landscape_file.Landscape):
        ls = landscape_file.load(ls)
    if options.shape != ls.shape:
        raise ValueError(f"--replay {ls.path or ls.name}: recorded for shape {ls.shape.key}, not {options.shape.key}")
    if options.workers > 1 and not options.storage:
        # The launcher and its workers are separate processes: they meet only in a server database.
        raise ValueError(f"--replay with --workers {options.workers}: the workers need a study they can share; pass "
                         "--storage postgresql://USER@HOST/DB (a replay's own storage is in memory, one process's), "
                         "or leave --workers out")
    families = options.families or ls.families
    outside = [f for f in families if f not in ls.families]
    if outside:
        raise ValueError(f"--family {outside}: the landscape covers only {list(ls.families)}")
    options = dataclasses.replace(options, replay=ls, families=tuple(families),
                                  storage=options.storage or "sqlite:///:memory:")
    noise = ReplayNoise(ls, options.replay_noise) if options.replay_noise is not None else None
    return (options, builder or ReplayBuilder(ls, jobs=options.jobs or 1), evaluator or ReplayEvaluator(ls, noise),
            store if store is not None else NullStore())


def choose_arch(requested: str | None, device_arch: str | None) -> Arch:
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


__all__ = ["DEFAULT_EVAL_TIMEOUT", "DEFAULT_TRIALS", "Session", "SearchInterrupted", "SearchOptions", "SearchResult",
           "TrialLoop", "abandon_through_interrupts", "choose_arch", "enqueue_first", "finale", "open_session",
           "plan_sweep", "plug_replay", "queue_first", "run_search", "run_trials", "run_worker"]
