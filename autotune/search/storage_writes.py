"""Writing trials in few transactions: Optuna's ask/suggest/set_user_attr commit once per call.

On a SQLite file a stored trial asked with `study.ask()` and 9-11 suggests, then told with 12-20 `set_user_attr`
calls and `study.tell`, took 30-35 write transactions (each a disk sync, plus SQLAlchemy's per-statement work).
Here a trial is created with its params in one transaction, and told (attrs, value, state) in one.

The stored study's sampler is sampling.NoSampler (proposals come from the shadow study, proposals.py), so
`study.tell`'s sampler hook has nothing to do there; a study with a real sampler is told through `study.tell`.
"""
from __future__ import annotations

import math


def create_trial(study, params: dict, distributions: dict):
    """A RUNNING trial of `study` holding `params`, written in one transaction. `study.ask()` followed by one
    suggest per parameter commits each parameter on its own (9-11 commits on SQLite, each a disk sync)."""
    import datetime

    import optuna
    from optuna.trial import FrozenTrial, TrialState

    template = FrozenTrial(number=-1, state=TrialState.RUNNING, value=None, values=None,
                           datetime_start=datetime.datetime.now(), datetime_complete=None, params=dict(params),
                           distributions=dict(distributions), user_attrs={}, system_attrs={}, intermediate_values={},
                           trial_id=-1)
    trial_id = study._storage.create_new_trial(study._study_id, template_trial=template)
    return optuna.Trial(study, trial_id)


def write_trial_attrs(study, trial_id: int, user_attrs: dict, system_attrs: dict | None = None) -> None:
    """Set a trial's user (and system) attrs in one transaction on an RDB storage; one call each elsewhere (the
    in-memory storage, where a call costs microseconds). Optuna's own setters commit once per attr: a told trial
    has 12-20 of them."""
    _transaction(study, trial_id, user_attrs, system_attrs or {}, None)


def finish_trial(study, trial_id: int, state, value: float | None, user_attrs: dict,
                 system_attrs: dict | None = None) -> bool:
    """Write the attrs, the value and the final state of a RUNNING trial in one transaction; returns False (and
    writes nothing) where that cannot be done: the storage is not an RDB one, or the study has a sampler that must
    see the tell (its after_trial hook): then the caller writes the attrs and calls study.tell."""
    from .sampling import NoSampler

    if not isinstance(study.sampler, NoSampler) or _rdb(study) is None:
        return False
    if state.name == "COMPLETE" and not (isinstance(value, (int, float)) and math.isfinite(value)):
        raise ValueError(f"finish_trial: a COMPLETE trial needs a finite value, got {value!r}")
    _transaction(study, trial_id, user_attrs, system_attrs or {}, (state, value))
    return True


def _rdb(study):
    storage = study._storage
    rdb = getattr(storage, "_backend", storage)  # Optuna wraps an RDBStorage in a cache that writes through
    return rdb if hasattr(rdb, "scoped_session") and hasattr(rdb, "check_trial_is_updatable") else None


def _transaction(study, trial_id: int, user_attrs: dict, system_attrs: dict, finish) -> None:
    rdb = _rdb(study)
    if rdb is None:
        storage = study._storage
        for key, value in user_attrs.items():
            storage.set_trial_user_attr(trial_id, key, value)
        for key, value in system_attrs.items():
            storage.set_trial_system_attr(trial_id, key, value)
        return
    import datetime

    from optuna.storages._rdb import models
    from optuna.storages._rdb.storage import _create_scoped_session

    def write(_rdb=None):
        with _create_scoped_session(rdb.scoped_session) as session:
            trial = models.TrialModel.find_or_raise_by_id(trial_id, session, for_update=finish is not None)
            rdb.check_trial_is_updatable(trial_id, trial.state)  # UpdateFinishedTrialError: failed under us
            _upsert(session, rdb, models.TrialUserAttributeModel, trial_id, user_attrs)
            _upsert(session, rdb, models.TrialSystemAttributeModel, trial_id, system_attrs)
            if finish is not None:
                state, value = finish
                if value is not None:
                    rdb._set_trial_value_without_commit(session, trial, 0, value)
                trial.state = state
                trial.datetime_complete = datetime.datetime.now()

    retry = getattr(rdb, "_retry", None)  # coordination.retrying_storage: ride out a server restart, as every call
    if retry is not None:
        retry(write, rdb)
    else:
        write()


def _upsert(session, rdb, model, trial_id: int, attrs: dict) -> None:
    """Insert or update the attrs in one statement (SQLite, PostgreSQL); Optuna's per-attr upsert elsewhere."""
    import json

    if not attrs:
        return
    dialect = rdb.engine.name
    if dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert
    elif dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        for key, value in attrs.items():
            rdb._set_trial_attr_without_commit(session, model, trial_id, key, value)
        return
    stmt = insert(model).values([{"trial_id": trial_id, "key": k, "value_json": json.dumps(v)} for k, v in attrs.items()])
    session.execute(stmt.on_conflict_do_update(index_elements=[model.trial_id, model.key],
                                               set_={"value_json": stmt.excluded.value_json}))


__all__ = ["create_trial", "finish_trial", "write_trial_attrs"]
