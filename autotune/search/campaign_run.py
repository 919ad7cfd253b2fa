"""Running a campaign: its shapes in turn, on one evaluator and one builder, within a time budget, resumable.

    first, passes.repair: shipped rows of earlier second passes that the table kept out (campaign_passes.py)
    for each shape (campaign.neighbour_order puts tuned neighbours first):
        finished in an earlier run?   → skip it (its study says so: the `campaign` study attr)
        too little budget left?       → stop cleanly; the same command continues with this shape
        search it (loop.run_search)   → a fresh study is warm-started from its tuned neighbours; a study that an
                                        earlier run left half-way (cut by the budget, or the process killed)
                                        resumes toward its trials: trials already told stay, trials the killed
                                        run left RUNNING are failed and their configs asked again
        record it on the study        → seconds (summed over runs), evaluated trials, finished or not
        one progress line             → shape, best TFLOPS, trials, seconds, shapes done/total, ETA
        after_shape()                 → e.g. snapshot the SQLite storage, so a run killed later keeps this shape
    then the second pass (campaign_passes.py): the winners above were held, not stored; every finished shape's
    finalists are re-timed in a fresh evaluator process and the config best across both passes is stored

What is shared by every shape, so that a campaign pays once for it:
- **one evaluator** (measure/child_process.py): one child process, one torch import and CUDA context for the
  whole campaign instead of one per shape (a fresh one after a crash, as in a single search);
- **one builder** (build/builder.py, on one kernel cache): a binary depends on the config and the compile-time
  space.Problem (dtype, head_dim, causal), not on seqlen, batch or heads, so the shapes of one group share every
  cubin; `SharedBuilder` hands back a binary built earlier in the campaign without asking the builder again.

The budget (`budget_s`) bounds the whole run: a shape starts only when `reserve_s` plus `MIN_TRIAL_LOOP_S` are
left, and its trial loop gets `--timeout` = what is left minus `reserve_s`, which keeps time for its re-timing,
baselines and storing (the finale) and for the caller to copy the storage out. A shape cut that way still re-times
and stores its best so far, and is not marked finished: the next run resumes its study.
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Callable

from ..build.builder import Builder
from ..measure.child_process import Evaluator
from ..store import storage_url
from . import campaign_passes as passes
from . import loop as search_mod
from . import study as studies
from . import verdicts
from .progress import format_result

RECORD_ATTR = "campaign"  # study user attr: {"finished", "seconds", "runs", "evaluated"}
DEFAULT_RESERVE_S = 20.0  # kept free after a shape's trial loop: re-timing 3 configs, 3-4 peers, storing
MIN_TRIAL_LOOP_S = 10.0   # a shape is not started with less trial-loop time than this (about 15 evaluations)


# -- what every shape shares -------------------------------------------------------------------------------------

class SharedBuilder:
    """The campaign's builder: each (config, problem) is asked of the real builder once; later shapes get the
    same BuildResult back. Failures that say nothing about the sources (ninja crashing) are not kept: a
    BuildError propagates as from the real builder."""

    def __init__(self, real):
        self.real = real
        self.results: dict[tuple, object] = {}

    def __getattr__(self, name):  # arch, jobs, kernels_dir, nvcc_version, sources_digest, ... (provenance)
        return getattr(self.real, name)

    def build(self, items, progress=None):
        wanted = [(c, p) for c, p in items if (c.key, p) not in self.results]
        unique = list({(c.key, p): (c, p) for c, p in wanted}.values())
        if unique:
            for (config, problem), result in zip(unique, self.real.build(unique)):
                self.results[(config.key, problem)] = result
        return [self.results[(c.key, p)] for c, p in items]

    def build_one(self, config, problem):
        return self.build([(config, problem)])[0]


@dataclass
class Plugs:
    """The evaluator and builder every shape's search is given (loop.run_search's keyword arguments)."""

    evaluator: object
    builder: object
    gpu_name: str
    own: bool = True

    @classmethod
    def open(cls, options) -> "Plugs":
        """One Evaluator (options.evaluator, eval_timeout) and one Builder for options' arch (default: the
        evaluator's GPU), cache, jobs and nvcc flags."""
        evaluator = Evaluator(options.evaluator, timeout=options.eval_timeout)
        try:
            info = evaluator.device_info()
            arch = search_mod.choose_arch(options.arch, info.get("arch"))
            builder = Builder(arch, cache_dir=options.cache_dir, jobs=options.jobs, extra_flags=options.nvcc_flags)
        except BaseException:
            evaluator.close()
            raise
        return cls(evaluator, SharedBuilder(builder), str(info.get("gpu_name") or "unknown-gpu"))

    def close(self) -> None:
        if self.own:
            self.evaluator.close()

    def another_process(self) -> bool:
        """Replace the evaluator by a fresh one (another child process) for the second pass; False when it is
        not ours to replace or not a child-process Evaluator (a test's stand-in): the same one is used."""
        if not self.own or not isinstance(self.evaluator, Evaluator):
            return False
        spec, timeout = self.evaluator.spec, self.evaluator.timeout
        self.evaluator.close()
        self.evaluator = Evaluator(spec, timeout=timeout)
        return True


SHARED_FIELDS = ("evaluator", "eval_timeout", "arch", "cache_dir", "jobs", "nvcc_flags")


def check_shareable(plans: list) -> None:
    """Every shape runs on the same plugs, so the options that make them must agree across the campaign."""
    for name in SHARED_FIELDS:
        values = {repr(getattr(p, name)) for p in plans}
        if len(values) > 1:
            raise ValueError(f"campaign: `{name}` differs between shapes ({', '.join(sorted(values))}); every shape "
                             "runs on one evaluator and one builder, so give it once (command line or defaults)")


# -- what the storage says about each shape ----------------------------------------------------------------------

def study_name(options, gpu_name: str) -> str:
    return options.study_name or studies.default_study_name(gpu_name, options.shape, options.families)


def load_study(options, gpu_name: str):
    """The shape's study, or None when it was never started."""
    import optuna

    try:
        return optuna.load_study(study_name=study_name(options, gpu_name),
                                 storage=storage_url.resolve_storage_url(options.storage))
    except KeyError:
        return None


def record_of(study) -> dict:
    return dict(study.user_attrs.get(RECORD_ATTR) or {}) if study is not None else {}


def finished(result, cut_by_budget: bool) -> bool:
    """The search ended for a reason of its own (its trials reached, the space exhausted, the asks spent, the
    file's own --timeout), not because Ctrl-C or the campaign's budget cut its trial loop: it needs no more runs."""
    if result.interrupted:
        return False
    return result.evaluated >= result.target or not (cut_by_budget and result.stop_reason.startswith("--timeout"))


def add_record(options, gpu_name: str, result, seconds: float, done: bool) -> dict:
    """Add this run's seconds to the study's record and say whether the shape is finished."""
    study = load_study(options, gpu_name)
    old = record_of(study)
    record = {"finished": done, "seconds": round(float(old.get("seconds", 0.0)) + seconds, 3),
              "runs": int(old.get("runs", 0)) + 1, "evaluated": result.evaluated}
    study.set_user_attr(RECORD_ATTR, record)
    return record


def requeue_cancelled(study) -> int:
    """Queue again the configs whose trials a cut run cancelled (FAIL, reason 'cancelled…'/'interrupted…') and
    that no other trial judged or holds: a budget cut cancels the configs already asked (the warm-start ones
    among them, which a resumed study does not queue again), and the resumed study should still try them."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    taken = [t.params for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.WAITING,
                                                     TrialState.RUNNING)]
    n = 0
    for t in sorted(trials, key=lambda t: t.number):
        reason = t.user_attrs.get("reason") or ""
        if t.state == TrialState.FAIL and reason.startswith(verdicts.ABANDONED_REASONS) and t.params not in taken:
            study.enqueue_trial(t.params, skip_if_exists=False)
            taken.append(t.params)
            n += 1
    return n


# -- the run -----------------------------------------------------------------------------------------------------

@dataclass
class Budget:
    """The run's wall-clock budget (None: unbounded), from its start."""

    seconds: float | None
    reserve_s: float = DEFAULT_RESERVE_S
    started: float = field(default_factory=time.monotonic)

    def __post_init__(self):
        if self.seconds is not None and not self.seconds > 0:
            raise ValueError(f"--budget-s: expected seconds > 0, got {self.seconds}")
        if not self.reserve_s >= 0:
            raise ValueError(f"--reserve-s: expected seconds ≥ 0, got {self.reserve_s}")

    def left(self) -> float:
        return math.inf if self.seconds is None else self.seconds - (time.monotonic() - self.started)

    def trial_loop_s(self) -> float | None:
        """--timeout for the next shape's trial loop; None: unbounded; 0: too little left to start one."""
        if self.seconds is None:
            return None
        loop = self.left() - self.reserve_s
        return loop if loop >= MIN_TRIAL_LOOP_S else 0.0


@dataclass
class Outcome:
    """One shape in this run: its search result (None when skipped or not reached) and what happened."""

    options: object
    state: str                   # "finished earlier", "finished", "cut by the budget", "failed: ...", "not reached"
    result: object = None
    seconds: float = 0.0
    second_pass: object = None   # campaign_passes.PassResult, when this run's second pass reached the shape


@dataclass
class CampaignRun:
    outcomes: list[Outcome]
    gpu_name: str
    stopped: str | None = None   # why the run ended before the last shape (budget, Ctrl-C)


def run(plans: list, *, log: Callable[[str], None] = print, budget: Budget | None = None, plugs: Plugs | None = None,
        search=None, after_shape: Callable[[], None] | None = None, store=None,
        second_pass: bool = True) -> CampaignRun:
    """Search each plan in turn (module docstring). `search`: loop.run_search, injectable for tests; `plugs`:
    the shared evaluator and builder (default: Plugs.open); `store`: where winners are stored and neighbours
    found (default: each plan's storage; warm_start.WarmStore adds shipped tables). `second_pass`: hold the
    winners, re-time every finished shape's finalists in another evaluator process at the end, and store the
    best across both passes (campaign_passes.py). Ctrl-C: SearchInterrupted propagates (the study of the shape in
    flight resumes next time; held winners are stored) with the run so far on its `campaign` attribute."""
    search = search or search_mod.run_search
    budget = budget or Budget(None)
    check_shareable(plans)
    plugs = plugs or Plugs.open(plans[0])
    run_ = CampaignRun([Outcome(p, "not reached") for p in plans], plugs.gpu_name)
    held: dict = {}  # the first pass's HeldStore per real store (campaign_passes.py)

    def real_store(options):
        return store if store is not None else storage_url.resolve_storage_url(options.storage)

    def first_pass_store(options):
        if not second_pass:
            return store
        real = real_store(options)
        return held.setdefault(real if isinstance(real, str) else id(real), passes.HeldStore(real))

    try:
        repair_passes(plans, plugs.gpu_name, real_store, log)
        earlier = [o for o in run_.outcomes if record_of(load_study(o.options, plugs.gpu_name)).get("finished")]
        for o in earlier:
            o.state = "finished earlier"
        if earlier:
            log(f"campaign: {len(earlier)} of {len(plans)} shape(s) finished in earlier runs, skipped")
        for n, outcome in enumerate(run_.outcomes, 1):
            if outcome.state == "finished earlier":
                continue
            opts = outcome.options
            loop_s = budget.trial_loop_s()
            if loop_s == 0.0:
                run_.stopped = (f"budget: {budget.left():.0f} s left, less than the {budget.reserve_s:g} s reserve + "
                                f"{MIN_TRIAL_LOOP_S:g} s a shape needs; the same command continues from "
                                f"{opts.shape.key}")
                log(f"campaign: {run_.stopped}")
                break
            cut_by_budget = loop_s is not None and (opts.timeout is None or loop_s < opts.timeout)
            if cut_by_budget:
                opts = dataclasses.replace(opts, timeout=loop_s)
            log(f"== campaign {n}/{len(plans)}: {opts.shape.key} ({opts.trials} trials, warm start {opts.warm_start}"
                f"{f', trial loop ≤ {opts.timeout:.0f} s' if opts.timeout else ''})")
            started = time.monotonic()
            study = load_study(opts, plugs.gpu_name)
            if study is not None and requeue_cancelled(study):
                log(f"campaign: {opts.shape.key}: the configs the last run cancelled are queued again")
            try:
                outcome.result = search(opts, log=log, builder=plugs.builder, evaluator=plugs.evaluator,
                                        store=first_pass_store(opts))
            except search_mod.SearchInterrupted as e:
                outcome.result, outcome.state = e.result, "interrupted"
                outcome.seconds = time.monotonic() - started
                add_record(opts, plugs.gpu_name, e.result, outcome.seconds, done=False)
                run_.stopped = "interrupted (Ctrl-C)"
                e.campaign = run_
                raise
            except (KeyboardInterrupt, SystemExit):
                raise
            except Exception as e:  # one shape's failure (a study mismatch, a dead GPU) must not cost the others
                outcome.state = f"failed: {type(e).__name__}: {e}"
                outcome.seconds = time.monotonic() - started
                log(f"campaign: {opts.shape.key} {outcome.state}")
                if after_shape is not None:
                    after_shape()
                continue
            outcome.seconds = time.monotonic() - started
            log(format_result(outcome.result))
            record = add_record(opts, plugs.gpu_name, outcome.result, outcome.seconds,
                                done=finished(outcome.result, cut_by_budget))
            outcome.state = "finished" if record["finished"] else "cut by the budget"
            log(progress_line(run_, n, outcome))
            if after_shape is not None:
                after_shape()
        if second_pass:
            run_second_pass(run_, plugs, first_pass_store, budget, log)
    finally:
        try:
            for h in held.values():
                h.flush()  # winners the second pass did not reach: stored as their first pass decided
        finally:
            plugs.close()
    return run_


def repair_passes(plans: list, gpu_name: str, real_store: Callable, log: Callable[[str], None]) -> list:
    """campaign_passes.repair over the plans' studies, per store they record to (`real_store(options)`)."""
    by_store: dict = {}
    for o in plans:
        real = real_store(o)
        by_store.setdefault(real if isinstance(real, str) else id(real), (real, []))[1].append(load_study(o, gpu_name))
    return [r for real, found in by_store.values() for r in passes.repair(found, real, log)]


def recorded_studies(plans: list, url: str) -> list:
    """The studies of `plans` that storage `url` holds, each found by the GPU its own attr names (no GPU needed):
    Optuna's study summaries, with their user attrs."""
    import optuna

    summaries = optuna.get_all_study_summaries(url, include_best_trial=False)
    return [s for s in summaries
            if any(s.study_name == study_name(p, str(s.user_attrs.get("gpu_name", ""))) for p in plans)]


def run_second_pass(run_: CampaignRun, plugs: Plugs, held_for: Callable, budget: Budget,
                    log: Callable[[str], None]) -> None:
    """campaign_passes.py's second pass over every finished shape still without one, while the budget keeps its
    reserve; a shape's failure is logged and leaves its first-pass winner to be stored."""
    todo = [o for o in run_.outcomes if o.state in ("finished", "finished earlier")
            and passes.needs_second_pass(load_study(o.options, plugs.gpu_name))]
    if not todo:
        return
    fresh = plugs.another_process()
    log(f"== campaign second pass: {len(todo)} shape(s)' finalists re-timed "
        f"{'in a fresh evaluator process' if fresh else 'with the same evaluator (not a child process of ours)'}")
    for outcome in todo:
        if budget.left() < budget.reserve_s:
            log(f"campaign: second pass stopped, {budget.left():.0f} s left (reserve {budget.reserve_s:g} s); the same "
                f"command continues it; first-pass winners stored for the rest")
            break
        opts = outcome.options
        try:
            study = load_study(opts, plugs.gpu_name)
            result = passes.second_pass(study, opts, held_for(opts), plugs.builder, plugs.evaluator,
                                        plugs.gpu_name, plugs.builder.arch, log=log)
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as e:  # one shape's failure must not cost the others their second pass
            log(f"campaign: second pass {opts.shape.key} failed: {type(e).__name__}: {e}")
            continue
        outcome.second_pass = result
        log(result.describe())


def progress_line(run_: CampaignRun, n: int, outcome: Outcome) -> str:
    """`campaign [n/total] shape: best TFLOPS (vs the best peer), trials, seconds | done d/total, ETA`; the ETA
    is the shapes still to run times the mean seconds of the shapes this run has finished."""
    r = outcome.result
    best = r.best
    what = f"{best.outcome.tflops:.1f} TFLOPS" if best else "no valid config"
    peers = {k: v for k, v in (r.baselines or {}).items() if v}
    if best and peers:
        name = max(peers, key=peers.get)
        what += f" ({best.outcome.tflops / peers[name]:.2f}× {name})"
    total = len(run_.outcomes)
    done = sum(o.state in ("finished", "finished earlier") for o in run_.outcomes)
    ran = [o.seconds for o in run_.outcomes if o.state == "finished"]
    to_run = sum(o.state in ("not reached", "cut by the budget") for o in run_.outcomes)
    eta = f"ETA {_minutes(to_run * sum(ran) / len(ran))} ({sum(ran) / len(ran):.1f} s/shape)" if ran else "ETA -"
    state = "" if outcome.state == "finished" else f" [{outcome.state}]"
    return (f"campaign [{n}/{total}] {r.shape.key}: {what}, {r.evaluated} trials, {outcome.seconds:.1f} s{state} | "
            f"done {done}/{total}, {eta}")


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


__all__ = ["Budget", "CampaignRun", "DEFAULT_RESERVE_S", "MIN_TRIAL_LOOP_S", "Outcome", "Plugs", "RECORD_ATTR",
           "SharedBuilder", "add_record", "check_shareable", "finished", "load_study", "progress_line", "record_of",
           "recorded_studies", "repair_passes", "run", "study_name"]
