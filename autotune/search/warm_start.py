"""Warm start: the configs a fresh study of a shape tries first, taken from the shapes already tuned nearby.

Neighbours are the best-per-shape rows (store/best_table.py) on the same GPU, arch, dtype, head_dim and causal
flag (those decide which configs are valid at all) and a fitting causal alignment (store.nearest.alignment_fits: a
lower-right decode row is no neighbour of an upper-left one of Nq != Nk, nor the other way round), ranked by the runtime's nearest-neighbour metric
(store.nearest.distance: log2 seqlen and log2 batch·heads, so seqlen 2048 → 4096 is a distance of 1). The
choice, up to `k` configs:

  1. the stored best of each neighbour, nearest first (each was re-timed and won its own study);
  2. then the next-best trials of the neighbours' studies, nearest study first, when those studies are in
     the same storage (a table imported from elsewhere has rows without studies: step 1 still works).

Every config is checked against the new shape's rules before it is queued; the search queues them ahead of the
heuristic default (search.loop.queue_first), so the sampler's first trials are the neighbours' winners.

`WarmStore` adds the rows of exported tables (studies/tuned/h200.json) to a storage's rows as neighbours: a campaign
into a fresh storage then starts each shape from the shipped winner of that very shape (distance 0) or of its
nearest shipped shape, and the shipped winner is re-measured beside whatever the search finds.
"""
from __future__ import annotations

from typing import Callable

import space
from space import Arch, Config, Shape

from ..store.best_table import BestStore, StoreError, read_export, row_matches
from ..store.nearest import alignment_fits, distance
from . import study as studies


def neighbour_configs(store, storage, shape: Shape, gpu_name: str, arch: Arch, k: int,
                      log: Callable[[str], None] = print) -> list[Config]:
    """Up to k configs for `shape` from its tuned neighbours (module docstring). `store`: a BestStore or the
    URL to open one at; `storage`: the Optuna storage holding the neighbours' studies (or None)."""
    if k <= 0:
        return []
    own = isinstance(store, str)
    table = BestStore(store) if own else store
    try:
        if not hasattr(table, "all_rows"):  # e.g. a replay's store, which holds nothing
            return []
        rows = table.all_rows(gpu_name=gpu_name, arch=arch.name, dtype=shape.dtype, head_dim=shape.head_dim,
                              causal=shape.causal)
    finally:
        if own:
            table.close()
    # Rows of the other causal alignment (Nq != Nk) timed another mask: not neighbours (store.nearest.alignment_fits)
    ranked = sorted((r for r in rows if alignment_fits(r.shape, shape)), key=lambda r: (distance(shape, r.shape), -r.tflops))
    chosen: list[Config] = []
    used: list[str] = []

    def take(key: str, source) -> None:
        if len(chosen) >= k:
            return
        try:
            config = Config.from_key(key)
        except (KeyError, ValueError):
            return  # from another version of the space
        if config in chosen or not space.is_valid(config, shape.problem, arch):
            return
        chosen.append(config)
        if source not in used:
            used.append(source)

    for row in ranked:
        take(row.config_key, row)
    for row in ranked:
        for key in _study_top(storage, row.study, k):
            take(key, row)
    if chosen:
        names = ", ".join(f"{r.shape.key} (distance {distance(shape, r.shape):.2f})" for r in used)
        log(f"warm start: {len(chosen)} config(s) from tuned neighbour(s) {names}")
    return chosen


def _study_top(storage, name: str | None, k: int) -> list[str]:
    """Config keys of the best trials of study `name` (none when it is not in this storage)."""
    import optuna

    if storage is None or not name:
        return []
    try:
        study = optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        return []
    return [t.user_attrs["config_key"] for t in studies.top_trials(study, k)]


class WarmStore:
    """A storage's best-per-shape table (BestStore) that also offers the rows of exported files as neighbours.
    Reading (`all_rows`): the storage's rows, then the files' rows of shapes the storage has no row for.
    Storing (`record_best`) and `lookup` go to the storage alone: the files are never written."""

    def __init__(self, store: BestStore, extra: list):
        self.store, self.extra = store, list(extra)

    @classmethod
    def open(cls, url: str, files) -> "WarmStore":
        """ValueError naming the file when one is not a readable export; its unusable rows are left out."""
        extra = []
        for path in files:
            try:
                extra += read_export(path).entries
            except StoreError as e:
                raise ValueError(f"--warm-from: {e}") from None
        return cls(BestStore(url), extra)

    def all_rows(self, **filters) -> list:
        own = self.store.all_rows(**filters)
        keys = {r.key for r in own}
        return own + [e for e in self.extra if e.key not in keys and row_matches(e, **filters)]

    def record_best(self, entry, source=None, **options):  # options: BestStore.record_best's (supersedes_study)
        return self.store.record_best(entry, source, **options)

    def lookup(self, gpu_name: str, arch: str, shape):
        """The storage's own row (the files' rows are never stored ones)."""
        return self.store.lookup(gpu_name, arch, shape)

    def close(self) -> None:
        self.store.close()


__all__ = ["WarmStore", "neighbour_configs"]
