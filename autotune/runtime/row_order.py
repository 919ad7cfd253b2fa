"""The order in which the lookup tries exact rows for a shape, before the nearest tuned shape:

  1. a searched row of the shape itself (the user's storage, then the shipped tables);
  2. a searched row of the shape's bucket (buckets.py: what a captured campaign tuned), storage then shipped;
  3. a row that benchmark mode (benchmark_mode.py) measured at first use for a shape of the same bucket (the
     shape itself first, then the others by distance): one measurement serves a bucket, as it does in the
     process that measured it.

So a row benchmarked before a campaign ran never hides the campaign's searched row, and the next process starts
from a benchmarked row rather than measuring again. Benchmarked rows keep the key of the shape that was measured,
so they never compete with a searched row of the bucket for one key in the best table. Benchmarked rows are told apart by their study name,
BENCHMARKED_STUDY, which `autotune best` and `autotune best --explain` print as the row's study.
"""
from __future__ import annotations

from typing import Iterator

from space import Shape

from ..store.nearest import distance
from .buckets import bucket

BENCHMARKED_STUDY = "benchmarked at first use (not searched)"


def is_benchmarked(entry) -> bool:
    """Whether a best-table row (store.best_table.BestEntry) was measured by benchmark mode, not searched."""
    return entry.study == BENCHMARKED_STUDY


def exact_steps(shape: Shape, stored: tuple, shipped: tuple) -> Iterator[tuple[str, tuple, Shape, str | None]]:
    """(source, candidates, the shape to match exactly, a note for explain() or None), in lookup order."""
    searched = tuple(c for c in stored if not is_benchmarked(c.entry))
    benchmarked = tuple(c for c in stored if is_benchmarked(c.entry))
    yield "storage", searched, shape, None
    yield "shipped", shipped, shape, None
    b = bucket(shape)
    if b != shape:
        note = f"tuned as the bucket {b.key} of {shape.key} (autotune/runtime/buckets.py)"
        yield "storage", searched, b, note
        yield "shipped", shipped, b, note
    same_bucket = []
    for c in benchmarked:
        try:
            if bucket(c.shape) == b:
                same_bucket.append(c)
        except ValueError:  # not a valid shape: the lookup's own checks name it
            continue
    same_bucket.sort(key=lambda c: (round(distance(shape, c.shape), 9), c.entry.key))
    for c in same_bucket:
        yield "storage", (c,), c.shape, (f"a row {BENCHMARKED_STUDY} for {c.shape.key}, in the bucket {b.key}: the "
                                         "fastest of a few tuned neighbours' configs and the default; a search of "
                                         "the shape or its bucket (a captured campaign) takes precedence")


__all__ = ["BENCHMARKED_STUDY", "exact_steps", "is_benchmarked"]
