"""A trial whose process died (SIGKILL, OOM, a host gone): what becomes of it, decided by how far it got.

Two marks on the trial, one storage write each, record how far it got:

    EVALUATING  written when its evaluation starts (its GPU turn taken, just before the kernel is submitted);
    MEASURED    its verdict (status, reason, figures), written in one write before the tell begins; the tell
                itself is several writes (each user attr, the constraint, then the state), any of which a kill
                may precede.

The dead trial is found by the next run (SQLite: study.fail_stale_running at start) or by the heartbeat check of
any process on the study (shared storages: coordination.py), which fails it and hands it to `after_death`
(`fate` says which of these, from the dead trial alone):

    MEASURED      re-told: the verdict becomes a new finished trial with the same params, marked `retold_for`
                  (the dead trial's number); the config is not run again. A measurement is never lost to a
                  kill, however often a retry of that config was killed before.
    no params     nothing: it had no config yet.
    EVALUATING    re-queued (a WAITING trial with the same params), unless this config's process already died
                  once while evaluating it: then it is given up. A config whose evaluation takes its process
                  (or host) down must not stop a search forever.
    otherwise     re-queued: it died while being asked, built or waiting for the GPU, which says nothing
                  against the config; bounded all the same (MAX_DEATHS in all), so a config whose build kills
                  the process cannot loop either.

Retries carry Optuna's `failed_trial` (the first trial of the series) and `retry_history` system attrs, as
Optuna's own RetryHeartbeatStaleTrialCallback writes them, plus DIED_EVALUATING (the series' deaths while
evaluating). Unlike Optuna's callback, no user attr of the dead trial is copied: a kill during its tell can
leave parts of a verdict there (`status`, `tflops`), which must not reach the retry.

Residual window: a process killed between failing a dead trial and re-telling or re-queuing it (the next write)
leaves that trial failed for good, as Optuna's own retry callback would.
"""
from __future__ import annotations

from typing import Callable

from . import verdicts as trial_mod
from .verdicts import Outcome

EVALUATING = "autotune:evaluating"
MEASURED = "autotune:measured"
DIED_EVALUATING = "autotune:died_evaluating"
# A config whose process died this many times while evaluating it is given up ...
MAX_DEATHS_EVALUATING = 2
# ... and any config after this many deaths of its trials, whatever they were doing.
MAX_DEATHS = 4


def mark_evaluating(study, trial) -> None:
    """Record that `trial` (a live Trial) is being evaluated now."""
    _mark(study, trial, EVALUATING, True)


def store_measurement(study, trial, outcome: Outcome) -> None:
    """Record `trial`'s verdict in one write, before it is told (module docstring)."""
    attrs = {k: v for k, v in outcome.attrs.items() if v is not None}  # as tell writes them
    _mark(study, trial, MEASURED, {"status": outcome.status, "reason": outcome.reason, "attrs": attrs})


def _mark(study, trial, key: str, value) -> None:
    from optuna.exceptions import UpdateFinishedTrialError

    try:
        study._storage.set_trial_system_attr(trial._trial_id, key, value)
    except UpdateFinishedTrialError:
        pass  # failed under this process (missed heartbeats): nothing to mark; the tell records it late (verdicts)


def measurement(frozen) -> Outcome | None:
    """The verdict a dead trial had reached, or None."""
    stored = frozen.system_attrs.get(MEASURED)
    if not isinstance(stored, dict):
        return None
    try:
        return Outcome(stored["status"], stored.get("reason") or "", dict(stored.get("attrs") or {}))
    except (KeyError, ValueError, TypeError):  # not ours, or written by another version: not a verdict
        return None


def fate(frozen) -> str:
    """What becomes of `frozen`, a trial failed because its process died: "retell", "requeue", "give up" or
    "nothing" (module docstring). A pure function of the trial's marks, so that a reader (a report, the fault
    drill) can tell a config given up from a trial lost; a finished trial cannot be annotated afterwards."""
    if measurement(frozen) is not None:
        return "retell"
    if not frozen.params:
        return "nothing"
    deaths = len(frozen.system_attrs.get("retry_history", [])) + 1
    return "give up" if _died_evaluating(frozen) >= MAX_DEATHS_EVALUATING or deaths >= MAX_DEATHS else "requeue"


def _died_evaluating(frozen) -> int:
    """How many trials of this config's retry series died while evaluating it, `frozen` included."""
    return int(frozen.system_attrs.get(DIED_EVALUATING, 0)) + (frozen.system_attrs.get(EVALUATING) is True)


def after_death(study, frozen, log: Callable[[str], None] = print,
                on_retold: Callable[..., None] | None = None) -> str:
    """`frozen`: a trial just failed because its process died. Re-tell, re-queue or give it up (`fate`); returns
    which. `on_retold(study, frozen, outcome, number, trial_id)` (the re-told trial's) lets a shared storage move
    the config's claim to it."""
    what = fate(frozen)
    where = f"trial #{frozen.number} was left running by a process that stopped"
    history = [*frozen.system_attrs.get("retry_history", []), frozen.number]
    if what == "retell":
        outcome = measurement(frozen)
        number, trial_id = trial_mod.record_anew(study, frozen, outcome, trial_mod.RETOLD_FOR)
        if on_retold is not None:
            on_retold(study, frozen, outcome, number, trial_id)
        log(f"note: {where} after measuring it ({outcome.status}); its result is re-told as trial #{number}, "
            "not measured again")
    elif what == "nothing":
        log(f"note: {where}; failed (it had no config yet: nothing to retry)")
    elif what == "give up":
        why = "while evaluating it twice" if _died_evaluating(frozen) >= MAX_DEATHS_EVALUATING else \
            f"{len(history)} times"
        log(f"note: {where}; its config's process has died {why} (trials {', '.join(f'#{n}' for n in history)}): "
            "given up, not re-queued")
    else:
        _requeue(study, frozen, history, _died_evaluating(frozen))
        if frozen.system_attrs.get(EVALUATING) is True:
            log(f"note: {where} while evaluating it; failed and re-queued once (given up if its process dies while "
                "evaluating it again)")
        else:
            log(f"note: {where} before evaluating it; failed and re-queued")
    return what


def _requeue(study, frozen, history: list[int], died_evaluating: int) -> None:
    import optuna
    from optuna.trial import TrialState

    system_attrs = {"failed_trial": frozen.system_attrs.get("failed_trial", frozen.number), "retry_history": history,
                    DIED_EVALUATING: died_evaluating}
    study.add_trial(optuna.trial.create_trial(state=TrialState.WAITING, params=frozen.params,
                                              distributions=frozen.distributions, system_attrs=system_attrs))


__all__ = ["DIED_EVALUATING", "EVALUATING", "MAX_DEATHS", "MAX_DEATHS_EVALUATING", "MEASURED", "after_death", "fate",
           "mark_evaluating", "measurement", "store_measurement"]
