"""The noise a GPU really has, for a replay: each replayed evaluation draws a figure from the landscape's recorded
re-measurement sessions (landscapes/noise.py), seeded, instead of answering the one recorded figure every time.

A replay without noise can never tie: every round of the search's finale returns the same figure, so the finale
and the samplers would be tested on a GPU that does not exist. With noise (`autotune search --replay FILE
--replay-noise SEED`, `compare-samplers --noise`):

    a row re-measured in the sessions (those like the latest: its GPU model, kernel sources, nvcc)
        draws one of those sessions at random, then one of that session's rounds at random, divided by the
        session's level (the median over its configs of session median / recorded figure): the sessions'
        spread between rounds and their changes of rank are kept, the shift of a whole session (another day,
        other kernel sources than the landscape's rows) is not
    any other complete row
        its recorded figure × exp(N(0, σ)), σ the spread the sessions measured: within a session (the rounds
        around their session's median) and between sessions (a config's session medians, levels removed),
        σ² = within² + between²; without sessions, the rows' own p20..p80 of their reps (width / 1.683)
    a failed row (wrong, crashed, timeout) fails as recorded

Every draw comes from a generator seeded by (seed, config, the how-many-th evaluation of that config by this
evaluator), so a replay is reproducible whatever order it asks in, and the same seed replays the same noise.
"""
from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass

from ..measure.rounds import P20_P80_WIDTH
from .landscape_file import Landscape, Row
from .noise import comparable_sessions


@dataclass(frozen=True)
class Spread:
    within: float      # σ of log TFLOPS between the rounds of one session
    between: float     # σ of a config's session medians across sessions, the sessions' levels removed
    source: str        # "sessions" or "reps" (no session recorded: the rows' p20..p80)

    @property
    def total(self) -> float:
        return math.hypot(self.within, self.between)


class ReplayNoise:
    """Draws the figure of a config's n-th evaluation (module docstring)."""

    def __init__(self, landscape: Landscape, seed: int):
        self.landscape, self.seed = landscape, int(seed)
        self.sessions = comparable_sessions(landscape)
        self.levels = self._levels()
        self.spread = self._spread()

    def _entries(self, row: Row) -> list[dict]:
        return [e for e in row.sessions or () if e.get("session") in self.levels and e.get("rounds")]

    def _levels(self) -> dict[str, float]:
        ratios: dict[str, list[float]] = {}
        for row in self.landscape.complete_rows():
            for e in row.sessions or ():
                if e.get("session") in self.sessions and "tflops" in e:
                    ratios.setdefault(e["session"], []).append(e["tflops"] / row.tflops)
        return {sid: statistics.median(r) for sid, r in ratios.items()}

    def _spread(self) -> Spread:
        within, within_df, between, between_df = 0.0, 0, 0.0, 0
        for row in self.landscape.complete_rows():
            medians = []
            for e in self._entries(row):
                logs = [math.log(x) for x in e["rounds"]]
                mean = sum(logs) / len(logs)
                within += sum((x - mean) ** 2 for x in logs)
                within_df += len(logs) - 1
                medians.append(math.log(e["tflops"] / self.levels[e["session"]]))
            if len(medians) >= 2:
                mean = sum(medians) / len(medians)
                between += sum((x - mean) ** 2 for x in medians)
                between_df += len(medians) - 1
        if within_df:
            return Spread(math.sqrt(within / within_df), math.sqrt(between / between_df) if between_df else 0.0,
                          "sessions")
        reps = [r.spread_ms / r.median_ms for r in self.landscape.complete_rows() if r.spread_ms and r.median_ms]
        return Spread(statistics.median(reps) / P20_P80_WIDTH if reps else 0.0, 0.0, "reps")

    def tflops(self, row: Row, n: int) -> float:
        """The figure of `row`'s config at its n-th evaluation (0 = the first)."""
        rng = random.Random(f"{self.seed}:{row.config_key}:{n}")
        entries = self._entries(row)
        if entries:
            e = rng.choice(entries)
            return rng.choice(e["rounds"]) / self.levels[e["session"]]
        return row.tflops * math.exp(rng.gauss(0.0, self.spread.total))

    def describe(self) -> str:
        drawn = sum(1 for r in self.landscape.complete_rows() if self._entries(r))
        s = self.spread
        if s.source == "sessions":
            spread = (f"σ {100 * s.total:.2f} % (within a session {100 * s.within:.2f} %, between sessions "
                      f"{100 * s.between:.2f} %)")
        else:
            spread = f"σ {100 * s.total:.2f} % (no session recorded: the rows' p20..p80 of their reps)"
        return (f"replay noise, seed {self.seed}: {drawn} config(s) draw a round of {len(self.levels)} recorded "
                f"session(s), the others their figure × exp(N(0, σ)), {spread}")


__all__ = ["ReplayNoise", "Spread"]
