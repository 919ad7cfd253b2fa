"""The best configuration per shape: one small table of our own, next to Optuna's tables in the same database.

The runtime and `autotune best` read this table and never parse trials. One row per key

    (gpu_name, arch, dtype, head_dim, causal, causal_align, seqlen, seqlen_k, batch, heads, kv_heads)

holding the winning config with its speed and provenance (study, trial, kernel source hash, nvcc version, date)
and the sha256 of the cubin it was measured with (`cubin_hash`), which the runtime checks a cached kernel against
before it loads it (build/builder.py: a kernel cache may be shared, and is not trusted on its own word).

Nothing a user stored is lost: `record_best` keeps whichever row is faster (or, asked to with
`supersedes_study`, lets a campaign's second pass replace its own study's earlier row whatever the figures), and
when a row replaces another the old one is moved to `autotune_best_replaced` (same columns plus when and by what),
never deleted. Our tables use their own SQLAlchemy metadata, so creating them never touches Optuna's tables, and the
schema version sits in `autotune_meta` (Optuna's `alembic_version` table is Optuna's) and says what an opening
migrates from. Versions: 1, the first; 2 adds the nullable `cubin_hash` to both tables; 3 adds `causal_align`
("upper_left" or "lower_right", space.CAUSAL_ALIGNS) to both tables and to the key: a causal shape with Nq != Nk is
two shapes, one per alignment (for Nq == Nk, or without a mask, the alignment is always "upper_left":
space.canonical_align, so the two spellings of one function are one key). Opening an older table for writing
migrates it (by whichever of several processes opening at once gets there first) and writes 3: cubin_hash by ALTER
TABLE ... ADD COLUMN, causal_align as a column NOT NULL DEFAULT 'upper_left' (what every older row was measured
with) with the unique key rebuilt around it (PostgreSQL: the constraint dropped and added again; SQLite, which
cannot alter a constraint: the table copied into a new one with every row and id, in one transaction). Old rows
keep every value; they have no cubin hash and are upper-left. Version 4 adds the two passes of a campaign
(search/campaign_passes.py), nullable, to both tables: `first_pass_tflops` and `second_pass_tflops`, the shipped
config's figures in the first pass (its search's finale) and in the second (another process, later), whose
geometric mean is the row's `tflops`; and the runner-up's (the finalist next best across both passes):
`runner_up_config_key`, `runner_up_first_tflops`, `runner_up_second_tflops`. A row stored without a second pass
(a single search, an older row) has them null. Opened read-only, an older table is read as it is (nothing is
written), its rows without a hash, upper-left and without passes.

Export/import is reviewable JSON: rows sorted by key, keys sorted, indented; import merges row by row with the
same keep-the-faster rule and reports what it did.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import importlib
import json
import math
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import (JSON, Boolean, DateTime, Float, Integer, MetaData, String, UniqueConstraint, create_engine, false,
                        inspect, select, text, update)
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, defer, mapped_column

import space

from . import storage_url, tables, transient

SCHEMA_VERSION = 4
PASS_FIELDS = ("first_pass_tflops", "second_pass_tflops", "runner_up_config_key", "runner_up_first_tflops",
               "runner_up_second_tflops")
ADDED_COLUMNS = {2: ("cubin_hash",), 3: ("causal_align",), 4: PASS_FIELDS}  # schema version → the columns it added (migrated on a
# writable open; read-only, a column the table lacks reads as its default: ABSENT_DEFAULTS)
KEY_COLUMNS_ADDED = {3: "causal_align"}  # added columns that are part of the unique key (the key is rebuilt)
TABLE = "autotune_best"
REPLACED_TABLE = "autotune_best_replaced"
META_TABLE = "autotune_meta"
SCHEMA_KEY = f"{TABLE}.schema_version"
EXPORT_FORMAT = "autotune-best"

KEY_FIELDS = ("gpu_name", "arch", "dtype", "head_dim", "causal", "causal_align", "seqlen", "seqlen_k", "batch", "heads",
              "kv_heads")
# What a row that lacks a column (an older table read read-only, an older export) means by it.
ABSENT_DEFAULTS = {"causal_align": "upper_left", "cubin_hash": None, **{f: None for f in PASS_FIELDS}}
VALUE_FIELDS = ("family", "config_key", "config", "tflops", "time_ms", "spread_ms", "study", "trial",
                "kernel_source_hash", "nvcc_version", "created", "cubin_hash") + PASS_FIELDS


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
    # schema 3: where the causal mask is aligned (space.CAUSAL_ALIGNS); "upper_left" for every older row
    causal_align: Mapped[str] = mapped_column(String(16), default="upper_left", server_default="upper_left")
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
    cubin_hash: Mapped[str | None] = mapped_column(String(64), nullable=True)  # schema 2: sha256 of the cubin timed
    # schema 4: a campaign's two passes (module docstring)
    first_pass_tflops: Mapped[float | None] = mapped_column(Float, nullable=True)
    second_pass_tflops: Mapped[float | None] = mapped_column(Float, nullable=True)
    runner_up_config_key: Mapped[str | None] = mapped_column(String(512), nullable=True)
    runner_up_first_tflops: Mapped[float | None] = mapped_column(Float, nullable=True)
    runner_up_second_tflops: Mapped[float | None] = mapped_column(Float, nullable=True)


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
                causal_align=shape.causal_align, seqlen=shape.seqlen_q, seqlen_k=shape.seqlen_k, batch=shape.batch, heads=shape.heads,
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
    cubin_hash: str | None = None  # sha256 (hex) of the cubin the row was measured with; None for older rows
    causal_align: str = "upper_left"  # part of the key (KEY_FIELDS); space.canonical_align keeps one spelling
    # A campaign's two passes (module docstring); None for a row stored without a second pass.
    first_pass_tflops: float | None = None
    second_pass_tflops: float | None = None
    runner_up_config_key: str | None = None
    runner_up_first_tflops: float | None = None
    runner_up_second_tflops: float | None = None

    def __post_init__(self):
        if not isinstance(self.tflops, (int, float)) or not math.isfinite(self.tflops) or self.tflops <= 0:
            raise ValueError(f"tflops: expected a positive finite number, got {self.tflops!r}")
        if not isinstance(self.causal_align, str) or self.causal_align not in space.CAUSAL_ALIGNS:
            raise ValueError(f"causal_align: expected one of {space.CAUSAL_ALIGNS}, got {self.causal_align!r}")
        if self.causal_align != "upper_left" and (not self.causal or self.seqlen == self.seqlen_k):
            object.__setattr__(self, "causal_align", "upper_left")  # the same function: the same key
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
                           head_dim=self.head_dim, dtype=self.dtype, causal=self.causal, kv_heads=self.kv_heads,
                           causal_align=self.causal_align)

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["created"] = self.created.astimezone(dt.timezone.utc).isoformat().replace("+00:00", "Z")
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any], where: str = "row") -> "BestEntry":
        if not isinstance(d, dict):
            raise StoreError(f"{where}: expected an object, got {type(d).__name__}")
        missing = [f for f in KEY_FIELDS + ("family", "config_key", "config", "tflops")
                   if f not in d and f not in ABSENT_DEFAULTS]
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
        if "causal_align" in values and values["causal_align"] not in space.CAUSAL_ALIGNS:
            raise StoreError(f"{where}: causal_align: expected one of {', '.join(map(repr, space.CAUSAL_ALIGNS))}, "
                             f"got {values['causal_align']!r}")
        if not isinstance(values["config"], dict):
            raise StoreError(f"{where}: config: expected an object, got {values['config']!r}")
        try:
            return cls(**values)
        except (TypeError, ValueError) as e:
            raise StoreError(f"{where}: {e}") from None

    @classmethod
    def _from_row(cls, row: _Columns) -> "BestEntry":
        unread = sa_inspect(row).unloaded  # columns a version-1 table lacks (BestStore._query): their defaults
        return cls(**{f: getattr(row, f) for f in KEY_FIELDS + VALUE_FIELDS if f not in unread})

    def _columns(self) -> dict[str, Any]:
        d = {f: getattr(self, f) for f in KEY_FIELDS + VALUE_FIELDS}
        d["created"] = _to_naive_utc(self.created)
        return d


def parse_config_key(key: str) -> space.Config:
    """Config.from_key, registering the key's family first: space/__init__ imports only some families (a table
    from a search over another family must not look invalid because nothing imported space/<family>.py yet)."""
    family = key.partition(":")[0]
    if family not in space.FAMILIES and family.isidentifier():
        try:
            importlib.import_module(f"space.{family}")
        except ModuleNotFoundError:
            pass  # from_key's error names the unknown family
    return space.Config.from_key(key)


def row_problem(e: BestEntry) -> str | None:
    """Why the runtime could not use row `e`, or None. The one check of every row that comes from outside the
    search (imported, shipped, or read back from a storage someone may have edited): a known arch and a valid
    shape; a config key naming a known family, its axes and values in their domains; a config dict that is the
    same config, of the row's family; the space's rules for the row's own problem and arch; positive finite
    figures (tflops is checked when the entry is made)."""
    try:
        arch = space.get_arch(e.arch)
    except (ValueError, KeyError) as err:
        return f"arch: {err}"
    try:
        shape = e.shape
    except (ValueError, TypeError) as err:
        return f"not a valid shape: {err}"
    try:
        config = parse_config_key(e.config_key)
    except (ValueError, KeyError, TypeError) as err:
        return f"config_key {e.config_key!r} not understood: {err}"
    try:
        as_dict = space.Config.from_dict(e.config)
    except (ValueError, KeyError, TypeError) as err:
        return f"config {e.config!r} not understood: {err}"
    if as_dict != config:
        differ = sorted(n for n, v in config.as_dict().items() if as_dict.as_dict().get(n) != v)
        return f"config contradicts config_key {e.config_key!r} (they differ in {', '.join(differ)})"
    if e.family != config.family:
        return f"family {e.family!r} contradicts config_key {e.config_key!r}"
    for name, low in (("time_ms", "positive"), ("spread_ms", "non-negative")):
        v = getattr(e, name)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 or (
                low == "positive" and v == 0):
            return f"{name}: expected a {low} finite number, got {v!r}"
    for name in ("first_pass_tflops", "second_pass_tflops", "runner_up_first_tflops", "runner_up_second_tflops"):
        v = getattr(e, name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0):
            return f"{name}: expected a positive finite number or null, got {v!r}"
    if e.runner_up_config_key is not None:
        try:
            parse_config_key(e.runner_up_config_key)
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            return f"runner_up_config_key {e.runner_up_config_key!r} not understood: {err}"
    elif e.runner_up_first_tflops is not None or e.runner_up_second_tflops is not None:
        return "runner_up_first_tflops/runner_up_second_tflops: given without runner_up_config_key"
    if e.trial is not None and (isinstance(e.trial, bool) or not isinstance(e.trial, int) or e.trial < 0):
        return f"trial: expected a trial number, got {e.trial!r}"
    if e.cubin_hash is not None and not (isinstance(e.cubin_hash, str) and re.fullmatch(r"[0-9a-f]{64}", e.cubin_hash)):
        return f"cubin_hash: expected a sha256 in hex (64 characters 0-9a-f), got {e.cubin_hash!r}"
    broken = space.violations(config, shape.problem, arch)
    if broken:
        return f"{e.config_key} cannot run on {arch.name} for {shape.problem.key}: {'; '.join(map(str, broken))}"
    return None


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
    skipped: list[str] = field(default_factory=list)  # rows not imported, each "<file>: rows[i]: why"

    def __str__(self) -> str:
        text = (f"{self.inserted} inserted, {self.replaced} replaced by faster rows, {self.kept} kept (existing row "
                "as fast or faster)")
        return text + (f", {len(self.skipped)} skipped (not usable)" if self.skipped else "")


class BestStore:
    """The table behind a storage URL. Methods are the verbs: record_best, lookup, all_rows, export/import."""

    def __init__(self, url: str | None = None, *, read_only: bool = False, thorough: bool = True):
        """Open the table behind `url` (resolved like the search's --storage). `read_only` (best, export, the
        runtime): a missing SQLite file is a StorageError rather than a new empty database, and nothing is
        created or written, not even our tables in a storage that lacks them (it then reads as empty).
        Storage mistakes (malformed URL, missing directory or file, corrupt file, no server) raise
        storage_url.StorageError before anything is opened (`thorough`: see storage_url.prepare)."""
        self.read_only = read_only
        self.skipped: list[str] = []  # the rows the last all_rows() left out, each with why
        self.kept = 0  # the rows the last export_json(merge=True) kept from the file it replaced
        self.url = storage_url.prepare(storage_url.resolve_storage_url(url), create=not read_only, thorough=thorough)
        connect_args = {"timeout": 60} if self.url.startswith("sqlite") else {}  # Optuna may hold the write lock
        self.engine = create_engine(self.url, connect_args=connect_args)
        try:
            if read_only:
                self._has_table = inspect(self.engine).has_table(TABLE)
            else:
                # hosts finishing together (tables.py), through a server restart (transient.py)
                transient.call(tables.create_missing, _Base.metadata, self.engine, reset=self.engine.dispose)
                self._has_table = True
            self._check_schema()
        except SQLAlchemyError as e:  # passed prepare's checks, failed on use: still one line, still untouched
            self.engine.dispose()
            raise storage_url.StorageError(f"{storage_url.describe(self.url)}: {storage_url.first_line(e)}") from None

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> "BestStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- schema ---------------------------------------------------------------------------------------------

    def _check_schema(self) -> None:
        self._unread: tuple[str, ...] = ()  # columns the table lacks (an older schema read read-only)
        if self.read_only:
            if not inspect(self.engine).has_table(META_TABLE):
                return
            with Session(self.engine) as s:
                row = s.get(_MetaRow, SCHEMA_KEY)
                if row is None:
                    return
                found = int(row.value)
        else:
            try:
                found = self._write_schema_version()
            except IntegrityError:  # another process inserted it between our read and our insert: read theirs
                found = self._write_schema_version()
            if found is None:
                return
        if found > SCHEMA_VERSION:
            raise StoreError(f"{storage_url.describe(self.url)}: table {TABLE} has schema version {found}, newer "
                             f"than this autotune's {SCHEMA_VERSION}; upgrade autotune")
        added = tuple(c for version in range(found + 1, SCHEMA_VERSION + 1) for c in ADDED_COLUMNS.get(version, ()))
        if not added:
            return
        if self.read_only:
            present = {c["name"] for c in inspect(self.engine).get_columns(TABLE)} if self._has_table else set()
            self._unread = tuple(c for c in added if c not in present)
            return
        self._migrate(found, added)

    def _migrate(self, found: int, added: tuple[str, ...]) -> None:
        """From schema `found` to SCHEMA_VERSION: add the columns the versions since added, to both tables (old rows
        keep every value: a new column is nullable, or NOT NULL with the default every older row was measured
        with), and rebuild the unique key around the added key columns. Several processes may migrate at once: a
        column another one added between our look and our ALTER is fine, and each key rebuild looks again under
        the table's lock."""
        key_added = [c for v, c in KEY_COLUMNS_ADDED.items() if v > found]
        for table in (TABLE, REPLACED_TABLE):
            for name in added:
                if table == TABLE and name in key_added and self.engine.dialect.name == "sqlite":
                    continue  # the copy into a rebuilt table adds it (_rebuild_sqlite_key)
                if name in {c["name"] for c in inspect(self.engine).get_columns(table)}:
                    continue
                try:
                    with self.engine.begin() as conn:
                        conn.execute(text(f"ALTER TABLE {table} ADD COLUMN {name} {self._column_ddl(name)}"))
                except SQLAlchemyError:
                    if name not in {c["name"] for c in inspect(self.engine).get_columns(table)}:
                        raise
        if key_added:
            transient.call(self._rebuild_key, reset=self.engine.dispose)
        with Session(self.engine) as s, s.begin():  # written last: a migration cut short is done again next time
            row = s.get(_MetaRow, SCHEMA_KEY)
            if int(row.value) < SCHEMA_VERSION:
                row.value = str(SCHEMA_VERSION)

    def _column_ddl(self, name: str) -> str:
        """The type (and NOT NULL DEFAULT, for a column older rows have a value for) of an added column."""
        column = _BestRow.__table__.c[name]
        kind = column.type.compile(dialect=self.engine.dialect)
        if column.nullable:
            return kind
        return f"{kind} NOT NULL DEFAULT '{ABSENT_DEFAULTS[name]}'"

    def _key_is_current(self, conn) -> bool:
        want = set(KEY_FIELDS)
        return any(set(u["column_names"]) == want for u in inspect(conn).get_unique_constraints(TABLE))

    def _rebuild_key(self) -> None:
        """The unique key over KEY_FIELDS, in one transaction under the table's lock, if it is not so already."""
        name = f"uq_{TABLE}_shape"
        with self.engine.begin() as conn:
            if self.engine.dialect.name == "sqlite":
                # pysqlite begins a transaction at the first write: this no-op one takes the write lock, so a second
                # process migrating at once waits here and then finds the key rebuilt
                conn.execute(update(_MetaRow).where(_MetaRow.key == SCHEMA_KEY).values(value=_MetaRow.value))
                if not self._key_is_current(conn):
                    self._rebuild_sqlite_key(conn)
                return
            conn.execute(text(f"LOCK TABLE {TABLE} IN ACCESS EXCLUSIVE MODE"))
            if self._key_is_current(conn):
                return
            conn.execute(text(f"ALTER TABLE {TABLE} DROP CONSTRAINT IF EXISTS {name}"))
            conn.execute(text(f"ALTER TABLE {TABLE} ADD CONSTRAINT {name} UNIQUE ({', '.join(KEY_FIELDS)})"))

    def _rebuild_sqlite_key(self, conn) -> None:
        """SQLite cannot alter a table's constraints: create the table anew beside it, copy every row (ids
        included; the key columns a version added take their ABSENT_DEFAULTS), drop the old one, rename."""
        from sqlalchemy.schema import CreateTable

        new = f"{TABLE}__rebuilt"
        have = {c["name"] for c in inspect(conn).get_columns(TABLE)}
        conn.execute(text(f"DROP TABLE IF EXISTS {new}"))  # left by nothing (one transaction), but be sure
        ddl = str(CreateTable(_BestRow.__table__).compile(dialect=self.engine.dialect))
        conn.execute(text(ddl.replace(f"CREATE TABLE {TABLE} ", f"CREATE TABLE {new} ", 1)))
        columns = [c.name for c in _BestRow.__table__.columns]
        values = [c if c in have else f"'{ABSENT_DEFAULTS[c]}'" if ABSENT_DEFAULTS.get(c) is not None else "NULL"
                  for c in columns]
        conn.execute(text(f"INSERT INTO {new} ({', '.join(columns)}) SELECT {', '.join(values)} FROM {TABLE}"))
        conn.execute(text(f"DROP TABLE {TABLE}"))
        conn.execute(text(f"ALTER TABLE {new} RENAME TO {TABLE}"))

    def _query(self, *where, **filters):
        """select(_BestRow) for the columns the table has (an older schema read read-only lacks some: a filter on
        one of those matches every row when it asks for the value older rows mean, ABSENT_DEFAULTS, else none)."""
        absent = {k: v for k, v in filters.items() if k in self._unread}
        query = select(_BestRow).filter_by(**{k: v for k, v in filters.items() if k not in absent})
        if any(v != ABSENT_DEFAULTS.get(k) for k, v in absent.items()):
            query = query.where(false())
        if where:
            query = query.where(*where)
        return query.options(*(defer(getattr(_BestRow, c), raiseload=True) for c in self._unread))

    def _write_schema_version(self) -> int | None:
        """The stored schema version, or None after writing ours into a table that had none."""
        with Session(self.engine) as s, s.begin():
            row = s.get(_MetaRow, SCHEMA_KEY)
            if row is None:
                s.add(_MetaRow(key=SCHEMA_KEY, value=str(SCHEMA_VERSION)))
                return None
            return int(row.value)

    @property
    def schema_version(self) -> int:
        with Session(self.engine) as s:
            return int(s.get(_MetaRow, SCHEMA_KEY).value)

    # -- verbs ----------------------------------------------------------------------------------------------

    def record_best(self, entry: BestEntry, source: str | None = None, *,
                    supersedes_study: str | None = None) -> RecordResult:
        """Insert `entry`, or replace the row of its key when `entry` is faster; otherwise keep the old row.

        `supersedes_study`: a row recorded from that study is replaced whatever the figures (a campaign's second
        pass, campaign_passes.py, decides again what an earlier pass of the same study stored); a row of any
        other study is still kept when it is at least as fast. A replaced row is moved to the replaced table with
        `source` (default "study #trial") as its successor.
        """
        if self.read_only:
            raise StoreError(f"{storage_url.describe(self.url)}: opened read-only; cannot record a row")
        for attempt in range(2):
            try:
                # One transaction, retried through a server restart like every storage call (transient.py). A try
                # whose commit went through just before its connection broke is read back by the next: "kept".
                return transient.call(self._record, entry, source or f"{entry.study} #{entry.trial}",
                                      supersedes_study, reset=self.engine.dispose)
            except IntegrityError:  # another process inserted the same key between our select and insert
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def _record(self, entry: BestEntry, source: str, supersedes_study: str | None = None) -> RecordResult:
        with Session(self.engine) as s, s.begin():
            # Lock before reading, so that a second process recording this shape waits for our commit and compares
            # against our row, rather than replacing the row we replaced and losing ours (test_distributed: two
            # processes recording at once). PostgreSQL: FOR UPDATE. SQLite ignores FOR UPDATE, and pysqlite opens
            # the transaction only at the first write, so a no-op write to our schema row takes its write lock.
            if self.engine.dialect.name == "sqlite":
                s.execute(update(_MetaRow).where(_MetaRow.key == SCHEMA_KEY).values(value=_MetaRow.value))
            row = s.scalars(select(_BestRow).filter_by(**dict(zip(KEY_FIELDS, entry.key))).with_for_update()
                            ).one_or_none()
            if row is None:
                s.add(_BestRow(**entry._columns()))
                return RecordResult("inserted", entry, None)
            previous = BestEntry._from_row(row)
            # A later pass of the row's own study replaces it whatever the figures; the row itself (a retry whose
            # commit went through) is kept. Otherwise ties keep the existing row: no churn, nothing lost.
            superseded = supersedes_study is not None and previous.study == supersedes_study
            if (entry.tflops <= previous.tflops and not superseded) or previous._columns() == entry._columns():
                return RecordResult("kept", previous, previous)
            s.add(_ReplacedRow(**previous._columns(), replaced=_to_naive_utc(utcnow()), replaced_by=source[:512]))
            for name, value in entry._columns().items():
                setattr(row, name, value)
            return RecordResult("replaced", entry, previous)

    def lookup(self, gpu_name: str, arch: str, shape) -> BestEntry | None:
        """The row for exactly this GPU, arch and space.Shape, or None."""
        if not self._has_table:
            return None
        with Session(self.engine) as s:
            row = s.scalars(self._query(**shape_key(gpu_name, arch, shape))).one_or_none()
            return BestEntry._from_row(row) if row else None

    def all_rows(self, *, gpu: str | None = None, **filters) -> list[BestEntry]:
        """Rows sorted by key; rows that fail `row_problem` are left out and named in `self.skipped`. `gpu`
        matches gpu_name by storage_url.gpu_matches (case-insensitive substring: 'h200' finds 'NVIDIA H200'); the
        other filters are exact matches on key columns (arch, dtype, head_dim, causal, seqlen, seqlen_k, batch,
        heads, kv_heads, gpu_name); None means no filter."""
        unknown = sorted(set(filters) - set(KEY_FIELDS))
        if unknown:
            raise ValueError(f"filters: unknown column(s) {unknown}; expected some of {list(KEY_FIELDS)} or gpu")
        if not self._has_table:  # a read-only storage our tables were never created in (an Optuna-only one)
            return []
        query = self._query(**{k: v for k, v in filters.items() if v is not None})
        rows, self.skipped = [], []
        with Session(self.engine) as s:
            for r in s.scalars(query):
                # One bad row (edited by hand, written by another version) costs that row, not the table.
                try:
                    e = BestEntry._from_row(r)
                    problem = row_problem(e)
                except (ValueError, TypeError) as err:
                    problem = str(err)
                if gpu and not storage_url.gpu_matches(gpu, r.gpu_name):  # the CLI's one rule, not SQL's LIKE
                    continue
                if problem:
                    self.skipped.append(f"{storage_url.describe(self.url)}: {TABLE} row id {r.id} ({r.gpu_name} "
                                        f"{r.arch} {r.dtype} d{r.head_dim} seqlen {r.seqlen}): {problem}")
                else:
                    rows.append(e)
        return sorted(rows, key=_sort_key)

    def gpu_names(self) -> list[str]:
        """The GPU names the table holds rows for (what a --gpu that matched nothing could have meant)."""
        if not self._has_table:
            return []
        with Session(self.engine) as s:
            return sorted(set(s.scalars(select(_BestRow.gpu_name))))

    def replaced_rows(self) -> list[dict[str, Any]]:
        """Rows that faster ones replaced, oldest replacement first (kept for the record, never read by the runtime)."""
        if not inspect(self.engine).has_table(REPLACED_TABLE):
            return []
        with Session(self.engine) as s:
            out = []
            query = select(_ReplacedRow).order_by(_ReplacedRow.id).options(
                *(defer(getattr(_ReplacedRow, c), raiseload=True) for c in self._unread))
            for r in s.scalars(query):
                d = BestEntry._from_row(r).to_json()
                d.update(replaced=r.replaced.isoformat() + "Z", replaced_by=r.replaced_by)
                out.append(d)
            return out

    def export_json(self, path: str | Path, *, force: bool = False, merge: bool = False, **filters) -> int:
        """Write the (filtered) rows to `path` as reviewable JSON; returns how many rows were written.

        An empty selection is not written over a file that holds something (a mistyped --gpu or --storage must
        not wipe a shipped table): StoreError saying so, unless `force`. The file is replaced atomically (a
        temporary file in the same directory, then os.replace), so on any error it is left as it was.
        `merge`: the rows `path` already holds for shapes the selection has no row for are kept (a storage that
        retuned some shapes updates a shipped table without dropping the others); a row of the same shape is
        replaced by the storage's, the newer measurement. `self.kept` counts the rows kept from the file; its
        unusable rows are named in `self.skipped`."""
        rows = self.all_rows(**filters)
        self.kept = 0
        if merge and Path(path).exists():
            held = read_export(path)
            keys = {r.key for r in rows}
            kept = [e for e in held.entries if e.key not in keys]
            self.skipped = [*self.skipped, *held.skipped]
            self.kept = len(kept)
            rows = sorted(rows + kept, key=_sort_key)
        doc = {"format": EXPORT_FORMAT, "schema_version": SCHEMA_VERSION, "rows": [r.to_json() for r in rows]}
        path = Path(path)
        if not rows and not force:
            held = _held_by(path)
            if held:
                raise StoreError(f"{path}: the storage {storage_url.describe(self.url)} has no rows that match "
                                 f"the filters, and {path} holds {held}; nothing was written (check --gpu, "
                                 "--storage and the other filters, or pass --force to write an empty table)")
        write_atomically(path, json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
        return len(rows)

    def import_json(self, path: str | Path) -> ImportCounts:
        """Merge the rows of an exported file: per key the faster row wins; slower existing rows are moved,
        not deleted. Every row is checked first (read_export): a bad row is skipped and named in the counts'
        `skipped`, the good rows are imported; a file that is not an export imports nothing (StoreError)."""
        rows = read_export(path)
        counts = ImportCounts(skipped=list(rows.skipped))
        for entry in rows.entries:
            result = self.record_best(entry, source=f"import {Path(path).name}")
            setattr(counts, result.action, getattr(counts, result.action) + 1)
        return counts


@dataclass
class ExportRows:
    """The rows of an exported file that can be used, and the ones that cannot, each as "<file>: rows[i]: why"."""

    path: Path
    entries: list[BestEntry]
    skipped: list[str]


def read_export(path: str | Path) -> ExportRows:
    """Parse and check an exported file. A file that is not an export (unreadable, not JSON, another format or a
    newer schema) is a StoreError; a row that is not usable (malformed, or failing `row_problem`, or repeating
    an earlier row's key) is skipped and named in `skipped` with its index, and the good rows are kept."""
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
    out = ExportRows(path, [], [])
    seen: dict[tuple, int] = {}
    for i, r in enumerate(rows):
        where = f"{path}: rows[{i}]"
        try:
            e = BestEntry.from_json(r, where=where)
        except StoreError as err:
            out.skipped.append(str(err))
            continue
        problem = row_problem(e)
        if problem:
            out.skipped.append(f"{where}: {problem}")
        elif e.key in seen:
            out.skipped.append(f"{where} has the same key as rows[{seen[e.key]}]: {e.key}")
        else:
            seen[e.key] = i
            out.entries.append(e)
    return out


def _held_by(path: Path) -> str | None:
    """What a file that an export would replace holds, in words; None when it is missing, empty or an export
    of no rows (replacing those loses nothing)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError):
        return "data that is not an export"
    if not text.strip():
        return None
    try:
        doc = json.loads(text)
    except ValueError:
        return "data that is not an export"
    if isinstance(doc, dict) and doc.get("format") == EXPORT_FORMAT and isinstance(doc.get("rows"), list):
        return f"{len(doc['rows'])} row(s)" if doc["rows"] else None
    return "data that is not an export"


def write_atomically(path: Path, text: str) -> None:
    """Replace `path` with `text` all at once: a reader (or a crash) sees the old file or the new one, never half
    of one; on an error the old file is left as it was and no temporary file stays behind. The directory must
    exist (a mistyped path must not create directories). A replaced file keeps its permissions."""
    directory = path.parent
    if not directory.is_dir():
        raise StoreError(f"{path}: directory {directory} does not exist; create it or fix the path")
    try:
        mode = path.stat().st_mode & 0o777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def row_matches(e: BestEntry, *, gpu: str | None = None, **filters) -> bool:
    """all_rows' filters applied to one row in memory (for rows that are not in a storage: shipped tables)."""
    if gpu and not storage_url.gpu_matches(gpu, e.gpu_name):
        return False
    return all(v is None or getattr(e, k) == v for k, v in filters.items())


def _sort_key(e: BestEntry) -> tuple:
    return tuple(str(v) if isinstance(v, str) else (int(v) if isinstance(v, bool) else v) for v in e.key)


def open_store(storage: str | None = None) -> BestStore:
    return BestStore(storage)


__all__ = ["BestEntry", "BestStore", "ExportRows", "ImportCounts", "parse_config_key", "row_matches", "row_problem", "KEY_FIELDS", "RecordResult", "SCHEMA_VERSION", "StoreError",
           "TABLE", "open_store", "read_export", "shape_key"]
