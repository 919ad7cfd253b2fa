"""Find the studies a report is asked for: by name, or by the shape the search recorded in each study."""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import optuna

from .data import shape_text

# CLI filter -> key of the study user attr `shape` (the fields of space.Shape).
SHAPE_FILTERS = {"seqlen": "seqlen_q", "batch": "batch", "heads": "heads", "head_dim": "head_dim",
                 "dtype": "dtype", "causal": "causal"}


@dataclass(frozen=True)
class StudyEntry:
    name: str
    n_trials: int
    shape: dict[str, Any]
    arch: str | None
    gpu_name: str | None
    started: dt.datetime | None

    def describe(self) -> str:
        where = " on ".join(x for x in (self.gpu_name, self.arch) if x) or "unknown GPU"
        return f"{self.name}  ({shape_text(self.shape)}; {where}; {self.n_trials} trials)"


def list_studies(storage: str | optuna.storages.BaseStorage) -> list[StudyEntry]:
    out = []
    for s in optuna.get_all_study_summaries(storage, include_best_trial=False):
        attrs = s.user_attrs
        out.append(StudyEntry(s.study_name, s.n_trials, dict(attrs.get("shape") or {}), attrs.get("arch"),
                              attrs.get("gpu_name"), s.datetime_start))
    return sorted(out, key=lambda e: e.name)


def match(entries: list[StudyEntry], name: str | None = None, **filters) -> list[StudyEntry]:
    """Entries with this name (if given) whose recorded shape has every given filter's value (None = any)."""
    wanted = {SHAPE_FILTERS[k]: v for k, v in filters.items() if v is not None}
    unknown = set(filters) - set(SHAPE_FILTERS)
    if unknown:
        raise TypeError(f"unknown shape filter(s) {sorted(unknown)}; known: {sorted(SHAPE_FILTERS)}")
    return [e for e in entries
            if (name is None or e.name == name)
            and all(k in e.shape and e.shape[k] == v for k, v in wanted.items())]
