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

The winners of shapes the second pass does not reach (cut by the budget, unfinished, a failure, Ctrl-C) are
stored as their first pass decided: nothing is lost by holding them.
"""
from __future__ import annotations

import datetime
import math
import statistics
from dataclasses import dataclass
from typing import Callable

from space import Config

from ..build.builder import provenance
from ..store.best_table import BestEntry, BestStore, RecordResult, row_matches
from . import retime

ATTR = "second_pass"


class HeldStore:
    """The first pass's store (module docstring): `record_best` holds the entry by shape; `all_rows` (warm
    starts) answers the held entries over the stored rows. `real`: a BestStore-like or a storage URL."""

    def __init__(self, real):
        self.real = real
        self.held: dict[tuple, BestEntry] = {}

    def _call(self, method: str, *args, **kwargs):
        own = isinstance(self.real, str)
        table = BestStore(self.real) if own else self.real
        try:
            return getattr(table, method)(*args, **kwargs) if hasattr(table, method) else []
        finally:
            if own:
                table.close()

    def record_best(self, entry: BestEntry, source: str | None = None) -> RecordResult:
        self.held[entry.key] = entry
        return RecordResult("held", entry, None)

    def all_rows(self, **filters) -> list:
        held = [e for e in self.held.values() if row_matches(e, **filters)]
        keys = {e.key for e in held}
        return held + [r for r in self._call("all_rows", **filters) if r.key not in keys]

    def store(self, entry: BestEntry, source: str | None = None) -> RecordResult:
        """Record `entry` in the real store now (the shape's held entry, if any, is dropped)."""
        self.held.pop(entry.key, None)
        return self._call("record_best", entry, source)

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

    @property
    def figure(self) -> float | None:
        return math.sqrt(self.first * self.second) if self.second else None


@dataclass(frozen=True)
class PassResult:
    shape_key: str
    finalists: tuple[Across, ...]
    first_winner: int | None       # trial number the first pass kept
    shipped: Across | None
    between: float | None          # spread between passes (module docstring), relative
    record: RecordResult | None = None

    def describe(self) -> str:
        if self.shipped is None:
            return f"second pass {self.shape_key}: no finalist completed both passes; the first pass's winner stays"
        s = self.shipped
        held = ("the first pass's winner held" if s.number == self.first_winner else
                f"the first pass kept #{self.first_winner}")
        between = f"; between passes σ {100 * self.between:.2f} %" if self.between is not None else ""
        return (f"second pass {self.shape_key}: shipped #{s.number} {s.figure:.1f} TFLOPS across both passes "
                f"(first {s.first:.1f}, second {s.second:.1f}), {held}, of {len(self.finalists)} finalist(s)"
                f"{between}")

    def as_attr(self) -> dict:
        return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "first_winner": self.first_winner, "shipped": self.shipped.number if self.shipped else None,
                "between_spread": self.between,
                "finalists": [{"trial": a.number, "config_key": a.config_key, "first_tflops": a.first,
                               "second_tflops": a.second, "first_rounds": list(a.first_rounds),
                               "second_rounds": list(a.second_rounds),
                               "across_tflops": a.figure, "status": a.status} for a in self.finalists]}


def pass_figures(shipped: Across, runner_up: Across | None) -> dict:
    """The best-table fields (best_table.PASS_FIELDS) of a shipped row: its figure in each pass, and the runner-up's
    (the finalist next best across both), so the row says how far its lead held from one process to the next."""
    out = {"first_pass_tflops": shipped.first, "second_pass_tflops": shipped.second}
    if runner_up is not None:
        out.update(runner_up_config_key=runner_up.config_key, runner_up_first_tflops=runner_up.first,
                   runner_up_second_tflops=runner_up.second)
    return out


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
                             "complete" if ok else (r.outcome.status if r else "not timed")))
    both = [a for a in across if a.second]
    ranked = sorted(both, key=lambda a: a.figure, reverse=True)
    shipped = ranked[0] if ranked else None
    runner_up = ranked[1] if len(ranked) > 1 else None
    shifts = [math.log(a.second / a.first) for a in both]
    between = statistics.stdev(shifts) if len(shifts) >= 2 else None
    record = None
    if shipped is not None:
        config = Config.from_key(shipped.config_key)
        figure = shipped.figure
        # the spread of the row: slowest - fastest round over both passes
        times = [options.shape.flops / (t * 1e12) * 1e3
                 for t in (*(shipped.first_rounds or (shipped.first,)), *shipped.second_rounds)]
        prov = provenance(builder, (config.family,))
        entry = BestEntry.for_shape(options.shape, gpu_name, arch.name, config, figure,
                                    time_ms=options.shape.flops / (figure * 1e12) * 1e3,
                                    spread_ms=max(times) - min(times), study=study.study_name,
                                    trial=shipped.number, kernel_source_hash=prov.get("kernel_source_hash"),
                                    nvcc_version=prov.get("nvcc_version"), **pass_figures(shipped, runner_up))
        record = held.store(entry, f"{study.study_name} #{shipped.number} (second pass)")
    result = PassResult(options.shape.key, tuple(across), first_winner, shipped, between, record)
    study.set_user_attr(ATTR, result.as_attr())
    for note in notes:
        log(f"  note: {note}")
    return result


__all__ = ["ATTR", "Across", "Finalist", "HeldStore", "PassResult", "first_pass", "needs_second_pass",
           "pass_figures", "second_pass"]
