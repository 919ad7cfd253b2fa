"""The end of a search: choose the finalists, re-time them interleaved in rounds in one evaluator session, add
rounds while the leader is not separated from the runner-up, keep the fastest median; store it.

Trial times come from many moments of a long run (clocks, temperature, other tenants), so the winner is decided
by timing the best few again in one worker process (measure/rounds.py), next to the SDPA baselines measured there:

    finalists  the top `at_least` trials (--retime, 5), and beyond them every trial within `within` (3 %) of
               the best trial's figure, up to `cap` (10): when many configs are close, the one the trials
               happened to rank first is not more likely the fastest than the others
    round 1:   A B C D E ...   every finalist once, in rank order (each evaluation checks, then times)
    rounds 2-3 the same order again: a drift of the GPU (clocks, heat) spreads over all of them
    more rounds, for the contenders only (the finalists not measurably slower than the leader), until the
               leader is separated from every other finalist or `max_rounds` rounds are spent (--retime-max-rounds)

A finalist's figure is the median of its rounds' TFLOPS; its band is the lowest..highest round (with a single
round: the one evaluation's p20..p80 of its reps). A finalist that fails any round (wrong, crashed, timeout) is
out and is not timed again.

The decision (separation.py for the statistics): the noise of one round is measured on the finalists themselves
(the pooled spread of their rounds); a finalist is *measurably slower* than the leader (the highest median) when
the leader's median is ahead by more than the margin that noise explains (t quantile 0.975 × the standard error
of the difference of the two medians). The leader is *separated* when every other finalist is measurably slower;
otherwise the ones that are not are its contenders and the verdict is a TIE. Either way the config kept is the
leader: the highest median is the best estimate of the fastest, and no rule among noise-equal configs may keep
one the measurement already places below it. (The rule this replaces kept, among finalists whose bands overlapped
the fastest's, the one closest to its family's default: on the H200 it stored a config 3 % slower than the
leader, and in the recorded sessions it still picked different winners in different sessions.)
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from space import Arch, Config, Shape

from ..measure.child_process import EvalOutcome
from ..measure.rounds import interleave, summarize
from ..store.best_table import BestEntry
from . import separation
from .exhaustive import distance_to_default
from .verdicts import SAME_CUBIN_AS

DEFAULT_ROUNDS = 3            # rounds every finalist gets
DEFAULT_MAX_ROUNDS = 8        # the round budget: contenders get rounds until separated or this many
DEFAULT_WITHIN = 0.03         # finalists: every trial within 3 % of the best trial's figure ...
DEFAULT_CAP = 10              # ... up to this many finalists


def finalists(top: list, at_least: int, within: float = DEFAULT_WITHIN, cap: int = DEFAULT_CAP) -> list:
    """The trials to re-time, from `top` (best first, each with a `value`): the first `at_least`, then every
    trial within `within` (relative) of the best one's value, up to max(cap, at_least) in all. A trial that
    copied the figure of an identical binary (verdicts.SAME_CUBIN_AS) is left out: its twin is timed instead."""
    if at_least < 1:
        raise ValueError(f"--retime: expected a count ≥ 1, got {at_least}")
    if not 0 <= within < 1:
        raise ValueError(f"--retime-within: expected a fraction from 0 to 1 (0.03 = 3 %), got {within}")
    top = [t for t in top if SAME_CUBIN_AS not in t.user_attrs]
    if not top:
        return []
    floor = float(top[0].value) * (1 - within)
    close = sum(1 for t in top if float(t.value) >= floor)
    return list(top[:min(max(at_least, close), max(cap, at_least))])


@dataclass(frozen=True)
class Retimed:
    number: int               # the trial that found this config
    config: Config
    outcome: EvalOutcome      # over the rounds: median TFLOPS and time, spread = slowest - fastest round (ms);
                              # or the first failed round
    trial_tflops: float       # what the trial measured
    rounds: tuple[EvalOutcome, ...] = ()  # every round, in order (a failed one ends them)
    default_distance: int | None = None   # axes that differ from its family's default (0: the default itself)
    cubin_hash: str | None = None         # sha256 of the cubin these rounds timed (the stored row records it)

    @property
    def ok(self) -> bool:
        return self.outcome.status == "complete" and bool(self.outcome.tflops)

    @property
    def figures(self) -> list[float]:
        """TFLOPS of every completed round."""
        return [r.tflops for r in self.rounds if r.ok and r.tflops]

    @property
    def band(self) -> tuple[float, float]:
        """(low, high) TFLOPS: the slowest and fastest round; one round: its p20..p80 (module docstring)."""
        values = self.figures
        if len(values) >= 2:
            return min(values), max(values)
        o = self.outcome
        if o.time_ms and o.spread_ms and o.spread_ms < o.time_ms:
            half = o.spread_ms / 2  # the time's p20..p80 around its median, as TFLOPS
            return o.tflops * o.time_ms / (o.time_ms + half), o.tflops * o.time_ms / (o.time_ms - half)
        return o.tflops, o.tflops

    @property
    def reps_spread(self) -> float | None:
        """One evaluation's p20..p80 of its reps, relative to its median time (the spread of a single round)."""
        o = self.outcome
        return o.spread_ms / o.time_ms if len(self.rounds) <= 1 and o.time_ms and o.spread_ms else None

    @property
    def relative_spread(self) -> float:
        low, high = self.band
        return (high - low) / self.outcome.tflops

    def as_attr(self) -> dict:
        o = self.outcome
        low, high = self.band if self.ok else (None, None)
        return {"trial": self.number, "config_key": self.config.key, "status": o.status, "tflops": o.tflops,
                "time_ms": o.time_ms, "time_spread_ms": o.spread_ms, "trial_tflops": self.trial_tflops,
                "reason": o.reason, "rounds_tflops": [r.tflops for r in self.rounds], "low_tflops": low,
                "high_tflops": high, "default_distance": self.default_distance}


def noise_of(retimed: list[Retimed]) -> separation.Noise:
    """The noise of one round, from every completed finalist's rounds (separation.pooled)."""
    done = [r for r in retimed if r.ok]
    return separation.pooled([r.figures for r in done], [r.reps_spread for r in done])


def measurably_slower(leader: Retimed, other: Retimed, noise: separation.Noise) -> bool:
    """Is `other`'s median below the leader's by more than the margin of the measured noise?"""
    margin = noise.margin(max(1, len(leader.figures)), max(1, len(other.figures)))
    return separation.lead(leader.outcome.tflops, other.outcome.tflops) > margin


@dataclass(frozen=True)
class Verdict:
    """Who won the re-timing, by how much, and whether that is beyond the measured noise."""

    chosen: Retimed | None                 # the config to store: the leader (highest median)
    fastest: Retimed | None                # the leader
    runner_up: Retimed | None              # the second-highest median
    tied: tuple[Retimed, ...] = ()         # the leader's contenders, it included (not measurably slower); () if none
    rounds: int = 0                        # the most rounds any finalist was timed
    noise: separation.Noise | None = None
    max_rounds: int | None = None          # the round budget it ran under

    @property
    def tie(self) -> bool:
        return len(self.tied) > 1

    @property
    def separated(self) -> bool:
        """The leader is ahead of every other finalist beyond the noise (or is the only one that completed)."""
        return self.chosen is not None and not self.tie

    @property
    def lead(self) -> float | None:
        """How far the fastest median is ahead of the runner-up's, relative (0.013 = 1.3 %)."""
        if self.fastest is None or self.runner_up is None:
            return None
        return self.fastest.outcome.tflops / self.runner_up.outcome.tflops - 1

    @property
    def margin(self) -> float | None:
        """The lead over the runner-up that the measured noise explains (relative, as `lead`)."""
        if self.runner_up is None or self.noise is None:
            return None
        return math.expm1(self.noise.margin(max(1, len(self.fastest.figures)), max(1, len(self.runner_up.figures))))

    def describe(self) -> str:
        if self.chosen is None:
            return "re-timing: no finalist completed every round; nothing to store"
        f = self.fastest

        def show(r: Retimed) -> str:
            low, high = r.band
            return f"#{r.number} {r.outcome.tflops:.1f} TFLOPS ({low:.1f}-{high:.1f})"

        budget = f" (up to {self.max_rounds})" if self.max_rounds and self.max_rounds > self.rounds else ""
        head = f"re-timed {self.rounds} round(s), interleaved{budget}: "
        if self.runner_up is None:
            return head + f"winner {show(f)}, the only finalist that completed"
        noise = self.noise.describe() if self.noise else "no noise measured"
        lead = (f"{100 * self.lead:.2f} % ahead of {show(self.runner_up)}, margin {100 * self.margin:.2f} % "
                f"({noise})")
        if not self.tie:
            return head + f"winner {show(f)}, {lead}: beyond noise, every other finalist measurably slower"
        return (head + f"TIE within noise: {show(f)} is {lead}; {len(self.tied)} finalists not measurably slower "
                f"than it (round budget spent); keeping the fastest median, #{f.number}")


def decide(retimed: list[Retimed], max_rounds: int | None = None) -> Verdict:
    """The module docstring's rule: the highest median is kept; its contenders are the finalists it is not
    measurably ahead of (separation.py), none: separated."""
    done = sorted((r for r in retimed if r.ok), key=lambda r: -r.outcome.tflops)
    if not done:
        return Verdict(None, None, None, rounds=max((len(r.rounds) for r in retimed), default=0),
                       max_rounds=max_rounds)
    fastest = done[0]
    runner_up = done[1] if len(done) > 1 else None
    noise = noise_of(done)
    contenders = tuple(r for r in done if r is fastest or not measurably_slower(fastest, r, noise))
    return Verdict(fastest, fastest, runner_up, contenders if len(contenders) > 1 else (),
                   max(len(r.rounds) for r in retimed), noise, max_rounds)


def pick(retimed: list[Retimed]) -> Retimed | None:
    """The config to store: decide(retimed).chosen."""
    return decide(retimed).chosen


def retime_and_baselines(top: list, builder, evaluator, shape: Shape, *, rounds: int = DEFAULT_ROUNDS,
                         max_rounds: int | None = None, arch: Arch | None = None,
                         log: Callable[[str], None] = print) -> tuple[list[Retimed], dict, list[str]]:
    """Re-time `top` (FrozenTrials, best first; `finalists` chooses them) interleaved: `rounds` rounds for
    every one, then one more round at a time for the leader's contenders until it is separated or `max_rounds`
    (default max(DEFAULT_MAX_ROUNDS, rounds)) are spent; and measure the SDPA baselines, all in the evaluator's
    one worker session. `arch` (for each family's default) only records how far each is from it."""
    max_rounds = round_budget(rounds, max_rounds)
    if rounds < 1:
        raise ValueError(f"rounds: expected a count ≥ 1, got {rounds}")
    if max_rounds < rounds:
        raise ValueError(f"--retime-max-rounds: expected at least --retime-rounds ({rounds}), got {max_rounds}")
    notes: list[str] = []
    configs = []
    for t in top:
        try:
            configs.append((t, Config.from_key(t.user_attrs["config_key"])))
        except (KeyError, ValueError) as e:
            notes.append(f"trial #{t.number}: cannot re-time, its config is no longer in the space ({e})")
    retimed: list[Retimed] = []
    if configs:
        log(f"re-timing the top {len(configs)} config(s) in one evaluator session, {rounds} round(s) interleaved, "
            f"up to {max_rounds} for the leader's contenders...")
        builds = builder.build([(c, shape.problem) for _, c in configs])  # cache hits, unless the sources changed
        measured = interleave(evaluator, [b if b.ok else None for b in builds], shape, rounds)
        measured = [m if b.ok else [EvalOutcome("crashed", f"rebuild failed: {b.error}")]
                    for m, b in zip(measured, builds)]

        def current() -> list[Retimed]:
            return [Retimed(t.number, c, summarize(m), float(t.value), tuple(m), default_distance(c, shape, arch),
                            b.cubin_hash if b.ok else None)
                    for (t, c), m, b in zip(configs, measured, builds)]

        retimed = current()
        done = rounds
        while done < max_rounds:
            verdict = decide(retimed, max_rounds)
            if not verdict.tie:
                break
            contenders = {id(r) for r in verdict.tied}
            more = interleave(evaluator, [b if id(r) in contenders else None for r, b in zip(retimed, builds)],
                              shape, 1)
            for m, extra in zip(measured, more):
                m.extend(extra)
            done += 1
            log(f"  round {done}: {len(contenders)} contender(s); the leader's lead {100 * verdict.lead:.2f} % was "
                f"within the margin {100 * verdict.margin:.2f} %")
            retimed = current()
        for r in retimed:
            if not r.ok:
                notes.append(f"trial #{r.number} failed its re-timing ({r.outcome.status}: {r.outcome.reason}); "
                             "it is not a candidate")
    try:
        baselines = evaluator.baselines(shape)
    except Exception as e:  # the table still prints; the baselines are context, not the result
        baselines = {}
        notes.append(f"SDPA baselines could not be measured: {e}")
    return retimed, baselines, notes


def round_budget(rounds: int, max_rounds: int | None) -> int:
    """The most rounds a contender is timed: `max_rounds`, by default DEFAULT_MAX_ROUNDS (or `rounds` if more)."""
    return max(DEFAULT_MAX_ROUNDS, rounds) if max_rounds is None else max_rounds


def default_distance(config: Config, shape: Shape, arch: Arch | None) -> int | None:
    """How many axes of `config` differ from its family's heuristic default for the shape (None: unknown)."""
    return None if arch is None else distance_to_default(config, shape.problem, arch)


def store_best(store, best: Retimed, shape: Shape, gpu_name: str, arch: Arch, study_name: str, prov: dict):
    """The winner's row: its median over the rounds, and their spread (slowest - fastest round, ms)."""
    entry = BestEntry.for_shape(
        shape, gpu_name, arch.name, best.config, best.outcome.tflops, time_ms=best.outcome.time_ms,
        spread_ms=best.outcome.spread_ms, study=study_name, trial=best.number,
        kernel_source_hash=prov.get("kernel_source_hash"), nvcc_version=prov.get("nvcc_version"),
        cubin_hash=best.cubin_hash,
    )
    return store.record_best(entry)


__all__ = ["DEFAULT_CAP", "DEFAULT_MAX_ROUNDS", "DEFAULT_ROUNDS", "DEFAULT_WITHIN", "Retimed", "Verdict", "decide",
           "default_distance", "finalists", "measurably_slower", "noise_of", "pick", "retime_and_baselines",
           "round_budget", "store_best"]
