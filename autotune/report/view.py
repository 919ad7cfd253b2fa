"""A study read once into plain records: the one place that knows how the search stores a trial.

Every plot's data function takes a `StudyView`, never an `optuna.Study`, so the report reads the storage once
and the data functions stay pure (tests can build a view by hand). Field names are those of docs/CONTRACTS.md
("Trial user attributes") and of autotune/search/verdicts.py, which writes them:

* every outcome but `complete` is a PRUNED trial with `status` and `reason`; a FAIL trial without `status` was
  cancelled (interrupt, --timeout) before it was judged;
* a trial that repeats an earlier config carries `duplicate_of` and copies that trial's result, so per-config
  plots skip it (it is not a new point of the space);
* parameters are `family` plus one per axis, named `<family>.<axis>` only where two families' domains clash;
  `config_key` names the config exactly, so axis values are read from it (no prefixes), params as fallback.
"""
from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState

import space

# The search's outcomes, in the order the report lists them (docs/CONTRACTS.md: user attr `status`).
STATUSES = ("complete", "invalid", "spilled", "compile_error", "wrong", "crashed", "timeout")
# Trials without a `status` attr (still running, cancelled, or told by something else): their Optuna state,
# named as autotune/search/study.py's status_counts names them.
_STATE_STATUS = {TrialState.COMPLETE: "complete", TrialState.PRUNED: "pruned", TrialState.FAIL: "cancelled",
                 TrialState.RUNNING: "running", TrialState.WAITING: "waiting"}
_INT_ATTRS = ("registers", "spill_stores", "spill_loads", "stack_bytes", "smem_bytes", "threads", "blocks_per_sm")
_FLOAT_ATTRS = ("time_ms", "time_spread_ms", "max_error", "compile_seconds")
FAMILY = "family"


@dataclass(frozen=True)
class TrialRecord:
    number: int
    status: str
    reason: str | None
    params: dict[str, Any]                 # as Optuna stores them (names may carry a family prefix)
    distributions: dict[str, optuna.distributions.BaseDistribution]
    config: dict[str, Any]                 # family + axis -> value, no prefixes
    tflops: float | None                   # complete trials only: a failed trial has no speed worth plotting
    rows_per_block: int | None = None      # Br, whatever the family calls it (space.Layout.rows_per_block)
    config_key: str | None = None
    duplicate_of: int | None = None
    registers: int | None = None
    spill_stores: int | None = None
    spill_loads: int | None = None
    stack_bytes: int | None = None
    smem_bytes: int | None = None
    threads: int | None = None
    blocks_per_sm: int | None = None
    time_ms: float | None = None
    time_spread_ms: float | None = None
    max_error: float | None = None
    compile_seconds: float | None = None
    datetime_start: dt.datetime | None = None
    datetime_complete: dt.datetime | None = None

    @property
    def complete(self) -> bool:
        return self.status == "complete" and self.tflops is not None

    @property
    def built(self) -> bool:
        """ptxas reported on it: registers are known (complete, spilled, wrong, crashed, timeout)."""
        return self.registers is not None

    @property
    def original(self) -> bool:
        """Not a repeat of an earlier trial's config (repeats copy its result and add nothing to the map)."""
        return self.duplicate_of is None

    @property
    def spill_bytes(self) -> int | None:
        if self.spill_stores is None and self.spill_loads is None:
            return None
        return (self.spill_stores or 0) + (self.spill_loads or 0)


@dataclass(frozen=True)
class Retimed:
    """The search's final re-timing of a top config, next to the baselines (study user attr `retimed`)."""

    trial: int
    config_key: str
    tflops: float
    chosen: bool = False  # the config the search stored (the fastest median; older studies: a tie kept the simplest)


@dataclass(frozen=True)
class StudyView:
    name: str
    shape: dict[str, Any]
    arch: str | None
    gpu_name: str | None
    baselines: dict[str, float]            # "sdpa_flash" -> TFLOPS; unmeasured ones left out
    trials: tuple[TrialRecord, ...]
    domains: dict[str, list] = field(default_factory=dict)  # axis (no prefix) -> searched values, in order
    retimed: tuple[Retimed, ...] = ()

    @property
    def complete(self) -> list[TrialRecord]:
        return [t for t in self.trials if t.complete]

    @property
    def configs(self) -> list[TrialRecord]:
        """One record per config the study judged: repeats left out."""
        return [t for t in self.trials if t.original]

    @property
    def best(self) -> TrialRecord | None:
        done = self.complete
        return max(done, key=lambda t: (t.tflops, -t.number)) if done else None


def load_view(study: optuna.Study) -> StudyView:
    """Snapshot a study (one storage read)."""
    attrs = dict(study.user_attrs)
    shape = dict(attrs.get("shape") or {})
    problem = _problem(shape)
    trials = tuple(record_from_trial(t, problem) for t in study.get_trials(deepcopy=False))
    return StudyView(name=study.study_name, shape=shape, arch=attrs.get("arch"), gpu_name=attrs.get("gpu_name"),
                     baselines=_baselines(attrs.get("baselines")), trials=trials, domains=domains_of(trials),
                     retimed=_retimed(attrs.get("retimed")))


def record_from_trial(trial: optuna.trial.FrozenTrial, problem: space.Problem | None = None) -> TrialRecord:
    ua = trial.user_attrs
    status = str(ua.get("status") or _STATE_STATUS.get(trial.state, trial.state.name.lower()))
    if trial.state == TrialState.FAIL:
        # A trial killed half-way through its tell keeps some verdict attrs (status=complete, tflops): its
        # result was lost, so it is shown by its state, never as a measurement.
        status = _STATE_STATUS[TrialState.FAIL]
    tflops = None
    if status == "complete":
        # The contract makes the trial's value the TFLOPS; the attr is the fallback for hand-told trials.
        tflops = _number(trial.value if trial.state == TrialState.COMPLETE else ua.get("tflops"))
    config, rows = _config(ua.get("config_key"), trial.params, problem)
    ints = {k: (None if _number(ua.get(k)) is None else int(_number(ua.get(k)))) for k in _INT_ATTRS}
    floats = {k: _number(ua.get(k)) for k in _FLOAT_ATTRS}
    dup = ua.get("duplicate_of")
    return TrialRecord(
        number=trial.number, status=status, reason=ua.get("reason"), params=dict(trial.params),
        distributions=dict(trial.distributions), config=config, tflops=tflops, rows_per_block=rows,
        config_key=ua.get("config_key"), duplicate_of=dup if isinstance(dup, int) else None,
        datetime_start=trial.datetime_start, datetime_complete=trial.datetime_complete, **ints, **floats,
    )


def domains_of(trials) -> dict[str, list]:
    """Each axis's searched values (the categorical choices the search declared), in the space's axis order."""
    out: dict[str, list] = {}
    for t in trials:
        for name, dist in t.distributions.items():
            if not isinstance(dist, CategoricalDistribution):
                continue
            values = out.setdefault(_axis_name(name, t.params.get(FAMILY)), [])
            values += [v for v in dist.choices if not any(_same(v, w) for w in values)]
    for axis, values in out.items():
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            values.sort()  # two families' numeric domains merge into one scale
    return out


def _config(key: str | None, params: dict, problem: space.Problem | None) -> tuple[dict, int | None]:
    try:
        config = space.Config.from_key(key) if key else None
    except (KeyError, ValueError):  # the space changed since this trial: its params are all we have
        config = None
    if config is None:
        values = {_axis_name(k, params.get(FAMILY)): v for k, v in params.items()}
        return values, values.get("br") if isinstance(values.get("br"), int) else None
    rows = None
    if problem is not None:
        try:
            rows = space.layout(config, problem).rows_per_block
        except Exception:  # a config whose geometry cannot be derived still has its axis values to show
            rows = None
    if rows is None and "br" in dict(config.values):
        rows = config.br
    return config.as_dict(), rows


def _axis_name(param: str, family: str | None) -> str:
    """'mma_sync.br' -> 'br' (sampling.py prefixes clashing axes with their family)."""
    prefix, dot, axis = param.partition(".")
    return axis if dot and (prefix == family or prefix in space.FAMILIES) else param


def _problem(shape: dict) -> space.Problem | None:
    try:
        return space.Problem(int(shape["head_dim"]), str(shape["dtype"]), bool(shape["causal"]))
    except (KeyError, TypeError, ValueError):
        return None


def _same(a, b) -> bool:
    return type(a) is type(b) and a == b  # True and 1 are different choices


def _number(value) -> float | None:
    """A finite float, else None (NaN/inf/strings from a broken trial must not poison a plot's axis)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _baselines(raw) -> dict[str, float]:
    if not isinstance(raw, dict):
        return {}
    return {str(k): _number(v) for k, v in raw.items() if _number(v) is not None and _number(v) > 0}


def _retimed(raw) -> tuple[Retimed, ...]:
    out = []
    for r in raw if isinstance(raw, list) else []:
        if isinstance(r, dict) and r.get("status") == "complete" and _number(r.get("tflops")):
            out.append(Retimed(int(r.get("trial", -1)), str(r.get("config_key", "")), _number(r["tflops"]),
                               r.get("chosen") is True))
    return tuple(out)
