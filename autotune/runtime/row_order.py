"""The order in which the lookup tries exact rows for a shape, before the nearest tuned shape:

  1. a searched row of the shape itself (the user's storage, then the shipped tables);
  2. a searched row of the shape's bucket (buckets.py: what a captured campaign tuned), storage then shipped;
  3. a row that benchmark mode (benchmark_mode.py) measured for the shape at first use.

So a row benchmarked before a campaign ran never hides the campaign's searched row, and the next process starts
from a benchmarked row rather than measuring again. Benchmarked rows are told apart by their study name,
BENCHMARKED_STUDY, which `autotune best` and `autotune best --explain` print as the row's study.
"""
from __future__ import annotations

from typing import Iterator

from space import Shape

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
    yield "storage", benchmarked, shape, (f"a row {BENCHMARKED_STUDY}: the fastest of a few tuned neighbours' "
                                          "configs and the default; `autotune search` finds better")


__all__ = ["BENCHMARKED_STUDY", "exact_steps", "is_benchmarked"]
