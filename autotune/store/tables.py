"""Our tables, created where missing, by any number of processes at once.

The hosts of a shared study start together (claims) and finish together (the best table), so several processes
can run `CREATE TABLE IF NOT EXISTS` on one database at the same moment. PostgreSQL does not make that safe: all
but one fail, on pg_type's unique index or with "already exists". The losers create again (checkfirst), which
finds the winner's tables and creates only any that are still missing. (Optuna's own tables have the same race;
search/coordination.make_storage retries those.)
"""
from __future__ import annotations

from sqlalchemy import MetaData
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

ATTEMPTS = 5


def create_missing(metadata: MetaData, engine: Engine) -> None:
    """`metadata.create_all(engine)`, tolerating other processes creating the same tables at the same moment."""
    for attempt in range(ATTEMPTS):
        try:
            metadata.create_all(engine)  # checkfirst
            return
        except (IntegrityError, ProgrammingError, OperationalError):
            if attempt == ATTEMPTS - 1:
                raise


__all__ = ["ATTEMPTS", "create_missing"]
