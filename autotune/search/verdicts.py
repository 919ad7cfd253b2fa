"""One trial's verdict: violations, build and evaluation → status, user attrs, Optuna state, constraint; and tell.

The state machine (docs/CONTRACTS.md names the statuses):

    config ──violations──▶ invalid                     (never built)
       │
     build ──failed──────▶ compile_error
       │   ──spills, under the spill policy──▶ spilled  (never run)
       │
    evaluate ──▶ complete (value = TFLOPS) | wrong | crashed | timeout

Only `complete` becomes a COMPLETE trial. Every other status becomes a PRUNED trial (TPE learns from pruned
trials; a FAIL trial is invisible to it) with `status`/`reason` user attrs and a positive constraint value,
so samplers that model feasibility (TPE, GP) learn where failures live. Constraints are set with
`Trial.set_constraint` on Optuna ≥ 5 and, for older ones, read back by `sampling.constraints_from_user_attr`
from the `constraint` user attr, which is written either way.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

import space
from space import Config, Problem

from ..build.spill_policy import SpillPolicy
from ..launch.occupancy import blocks_per_sm
from .sampling import set_constraint_supported
from .storage_writes import finish_trial, write_trial_attrs

STATUSES = ("complete", "invalid", "spilled", "compile_error", "wrong", "crashed", "timeout")
USER_ATTRS = ("config_key", "status", "reason", "registers", "spill_stores", "spill_loads", "stack_bytes",
              "smem_bytes", "threads", "blocks_per_sm", "time_ms", "time_spread_ms", "tflops", "max_error",
              "cubin_hash", "compile_seconds")
CONSTRAINT_ATTR = "constraint"
CONSTRAINT_NAME = "feasible"
# Extra user attrs on trials that reuse an earlier trial's result instead of running again.
DUPLICATE_OF = "duplicate_of"     # same config as that trial
SAME_CUBIN_AS = "same_cubin_as"   # different config, identical cubin and launch geometry
# On FAIL trials, shared storages only (coordination.py): the config was being evaluated by that trial in another process.
RUNNING_IN = "running_in"
# On a trial re-recorded because the process's own trial was failed under it (missed heartbeats): the lost number.
LATE_FOR = "late_for"
# On a trial recording the verdict of a trial whose process died after measuring it (deaths.py): the dead number.
RETOLD_FOR = "retold_for"
# How the reasons of trials failed on purpose begin (abandon's callers: Ctrl-C, --timeout); any other FAIL trial
# without RUNNING_IN died (study.status_counts).
ABANDONED_REASONS = ("interrupted", "cancelled")
# How far from feasible each failure is (positive = infeasible). When few trials succeed, TPE's "good" group
# is filled from the least infeasible: a spilling kernel is nearer to a good one than a config that crashed.
SEVERITY = {"complete": 0.0, "spilled": 1.0, "wrong": 2.0, "compile_error": 3.0, "crashed": 4.0, "timeout": 4.0,
            "invalid": 5.0}


@dataclass(frozen=True)
class Outcome:
    status: str
    reason: str
    attrs: Mapping[str, Any] = field(default_factory=dict)  # every USER_ATTRS key; None where unknown

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"status: expected one of {STATUSES}, got {self.status!r}")

    @property
    def value(self) -> float | None:
        return self.attrs.get("tflops") if self.status == "complete" else None

    @property
    def constraint(self) -> float:
        return SEVERITY[self.status]


def config_attrs(config: Config, problem: Problem) -> dict[str, Any]:
    """The attrs known before building: the config key and its launch geometry."""
    attrs: dict[str, Any] = dict.fromkeys(USER_ATTRS)
    attrs["config_key"] = config.key
    try:
        lay = space.layout(config, problem)
        attrs["threads"], attrs["smem_bytes"] = lay.threads, lay.smem_total
    except Exception:  # a layout that cannot even be derived is reported by the rules, not here
        pass
    return attrs


def _outcome(status: str, reason: str, attrs: dict) -> Outcome:
    attrs.update(status=status, reason=reason)
    return Outcome(status, reason, attrs)


def invalid(config: Config, problem: Problem, violations) -> Outcome:
    # Rule names only: the messages are a pure function of the config (space.violations recomputes them).
    return _outcome("invalid", ", ".join(v.rule for v in violations), config_attrs(config, problem))


def build_attrs(build) -> dict[str, Any]:
    attrs = config_attrs(build.config, build.problem)
    attrs["cubin_hash"] = build.cubin_hash
    r = build.report
    if r is not None:
        attrs.update(registers=r.registers, spill_stores=r.spill_stores, spill_loads=r.spill_loads,
                     stack_bytes=r.stack_bytes, compile_seconds=r.compile_seconds)
        # ptxas knows the static smem the code really declares; the layout knows the dynamic part.
        lay = space.layout(build.config, build.problem)
        attrs["smem_bytes"] = max(r.smem_static, lay.smem_static) + lay.smem_dynamic
        attrs["blocks_per_sm"] = blocks_per_sm(build.arch, lay.threads, r.registers, attrs["smem_bytes"])
    return attrs


def after_build(build, policy: SpillPolicy) -> Outcome | None:
    """The verdict a build alone decides (compile error, pruned spill), or None: go and evaluate it."""
    if getattr(build, "rejected_by", ()):  # the Builder's own rule check; the search checks first
        return _outcome("invalid", ", ".join(build.rejected_by), config_attrs(build.config, build.problem))
    attrs = build_attrs(build)
    if not build.ok:
        return _outcome("compile_error", (build.error or "compile failed")[:2000], attrs)
    pruned = policy.prunes(build.report)
    if pruned:
        return _outcome("spilled", pruned, attrs)
    return None


def after_eval(build, ev) -> Outcome:
    """ev is a child_process.EvalOutcome."""
    attrs = build_attrs(build)
    attrs.update(time_ms=ev.time_ms, time_spread_ms=ev.spread_ms, max_error=ev.max_error)
    if ev.blocks_per_sm is not None:
        attrs["blocks_per_sm"] = ev.blocks_per_sm  # the driver's figure beats our estimate
    if ev.status == "complete":
        attrs["tflops"] = ev.tflops
        return _outcome("complete", ev.reason, attrs)
    return _outcome(ev.status, ev.reason or ev.status, attrs)


def reused(earlier: Outcome, marker: str, trial_number: int, config: Config, problem: Problem) -> Outcome:
    """This trial's outcome is an earlier trial's (same config, or same cubin): copy it, say so."""
    attrs = dict(earlier.attrs)
    fresh = config_attrs(config, problem)
    attrs.update(config_key=fresh["config_key"], threads=fresh["threads"])
    attrs[marker] = trial_number
    return replace(earlier, attrs=attrs)


def from_trial(trial) -> Outcome | None:
    """The outcome a finished trial recorded (None for trials this module did not tell)."""
    attrs = trial.user_attrs
    status = attrs.get("status")
    if status not in STATUSES:
        return None
    if status == "complete" and not _finite(attrs.get("tflops")):
        return None
    markers = (CONSTRAINT_ATTR, DUPLICATE_OF, SAME_CUBIN_AS, LATE_FOR, RETOLD_FOR)
    keep = {k: v for k, v in attrs.items() if k not in markers}
    return Outcome(status, attrs.get("reason") or "", keep)


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def tell(study, trial, outcome: Outcome) -> bool:
    """Record the outcome on the trial (user attrs, constraint) and finish it in the study.

    Returns True when the sampler says the space is exhausted: BruteForceSampler calls study.stop() from
    after_trial, which outside optimize() raises — after the trial's state has been stored.

    On a shared storage another process may have failed the trial meanwhile (this process missed its heartbeats
    for longer than the grace period: a stalled host). The measurement is then kept as a new finished trial
    with the same params, marked `late_for`, rather than dropped.
    """
    from optuna.exceptions import UpdateFinishedTrialError

    try:
        return _tell(study, trial, outcome)
    except UpdateFinishedTrialError:
        _add_late(study, trial, outcome)
    except ValueError as e:  # Optuna read the trial as finished before writing: "Cannot tell a FAIL trial."
        if "Cannot tell a " not in str(e):
            raise
        _add_late(study, trial, outcome)
    return False


def _tell(study, trial, outcome: Outcome) -> bool:
    from optuna.trial import TrialState

    attrs = {key: value for key, value in outcome.attrs.items() if value is not None}  # unknown: left out (.get)
    attrs[CONSTRAINT_ATTR] = [outcome.constraint]
    # Where Trial.set_constraint puts it (optuna.study._constrained_optimization), written with the user attrs in
    # one transaction (storage_writes.py), with the value and state too where the study never samples.
    system = {f"constraints:{CONSTRAINT_NAME}": outcome.constraint} if set_constraint_supported() else {}
    state = TrialState.COMPLETE if outcome.status == "complete" else TrialState.PRUNED
    if finish_trial(study, trial._trial_id, state, outcome.value, attrs, system):
        return False  # one transaction: attrs, value, state (a stored study that never samples)
    write_trial_attrs(study, trial._trial_id, attrs, system)
    try:
        if outcome.status == "complete":
            study.tell(trial, outcome.value)
        else:
            study.tell(trial, state=TrialState.PRUNED)
    except RuntimeError as e:
        if "Study.stop" not in str(e):
            raise
        return True
    return False


def _add_late(study, trial, outcome: Outcome) -> int:
    """The outcome as a new finished trial with `trial`'s params; returns its number."""
    return record_anew(study, study._storage.get_trial(trial._trial_id), outcome, LATE_FOR)[0]


def record_anew(study, frozen, outcome: Outcome, marker: str) -> tuple[int, int]:
    """`outcome` as a new finished trial with the params of `frozen` (a trial failed before it was told), marked
    `marker` = the failed trial's number; returns the new trial's (number, id)."""
    import optuna
    from optuna.trial import TrialState

    attrs = {k: v for k, v in outcome.attrs.items() if v is not None}
    attrs.update({CONSTRAINT_ATTR: [outcome.constraint], marker: frozen.number})
    complete = outcome.status == "complete"
    extra = {"constraints": {CONSTRAINT_NAME: outcome.constraint}} if set_constraint_supported() else {}
    template = optuna.trial.create_trial(
        state=TrialState.COMPLETE if complete else TrialState.PRUNED, value=outcome.value if complete else None,
        params=frozen.params, distributions=frozen.distributions, user_attrs=attrs, **extra)
    trial_id = study._storage.create_new_trial(study._study_id, template_trial=template)
    return study._storage.get_trial(trial_id).number, trial_id


def defer(study, trial, config: Config, owner: int | None) -> None:
    """Finish a trial whose config another process is evaluating right now (shared storages): FAIL, so it
    does not count toward --trials and no sampler learns from it twice; the owner's result stands."""
    from optuna.trial import TrialState

    trial.set_user_attr("config_key", config.key)
    trial.set_user_attr(RUNNING_IN, owner)
    trial.set_user_attr("reason", f"skipped: trial #{owner} in another process is evaluating this config")
    study.tell(trial, state=TrialState.FAIL)


def abandon(study, trial, reason: str) -> None:  # trial: optuna Trial or trial number
    """Finish a trial that was asked but never judged (interrupt, --timeout): FAIL, so no sampler learns
    from it and a later run does not count it; its config may be proposed again. `reason` begins with one of
    ABANDONED_REASONS (or study.DIED_REASON's "died:"), which is how the summary tells the two apart.

    The state matters more than the reason: a failed write of the reason (e.g. the first write on a connection
    that an interrupt left in the middle of a query) does not skip the state, and the state is written twice
    before giving up."""
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState

    if hasattr(trial, "set_user_attr"):  # a Trial from ask(); stale ones from storage come as numbers
        try:
            trial.set_user_attr("reason", reason)
        except Exception:  # noqa: BLE001  (see above; the tell below is what counts)
            pass
    for attempt in (1, 2):
        try:
            study.tell(trial, state=TrialState.FAIL)
            return
        except (UpdateFinishedTrialError, ValueError):  # already finished (told, or failed as stale): done
            return
        except Exception:  # noqa: BLE001  (a broken connection: the pool hands out a fresh one next time)
            if attempt == 2:
                return  # the storage is gone while shutting down; the heartbeat check fails it later


__all__ = ["ABANDONED_REASONS", "CONSTRAINT_ATTR", "DUPLICATE_OF", "LATE_FOR", "Outcome", "RETOLD_FOR", "RUNNING_IN",
           "SAME_CUBIN_AS", "STATUSES", "USER_ATTRS", "abandon", "after_build", "after_eval", "build_attrs",
           "config_attrs", "defer", "from_trial", "invalid", "record_anew", "reused", "tell"]
