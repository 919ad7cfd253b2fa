"""Which configuration runs for a shape at run time, and the kernel that implements it.

Lookup order for `select_config(shape, gpu_name, arch)`, first hit wins:

  1. storage    the user's best-per-shape table (autotune/store/best_table.py) behind the storage URL, resolved like
                `autotune search` does (argument → $AUTOTUNE_STORAGE → studies/autotune.db): the exact key, the
                causal mask's alignment included (a lower-right call never gets an upper-left row of Nq != Nk; for
                Nq == Nk the two are one key, space.canonical_align).
  2. shipped    the tuned tables shipped in studies/tuned/*.json (the `autotune export` format): the exact key.
                (Then, still exact: the shape's capture bucket in 1 and 2, and a row that benchmark mode measured for
                the shape; row_order.py.)
  3. same_arch  a shipped row of the exact key tuned on another GPU of the same arch (the H200's table on an H100:
                one die, the same shared memory): it compiles the same kernel, tuned for this very shape, where a
                neighbour shape's config (4) was tuned for other waves and tails, so a few rows of this GPU (a
                user's, or a short shipped table) never hide another GPU's exact rows from this GPU's other shapes.
  4. nearest    the closest tuned shape, from 1 and 2, on the same GPU name, arch, dtype, head_dim
                and causal flag (those decide the compiled kernel; the rest only its speed), and of the same causal
                alignment unless either shape is square (Nq == Nk, where the two alignments are one mask):

                    d = sqrt( ½·(log2 Nq − log2 Nq')² + ½·(log2 Nk − log2 Nk')² + (log2 B·H − log2 B'·H')² )

                so a factor of 2 in seqlen or in batch·heads is a distance of 1 (for Nq = Nk the first two terms
                are the single "log seqlen" term). Ties (equal d within 1e-9) go to the closer GQA group size
                |log2(H/Hkv) − log2(H'/Hkv')|, then to the user's storage over shipped tables, then to the
                smaller key (seqlen, seqlen_k, batch, heads, kv_heads in that order): deterministic.
                Decode shapes (seqlen_q <= space.DECODE_MAX_QUERIES) take only decode rows, prefill only prefill rows;
                then, with no row of this GPU, the nearest row of another GPU of the arch (source same_arch).
                A same_arch row beats the pure default by far on prefill (docs/benchmarks.md); explain() names the
                GPU it was tuned on, and benchmark mode still measures it, as it does a nearest row.
  5. heuristic  `space.default_config_for_shape(shape, arch)`, a pure function (the family's decode default for
                decode shapes: split-KV and packed GQA heads on sm_90, space/wgmma.py decode_default; split-KV
                elsewhere, space/mma_sync.py decode_default).

Every row is checked as it is read (store.best_table.row_problem: known family, axes and values, config dict
agreeing with the key, the space's rules, positive finite figures), and again against this arch and problem
(`space.violations`); a row that fails (a hand-edited table, a table from another version of the space) is
skipped with an `InvalidRowWarning` naming it (a shipped file's row by its index), never launched, and the rest
of its file or storage is kept. The user's storage is opened read-only: nothing is ever created or written.

Caching, per process: the rows of one (storage URL, GPU, arch, problem) are read once; shipped tables are parsed
once per directory; selections are memoized by (GPU, arch, shape, storage URL, tables dir); `resolve()` memoizes
the built, loaded kernel by (device index, shape, storage URL). A warm call therefore does no disk or DB work;
`clear_caches()` forgets everything (e.g. after a search in another process).

This module imports no torch at import time; only `resolve()` (which loads kernels) needs it.
"""
from __future__ import annotations

import dataclasses
import math
import os
import sys
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import space
from space import Arch, Config, Problem, Shape

from ..build.builder import Builder
from . import row_order
from ..store import storage_url
from ..store.nearest import alignment_fits, distance

SOURCES = ("storage", "shipped", "nearest", "same_arch", "heuristic")
# best_table.PASS_FIELDS, named here so that reading a selection costs no sqlalchemy import
PASS_FIELDS = ("first_pass_tflops", "second_pass_tflops", "runner_up_config_key", "runner_up_first_tflops",
               "runner_up_second_tflops")
TIE_EPSILON = 1e-9


class InvalidRowWarning(UserWarning):
    """A tuned row was skipped because its config cannot run on this arch/problem (or does not parse)."""


class StorageWarning(UserWarning):
    """The user's storage could not be read; the lookup went on without it."""


# Per-process caches (see the module docstring); every one is cleared by clear_caches().
_lock = threading.RLock()
_shipped: dict[Path, tuple[Candidate, ...]] = {}
_storage_rows: dict[tuple, tuple[Candidate, ...]] = {}
_skipped_rows: dict[Any, tuple[str, ...]] = {}  # per tables dir / storage key: the rows left out, and why
_selections: dict[tuple, "Selection"] = {}
_plans: dict[tuple, "Plan"] = {}
_builders: dict[str, Any] = {}
_devices: dict[int, tuple[str, Arch]] = {}
_default_tables: list[Path | None] = []
_default_urls: dict[str | None, str] = {}


def clear_caches() -> None:
    """Forget every cached row, selection, build and device: the next call looks everything up again."""
    with _lock:
        for cache in (_shipped, _storage_rows, _skipped_rows, _selections, _plans, _builders, _devices, _default_tables,
                      _default_urls):
            cache.clear()


def storage_key(storage: str | None = None) -> str:
    """storage_url.resolve_storage_url(storage), without its disk work on repeat calls: the default URL (which
    looks for the checkout on disk) is computed once per value of $AUTOTUNE_STORAGE, so a warm call costs one
    environment read and an environment change still takes effect."""
    if storage is not None:
        return storage_url.resolve_storage_url(storage)
    env = os.environ.get(storage_url.ENV_VAR)
    url = _default_urls.get(env)
    if url is None:
        url = _default_urls[env] = storage_url.resolve_storage_url(None)
    return url


# ---- where rows come from -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Candidate:
    """One tuned row and where it came from: origin 'storage' or 'shipped', `where` the URL or file."""

    entry: Any  # best_table.BestEntry
    origin: str
    where: str

    @property
    def shape(self) -> Shape:
        return self.entry.shape


def shipped_tables_dir() -> Path | None:
    """studies/tuned/ of the checkout this package runs from, else the package data `autotune._tuned`
    (looked up once per process: the answer is part of every selection's memo key)."""
    if _default_tables:
        return _default_tables[0]
    _default_tables.append(_find_tables_dir())
    return _default_tables[0]


def _find_tables_dir() -> Path | None:
    checkout = Path(__file__).resolve().parents[2] / "studies" / "tuned"
    if checkout.is_dir():
        return checkout
    try:
        import importlib.resources

        packaged = Path(str(importlib.resources.files("autotune._tuned")))
        return packaged if packaged.is_dir() else None
    except (ModuleNotFoundError, TypeError):
        return None


def shipped_candidates(tables_dir: Path | None) -> tuple[Candidate, ...]:
    """Every usable row of every *.json in tables_dir (parsed once per process). A file that does not parse, or
    a row that best_table.row_problem rejects, is skipped with a warning: a broken shipped table must not take
    attention() down with it, nor one bad row the rest of its file."""
    if tables_dir is None:
        return ()
    tables_dir = Path(tables_dir)
    with _lock:
        cached = _shipped.get(tables_dir)
        if cached is not None:
            return cached
        from ..store.best_table import StoreError, read_export  # sqlalchemy: only when a table is read

        out: list[Candidate] = []
        skipped: list[str] = []
        for path in sorted(tables_dir.glob("*.json")):
            try:
                rows = read_export(path)
            except StoreError as e:
                warnings.warn(f"autotune: skipping shipped table {path}: {e}", InvalidRowWarning, stacklevel=2)
                continue
            for why in rows.skipped:  # one bad row costs that row; the file's good rows are kept
                warnings.warn(f"autotune: skipping shipped row {why}", InvalidRowWarning, stacklevel=2)
                skipped.append(f"skipped shipped row {why}")
            out += [Candidate(e, "shipped", str(path)) for e in rows.entries]
        _skipped_rows[tables_dir] = tuple(skipped)
        _shipped[tables_dir] = tuple(out)
        return _shipped[tables_dir]


def storage_candidates(url: str, gpu_name: str, arch: Arch, problem: Problem) -> tuple[Candidate, ...]:
    """The rows of the user's storage for one GPU, arch and problem (read once per process).

    A SQLite file that does not exist is not created (the runtime only reads); a storage that cannot be read
    is skipped with a StorageWarning so that attention() still runs on shipped tables or the default.
    """
    key = (url, gpu_name, arch.name, problem)
    with _lock:
        cached = _storage_rows.get(key)
        if cached is not None:
            return cached
        rows, skipped = _read_storage(url, gpu_name, arch, problem)
        _skipped_rows[key] = skipped
        _storage_rows[key] = rows
        return rows


def _read_storage(url: str, gpu_name: str, arch: Arch, problem: Problem) -> tuple[tuple[Candidate, ...], tuple[str, ...]]:
    """(the usable rows, the rows left out with why)."""
    path = storage_url.sqlite_path(url)
    if path is not None and not path.expanduser().is_file():
        return (), ()
    from ..store.best_table import BestStore  # sqlalchemy: only when a storage is read

    where = storage_url.describe(url)
    try:
        # Read-only: the runtime never creates or writes anything there. Not `thorough`: a full integrity check
        # of a large storage would cost seconds on the first call; a damaged page still fails the read below.
        with BestStore(url, read_only=True, thorough=False) as store:
            entries = store.all_rows(gpu_name=gpu_name, arch=arch.name, dtype=problem.dtype,
                                     head_dim=problem.head_dim, causal=problem.causal)
            skipped = store.skipped
    except Exception as e:  # SQLAlchemyError, StoreError (newer schema), OSError, a missing DB driver, ...
        warnings.warn(f"autotune: cannot read tuned configs from {where} ({type(e).__name__}: {e}); "
                      "going on with the shipped tables and the default", StorageWarning, stacklevel=3)
        return (), ()
    for why in skipped:  # one bad row costs that row, not the user's whole table
        warnings.warn(f"autotune: skipping stored row {why}", InvalidRowWarning, stacklevel=3)
    return tuple(Candidate(e, "storage", where) for e in entries), tuple(f"skipped stored row {w}" for w in skipped)


# ---- the choice -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Selection:
    """The config for one shape and why: `source` is one of SOURCES; `row` the tuned row it came from (None for
    the heuristic); `distance` 0 for exact rows, the metric above for 'nearest', None for the heuristic;
    `notes` say what was skipped on the way."""

    config: Config
    source: str
    shape: Shape
    gpu_name: str
    arch: str
    row: Any = None          # best_table.BestEntry
    origin: str | None = None  # storage URL (described) or shipped file the row came from
    distance: float | None = None
    notes: tuple[str, ...] = field(default=())
    searched: tuple[str, ...] = field(default=())  # the tables consulted, in lookup order

    @property
    def provenance(self) -> dict[str, Any] | None:
        """Where the row was measured: study, trial, speed, kernel source hash, nvcc, date, and the table."""
        if self.row is None:
            return None
        r = self.row
        return {"table": self.origin, "study": r.study, "trial": r.trial, "tflops": r.tflops,
                "time_ms": r.time_ms, "kernel_source_hash": r.kernel_source_hash,
                "nvcc_version": r.nvcc_version, "created": r.created.isoformat(), "tuned_shape": r.shape.key,
                **{f: getattr(r, f, None) for f in PASS_FIELDS}}

    def explain(self) -> str:
        lines = [f"{self.shape.key} on {self.gpu_name} ({self.arch}): {self.config.key}"]
        if self.source == "heuristic":
            lines.append(f"  source: heuristic — space.default_config_for_shape({self.shape.key}, {self.arch}): "
                         f"no usable tuned row for {self.gpu_name} {self.arch} {self.shape.problem.key}")
        else:
            exact = self.source != "nearest" and (self.source != "same_arch" or _same_key(self.row, self.shape))
            how = "exact shape" if exact else (
                f"nearest tuned shape {self.row.shape.key}, distance {self.distance:.3f} "
                "(log2 seqlen, log2 batch·heads)")
            if self.source == "same_arch":
                how = (f"tuned on {self.row.gpu_name}, another GPU of {self.arch} (not this shape on this one; "
                       f"`autotune search` here tunes its own), {how}")
            lines.append(f"  source: {self.source} — {how}, from {self.origin}")
            p = self.provenance
            lines.append(f"  row: {p['tflops']:.1f} TFLOPS, study {p['study']!r} trial {p['trial']}, "
                         f"kernel sources {str(p['kernel_source_hash'])[:12]}, nvcc {p['nvcc_version']}, "
                         f"{p['created']}")
            passes = describe_passes(self.row)
            if passes:
                lines.append(f"  passes: {passes}")
        lines += [f"  searched: {w}" for w in self.searched]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def describe_passes(row) -> str | None:
    """A campaign row's two passes in words (store.best_table.PASS_FIELDS), None for a row without a second pass."""
    first, second = getattr(row, "first_pass_tflops", None), getattr(row, "second_pass_tflops", None)
    if first is None or second is None:
        return None
    text = (f"first {first:.1f}, second {second:.1f} TFLOPS (another process, later; the row's figure is their "
            "geometric mean)")
    key = getattr(row, "runner_up_config_key", None)
    if key:
        a, b = row.runner_up_first_tflops, row.runner_up_second_tflops
        figures = f"first {a:.1f}, second {b:.1f}" if a is not None and b is not None else "figures not recorded"
        text += f"; runner-up {key}: {figures}"
    return text


def _gqa_gap(a: Shape, b: Shape) -> float:
    return abs(math.log2(a.heads / a.kv_heads) - math.log2(b.heads / b.kv_heads))


def _same_key(c, shape: Shape) -> bool:
    """Whether the row (a Candidate or its entry) is tuned for exactly this shape."""
    e = c.entry if isinstance(c, Candidate) else c
    return (e.seqlen, e.seqlen_k, e.batch, e.heads, e.kv_heads, e.causal_align) == (
        shape.seqlen_q, shape.seqlen_k, shape.batch, shape.heads, shape.kv_heads, shape.causal_align)


def shipped_for_problem(candidates, arch: Arch, problem: Problem) -> tuple[Candidate, ...]:
    """The rows of `arch` and of `problem`'s dtype, head_dim and causal flag (what decides the compiled kernel),
    of any GPU: callers pick this GPU's rows, or another GPU's."""
    return tuple(c for c in candidates if c.entry.arch == arch.name and c.entry.dtype == problem.dtype
                 and c.entry.head_dim == problem.head_dim and c.entry.causal == problem.causal)


def _stands_in_for(c: Candidate, shape: Shape) -> bool:
    """Whether a row of another shape may stand in for `shape`. Decode rows stand in only for decode shapes and
    prefill rows only for prefill: their best configs differ in kind (split-KV, packed heads), not in degree, so a
    nearer row of the other kind is worse than the default. Nor does a row of the other causal alignment
    (store.nearest.alignment_fits)."""
    return (c.entry.seqlen <= space.DECODE_MAX_QUERIES) == shape.is_decode and _alignment_fits(c, shape)


def _alignment_fits(c: Candidate, shape: Shape) -> bool:
    try:
        return alignment_fits(c.shape, shape)
    except ValueError:  # not a valid shape: _nearest's checker names it
        return True


class _Checker:
    """Decides whether a tuned row can be used for one (problem, arch), noting and warning once per skipped row."""

    def __init__(self, problem: Problem, arch: Arch):
        self.problem, self.arch = problem, arch
        self.notes: list[str] = []
        self._verdicts: dict[tuple, Config | None] = {}

    def reject(self, c: Candidate, why: str) -> None:
        e = c.entry
        note = (f"skipped {c.origin} row (seqlen {e.seqlen}, seqlen_k {e.seqlen_k}, batch {e.batch}, heads "
                f"{e.heads}, kv_heads {e.kv_heads}) from {c.where}: {why}")
        self.notes.append(note)
        warnings.warn(f"autotune: {note}", InvalidRowWarning, stacklevel=5)
        self._verdicts[(c.origin, c.where, e.key)] = None

    def shape(self, c: Candidate) -> Shape | None:
        """The row's shape, or None (rejected) when its sizes are not a valid shape (a hand-edited table)."""
        try:
            return c.shape
        except ValueError as e:
            self.reject(c, f"not a valid shape: {e}")
            return None

    def config(self, c: Candidate) -> Config | None:
        ident = (c.origin, c.where, c.entry.key)
        if ident in self._verdicts:
            return self._verdicts[ident]
        try:
            from ..store.best_table import parse_config_key  # sqlalchemy: only when a row is checked

            config = parse_config_key(c.entry.config_key)
            problems = [str(v) for v in space.violations(config, self.problem, self.arch)]
        except (ValueError, KeyError) as e:
            config, problems = None, [f"config key {c.entry.config_key!r} not understood: {e}"]
        if problems:
            self.reject(c, f"{c.entry.config_key} cannot run on {self.arch.name}: {'; '.join(problems)}")
            return None
        self._verdicts[ident] = config
        return config


def _exact(candidates, shape: Shape, checker: _Checker) -> tuple[Candidate, Config] | None:
    # Several shipped files may hold the same key: the fastest row first, then file order (deterministic).
    hits = sorted((c for c in candidates if _same_key(c, shape)), key=lambda c: (-c.entry.tflops, c.where))
    for c in hits:
        config = checker.config(c)
        if config is not None:
            return c, config
    return None


def _nearest(candidates, shape: Shape, checker: _Checker) -> tuple[Candidate, Config, float] | None:
    rank = {"storage": 0, "shipped": 1}
    scored = []
    for c in candidates:
        other = checker.shape(c)
        if other is None:
            continue
        d = distance(shape, other)
        # Rounding makes float noise unable to break a tie the metric calls a tie.
        scored.append((round(d / TIE_EPSILON) * TIE_EPSILON, _gqa_gap(shape, other), rank[c.origin],
                       (c.entry.seqlen, c.entry.seqlen_k, c.entry.batch, c.entry.heads, c.entry.kv_heads),
                       -c.entry.tflops, c.where, d, c))
    scored.sort(key=lambda t: t[:6])
    for *_, d, c in scored:
        config = checker.config(c)
        if config is not None:
            return c, config, d
    return None


def heuristic(shape: Shape, gpu_name: str, arch: Arch, notes: tuple[str, ...] = (),
              searched: tuple[str, ...] = ()) -> Selection:
    """The pure-function default, as a Selection."""
    config = space.default_config_for_shape(shape, arch)
    broken = space.violations(config, shape.problem, arch)
    if broken:  # a bug in space/, not in the user's input: say so rather than launch an invalid kernel
        raise RuntimeError(f"space.default_config_for_shape({shape.key}, {arch.name}) returned {config.key}, which "
                           f"violates {'; '.join(map(str, broken))}")
    return Selection(config, "heuristic", shape, gpu_name, arch.name, notes=notes, searched=searched)


def select_config(shape: Shape, gpu_name: str, arch: Arch | str, storage: str | None = None, *,
                  tables_dir: Path | str | None | bool = True) -> Selection:
    """The config to run `shape` with on GPU `gpu_name` (as torch.cuda.get_device_name names it) of `arch`.

    `storage`: an SQLAlchemy URL, resolved like the search's --storage. `tables_dir`: the shipped tables'
    directory; True (default) means `shipped_tables_dir()`, None or False means no shipped tables.
    Memoized per process; see the module docstring for the order and the metric.
    """
    arch = arch if isinstance(arch, Arch) else space.get_arch(arch)
    url = storage_key(storage)
    tables = shipped_tables_dir() if tables_dir is True else (Path(tables_dir) if tables_dir else None)
    key = (gpu_name, arch.name, shape, url, tables)
    hit = _selections.get(key)
    if hit is not None:
        return hit
    with _lock:
        selection = _select(shape, gpu_name, arch, url, tables)
        _selections[key] = selection
        return selection


def _select(shape: Shape, gpu_name: str, arch: Arch, url: str, tables: Path | None) -> Selection:
    problem = shape.problem
    checker = _Checker(problem, arch)
    stored = storage_candidates(url, gpu_name, arch, problem)
    all_shipped = shipped_candidates(tables)
    # Rows left out when read (best_table.row_problem) are said in explain() like rows rejected here.
    checker.notes += _skipped_rows.get((url, gpu_name, arch.name, problem), ())
    checker.notes += _skipped_rows.get(tables, ()) if tables is not None else ()
    for_problem = shipped_for_problem(all_shipped, arch, problem)
    shipped = tuple(c for c in for_problem if c.entry.gpu_name == gpu_name)

    searched = (f"storage {storage_url.describe(url)} ({len(stored)} rows for this GPU and problem)",
                f"shipped tables {tables if tables else '(none)'} ({len(shipped)} rows for this GPU and problem)")

    def chosen(source, found, d):
        c, config = found[0], found[1]
        return Selection(config, source, shape, gpu_name, arch.name, c.entry, c.where, d, tuple(checker.notes),
                         searched)

    # Exact rows: the shape's own, its capture bucket's, one benchmarked at first use (row_order.py).
    for source, pool, target, note in row_order.exact_steps(shape, stored, shipped):
        found = _exact(pool, target, checker)
        if found:
            checker.notes += [note] if note else []
            return chosen(source, found, 0.0)
    # Another GPU's exact row before this GPU's nearest: it compiles the same kernel, tuned for this very tile
    # count, where a neighbour shape's config was tuned for other waves and tails (a table of a few rows of this
    # GPU, such as the H100's beside the H200's, must not hide the H200's exact rows from the H100's other shapes).
    siblings = tuple(c for c in for_problem if c.entry.gpu_name != gpu_name)
    if siblings:
        searched += (f"shipped tables {tables} ({len(siblings)} rows for other GPUs of {arch.name} and this problem)",)
    found = _exact(siblings, shape, checker)
    if found:
        return chosen("same_arch", found, 0.0)
    found = _nearest(tuple(c for c in stored + shipped if _stands_in_for(c, shape)), shape, checker)
    if found:
        return chosen("nearest", found, found[2])
    found = _nearest(tuple(c for c in siblings if _stands_in_for(c, shape)), shape, checker)
    if found:
        return chosen("same_arch", found, found[2])
    return heuristic(shape, gpu_name, arch, tuple(checker.notes), searched)


# ---- from a selection to a launchable kernel ----------------------------------------------------------------

def device_info(device: int) -> tuple[str, Arch]:
    """(GPU name, space.Arch) of a CUDA device, queried once per process."""
    info = _devices.get(device)
    if info is None:
        import torch

        from ..launch.gpu_arch import detect_arch  # the device path: cuda-python with torch

        info = _devices[device] = (torch.cuda.get_device_name(device), detect_arch(device))
    return info


def builder(arch: Arch):
    """One Builder per arch per process, on the default kernel cache (the one `autotune search` fills)."""
    with _lock:
        b = _builders.get(arch.name)
        if b is None:
            b = _builders[arch.name] = Builder(arch, jobs=1)
        return b


def build(config: Config, problem: Problem, arch: Arch, trusted_hash: str | None = None):
    """The cached build of (config, problem) for arch; a missing one is compiled once, saying so on stderr.
    `trusted_hash`: the cubin hash the tuned row recorded; a cached cubin that is not it (nor one this user built)
    is rebuilt locally, with a warning (build/builder.py)."""
    b = builder(arch)
    key = b.key(config, problem)
    if not (b.entry_dir(key) / "meta.json").is_file():
        print(f"autotune: compiling {config.key} for {problem.key} on {arch.name} (first use; cached in "
              f"{b.cache_dir})", file=sys.stderr, flush=True)
    return b.build_one(config, problem, trusted_hash)


@dataclass(frozen=True)
class Plan:
    """What attention() needs for one (device, shape, storage): the selection and a runner with a loaded kernel."""

    selection: Selection
    runner: Any  # loader.KernelRunner
    kernel: Any  # loader.Kernel, loaded on the device


def resolve(device: int, shape: Shape, storage: str | None = None, seqused_k: bool = False) -> Plan:
    """select_config for the device's GPU, then build (or find in the cache) and load the kernel. Memoized by
    (device index, shape, storage URL, seqused_k). A tuned config that fails to build falls back to the heuristic
    default with a warning; if the default fails too, RuntimeError. seqused_k: build the selected config for the
    shape's problem with seqused_k (the config is the one tuned for the tensors' seqlen_k)."""
    url = storage_key(storage)
    key = (device, shape, url, seqused_k)
    plan = _plans.get(key)
    if plan is not None:
        return plan
    with _lock:
        gpu_name, arch = device_info(device)
        selection = select_config(shape, gpu_name, arch, url)
        problem = dataclasses.replace(shape.problem, seqused_k=True) if seqused_k else shape.problem
        # A tuned row's cubin hash is that of its own build, not of the seqused_k one.
        trusted = None if seqused_k else getattr(selection.row, "cubin_hash", None)
        result = build(selection.config, problem, arch, trusted)
        if not result.ok and selection.source != "heuristic":
            note = f"{selection.source} config {selection.config.key} failed to build: {result.error}"
            warnings.warn(f"autotune: {note}; using the default", InvalidRowWarning, stacklevel=3)
            selection = heuristic(shape, gpu_name, arch, selection.notes + (note,), selection.searched)
            result = build(selection.config, problem, arch)
        if not result.ok:
            raise RuntimeError(f"autotune: the default kernel {selection.config.key} for {problem.key} on "
                               f"{arch.name} failed to build: {result.error}")
        from ..launch.loader import KernelRunner  # the device path: libcuda, loaded on first launch

        runner = KernelRunner(result)
        plan = _plans[key] = Plan(selection, runner, runner.kernel(device))
        return plan


__all__ = ["Candidate", "InvalidRowWarning", "Plan", "SOURCES", "Selection", "StorageWarning", "build", "builder",
           "clear_caches", "device_info", "distance", "heuristic", "resolve", "select_config", "shipped_for_problem",
           "shipped_candidates", "shipped_tables_dir", "storage_candidates"]
