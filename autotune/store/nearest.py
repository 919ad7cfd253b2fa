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


__all__ = ["distance"]
