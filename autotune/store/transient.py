"""Storage errors that pass: a database server restarting, a connection dropped by the network or an idle reaper.

A long search outlives them. `call` retries one storage operation with backoff for a bounded time
(`retry_seconds()`: $AUTOTUNE_STORAGE_RETRY, default 120 s), dropping the pooled connections before each retry
(after `pg_ctl restart` every pooled connection is dead, and pool_pre_ping alone does not cover a connection
that broke in the middle of a transaction); anything else, or an outage longer than the bound, is raised as it
was. It is the one retry policy of every storage call that can meet such an error: every database operation of
the search's Optuna storage (search/coordination.retrying_storage: all of RDBStorage's units of work, the private
ones Optuna's cached storage calls included), the claims table (claims.py) and the best table's writes
(best_table.py: opening it, record_best).

What counts as transient: the driver's OperationalError/InterfaceError (connection refused, "terminating
connection due to administrator command", "the database system is starting up", "server closed the connection
unexpectedly"), directly or as the cause of Optuna's StorageInternalError. SQLite's errors are not retried here:
a SQLite study has one search process (coordination.StudyLock), so "database is locked" means another program.
"""
from __future__ import annotations

import os
import time
from typing import Callable

RETRY_ENV = "AUTOTUNE_STORAGE_RETRY"
DEFAULT_RETRY_SECONDS = 120.0
FIRST_WAIT, LONGEST_WAIT = 0.2, 5.0  # seconds between tries: doubling from the first to the longest


def retry_seconds() -> float:
    """How long one operation is retried ($AUTOTUNE_STORAGE_RETRY seconds; 0 turns retrying off)."""
    value = os.environ.get(RETRY_ENV, "").strip()
    try:
        return max(0.0, float(value)) if value else DEFAULT_RETRY_SECONDS
    except ValueError:
        raise ValueError(f"${RETRY_ENV}: expected a number of seconds, got {value!r}") from None


def is_transient(exc: BaseException) -> bool:
    """A lost or refused connection to a server database (module docstring), anywhere in the exception chain."""
    from sqlalchemy import exc as sa

    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, sa.DBAPIError):
            if exc.connection_invalidated:
                return True
            if isinstance(exc, (sa.OperationalError, sa.InterfaceError)):
                return _server_dialect(exc)
        elif type(exc).__module__.startswith(("psycopg", "psycopg2")) and type(exc).__name__ in (
                "OperationalError", "InterfaceError", "AdminShutdown", "CannotConnectNow", "ConnectionFailure"):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _server_dialect(exc) -> bool:
    # sqlite3's OperationalError is also "operational" ("database is locked", "no such table"): not a server
    # that went away, so not retried (module docstring).
    return not type(getattr(exc, "orig", None)).__module__.startswith("sqlite3")


def call(fn: Callable, *args, reset: Callable[[], None] | None = None,
         on_retry: Callable[[BaseException, float], None] | None = None, **kwargs):
    """fn(*args, **kwargs), retried while it fails transiently and retry_seconds() have not passed.
    `reset()` runs before each retry (drop pooled connections); `on_retry(error, seconds_left)` is told of each."""
    budget = retry_seconds()
    deadline = time.monotonic() + budget
    wait = FIRST_WAIT
    while True:
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001  (classified below; anything else is raised unchanged)
            left = deadline - time.monotonic()
            if budget <= 0 or left <= 0 or not is_transient(e):
                raise
            if on_retry is not None:
                on_retry(e, left)
            time.sleep(min(wait, left))
            wait = min(2 * wait, LONGEST_WAIT)
            if reset is not None:
                try:
                    reset()
                except Exception:  # noqa: BLE001  (a pool that cannot even be closed: the next try reconnects)
                    pass


def first_line(exc: BaseException) -> str:
    """The driver's own words for an error (its first line), for one-line notes."""
    root = exc
    while root.__cause__ is not None:
        root = root.__cause__
    text = str(root).strip().splitlines()
    return f"{type(root).__name__}: {text[0] if text else ''}"


__all__ = ["DEFAULT_RETRY_SECONDS", "RETRY_ENV", "call", "first_line", "is_transient", "retry_seconds"]
