"""Tables created where missing, by any number of processes at once: the one creation path of every storage.

Several processes can create the same tables in one database at the same moment: the hosts of a shared study
start together (Optuna's tables, the claims) and finish together (the best table), and several searches of
different shapes started at once on a fresh SQLite file (a user's script tuning shapes in parallel on the
default studies/autotune.db) all create Optuna's tables and stamp its alembic_version. Neither database makes
that safe: `create_all` checks, then creates, and between the two another process creates. The losers fail:
PostgreSQL on pg_type's unique index or with "relation ... already exists", SQLite with "table ... already
exists", both with a unique violation on a row the winner inserted first (alembic_version, Optuna's version_info,
our schema row). A loser that opens again finds the winner's tables and creates only what is still missing.

`create_with_others(open_fn, ...)` runs an opening step (Optuna's RDBStorage constructor, or `create_all` of our
own metadata) and repeats it while it fails that way; `create_missing(metadata, engine)` is the same for our
tables. Anything else is raised as it was.
"""
from __future__ import annotations

import time
from typing import Callable, TypeVar

from sqlalchemy import MetaData
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

ATTEMPTS = 5
PAUSE = 0.1  # seconds before the n-th retry: n × PAUSE (the winner is committing its CREATEs meanwhile)

T = TypeVar("T")


def created_meanwhile(error: BaseException) -> bool:
    """Whether `error` is what a process meets when another one created the same tables (or their first rows)
    between its check and its own CREATE or INSERT (module docstring)."""
    if isinstance(error, IntegrityError):  # pg_type's index, alembic_version, version_info, our schema row
        return True
    return isinstance(error, (ProgrammingError, OperationalError)) and "already exists" in str(error)


def create_with_others(open_fn: Callable[..., T], *args, **kwargs) -> T:
    """open_fn(*args, **kwargs), repeated while it fails because other processes created the same tables at the
    same moment (at most ATTEMPTS times)."""
    for attempt in range(ATTEMPTS):
        try:
            return open_fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001  (one race is repeated; the rest raised unchanged)
            if attempt == ATTEMPTS - 1 or not created_meanwhile(e):
                raise
            time.sleep(PAUSE * (attempt + 1))
    raise AssertionError("unreachable")


def create_missing(metadata: MetaData, engine: Engine) -> None:
    """`metadata.create_all(engine)` (checkfirst), tolerating other processes creating the same tables at once."""
    create_with_others(metadata.create_all, engine)


__all__ = ["ATTEMPTS", "create_missing", "create_with_others", "created_meanwhile"]
