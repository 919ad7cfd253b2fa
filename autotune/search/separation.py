"""Whether one re-timed config is measurably slower than another: the noise of one round, measured on the
finalists themselves, and the margin a difference of medians must exceed to be more than that noise.

The model: a round of config c measures log TFLOPS = log(true speed of c) + e, with e independent between rounds
and of one spread σ for every finalist of a session (the same GPU, the same minutes, rounds interleaved). The
recorded re-measurement sessions support both halves: after removing each config's own level, the rounds of 20
configs per landscape share one spread (1.5-2.7 % on the N4096 landscapes, 0.24 % on N1024), and the common
drift from round to round is small beside it (≤ 0.8 %), so pairing rounds would gain little.

    σ̂       pooled standard deviation of log TFLOPS around each finalist's mean, over every completed round of
             every finalist that completed: df = Σ (rounds − 1) degrees of freedom. With one round each (df 0)
             the only spread measured is each evaluation's p20..p80 of its reps: σ̂ = that width / 1.683 (the
             p20..p80 width of a normal distribution), median over the finalists, and the t quantile of df ∞.
    SE       of a median of R rounds: 1.2533 σ̂ / √R (its large-sample value for normal noise; for R = 3 the exact
             factor is 1.16, so this errs toward "not separated")
    margin   t(0.975, df) · 1.2533 σ̂ · √(1/Ra + 1/Rb)   (relative; 0.02 = 2 %)

b is measurably slower than a when log(median a) − log(median b) > margin(a, b): a difference that noise of the
measured size produces by chance in fewer than 2.5 % of sessions.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from ..measure.rounds import P20_P80_WIDTH

# Student's t, 0.975 quantile, by degrees of freedom (between rows: the next smaller df's value, conservative)
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
         11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
         20: 2.086, 21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064, 25: 2.060, 26: 2.056, 27: 2.052, 28: 2.048,
         29: 2.045, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}
Z_975 = 1.960
MEDIAN_SE = 1.2533            # SE of a median / SE of a mean, normal noise, large samples


def t_975(df: int | None) -> float:
    """Student's t 0.975 quantile; None or a df beyond the table: the normal's."""
    if df is None or df > max(T_975):
        return Z_975
    if df < 1:
        raise ValueError(f"df: expected ≥ 1 degrees of freedom, got {df}")
    return T_975[max(d for d in T_975 if d <= df)]


@dataclass(frozen=True)
class Noise:
    """The measured noise of one round (relative), and where it came from."""

    sigma: float            # σ̂ of log TFLOPS per round (0.012 = 1.2 %)
    df: int | None          # degrees of freedom; None: from the reps' spread of single evaluations
    source: str             # "rounds", "reps" or "none" (nothing to measure it from: every difference counts)

    def margin(self, rounds_a: int, rounds_b: int) -> float:
        """The relative difference of two medians (of that many rounds each) that noise stays below (97.5 %)."""
        if self.sigma == 0:
            return 0.0
        return t_975(self.df) * MEDIAN_SE * self.sigma * math.sqrt(1 / rounds_a + 1 / rounds_b)

    def describe(self) -> str:
        if self.source == "none":
            return "no spread measured"
        what = f"{self.df} df over the rounds" if self.source == "rounds" else "from single evaluations' reps"
        return f"σ {100 * self.sigma:.2f} % per round ({what})"


def pooled(series: list[list[float]], reps_spreads: list[float] = ()) -> Noise:
    """Noise of one round from each finalist's completed rounds (TFLOPS, each list one finalist); with no
    finalist timed twice, from `reps_spreads` (each evaluation's (p80 - p20) / median)."""
    squares, df = 0.0, 0
    for values in series:
        logs = [math.log(v) for v in values if v and v > 0]
        if len(logs) >= 2:
            mean = sum(logs) / len(logs)
            squares += sum((x - mean) ** 2 for x in logs)
            df += len(logs) - 1
    if df:
        return Noise(math.sqrt(squares / df), df, "rounds")
    spreads = [s for s in reps_spreads if s is not None and s > 0]
    if spreads:
        return Noise(statistics.median(spreads) / P20_P80_WIDTH, None, "reps")
    return Noise(0.0, None, "none")


def lead(faster: float, slower: float) -> float:
    """log(faster / slower): the relative lead the margins are compared with."""
    return math.log(faster / slower)


__all__ = ["MEDIAN_SE", "Noise", "T_975", "lead", "pooled", "t_975"]
