"""The Optuna study of one search: its name, its attributes, and what its finished trials already tell us.

A study belongs to one shape on one GPU (its default name says which, e.g. `h200-b4-h16-n4096-d128-fp16-full`).
Running the same command again loads it (`load_if_exists=True`) and continues toward the requested number of
evaluated trials; `StudyMemory` is how the search avoids repeating work: a config already judged in the study
is not built or run again, and a cubin already timed (same bytes, same launch geometry) is not timed again.
"""
from __future__ import annotations

import dataclasses
import warnings
from collections import Counter
from dataclasses import dataclass, field

from space import Arch, Config, Shape

from ..build.builder import cubin_key
from ..store.storage_url import gpu_slug
from . import verdicts as trial_mod
from .verdicts import Outcome

STUDY_ATTRS = ("shape", "arch", "gpu_name", "kernel_source_hash", "nvcc_version")
DIED_REASON = "died: left running by an earlier search run that stopped (killed, power loss)"


class StudyMismatchError(ValueError):
    """An existing study of that name was made for another shape or arch."""


def default_study_name(gpu_name: str, shape: Shape, families: tuple[str, ...] | None = None) -> str:
    """GPU + shape key; a --family restriction gets its own study (its `family` parameter has other choices)."""
    name = f"{gpu_slug(gpu_name)}-{shape.key}"
    return f"{name}-{'+'.join(families)}" if families else name


def _same_shape(recorded, shape: Shape) -> bool:
    """Whether a study's recorded shape attr is `shape`: a study recorded before causal alignments were part of the
    shape has no `causal_align`, and was measured upper-left (Shape's default)."""
    try:
        return Shape(**recorded) == shape
    except (TypeError, ValueError):
        return False


def open_study(name: str, storage, sampler, shape: Shape, arch: Arch, gpu_name: str, provenance: dict,
               log=print):
    """Create or load the study; refuse one made for another shape or arch; record the study attrs."""
    import optuna

    study = optuna.create_study(study_name=name, storage=storage, sampler=sampler, direction="maximize",
                                load_if_exists=True)
    attrs = study.user_attrs
    shape_attr = dataclasses.asdict(shape)
    if "shape" in attrs and not _same_shape(attrs["shape"], shape):
        raise StudyMismatchError(f"--study {name}: this study was made for shape {attrs['shape']}, not {shape_attr}; "
                                 "pick another --study name (or leave it out for the default)")
    if "arch" in attrs and attrs["arch"] != arch.name:
        raise StudyMismatchError(f"--study {name}: this study was made for {attrs['arch']}, not {arch.name}")
    old_hash = attrs.get("kernel_source_hash")
    if old_hash and old_hash != provenance.get("kernel_source_hash"):
        log(f"note: the kernel sources changed since this study's earlier trials ({old_hash[:12]} → "
            f"{provenance.get('kernel_source_hash', '?')[:12]}); old results stay as they are, and the final "
            "re-timing measures the current kernel")
    for key, value in {"shape": shape_attr, "arch": arch.name, "gpu_name": gpu_name, **provenance}.items():
        if attrs.get(key) != value:
            study.set_user_attr(key, value)
    return study


def fail_stale_running(study, log=print, on_failed=None) -> int:
    """Trials left RUNNING by an earlier run that died (kill -9, power) are finished as FAIL so they stop
    counting as in-flight guesses; then `on_failed(study, frozen_trial)` decides what becomes of each (re-told,
    re-queued or given up: deaths.py). Only for a study with one search process (SQLite; coordination.py): on a
    shared storage another process's live trials are RUNNING too, and only the heartbeat tells the dead from the
    living. Returns how many were failed."""
    from optuna.trial import TrialState

    stale = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    for t in stale:
        try:
            study._storage.set_trial_user_attr(t._trial_id, "reason", DIED_REASON)
        except Exception:  # finished meanwhile: nothing to mark
            continue
        trial_mod.abandon(study, t.number, DIED_REASON)
        if on_failed is not None:
            on_failed(study, study._storage.get_trial(t._trial_id))
    if stale:
        log(f"note: {len(stale)} trial(s) left running by an earlier run were marked failed")
    return len(stale)


@dataclass
class Judged:
    number: int
    outcome: Outcome


@dataclass
class StudyMemory:
    """What finished trials already know, keyed by config and by (cubin, launch geometry)."""

    by_config: dict[str, Judged] = field(default_factory=dict)
    by_cubin: dict[tuple, Judged] = field(default_factory=dict)
    seen: set[int] = field(default_factory=set)  # trial numbers absorbed (finished trials never change)

    @classmethod
    def load(cls, study, problem) -> "StudyMemory":
        memory = cls()
        memory.absorb(study.get_trials(deepcopy=False), problem)
        return memory

    def absorb(self, trials, problem) -> None:
        """Remember the finished trials not seen yet (other processes' results, on a shared storage)."""
        from optuna.trial import TrialState

        for t in trials:
            if t.number in self.seen or t.state not in (TrialState.COMPLETE, TrialState.PRUNED):
                continue
            self.seen.add(t.number)
            outcome = trial_mod.from_trial(t)
            if outcome is None or outcome.status == "invalid":
                continue
            if trial_mod.DUPLICATE_OF in t.user_attrs or trial_mod.SAME_CUBIN_AS in t.user_attrs:
                continue  # the original is (or will be) remembered under its own number
            try:
                config = Config.from_key(outcome.attrs["config_key"])
            except (KeyError, ValueError):
                continue  # the space changed since: that config no longer exists
            self.remember(t.number, config, problem, outcome)

    def remember(self, number: int, config: Config, problem, outcome: Outcome) -> None:
        judged = Judged(number, outcome)
        self.by_config.setdefault(config.key, judged)
        key = cubin_key(outcome.attrs.get("cubin_hash"), config, problem)
        if key and outcome.status in ("complete", "wrong", "crashed", "timeout"):  # i.e. it was run
            self.by_cubin.setdefault(key, judged)

    @property
    def evaluated(self) -> int:
        """Distinct configs built in this study (every status but invalid): what --trials counts."""
        return len(self.by_config)


def status_counts(study) -> Counter:
    """Finished trials by status. Repeats of a config already judged count as `repeated` (they ran nothing);
    trials abandoned before being judged (interrupt, --timeout) as `cancelled`; trials skipped because another
    process was evaluating the same config as `deferred`; trials of a process that died (failed by the
    heartbeat check, so nobody could give a reason) as `died`.

    A FAIL trial is judged by its state and by how it was failed, never by the verdict attrs it may carry: a
    process killed half-way through telling a trial leaves some of them (status=complete, tflops, duplicate_of)
    on a trial that the heartbeat check or the next SQLite run then fails; it died, and its result was lost."""
    counts: Counter = Counter()
    for t in study.get_trials(deepcopy=False):
        if not t.state.is_finished():
            continue
        if t.state.name == "FAIL":
            attrs, reason = t.user_attrs, t.user_attrs.get("reason") or ""
            counts["deferred" if trial_mod.RUNNING_IN in attrs else
                   "cancelled" if reason.startswith(trial_mod.ABANDONED_REASONS) else "died"] += 1
        elif trial_mod.DUPLICATE_OF in t.user_attrs:
            counts["repeated"] += 1
        else:
            counts[t.user_attrs.get("status") or t.state.name.lower()] += 1
    return counts


def top_trials(study, n: int) -> list:
    """The n best COMPLETE trials with distinct configs (originals, not reuses), best first."""
    from optuna.trial import TrialState

    best: dict[str, object] = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        key = t.user_attrs.get("config_key")
        if key is None or t.value is None:
            continue
        if key not in best or t.value > best[key].value:
            best[key] = t
    return sorted(best.values(), key=lambda t: -t.value)[:n]


def trials_to_best(study) -> int | None:
    """How many evaluated trials (configs built, in the order they were asked) the study took to first reach
    its best value; None when no trial completed. What a warm start is meant to lower."""
    from optuna.trial import TrialState

    evaluated = [t for t in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)
                 if t.state in (TrialState.COMPLETE, TrialState.PRUNED)
                 and t.user_attrs.get("status") not in (None, "invalid") and trial_mod.DUPLICATE_OF not in t.user_attrs]
    values = [t.value for t in evaluated if t.state == TrialState.COMPLETE and t.value is not None]
    if not values:
        return None
    best = max(values)
    return next(i for i, t in enumerate(evaluated, 1) if t.state == TrialState.COMPLETE and t.value == best)


def quiet_optuna() -> None:
    """Optuna logs every trial at INFO; the search prints its own one-line progress instead."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    # Ask-and-tell with heartbeats is what coordination.py does on purpose (it beats for every trial in flight).
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")


__all__ = ["STUDY_ATTRS", "StudyMemory", "StudyMismatchError", "default_study_name", "fail_stale_running",
           "open_study", "quiet_optuna", "status_counts", "top_trials", "trials_to_best"]
