"""The end of a search: re-time the finalists interleaved, in rounds, in one evaluator session; decide the winner
(or a tie) from the measured spreads; store it.

Trial times come from many moments of a long run (clocks, temperature, other tenants), so the winner is decided
by timing the few best again in one worker process (measure/rounds.py), next to the SDPA baselines measured there:

    round 1:  A B C D E        every finalist once, in rank order (each evaluation checks, then times)
    round 2:  A B C D E        the same order again: a drift of the GPU (clocks, heat) spreads over all of
    round 3:  A B C D E        them instead of landing on whichever config happened to be timed last

A finalist's figure is the median of its rounds' TFLOPS; its band is the lowest..highest round (with a single
round: the one evaluation's p20..p80 of its reps, the only spread measured). A finalist that fails any round
(wrong, crashed, timeout) is out and is not timed again.

Ahead beyond noise: the fastest finalist (highest median) wins outright only when its band lies wholly above the
runner-up's, i.e. every round of the winner beat every round of the runner-up. Otherwise it is a TIE, and the
tied finalists are those whose band overlaps the fastest one's. Among tied finalists the simplest is kept:
the heuristic default of its family for this shape (space.default_config) if one is tied, else the one with the
fewest axes that differ from its family's default, then the higher median. The default is what an untuned shape
runs anyway, and a fixed rule among noise-equal configs makes two sessions pick the same winner.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from space import Arch, Config, Shape

from ..measure.child_process import EvalOutcome
from ..measure.rounds import interleave, summarize
from ..store.best_table import BestEntry
from .exhaustive import distance_to_default

DEFAULT_ROUNDS = 3


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
    def band(self) -> tuple[float, float]:
        """(low, high) TFLOPS: the slowest and fastest round; one round: its p20..p80 (module docstring)."""
        values = [r.tflops for r in self.rounds if r.ok and r.tflops]
        if len(values) >= 2:
            return min(values), max(values)
        o = self.outcome
        if o.time_ms and o.spread_ms and o.spread_ms < o.time_ms:
            half = o.spread_ms / 2  # the time's p20..p80 around its median, as TFLOPS
            return o.tflops * o.time_ms / (o.time_ms + half), o.tflops * o.time_ms / (o.time_ms - half)
        return o.tflops, o.tflops

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


@dataclass(frozen=True)
class Verdict:
    """Who won the re-timing, by how much, and whether that is beyond the measured noise."""

    chosen: Retimed | None                 # the config to store
    fastest: Retimed | None                # the highest median
    runner_up: Retimed | None
    tied: tuple[Retimed, ...] = ()         # finalists whose band overlaps the fastest one's (it included); () if none
    rounds: int = 0

    @property
    def tie(self) -> bool:
        return len(self.tied) > 1

    @property
    def lead(self) -> float | None:
        """How far the fastest median is ahead of the runner-up's, relative (0.013 = 1.3 %)."""
        if self.fastest is None or self.runner_up is None:
            return None
        return self.fastest.outcome.tflops / self.runner_up.outcome.tflops - 1

    def describe(self) -> str:
        if self.chosen is None:
            return "re-timing: no finalist completed every round; nothing to store"
        f = self.fastest

        def show(r: Retimed) -> str:
            low, high = r.band
            return f"#{r.number} {r.outcome.tflops:.1f} TFLOPS ({low:.1f}-{high:.1f})"

        head = f"re-timed {self.rounds} round(s), interleaved: "
        if self.runner_up is None:
            return head + f"winner {show(f)}, the only finalist that completed"
        lead = f"{100 * self.lead:.2f} % ahead of {show(self.runner_up)}"
        if not self.tie:
            return head + f"winner {show(f)}, {lead}: beyond noise (every round faster)"
        c = self.chosen
        why = ("its family's default" if c.default_distance == 0 else
               f"{c.default_distance} axes from its family's default, the fewest" if c.default_distance is not None
               else "the fastest")
        kept = "the fastest" if c is f else f"#{c.number} {c.outcome.tflops:.1f} TFLOPS ({why})"
        return (head + f"TIE within noise: {show(f)} is {lead}; {len(self.tied)} finalists' rounds overlap "
                f"the fastest one's, keeping {kept}")


def retime_and_baselines(top: list, builder, evaluator, shape: Shape, *, rounds: int = DEFAULT_ROUNDS,
                         arch: Arch | None = None,
                         log: Callable[[str], None] = print) -> tuple[list[Retimed], dict, list[str]]:
    """Re-time `top` (FrozenTrials, best first) interleaved for `rounds` rounds, and measure the SDPA baselines,
    all in the evaluator's one worker session. `arch` (for each family's default) enables the tie-break by
    simplicity."""
    if rounds < 1:
        raise ValueError(f"rounds: expected a count ≥ 1, got {rounds}")
    notes: list[str] = []
    configs = []
    for t in top:
        try:
            configs.append((t, Config.from_key(t.user_attrs["config_key"])))
        except (KeyError, ValueError) as e:
            notes.append(f"trial #{t.number}: cannot re-time, its config is no longer in the space ({e})")
    retimed: list[Retimed] = []
    if configs:
        log(f"re-timing the top {len(configs)} config(s) in one evaluator session, {rounds} round(s) interleaved...")
        builds = builder.build([(c, shape.problem) for _, c in configs])  # cache hits, unless the sources changed
        measured = interleave(evaluator, [b if b.ok else None for b in builds], shape, rounds)
        for (t, config), build, outcomes in zip(configs, builds, measured):
            if not build.ok:
                outcomes = [EvalOutcome("crashed", f"rebuild failed: {build.error}")]
            r = Retimed(t.number, config, summarize(outcomes), float(t.value), tuple(outcomes),
                        default_distance(config, shape, arch), build.cubin_hash if build.ok else None)
            retimed.append(r)
            if not r.ok:
                notes.append(f"trial #{t.number} failed its re-timing ({r.outcome.status}: {r.outcome.reason}); "
                             "it is not a candidate")
    try:
        baselines = evaluator.baselines(shape)
    except Exception as e:  # the table still prints; the baselines are context, not the result
        baselines = {}
        notes.append(f"SDPA baselines could not be measured: {e}")
    return retimed, baselines, notes


def default_distance(config: Config, shape: Shape, arch: Arch | None) -> int | None:
    """How many axes of `config` differ from its family's heuristic default for the shape (None: unknown)."""
    return None if arch is None else distance_to_default(config, shape.problem, arch)


def decide(retimed: list[Retimed]) -> Verdict:
    """The module docstring's rule: the fastest median wins when its band is wholly above the runner-up's; else
    the tied finalists' simplest (default, then fewest axes from the default, then the faster median)."""
    done = sorted((r for r in retimed if r.ok), key=lambda r: -r.outcome.tflops)
    rounds = max((len(r.rounds) for r in retimed), default=0)
    if not done:
        return Verdict(None, None, None, rounds=rounds)
    fastest = done[0]
    runner_up = done[1] if len(done) > 1 else None
    floor = fastest.band[0]
    tied = tuple(r for r in done if r is fastest or r.band[1] >= floor)
    if len(tied) < 2:
        return Verdict(fastest, fastest, runner_up, (), rounds)

    def simplicity(r: Retimed):
        distance = r.default_distance if r.default_distance is not None else float("inf")
        return (distance, -r.outcome.tflops)

    return Verdict(min(tied, key=simplicity), fastest, runner_up, tied, rounds)


def pick(retimed: list[Retimed]) -> Retimed | None:
    """The config to store: decide(retimed).chosen."""
    return decide(retimed).chosen


def store_best(store, best: Retimed, shape: Shape, gpu_name: str, arch: Arch, study_name: str, prov: dict):
    """The winner's row: its median over the rounds, and their spread (slowest - fastest round, ms)."""
    entry = BestEntry.for_shape(
        shape, gpu_name, arch.name, best.config, best.outcome.tflops, time_ms=best.outcome.time_ms,
        spread_ms=best.outcome.spread_ms, study=study_name, trial=best.number,
        kernel_source_hash=prov.get("kernel_source_hash"), nvcc_version=prov.get("nvcc_version"),
        cubin_hash=best.cubin_hash,
    )
    return store.record_best(entry)


__all__ = ["DEFAULT_ROUNDS", "Retimed", "Verdict", "decide", "default_distance", "pick", "retime_and_baselines",
           "store_best"]
