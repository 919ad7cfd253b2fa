"""How far a landscape's figures move between GPU sessions: re-measure its top configs, record each session in the
file, and compute the noise band that search-quality figures must be read against.

A landscape row is one measurement from one session. Re-measuring the best configs in later sessions (another
host, another day, the same kernel sources) shows how much of the ranking survives:

    remeasure     the top N complete rows (one per cubin: rows that copy a twin's timing are left out), built
                  again (cache hits) and timed interleaved in R rounds in one evaluator session
                  (measure/rounds.py); the session is appended to the file (landscape_file: header `sessions`,
                  per-row `sessions` entries), the rest of the file untouched
    session_table config, the recorded TFLOPS, this session's median, its spread over the rounds, rank change
    noise_band    over the sessions like the latest one (its kernel sources, nvcc and GPU model): per config,
                  the spread of its session medians, (max - min) / median; the band is the median of that over
                  the configs measured in at least two of them (and the largest, for the worst case)

The within-session spread (one session's rounds) is reported beside it: it is what the search's finale can see
(search/retime.py), and the band is what it cannot.
"""
from __future__ import annotations

import datetime
import statistics
from dataclasses import dataclass
from typing import Callable

from ..measure.child_process import EvalOutcome
from ..measure.rounds import interleave, summarize
from .landscape_file import Landscape, Row

DEFAULT_TOP = 20
DEFAULT_ROUNDS = 3


def top_rows(landscape: Landscape, n: int = DEFAULT_TOP) -> list[Row]:
    """The n fastest complete rows as recorded, one per cubin (a `same_cubin_as` row copies its twin's timing)."""
    rows = [r for r in landscape.complete_rows() if not r.same_cubin_as]
    return sorted(rows, key=lambda r: (-r.tflops, r.config_key))[:n]


def new_session(landscape: Landscape, *, gpu_name: str, kernel_source_hash: str, nvcc_version: str,
                evaluator: str, rounds: int) -> dict:
    """Append a session descriptor to the header and return it (its `id` names it in the rows)."""
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    taken = {s["id"] for s in landscape.sessions}
    sid, k = now, 1
    while sid in taken:  # two sessions in one second (tests): keep ids unique
        k += 1
        sid = f"{now}#{k}"
    session = {"id": sid, "date": now, "gpu_name": gpu_name, "kernel_source_hash": kernel_source_hash,
               "nvcc_version": nvcc_version, "evaluator": evaluator, "rounds": rounds}
    landscape.header.setdefault("sessions", []).append(session)
    return session


def record(landscape: Landscape, session_id: str, config_key: str, outcomes: list) -> dict:
    """Add one config's rounds (EvalOutcomes) to its row as a session entry; returns the entry."""
    summary = summarize(outcomes)
    if summary.ok:
        values = [round(o.tflops, 2) for o in outcomes]
        median = statistics.median(values)
        entry = {"session": session_id, "tflops": round(median, 2), "rounds": values,
                 "spread": round((max(values) - min(values)) / median, 5)}
    else:
        entry = {"session": session_id, "status": summary.status,
                 "reason": (summary.reason or summary.status)[:300]}
    row = landscape.rows[config_key]
    row.sessions = [*(row.sessions or []), entry]
    return entry


def remeasure(landscape: Landscape, builder, evaluator, *, gpu_name: str, kernel_source_hash: str,
              nvcc_version: str, evaluator_name: str, top: int = DEFAULT_TOP, rounds: int = DEFAULT_ROUNDS,
              builds=None, log: Callable[[str], None] = print) -> dict:
    """Re-measure `landscape`'s top rows in this session and record them (module docstring); returns the
    session descriptor. `builds` (one BuildResult per top row, in order) skips the build step."""
    rows = top_rows(landscape, top)
    if not rows:
        raise ValueError(f"{landscape.name}: no complete row to re-measure")
    shape = landscape.shape
    if builds is None:
        builds = builder.build([(r.config, shape.problem) for r in rows])
    session = new_session(landscape, gpu_name=gpu_name, kernel_source_hash=kernel_source_hash,
                          nvcc_version=nvcc_version, evaluator=evaluator_name, rounds=rounds)
    measured = interleave(evaluator, [b if b.ok else None for b in builds], shape, rounds)
    for row, build, outcomes in zip(rows, builds, measured):
        if not build.ok:
            outcomes = [EvalOutcome("compile_error", build.error or "the build failed")]
        record(landscape, session["id"], row.config_key, outcomes)
    log(f"{landscape.name}: {len(rows)} configs × {rounds} rounds re-measured")
    return session


@dataclass(frozen=True)
class TableRow:
    config_key: str
    recorded: float                 # the landscape row's TFLOPS
    median: float | None            # this session's median of the rounds (None: failed)
    spread: float | None            # (max - min) / median of the rounds
    recorded_rank: int              # 1-based, among the re-measured configs
    rank: int | None                # this session's rank among them
    status: str = "complete"

    @property
    def rank_change(self) -> int | None:
        return None if self.rank is None else self.recorded_rank - self.rank  # > 0: moved up


def session_table(landscape: Landscape, session_id: str) -> list[TableRow]:
    """Every config measured in the session: recorded figure and rank, this session's median, spread and rank."""
    entries = [(row, entry) for row in landscape.rows.values() for entry in row.sessions or ()
               if entry.get("session") == session_id]
    entries.sort(key=lambda x: (-(x[0].tflops or 0), x[0].config_key))
    done = sorted((e["tflops"] for _, e in entries if "tflops" in e), reverse=True)
    out = []
    for i, (row, e) in enumerate(entries):
        ok = "tflops" in e
        out.append(TableRow(row.config_key, row.tflops, e.get("tflops"), e.get("spread"), i + 1,
                            done.index(e["tflops"]) + 1 if ok else None, "complete" if ok else e.get("status", "?")))
    return out


def format_table(landscape: Landscape, session_id: str) -> list[str]:
    lines = [f"{landscape.name}: session {session_id}",
             f"  {'recorded':>9} {'now':>9} {'spread':>7} {'rank':>9}  config"]
    for r in session_table(landscape, session_id):
        if r.median is None:
            lines.append(f"  {r.recorded:9.1f} {r.status:>9} {'':>7} {r.recorded_rank:>3} →  -   {r.config_key}")
            continue
        change = f"{r.rank_change:+d}" if r.rank_change else "="
        lines.append(f"  {r.recorded:9.1f} {r.median:9.1f} {100 * r.spread:6.2f}% {r.recorded_rank:>3} → {r.rank:<3}"
                     f"{change:>3}  {r.config_key}")
    return lines


@dataclass(frozen=True)
class NoiseBand:
    landscape: str
    sessions: int               # sessions like the latest: its kernel sources, nvcc and GPU model
    configs: int                # configs measured (complete) in at least two of them
    band: float                 # median over those configs of (max - min) / median of their session medians
    worst: float                # the largest of those
    within: float               # median over every (config, session) of the spread of its rounds

    def describe(self) -> str:
        return (f"{self.landscape}: noise band {100 * self.band:.2f} % (median over {self.configs} configs of the "
                f"spread of their medians across {self.sessions} sessions; largest {100 * self.worst:.2f} %); "
                f"within one session {100 * self.within:.2f} %")


def comparable_sessions(landscape: Landscape) -> set[str]:
    """The ids of the sessions like the latest one: its GPU model, kernel sources and nvcc (none: no session)."""
    sessions = landscape.sessions
    if not sessions:
        return set()
    latest = sessions[-1]
    return {s["id"] for s in sessions
            if all(s.get(k) == latest.get(k) for k in ("gpu_name", "kernel_source_hash", "nvcc_version"))}


def noise_band(landscape: Landscape) -> NoiseBand:
    """The cross-session band (module docstring); ValueError when fewer than two sessions measured the latest
    session's kernel sources with its nvcc on its GPU model, or no config completed in two of them."""
    if not landscape.sessions:
        raise ValueError(f"{landscape.name}: no re-measurement session recorded (benchmarks/landscape_noise.py)")
    same = comparable_sessions(landscape)
    if len(same) < 2:
        raise ValueError(f"{landscape.name}: {len(same)} session(s) measured the latest kernel sources; the noise "
                         "band needs at least two (run benchmarks/landscape_noise.py in another GPU session)")
    spreads, within = [], []
    for row in landscape.rows.values():
        medians = [e["tflops"] for e in row.sessions or () if e.get("session") in same and "tflops" in e]
        within += [e["spread"] for e in row.sessions or () if e.get("session") in same and "spread" in e]
        if len(medians) >= 2:
            spreads.append((max(medians) - min(medians)) / statistics.median(medians))
    if not spreads:
        raise ValueError(f"{landscape.name}: no config completed in two sessions of the same kernel sources")
    return NoiseBand(landscape.name, len(same), len(spreads), statistics.median(spreads), max(spreads),
                     statistics.median(within))


__all__ = ["DEFAULT_ROUNDS", "DEFAULT_TOP", "NoiseBand", "TableRow", "comparable_sessions", "format_table", "new_session", "noise_band",
           "record", "remeasure", "session_table", "top_rows"]
