"""A recorded landscape: every valid config of one shape (for some kernel families), measured once, in one file.

`autotune sweep` writes it, `autotune search --replay` and `autotune compare-samplers` read it. The file is one
JSON object meant to be reviewed in a diff: the header pretty-printed, then one line per config, sorted by
config key:

    {"format": "autotune-landscape", "version": 1,
     "header": {"shape": {...}, "shape_key": ..., "gpu_name": ..., "arch": ..., "date": ...,
                "kernel_source_hash": ..., "nvcc_version": ..., "families": ["wgmma"], "n_valid": 252,
                "measurement": {...how each row was measured...}, "baselines": {"sdpa_flash": TFLOPS, ...}, ...},
     "rows": [
      {"config_key": "wgmma:consumer_wgs=2,...", "status": "complete", "tflops": 512.3, "median_ms": ..., ...},
      ...
     ]}

Re-measurements in later GPU sessions (landscapes/noise.py, benchmarks/landscape_noise.py) are optional and
leave everything above as it was: the header's `sessions` lists each session ({"id", "date", "gpu_name",
"kernel_source_hash", "nvcc_version", "evaluator", "rounds"}), and a re-measured row carries
`"sessions": [{"session": id, "tflops": median of the rounds, "rounds": [TFLOPS, ...], "spread": (max - min) /
median}, ...]` (or `{"session": id, "status": "crashed", "reason": ...}` when it failed that session). Files
without them read as before.

`families` are the families the landscape is exhaustive over: every config of those families that space/ held
valid for the shape and arch at recording time (`n_valid` of them) gets a row once the sweep finished. A row's
status is one of trial.STATUSES but `invalid` (invalid configs are not recorded: space/ recomputes them).
A missing row means "not measured" — never a guess — and readers must treat it as an error.
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import space
from space import Arch, Config, Shape

from ..store.best_table import write_atomically
from ..store.storage_url import default_root, gpu_slug

FORMAT, VERSION = "autotune-landscape", 1
ROW_STATUSES = ("complete", "spilled", "compile_error", "wrong", "crashed", "timeout")
HEADER_REQUIRED = ("shape", "gpu_name", "arch", "date", "kernel_source_hash", "nvcc_version", "families", "n_valid")
# Row fields in the order they are written (so every line of the file reads the same way). Timing is in ms;
# spread is p20..p80 of the timed repetitions; the build figures are ptxas' report.
ROW_FIELDS = ("config_key", "status", "tflops", "median_ms", "p20_ms", "p80_ms", "n_reps", "max_error",
              "registers", "spill_stores", "spill_loads", "stack_bytes", "smem_static", "compile_seconds",
              "blocks_per_sm", "cubin_hash", "same_cubin_as", "reason", "sessions")
BUILD_FIELDS = ("registers", "spill_stores", "spill_loads", "stack_bytes", "smem_static", "compile_seconds")
CUBIN_HASH_CHARS = 16  # equality is all a reader needs (identical cubins are timed once); 64 bits is plenty
REASON_CHARS = 300


class LandscapeError(ValueError):
    """The file is not a valid landscape (the message names the file and what is wrong)."""


@dataclass
class Row:
    config_key: str
    status: str
    tflops: float | None = None
    median_ms: float | None = None
    p20_ms: float | None = None
    p80_ms: float | None = None
    n_reps: int | None = None
    max_error: float | None = None
    registers: int | None = None
    spill_stores: int | None = None
    spill_loads: int | None = None
    stack_bytes: int | None = None
    smem_static: int | None = None
    compile_seconds: float | None = None
    blocks_per_sm: int | None = None
    cubin_hash: str | None = None
    same_cubin_as: str | None = None   # this row copies the timing of that config (identical cubin and geometry)
    reason: str | None = None
    sessions: list | None = None       # re-measurements in later sessions (module docstring), oldest first

    @property
    def config(self) -> Config:
        return Config.from_key(self.config_key)

    @property
    def spread_ms(self) -> float | None:
        return None if self.p20_ms is None or self.p80_ms is None else self.p80_ms - self.p20_ms

    @property
    def has_report(self) -> bool:
        return self.registers is not None

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        return {k: d[k] for k in ROW_FIELDS if d[k] is not None}

    @classmethod
    def from_dict(cls, d: dict) -> "Row":
        unknown = set(d) - set(ROW_FIELDS)
        if unknown:
            raise LandscapeError(f"row {d.get('config_key')!r}: unknown fields {sorted(unknown)}")
        return cls(**d)


@dataclass
class Landscape:
    header: dict[str, Any]
    rows: dict[str, Row] = field(default_factory=dict)  # by config key
    path: Path | None = None                           # where it was loaded from / saved to

    # -- what readers ask -----------------------------------------------------------------------------------

    @property
    def shape(self) -> Shape:
        return Shape(**self.header["shape"])

    @property
    def arch(self) -> Arch:
        return space.get_arch(self.header["arch"])

    @property
    def families(self) -> tuple[str, ...]:
        return tuple(self.header["families"])

    @property
    def name(self) -> str:
        return self.path.stem if self.path else self.header.get("shape_key", "landscape")

    @property
    def sessions(self) -> list[dict]:
        """The re-measurement sessions recorded in the header, oldest first (module docstring)."""
        return list(self.header.get("sessions") or [])

    def row(self, config: Config | str) -> Row | None:
        return self.rows.get(config if isinstance(config, str) else config.key)

    def complete_rows(self) -> list[Row]:
        return [r for r in self.rows.values() if r.status == "complete" and r.tflops]

    @property
    def best(self) -> Row | None:
        done = self.complete_rows()
        return max(done, key=lambda r: r.tflops) if done else None

    @property
    def optimum(self) -> float:
        best = self.best
        if best is None:
            raise LandscapeError(f"{self.name}: no config completed, the landscape has no optimum")
        return best.tflops

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.rows.values():
            out[r.status] = out.get(r.status, 0) + 1
        return out

    def valid_configs(self) -> list[Config]:
        """What space/ holds valid for this shape, arch and families now (may differ from recording time)."""
        return space.valid_configs(self.shape.problem, self.arch, self.families)

    def missing(self) -> list[Config]:
        """Valid configs (by today's space/) without a row: not measured."""
        return [c for c in self.valid_configs() if c.key not in self.rows]

    @property
    def is_complete(self) -> bool:
        return not self.missing()

    def summary(self) -> str:
        """One line: shape, GPU, rows per status, best config and its TFLOPS."""
        counts = ", ".join(f"{s} {n}" for s, n in sorted(self.counts().items(), key=lambda x: ROW_STATUSES.index(x[0])))
        best = self.best
        top = f"best {best.tflops:.1f} TFLOPS {best.config_key}" if best else "no config completed"
        return (f"{self.name}: {self.header.get('shape_key')} on {self.header.get('gpu_name')} "
                f"({self.header.get('arch')}), {len(self.rows)}/{self.header.get('n_valid')} rows ({counts}); {top}")

    # -- writing --------------------------------------------------------------------------------------------

    def add(self, row: Row) -> None:
        self.rows[row.config_key] = row

    def save(self, path: str | Path | None = None) -> Path:
        """Write atomically (a sweep rewrites the file as it goes; a reader never sees half of it, and two
        writers never share a temporary file). Creates the directory: a sweep names where its landscape goes."""
        path = Path(path or self.path)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, dumps(self))
        self.path = path
        return path


# -- header ------------------------------------------------------------------------------------------------


def make_header(shape: Shape, arch: Arch, families: Iterable[str], *, gpu_name: str, kernel_source_hash: str,
                nvcc_version: str, n_valid: int, **extra) -> dict[str, Any]:
    header = {
        "shape": dataclasses.asdict(shape), "shape_key": shape.key, "gpu_name": gpu_name, "arch": arch.name,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "kernel_source_hash": kernel_source_hash, "nvcc_version": nvcc_version, "families": list(families),
        "n_valid": n_valid,
    }
    header.update(extra)
    return header


# -- serialisation -----------------------------------------------------------------------------------------


def _round(x):
    """Floats to 5 significant digits: measurement noise is far above that, and diffs stay readable."""
    if isinstance(x, float) and math.isfinite(x) and x != 0:
        return float(f"{x:.5g}")
    return x


def dumps(landscape: Landscape) -> str:
    rows = sorted(landscape.rows.values(), key=lambda r: r.config_key)
    lines = ["{", f'"format": "{FORMAT}", "version": {VERSION},',
             '"header": ' + json.dumps(landscape.header, indent=1, sort_keys=True) + ",", '"rows": [']
    body = [json.dumps({k: _round(v) for k, v in r.as_dict().items()}) for r in rows]
    lines.append(",\n".join(body))
    lines.append("]}")
    return "\n".join(lines) + "\n"


def upgrade_key(key: str) -> str:
    """A key recorded before an axis was added (space.Axis.default) names the config whose new axes are at their
    defaults: today's key is the old one with those axes put in their places (appended, or between older ones, as
    softmax_reduce before kv_splits). Anything else, e.g. a key whose axes are out of order, is returned as it is
    (and validate() judges it)."""
    try:
        current = Config.from_key(key).key
    except (KeyError, ValueError):
        return key
    given = key.partition(":")[2]
    today = current.partition(":")[2].split(",")
    given_pairs = given.split(",")
    named = {pair.split("=")[0] for pair in given_pairs}
    return current if [pair for pair in today if pair.split("=")[0] in named] == given_pairs else key


def loads(text: str, source: str = "<string>") -> Landscape:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise LandscapeError(f"{source}: not JSON ({e})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise LandscapeError(f"{source}: not an autotune landscape (expected \"format\": \"{FORMAT}\")")
    if data.get("version") != VERSION:
        raise LandscapeError(f"{source}: landscape version {data.get('version')!r}, this autotune reads {VERSION}")
    header = data.get("header")
    if not isinstance(header, dict):
        raise LandscapeError(f"{source}: no header object")
    rows: dict[str, Row] = {}
    for i, d in enumerate(data.get("rows") or []):
        if not isinstance(d, dict) or "config_key" not in d or "status" not in d:
            raise LandscapeError(f"{source}: row {i} needs config_key and status")
        try:
            row = Row.from_dict({**d, **{f: upgrade_key(d[f]) for f in ("config_key", "same_cubin_as") if d.get(f)}})
        except LandscapeError as e:
            raise LandscapeError(f"{source}: {e}") from None
        if row.config_key in rows:
            raise LandscapeError(f"{source}: config {row.config_key} has two rows")
        rows[row.config_key] = row
    landscape = Landscape(header, rows)
    validate(landscape, source)
    return landscape


def load(path: str | Path) -> Landscape:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise LandscapeError(f"{path}: cannot read the landscape ({e.strerror or e})") from None
    landscape = loads(text, str(path))
    landscape.path = path
    return landscape


def validate(landscape: Landscape, source: str = "landscape") -> None:
    """Raise LandscapeError naming the first problem: header fields, shape, arch, families, rows."""
    h = landscape.header
    missing = [k for k in HEADER_REQUIRED if k not in h]
    if missing:
        raise LandscapeError(f"{source}: header lacks {missing}")
    try:
        shape = landscape.shape
        arch = landscape.arch
    except (TypeError, ValueError) as e:
        raise LandscapeError(f"{source}: header shape/arch: {e}") from None
    session_ids = _session_ids(h, source)
    for family in landscape.families:
        if family not in space.FAMILIES:
            raise LandscapeError(f"{source}: unknown family {family!r} (known: {sorted(space.FAMILIES)})")
    for key, row in landscape.rows.items():
        where = f"{source}: row {key}"
        if row.status not in ROW_STATUSES:
            raise LandscapeError(f"{where}: status {row.status!r}, expected one of {list(ROW_STATUSES)}")
        try:
            config = Config.from_key(key)
        except (KeyError, ValueError) as e:
            raise LandscapeError(f"{where}: not a config of today's space ({e})") from None
        if config.key != key:
            raise LandscapeError(f"{where}: not in canonical form ({config.key})")
        if config.family not in landscape.families:
            raise LandscapeError(f"{where}: family {config.family!r} is not among the header's {list(landscape.families)}")
        violations = space.violations(config, shape.problem, arch)
        if violations:
            raise LandscapeError(f"{where}: invalid for {shape.problem.key} on {arch.name} "
                                 f"({'; '.join(map(str, violations))}); the space changed since recording?")
        if row.status == "complete":
            if not (isinstance(row.tflops, (int, float)) and math.isfinite(row.tflops) and row.tflops > 0):
                raise LandscapeError(f"{where}: complete rows need tflops > 0, got {row.tflops!r}")
            if row.median_ms is None:
                raise LandscapeError(f"{where}: complete rows need median_ms")
        if row.status != "compile_error" and not row.has_report:
            raise LandscapeError(f"{where}: a built config needs its build report (registers, spills, ...)")
        if row.same_cubin_as is not None and row.same_cubin_as not in landscape.rows:
            raise LandscapeError(f"{where}: same_cubin_as {row.same_cubin_as} has no row")
        _validate_sessions(row, session_ids, where)


def _session_ids(header: dict, source: str) -> set[str]:
    sessions = header.get("sessions", [])
    if not isinstance(sessions, list) or not all(isinstance(s, dict) and isinstance(s.get("id"), str)
                                                 for s in sessions):
        raise LandscapeError(f"{source}: header sessions: expected a list of objects with an \"id\"")
    ids = [s["id"] for s in sessions]
    if len(set(ids)) != len(ids):
        raise LandscapeError(f"{source}: header sessions: two sessions share an id")
    return set(ids)


def _validate_sessions(row: Row, session_ids: set[str], where: str) -> None:
    if row.sessions is None:
        return
    if not isinstance(row.sessions, list):
        raise LandscapeError(f"{where}: sessions: expected a list, got {row.sessions!r}")
    for e in row.sessions:
        if not isinstance(e, dict) or e.get("session") not in session_ids:
            raise LandscapeError(f"{where}: sessions: {e!r} names no session of the header")
        if "tflops" in e:
            values = e.get("rounds")
            if not (isinstance(values, list) and values and all(_positive(v) for v in values + [e["tflops"]])):
                raise LandscapeError(f"{where}: sessions: {e!r}: expected positive TFLOPS and a list of rounds")
        elif not isinstance(e.get("status"), str):
            raise LandscapeError(f"{where}: sessions: {e!r}: expected tflops and rounds, or a status")


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def short_hash(cubin_hash: str | None) -> str | None:
    return cubin_hash[:CUBIN_HASH_CHARS] if cubin_hash else None


def short_reason(reason: str | None) -> str | None:
    if not reason:
        return None
    text = " ".join(reason.split())
    return text if len(text) <= REASON_CHARS else text[:REASON_CHARS - 1] + "…"


def default_path(shape: Shape, gpu_name: str, families: Iterable[str], root: Path | None = None) -> Path:
    """studies/landscapes/<gpu>-<shape key>-<families>.json under the checkout (or the cwd)."""
    name = f"{gpu_slug(gpu_name)}-{shape.key}-{'+'.join(families)}.json"
    return (root or default_root()) / "studies" / "landscapes" / name


__all__ = ["BUILD_FIELDS", "FORMAT", "Landscape", "LandscapeError", "ROW_FIELDS", "ROW_STATUSES", "Row",
           "VERSION", "default_path", "dumps", "load", "loads", "make_header", "short_hash", "short_reason",
           "validate"]
