"""The best configuration per shape: one small table of our own, next to Optuna's tables in the same database.

The runtime and `autotune best` read this table and never parse trials. One row per key

    (gpu_name, arch, dtype, head_dim, causal, seqlen, seqlen_k, batch, heads, kv_heads)

holding the winning config with its speed and provenance (study, trial, kernel source hash, nvcc version, date).

Nothing a user stored is lost: `record_best` keeps whichever row is faster, and when a faster row replaces a
slower one the slower one is moved to `autotune_best_replaced` (same columns plus when and by what), never
deleted. Our tables use their own SQLAlchemy metadata, so creating them never touches Optuna's tables, and the
schema version sits in `autotune_meta` (Optuna's `alembic_version` table is Optuna's) so that a later alembic
revision of ours knows what it is migrating from.

Export/import is reviewable JSON: rows sorted by key, keys sorted, indented; import merges row by row with the
same keep-the-faster rule and reports what it did.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from sqlalchemy import JSON, Boolean, DateTime, Float, Integer, MetaData, String, UniqueConstraint, create_engine, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import space

from . import storage_url

SCHEMA_VERSION = 1
TABLE = "autotune_best"
REPLACED_TABLE = "autotune_best_replaced"
META_TABLE = "autotune_meta"
SCHEMA_KEY = f"{TABLE}.schema_version"
EXPORT_FORMAT = "autotune-best"

KEY_FIELDS = ("gpu_name", "arch", "dtype", "head_dim", "causal", "seqlen", "seqlen_k", "batch", "heads", "kv_heads")
VALUE_FIELDS = ("family", "config_key", "config", "tflops", "time_ms", "spread_ms", "study", "trial",
                "kernel_source_hash", "nvcc_version", "created")


class StoreError(RuntimeError):
    """The table cannot be used as asked (newer schema, malformed import file, ...)."""


class _Base(DeclarativeBase):
    metadata = MetaData()  # ours alone: create_all never sees (or creates, or alters) Optuna's tables


class _Columns:
    gpu_name: Mapped[str] = mapped_column(String(128))
    arch: Mapped[str] = mapped_column(String(16))
    dtype: Mapped[str] = mapped_column(String(8))
    head_dim: Mapped[int] = mapped_column(Integer)
    causal: Mapped[bool] = mapped_column(Boolean)
    seqlen: Mapped[int] = mapped_column(Integer)
    seqlen_k: Mapped[int] = mapped_column(Integer)
    batch: Mapped[int] = mapped_column(Integer)
    heads: Mapped[int] = mapped_column(Integer)
    kv_heads: Mapped[int] = mapped_column(Integer)
    family: Mapped[str] = mapped_column(String(64))
    config_key: Mapped[str] = mapped_column(String(512))
    config: Mapped[dict] = mapped_column(JSON)
    tflops: Mapped[float] = mapped_column(Float)
    time_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    spread_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    study: Mapped[str | None] = mapped_column(String(512), nullable=True)
    trial: Mapped[int | None] = mapped_column(Integer, nullable=True)
    kernel_source_hash: Mapped[str | None] = mapped_column(String(128), nullable=True)
    nvcc_version: Mapped[str | None] = mapped_column(String(512), nullable=True)
    created: Mapped[dt.datetime] = mapped_column(DateTime)  # naive UTC: SQLite keeps no zone


class _BestRow(_Columns, _Base):
    __tablename__ = TABLE
    __table_args__ = (UniqueConstraint(*KEY_FIELDS, name=f"uq_{TABLE}_shape"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)


class _ReplacedRow(_Columns, _Base):
    __tablename__ = REPLACED_TABLE
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    replaced: Mapped[dt.datetime] = mapped_column(DateTime)
    replaced_by: Mapped[str] = mapped_column(String(512))  # "study #trial" or "import <file>"


class _MetaRow(_Base):
    __tablename__ = META_TABLE
    key: Mapped[str] = mapped_column(String(128), primary_key=True)
    value: Mapped[str] = mapped_column(String(512))


def shape_key(gpu_name: str, arch: str, shape) -> dict[str, Any]:
    """The key columns of a row for a space.Shape on one GPU and arch."""
    return dict(gpu_name=gpu_name, arch=arch, dtype=shape.dtype, head_dim=shape.head_dim, causal=shape.causal,
                seqlen=shape.seqlen_q, seqlen_k=shape.seqlen_k, batch=shape.batch, heads=shape.heads,
                kv_heads=shape.kv_heads)


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _to_naive_utc(t: dt.datetime) -> dt.datetime:
    return t.astimezone(dt.timezone.utc).replace(tzinfo=None) if t.tzinfo else t


@dataclass(frozen=True)
class BestEntry:
    """One row, detached from the database: what callers pass in and get back."""

    gpu_name: str
    arch: str
    dtype: str
    head_dim: int
    causal: bool
    seqlen: int
    seqlen_k: int
    batch: int
    heads: int
    kv_heads: int
    family: str
    config_key: str
    config: dict
    tflops: float
    time_ms: float | None = None
    spread_ms: float | None = None
    study: str | None = None
    trial: int | None = None
    kernel_source_hash: str | None = None
    nvcc_version: str | None = None
    created: dt.datetime = field(default_factory=utcnow)

    def __post_init__(self):
        if not isinstance(self.tflops, (int, float)) or not math.isfinite(self.tflops) or self.tflops <= 0:
            raise ValueError(f"tflops: expected a positive finite number, got {self.tflops!r}")
        if self.created.tzinfo is None:  # rows read back from SQLite: naive means UTC here
            object.__setattr__(self, "created", self.created.replace(tzinfo=dt.timezone.utc))

    @classmethod
    def for_shape(cls, shape, gpu_name: str, arch: str, config, tflops: float, **provenance) -> "BestEntry":
        """From a space.Shape and a space.Config (the search's way in)."""
        return cls(**shape_key(gpu_name, arch, shape), family=config.family, config_key=config.key,
                   config=config.as_dict(), tflops=float(tflops), **provenance)

    @property
    def key(self) -> tuple:
        return tuple(getattr(self, f) for f in KEY_FIELDS)

    @property
    def shape(self):
        return space.Shape(batch=self.batch, heads=self.heads, seqlen_q=self.seqlen, seqlen_k=self.seqlen_k,
                           head_dim=self.head_dim, dtype=self.dtype, causal=self.causal, kv_heads=self.kv_heads)

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["created"] = self.created.astimezone(dt.timezone.utc).isoformat().replace("+00:00", "Z")
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any], where: str = "row") -> "BestEntry":
        if not isinstance(d, dict):
            raise StoreError(f"{where}: expected an object, got {type(d).__name__}")
        missing = [f for f in KEY_FIELDS + ("family", "config_key", "config", "tflops") if f not in d]
        if missing:
            raise StoreError(f"{where}: missing field(s) {missing}")
        unknown = sorted(set(d) - set(KEY_FIELDS) - set(VALUE_FIELDS))
        if unknown:
            raise StoreError(f"{where}: unknown field(s) {unknown}")
        values = dict(d)
        if "created" in values:
            try:
                values["created"] = dt.datetime.fromisoformat(str(values["created"]).replace("Z", "+00:00"))
            except ValueError:
                raise StoreError(f"{where}: created: expected an ISO 8601 time, got {d['created']!r}") from None
        typed = {"head_dim": int, "seqlen": int, "seqlen_k": int, "batch": int, "heads": int, "kv_heads": int}
        for name, kind in typed.items():
            if not isinstance(values[name], kind) or isinstance(values[name], bool):
                raise StoreError(f"{where}: {name}: expected an integer, got {values[name]!r}")
        if not isinstance(values["causal"], bool):
            raise StoreError(f"{where}: causal: expected true or false, got {values['causal']!r}")
        if not isinstance(values["config"], dict):
            raise StoreError(f"{where}: config: expected an object, got {values['config']!r}")
        try:
            return cls(**values)
        except (TypeError, ValueError) as e:
            raise StoreError(f"{where}: {e}") from None

    @classmethod
    def _from_row(cls, row: _Columns) -> "BestEntry":
        return cls(**{f: getattr(row, f) for f in KEY_FIELDS + VALUE_FIELDS})

    def _columns(self) -> dict[str, Any]:
        d = {f: getattr(self, f) for f in KEY_FIELDS + VALUE_FIELDS}
        d["created"] = _to_naive_utc(self.created)
        return d


@dataclass(frozen=True)
class RecordResult:
    action: str                  # "inserted" | "replaced" (the old row moved to the replaced table) | "kept"
    entry: BestEntry             # the row now in the table for this key
    previous: BestEntry | None   # the row that was there before, if any


@dataclass
class ImportCounts:
    inserted: int = 0
    replaced: int = 0
    kept: int = 0  # the existing row was at least as fast

    def __str__(self) -> str:
        return f"{self.inserted} inserted, {self.replaced} replaced by faster rows, {self.kept} kept (existing row as fast or faster)"


class BestStore:
    """The table behind a storage URL. Methods are the verbs: record_best, lookup, all_rows, export/import."""

    def __init__(self, url: str | None = None):
        self.url = storage_url.prepare(storage_url.resolve_storage_url(url))
        connect_args = {"timeout": 60} if self.url.startswith("sqlite") else {}  # Optuna may hold the write lock
        self.engine = create_engine(self.url, connect_args=connect_args)
        _Base.metadata.create_all(self.engine)  # checkfirst: creates only our missing tables
        self._check_schema()

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> "BestStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- schema ---------------------------------------------------------------------------------------------

    def _check_schema(self) -> None:
        with Session(self.engine) as s, s.begin():
            row = s.get(_MetaRow, SCHEMA_KEY)
            if row is None:
                s.add(_MetaRow(key=SCHEMA_KEY, value=str(SCHEMA_VERSION)))
                return
            found = int(row.value)
        if found > SCHEMA_VERSION:
            raise StoreError(f"{storage_url.describe(self.url)}: table {TABLE} has schema version {found}, newer "
                             f"than this autotune's {SCHEMA_VERSION}; upgrade autotune")
        # found < SCHEMA_VERSION cannot happen yet; a later version migrates here (an alembic revision of ours).

    @property
    def schema_version(self) -> int:
        with Session(self.engine) as s:
            return int(s.get(_MetaRow, SCHEMA_KEY).value)

    # -- verbs ----------------------------------------------------------------------------------------------

    def record_best(self, entry: BestEntry, source: str | None = None) -> RecordResult:
        """Insert `entry`, or replace the row of its key when `entry` is faster; otherwise keep the old row.

        A replaced row is moved to the replaced table with `source` (default "study #trial") as its successor.
        """
        for attempt in range(2):
            try:
                return self._record(entry, source or f"{entry.study} #{entry.trial}")
            except IntegrityError:  # another process inserted the same key between our select and insert
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def _record(self, entry: BestEntry, source: str) -> RecordResult:
        with Session(self.engine) as s, s.begin():
            row = s.scalars(select(_BestRow).filter_by(**dict(zip(KEY_FIELDS, entry.key)))).one_or_none()
            if row is None:
                s.add(_BestRow(**entry._columns()))
                return RecordResult("inserted", entry, None)
            previous = BestEntry._from_row(row)
            if entry.tflops <= previous.tflops:  # ties keep the existing row: no churn, nothing lost
                return RecordResult("kept", previous, previous)
            s.add(_ReplacedRow(**previous._columns(), replaced=_to_naive_utc(utcnow()), replaced_by=source[:512]))
            for name, value in entry._columns().items():
                setattr(row, name, value)
            return RecordResult("replaced", entry, previous)

    def lookup(self, gpu_name: str, arch: str, shape) -> BestEntry | None:
        """The row for exactly this GPU, arch and space.Shape, or None."""
        with Session(self.engine) as s:
            row = s.scalars(select(_BestRow).filter_by(**shape_key(gpu_name, arch, shape))).one_or_none()
            return BestEntry._from_row(row) if row else None

    def all_rows(self, *, gpu: str | None = None, **filters) -> list[BestEntry]:
        """Rows sorted by key. `gpu` matches gpu_name case-insensitively as a substring ('h200' finds
        'NVIDIA H200'); the other filters are exact matches on key columns (arch, dtype, head_dim, causal,
        seqlen, seqlen_k, batch, heads, kv_heads, gpu_name); None means no filter."""
        unknown = sorted(set(filters) - set(KEY_FIELDS))
        if unknown:
            raise ValueError(f"filters: unknown column(s) {unknown}; expected some of {list(KEY_FIELDS)} or gpu")
        query = select(_BestRow).filter_by(**{k: v for k, v in filters.items() if v is not None})
        if gpu:
            query = query.where(_BestRow.gpu_name.ilike(f"%{gpu}%"))
        with Session(self.engine) as s:
            rows = [BestEntry._from_row(r) for r in s.scalars(query)]
        return sorted(rows, key=_sort_key)

    def replaced_rows(self) -> list[dict[str, Any]]:
        """Rows that faster ones replaced, oldest replacement first (kept for the record, never read by the runtime)."""
        with Session(self.engine) as s:
            out = []
            for r in s.scalars(select(_ReplacedRow).order_by(_ReplacedRow.id)):
                d = BestEntry._from_row(r).to_json()
                d.update(replaced=r.replaced.isoformat() + "Z", replaced_by=r.replaced_by)
                out.append(d)
            return out

    def export_json(self, path: str | Path, **filters) -> int:
        """Write the (filtered) rows to `path` as reviewable JSON; returns how many rows were written."""
        rows = self.all_rows(**filters)
        doc = {"format": EXPORT_FORMAT, "schema_version": SCHEMA_VERSION, "rows": [r.to_json() for r in rows]}
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
        tmp.replace(path)  # a reader never sees half a file
        return len(rows)

    def import_json(self, path: str | Path) -> ImportCounts:
        """Merge the rows of an exported file: per key the faster row wins; slower existing rows are moved,
        not deleted. The whole file is validated before anything is written."""
        entries = list(read_export(path))
        counts = ImportCounts()
        for entry in entries:
            result = self.record_best(entry, source=f"import {Path(path).name}")
            setattr(counts, result.action, getattr(counts, result.action) + 1)
        return counts


def read_export(path: str | Path) -> Iterator[BestEntry]:
    """Parse and validate an exported file; errors name the file, the row and the field."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except OSError as e:
        raise StoreError(f"PATH: cannot read {path}: {e.strerror}") from None
    except ValueError as e:
        raise StoreError(f"{path}: not valid JSON: {e}") from None
    if not isinstance(doc, dict) or doc.get("format") != EXPORT_FORMAT:
        raise StoreError(f"{path}: expected an object with \"format\": \"{EXPORT_FORMAT}\" (written by autotune export)")
    version = doc.get("schema_version")
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise StoreError(f"{path}: schema_version {version!r} is not one this autotune reads (≤ {SCHEMA_VERSION})")
    rows = doc.get("rows")
    if not isinstance(rows, list):
        raise StoreError(f"{path}: \"rows\": expected a list")
    entries = [BestEntry.from_json(r, where=f"{path}: rows[{i}]") for i, r in enumerate(rows)]
    seen: dict[tuple, int] = {}
    for i, e in enumerate(entries):
        if e.key in seen:
            raise StoreError(f"{path}: rows[{i}] has the same key as rows[{seen[e.key]}]: {e.key}")
        seen[e.key] = i
    return iter(entries)


def _sort_key(e: BestEntry) -> tuple:
    return tuple(str(v) if isinstance(v, str) else (int(v) if isinstance(v, bool) else v) for v in e.key)


def open_store(storage: str | None = None) -> BestStore:
    return BestStore(storage)


__all__ = ["BestEntry", "BestStore", "ImportCounts", "KEY_FIELDS", "RecordResult", "SCHEMA_VERSION", "StoreError",
           "TABLE", "open_store", "read_export", "shape_key"]
