"""Time several builds against each other: interleaved, in rounds, in one evaluator session.

    round 1:  A B C D E        every build once, in the given order (each evaluation checks, then times)
    round 2:  A B C D E        the same order again: a drift of the GPU (clocks, heat, a neighbour tenant)
    round 3:  A B C D E        spreads over all of them instead of landing on whichever was timed last

A build that fails a round (wrong, crashed, timeout) is out and is not timed again: a kernel that faulted once is
no candidate, and timing it again would only cost a worker restart. Used by the search's finale
(search/retime.py) and the landscapes' re-measurement (landscapes/noise.py); `evaluator` is anything with
`evaluate(build, shape) -> EvalOutcome` (child_process.Evaluator, a replay, a test double).
"""
from __future__ import annotations

import statistics

from .child_process import EvalOutcome

P20_P80_WIDTH = 1.683  # (p80 - p20) / σ of a normal distribution: an evaluation's reps spread as a σ


def interleave(evaluator, builds: list, shape, rounds: int) -> list[list[EvalOutcome]]:
    """Each build's outcomes, in round order; a None build is skipped (no outcomes)."""
    if rounds < 1:
        raise ValueError(f"rounds: expected a count ≥ 1, got {rounds}")
    out: list[list[EvalOutcome]] = [[] for _ in builds]
    for _ in range(rounds):
        for build, outcomes in zip(builds, out):
            if build is None or (outcomes and not outcomes[-1].ok):
                continue
            outcomes.append(evaluator.evaluate(build, shape))
    return out


def summarize(outcomes: list[EvalOutcome]) -> EvalOutcome:
    """One outcome for a build's rounds: the first failure, else the median TFLOPS and time of the rounds with the
    slowest - fastest round as the spread (ms); one round is returned as it is."""
    if not outcomes:
        return EvalOutcome("crashed", "not timed")
    failed = next((o for o in outcomes if not o.ok), None)
    if failed is not None:
        return failed
    if len(outcomes) == 1:
        return outcomes[0]
    times = [o.time_ms for o in outcomes if o.time_ms]
    first = outcomes[0]
    return EvalOutcome("complete", first.reason, statistics.median(o.tflops for o in outcomes),
                       statistics.median(times) if times else None, (max(times) - min(times)) if times else None,
                       max((o.max_error for o in outcomes if o.max_error is not None), default=None),
                       first.blocks_per_sm)


__all__ = ["P20_P80_WIDTH", "interleave", "summarize"]
