"""How near one shape is to another, for lookups that fall back to the nearest tuned shape (the runtime) and for
warm starts (the search). Kept apart from best_table.py so that reading it costs no sqlalchemy import."""
from __future__ import annotations

import math

from space import Shape


def distance(a: Shape, b: Shape) -> float:
    """The nearest-neighbour metric of runtime/lookup.py's docstring (log2 seqlen, log2 batch·heads)."""
    dq = math.log2(a.seqlen_q) - math.log2(b.seqlen_q)
    dk = math.log2(a.seqlen_k) - math.log2(b.seqlen_k)
    dbh = math.log2(a.batch * a.heads) - math.log2(b.batch * b.heads)
    return math.sqrt(0.5 * dq * dq + 0.5 * dk * dk + dbh * dbh)


def alignment_fits(row: Shape, shape: Shape) -> bool:
    """Whether a tuned row's shape may stand in for `shape` (a nearest neighbour, a warm start) by the causal mask's
    alignment: the same alignment, or a square row or shape (Nq == Nk: both alignments are one mask there). An
    upper-left row of Nq != Nk timed a mostly masked kernel, a lower-right one a nearly full one: never the other's."""
    return (row.causal_align == shape.causal_align or row.seqlen_q == row.seqlen_k
            or shape.seqlen_q == shape.seqlen_k)


__all__ = ["alignment_fits", "distance"]
