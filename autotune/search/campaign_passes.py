"""A campaign's second pass: each shape's finalists timed again later in the run, in another evaluator process,
and the config that is best across both passes shipped.

One session's re-timing cannot see what moves between processes and minutes (the recorded sessions: medians
1-1.5 % apart within one lease, ranks among the top 20 correlated 0.58-0.72), so a table decided in one pass holds
winners that another day measures behind their own finalists. So:

    first pass    each shape's search (campaign_run) re-times its finalists and decides (retime.py); its winner
                  is held (HeldStore), not stored, and later shapes' warm starts still see it
    second pass   after the last shape, in a fresh evaluator process: for every finished shape whose study has
                  finalists and no second pass yet, the finalists that completed the first pass are re-timed,
                  interleaved, in --retime-rounds rounds (no added rounds: the passes are what is compared)
    across        per finalist that completed both: the geometric mean of its two medians (a shift of the whole
                  process between the passes scales every finalist alike and changes no ranking); the highest
                  is shipped, with that figure as its row's TFLOPS
    recorded      the study attr `second_pass`: every finalist's figure in each pass and across them, the first
                  pass's winner and the shipped one, and the spread between passes (the standard deviation over
                  the finalists of log(second / first) around its mean: what a process changes per config); and
                  in the shipped row itself (best_table.PASS_FIELDS, exported with it): the shipped config's figure
                  in each pass, and the runner-up's config and figures
    stored        the shipped row replaces a row of the same study whatever the figures: the first pass's winner,
                  stored when a run stopped before this shape's second pass (the next run does it) or by an
                  earlier run, was an earlier decision of the same search (BestStore.record_best's
                  supersedes_study); a row of another study stays when it is at least as fast, and the log says
                  the shipped row was not stored

The winners of shapes the second pass does not reach (cut by the budget, unfinished, a failure, Ctrl-C) are
stored as their first pass decided: nothing is lost by holding them.

`repair` re-records, with no GPU, shipped rows that the table kept out before that rule (the first pass's row
stayed whenever it was faster than the figure across both passes): from the study's attrs alone, for every study
whose second pass is recorded and whose row is an earlier one of the same study, or missing. `autotune campaign`
runs it before its shapes; `autotune campaign FILE --repair-passes` runs only it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import math
import statistics
from dataclasses import dataclass
from typing import Callable, Iterable

from space import Shape

from ..build.builder import provenance
from ..store.best_table import PASS_FIELDS, BestEntry, BestStore, RecordResult, parse_config_key, row_matches
from . import retime

ATTR = "second_pass"
PROVENANCE = ("kernel_source_hash", "nvcc_version")  # what a shipped row says it was built with


@contextlib.contextmanager
def opened(real):
    """`real` when it is a BestStore-like; a BestStore on it, closed afterwards, when it is a storage URL."""
    if not isinstance(real, str):
        yield real
        return
    table = BestStore(real)
    try:
        yield table
    finally:
        table.close()


class HeldStore:
    """The first pass's store (module docstring): `record_best` holds the entry by shape; `all_rows` (warm
    starts) answers the held entries over the stored rows. `real`: a BestStore-like or a storage URL."""

    def __init__(self, real):
        self.real = real
        self.held: dict[tuple, BestEntry] = {}

    def _call(self, method: str, *args, **kwargs):
        with opened(self.real) as table:
            return getattr(table, method)(*args, **kwargs) if hasattr(table, method) else []

    def record_best(self, entry: BestEntry, source: str | None = None) -> RecordResult:
        self.held[entry.key] = entry
        return RecordResult("held", entry, None)

    def all_rows(self, **filters) -> list:
        held = [e for e in self.held.values() if row_matches(e, **filters)]
        keys = {e.key for e in held}
        return held + [r for r in self._call("all_rows", **filters) if r.key not in keys]

    def store(self, entry: BestEntry, source: str | None = None, *,
              supersedes_study: str | None = None) -> RecordResult:
        """Record `entry` in the real store now (the shape's held entry, if any, is dropped); `supersedes_study`:
        BestStore.record_best's (a row of that study is replaced whatever the figures)."""
        self.held.pop(entry.key, None)
        options = {"supersedes_study": supersedes_study} if supersedes_study is not None else {}
        return self._call("record_best", entry, source, **options)

    def flush(self) -> list[RecordResult]:
        """Store every entry still held, as its first pass decided."""
        return [self.store(e) for e in list(self.held.values())]


@dataclass(frozen=True)
class Finalist:
    """A first-pass finalist as retime.retime_and_baselines reads a trial."""

    number: int
    value: float
    user_attrs: dict
    rounds: tuple = ()             # the first pass's rounds (TFLOPS)


@dataclass(frozen=True)
class Across:
    number: int
    config_key: str
    first: float                   # the first pass's median
    second: float | None           # the second pass's (None: failed it)
    first_rounds: tuple = ()
    second_rounds: tuple = ()
    status: str = "complete"
    cubin_hash: str | None = None  # sha256 of the cubin the second pass timed (None: failed it, or not recorded)

    @property
    def figure(self) -> float | None:
        return math.sqrt(self.first * self.second) if self.second else None

    @classmethod
    def from_attr(cls, d: dict) -> "Across":
        """A finalist as PassResult.as_attr recorded it."""
        return cls(int(d["trial"]), d["config_key"], float(d["first_tflops"]),
                   float(d["second_tflops"]) if d.get("second_tflops") else None,
                   tuple(d.get("first_rounds") or ()), tuple(d.get("second_rounds") or ()),
                   d.get("status") or "complete", d.get("cubin_hash"))


@dataclass(frozen=True)
class PassResult:
    shape_key: str
    finalists: tuple[Across, ...]
    first_winner: int | None       # trial number the first pass kept
    shipped: Across | None
    between: float | None          # spread between passes (module docstring), relative
    record: RecordResult | None = None
    study: str | None = None       # the study's name
    provenance: dict | None = None  # the shipped row's kernel_source_hash and nvcc_version

    @property
    def kept_row(self) -> BestEntry | None:
        """The row the table keeps instead of the shipped one (another study's, at least as fast), or None."""
        r = self.record
        if self.shipped is None or getattr(r, "action", None) != "kept":
            return None
        mine = r.entry.study == self.study and r.entry.trial == self.shipped.number  # stored already, as it is
        return None if mine else r.entry

    def describe(self) -> str:
        if self.shipped is None:
            return f"second pass {self.shape_key}: no finalist completed both passes; the first pass's winner stays"
        s, kept = self.shipped, self.kept_row
        held = ("the first pass's winner held" if s.number == self.first_winner else
                f"the first pass kept #{self.first_winner}")
        between = f"; between passes σ {100 * self.between:.2f} %" if self.between is not None else ""
        outcome = "" if kept is None else (
            f"; not stored: the table keeps {'a row of another study' if kept.study != self.study else 'a row'} "
            f"at least as fast, {kept.study} #{kept.trial} {kept.tflops:.1f} TFLOPS"
            f"{'' if kept.config_key == s.config_key else ' (another config)'}")
        return (f"second pass {self.shape_key}: {'chose' if kept else 'shipped'} #{s.number} {s.figure:.1f} TFLOPS "
                f"across both passes (first {s.first:.1f}, second {s.second:.1f}), {held}, of "
                f"{len(self.finalists)} finalist(s){between}{outcome}")

    def as_attr(self) -> dict:
        kept = self.kept_row
        return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "first_winner": self.first_winner, "shipped": self.shipped.number if self.shipped else None,
                "between_spread": self.between,
                "finalists": [{"trial": a.number, "config_key": a.config_key, "first_tflops": a.first,
                               "second_tflops": a.second, "first_rounds": list(a.first_rounds),
                               "second_rounds": list(a.second_rounds),
                               "across_tflops": a.figure, "status": a.status, "cubin_hash": a.cubin_hash}
                              for a in self.finalists],
                **{k: v for k, v in (self.provenance or {}).items() if k in PROVENANCE},
                "stored": getattr(self.record, "action", None),
                **({"kept_row": {"study": kept.study, "trial": kept.trial, "config_key": kept.config_key,
                                 "tflops": kept.tflops}} if kept else {})}

    @classmethod
    def from_attr(cls, shape_key: str, attr: dict, study: str | None = None) -> "PassResult":
        """The pass a study recorded (its attr ATTR), without the store's answer."""
        finalists = tuple(Across.from_attr(d) for d in attr.get("finalists") or ())
        shipped, _ = choose(finalists, attr.get("shipped"))
        return cls(shape_key, finalists, attr.get("first_winner"), shipped, attr.get("between_spread"), None,
                   study, {k: attr[k] for k in PROVENANCE if attr.get(k)})


def choose(finalists: Iterable[Across], shipped_number: int | None = None) -> tuple[Across | None, Across | None]:
    """(shipped, runner-up) among the finalists that completed both passes, ranked by their figure across both:
    the best one (or trial `shipped_number`, as a recorded pass shipped it), and the best of the others."""
    ranked = sorted((a for a in finalists if a.second), key=lambda a: a.figure, reverse=True)
    if shipped_number is None:
        shipped = ranked[0] if ranked else None
    else:
        shipped = next((a for a in ranked if a.number == shipped_number), None)
    return shipped, next((a for a in ranked if a is not shipped), None)


def pass_figures(shipped: Across, runner_up: Across | None) -> dict:
    """The best-table fields (best_table.PASS_FIELDS) of a shipped row: its figure in each pass, and the runner-up's
    (the finalist next best across both), so the row says how far its lead held from one process to the next."""
    out = {"first_pass_tflops": shipped.first, "second_pass_tflops": shipped.second}
    if runner_up is not None:
        out.update(runner_up_config_key=runner_up.config_key, runner_up_first_tflops=runner_up.first,
                   runner_up_second_tflops=runner_up.second)
    return out


def shipped_entry(shape: Shape, gpu_name: str, arch_name: str, study_name: str, shipped: Across,
                  runner_up: Across | None, prov: dict) -> BestEntry:
    """The row a second pass ships (second_pass, and repair from the recorded pass): the figure across both passes
    as its TFLOPS and time, the spread of its rounds over both passes (slowest - fastest, ms), both passes'
    figures and the runner-up's (pass_figures), the cubin it timed, and `prov`'s kernel_source_hash and
    nvcc_version."""
    figure = shipped.figure
    times = [shape.flops / (t * 1e12) * 1e3
             for t in (*(shipped.first_rounds or (shipped.first,)), *shipped.second_rounds)]
    return BestEntry.for_shape(shape, gpu_name, arch_name, parse_config_key(shipped.config_key), figure,
                               time_ms=shape.flops / (figure * 1e12) * 1e3, spread_ms=max(times) - min(times),
                               study=study_name, trial=shipped.number, cubin_hash=shipped.cubin_hash,
                               kernel_source_hash=prov.get("kernel_source_hash"),
                               nvcc_version=prov.get("nvcc_version"), **pass_figures(shipped, runner_up))


def first_pass(study) -> tuple[list[Finalist], int | None]:
    """The finalists that completed the first pass (study attr `retimed`), and the trial it kept."""
    done = [r for r in study.user_attrs.get("retimed") or [] if r.get("status") == "complete" and r.get("tflops")]
    chosen = next((r["trial"] for r in done if r.get("chosen")), None)
    return [Finalist(int(r["trial"]), float(r["tflops"]), {"config_key": r["config_key"]},
                     tuple(x for x in r.get("rounds_tflops") or () if x)) for r in done], chosen


def needs_second_pass(study) -> bool:
    return study is not None and ATTR not in study.user_attrs and bool(first_pass(study)[0])


def second_pass(study, options, held: HeldStore, builder, evaluator, gpu_name: str, arch,
                log: Callable[[str], None] = print) -> PassResult:
    """Re-time the study's first-pass finalists with `evaluator` (another process than the first pass's), ship the
    best across both passes to `held`'s real store, and record the pass on the study (module docstring)."""
    finalists, first_winner = first_pass(study)
    retimed, _, notes = retime.retime_and_baselines(finalists, builder, evaluator, options.shape,
                                                    rounds=options.retime_rounds, max_rounds=options.retime_rounds,
                                                    log=log)
    by_number = {r.number: r for r in retimed}
    across = []
    for f in finalists:
        r = by_number.get(f.number)
        ok = r is not None and r.ok
        across.append(Across(f.number, f.user_attrs["config_key"], f.value, r.outcome.tflops if ok else None,
                             f.rounds, tuple(r.figures) if ok else (),
                             "complete" if ok else (r.outcome.status if r else "not timed"),
                             r.cubin_hash if ok else None))
    shipped, runner_up = choose(across)
    shifts = [math.log(a.second / a.first) for a in across if a.second]
    between = statistics.stdev(shifts) if len(shifts) >= 2 else None
    record, prov = None, {}
    if shipped is not None:
        prov = provenance(builder, (parse_config_key(shipped.config_key).family,))
        entry = shipped_entry(options.shape, gpu_name, arch.name, study.study_name, shipped, runner_up, prov)
        # replaces the row of an earlier pass of this study (module docstring: stored), whatever its figure
        record = held.store(entry, f"{study.study_name} #{shipped.number} (second pass)",
                            supersedes_study=study.study_name)
    result = PassResult(options.shape.key, tuple(across), first_winner, shipped, between, record,
                        study.study_name, prov)
    study.set_user_attr(ATTR, result.as_attr())
    for note in notes:
        log(f"  note: {note}")
    return result


@dataclass(frozen=True)
class Repaired:
    """A shipped row that `repair` recorded: `previous` is the row the table held for the shape (None: none)."""

    shape_key: str
    entry: BestEntry
    previous: BestEntry | None

    def describe(self) -> str:
        e, p = self.entry, self.previous
        was = "no row before" if p is None else (
            f"replacing {p.study} #{p.trial} {p.tflops:.1f} TFLOPS"
            f"{' (another config)' if p.config_key != e.config_key else ''}")
        return (f"campaign: {self.shape_key}: the second pass's row re-recorded, {e.study} #{e.trial} "
                f"{e.tflops:.1f} TFLOPS across both passes (first {e.first_pass_tflops:.1f}, second "
                f"{e.second_pass_tflops:.1f}); {was}")


def recorded_entry(study_name: str, attrs: dict, shape: Shape, row: BestEntry | None) -> BestEntry | None:
    """The row the study's recorded second pass ships (None: no pass recorded, or it shipped nothing), from the
    study attrs alone. Its provenance: the pass's own (recorded with it); for a pass recorded without it, the
    row `row` being replaced when it is the same study's and family's (the first pass's winner), else the study's
    (the digest of the families it searched); its cubin hash, for a pass recorded without one, the row's when it
    is the same trial's (the cubin the first pass timed), else none."""
    attr = attrs.get(ATTR) or {}
    result = PassResult.from_attr("", attr, study_name)
    shipped = result.shipped
    if shipped is None:
        return None
    prov = {k: attrs[k] for k in PROVENANCE if attrs.get(k)}
    if row is not None and row.study == study_name and row.family == parse_config_key(shipped.config_key).family:
        prov.update({k: getattr(row, k) for k in PROVENANCE if getattr(row, k)})
        if shipped.cubin_hash is None and (row.trial, row.config_key) == (shipped.number, shipped.config_key):
            shipped = dataclasses.replace(shipped, cubin_hash=row.cubin_hash)
    prov.update(result.provenance)
    _, runner_up = choose(result.finalists, shipped.number)
    return shipped_entry(shape, attrs["gpu_name"], attrs["arch"], study_name, shipped, runner_up, prov)


def is_pass_row(row: BestEntry, entry: BestEntry) -> bool:
    """Whether the stored `row` is the pass's row `entry`: the same study, trial, config and figures."""
    same = (row.study, row.trial, row.config_key, row.runner_up_config_key) == (
        entry.study, entry.trial, entry.config_key, entry.runner_up_config_key)
    figures = [(getattr(row, f), getattr(entry, f)) for f in ("tflops", *PASS_FIELDS) if f != "runner_up_config_key"]
    return same and all(a == b or (a is not None and b is not None and math.isclose(a, b, rel_tol=1e-9))
                        for a, b in figures)


def kept_out(row: BestEntry | None, entry: BestEntry, date: str | None) -> bool:
    """Whether the pass's row `entry`, recorded on `date` (the attr's, to the second), should be where `row` is:
    the table has no row for the shape, or an earlier row of the same study that is not this one. A row stored
    after the pass (a later search of the study decided again) stays, and so does another study's row (the
    faster-wins rule kept it, as it would now)."""
    if row is None:
        return True
    if row.study != entry.study or is_pass_row(row, entry):
        return False
    try:
        passed = datetime.datetime.fromisoformat(date) + datetime.timedelta(seconds=1)
    except (TypeError, ValueError):
        return True  # no date: nothing says the row is newer
    return row.created < passed


def repair(studies: Iterable, real, log: Callable[[str], None] = print) -> list[Repaired]:
    """Re-record the shipped row of every study in `studies` (objects with `study_name` and `user_attrs`: Optuna
    studies or study summaries) whose second pass is recorded but whose row `kept_out` says is missing or an
    earlier one, into `real` (a BestStore-like, or a storage URL); the row it replaces moves to the replaced
    table. Needs no GPU and no compiler: everything comes from the attrs. Idempotent: a repaired row is the pass's
    row. A study whose attrs cannot be read is named in the log and left as it is."""
    recorded = [s for s in studies if s is not None and (s.user_attrs.get(ATTR) or {}).get("shipped") is not None]
    if not recorded:
        return []
    done = []
    with opened(real) as table:
        for study in recorded:
            attrs = study.user_attrs
            try:
                shape = Shape(**attrs["shape"])
                row = table.lookup(attrs["gpu_name"], attrs["arch"], shape)
                entry = recorded_entry(study.study_name, attrs, shape, row)
            except (KeyError, TypeError, ValueError) as e:
                log(f"campaign: {study.study_name}: its recorded second pass cannot be read ({type(e).__name__}: "
                    f"{e}); its row is left as it is")
                continue
            if entry is None or not kept_out(row, entry, attrs[ATTR].get("date")):
                continue
            record = table.record_best(entry, f"{study.study_name} #{entry.trial} (second pass, re-recorded)",
                                       supersedes_study=study.study_name)
            if record.action in ("inserted", "replaced"):
                done.append(Repaired(shape.key, record.entry, record.previous))
                log(done[-1].describe())
    return done


__all__ = ["ATTR", "Across", "Finalist", "HeldStore", "PassResult", "Repaired", "choose", "first_pass",
           "is_pass_row", "kept_out", "needs_second_pass", "opened", "pass_figures", "recorded_entry", "repair",
           "second_pass", "shipped_entry"]
