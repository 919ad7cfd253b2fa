"""Who evaluates which config of a study: one row per (study, config), so that processes sharing a study never
time the same config twice.

Optuna alone cannot promise that: two workers that each check "is this config running anywhere?" and then
start it can both pass the check before either's trial is visible to the other. A unique constraint can: the
first INSERT of (study_id, config_key) wins, in one transaction, on any SQL database. The loser reads the
winner's trial and reuses its result (finished), skips the config (still running), or takes the claim over when
that trial failed (a worker killed, a run interrupted), with an UPDATE conditioned on the old owner so that
only one taker succeeds.

A server restart or a dropped connection is retried (transient.py): `claim` and `take_over` are safe to repeat
(a claim whose INSERT was committed just before its connection broke reads back as this trial's own claim).

Rows are never deleted: a claim ends up naming the trial whose result stands for that config. The table sits
next to Optuna's and autotune_best in the same database, with its own SQLAlchemy metadata (creating it never
touches Optuna's tables). Only shared (server) storages use it; a SQLite study has one process by policy
(docs/distributed.md), and its in-process memory is enough.
"""
from __future__ import annotations

import datetime as dt
import os
import socket
from dataclasses import dataclass

from sqlalchemy import DateTime, Integer, MetaData, String, UniqueConstraint, create_engine, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from . import tables, transient

TABLE = "autotune_claims"


class _Base(DeclarativeBase):
    metadata = MetaData()  # ours alone, like store.py's


class _ClaimRow(_Base):
    __tablename__ = TABLE
    __table_args__ = (UniqueConstraint("study_id", "config_key", name=f"uq_{TABLE}_config"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    study_id: Mapped[int] = mapped_column(Integer)             # Optuna's study id (names can be reused)
    config_key: Mapped[str] = mapped_column(String(512))
    trial_id: Mapped[int] = mapped_column(Integer)             # Optuna's trial id of the current owner
    trial_number: Mapped[int] = mapped_column(Integer)
    owner: Mapped[str] = mapped_column(String(256))            # host:pid, for people reading the table
    claimed: Mapped[dt.datetime] = mapped_column(DateTime)     # naive UTC


@dataclass(frozen=True)
class Owner:
    trial_id: int
    trial_number: int
    owner: str


def _me() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


class Claims:
    """The claims of one storage URL. `claim` and `take_over` are the verbs; both are single transactions."""

    def __init__(self, url: str, on_retry=None):
        self.engine = create_engine(url, pool_size=2, max_overflow=2, pool_pre_ping=True)
        self._on_retry = on_retry  # (error, seconds left): told once per operation that had to be retried
        self._retried(self.ensure_table)

    def _retried(self, fn, *args):
        told = []

        def note(error, left):
            if not told and self._on_retry is not None:
                self._on_retry(error, left)
            told.append(1)
        return transient.call(fn, *args, reset=self.engine.dispose, on_retry=note)

    def ensure_table(self) -> None:
        tables.create_missing(_Base.metadata, self.engine)  # several processes may create it at once

    def close(self) -> None:
        self.engine.dispose()

    def claim(self, study_id: int, config_key: str, trial_id: int, trial_number: int) -> Owner | None:
        """Claim the config for this trial: None when it is ours now, else the current owner."""
        return self._retried(self._claim, study_id, config_key, trial_id, trial_number)

    def _claim(self, study_id: int, config_key: str, trial_id: int, trial_number: int) -> Owner | None:
        try:
            with Session(self.engine) as s, s.begin():
                s.add(_ClaimRow(study_id=study_id, config_key=config_key, trial_id=trial_id,
                                trial_number=trial_number, owner=_me(), claimed=_now()))
            return None
        except IntegrityError:
            pass
        with Session(self.engine) as s:
            row = s.scalars(select(_ClaimRow).filter_by(study_id=study_id, config_key=config_key)).one()
            return Owner(row.trial_id, row.trial_number, row.owner)

    def take_over(self, study_id: int, config_key: str, previous: Owner, trial_id: int, trial_number: int) -> bool:
        """Move the claim from `previous` (whose trial failed) to this trial; False if someone else did first (or
        this trial did, in a try whose connection broke after the commit: the caller's next claim reads it back)."""
        return self._retried(self._take_over, study_id, config_key, previous, trial_id, trial_number)

    def _take_over(self, study_id: int, config_key: str, previous: Owner, trial_id: int, trial_number: int) -> bool:
        with Session(self.engine) as s, s.begin():
            done = s.execute(update(_ClaimRow)
                             .where(_ClaimRow.study_id == study_id, _ClaimRow.config_key == config_key,
                                    _ClaimRow.trial_id == previous.trial_id)
                             .values(trial_id=trial_id, trial_number=trial_number, owner=_me(), claimed=_now()))
            return done.rowcount == 1

    def owners(self, study_id: int) -> dict[str, int]:
        """config key → owning trial number, for one study (tests and people)."""
        with Session(self.engine) as s:
            return {r.config_key: r.trial_number for r in s.scalars(select(_ClaimRow).filter_by(study_id=study_id))}


__all__ = ["Claims", "Owner", "TABLE"]
