"""Does a shipped table hold on another day? Each shipped row re-timed beside its shape's campaign finalists.

A campaign's second pass (campaign_passes.py) ships, per shape, the finalist best across two passes of one run.
The test of the table is a later one: on another GPU host or day, every shipped row should be within the noise
band of the best of its own finalists, measured then, in one process, interleaved. So:

    finalists file   what the check needs from the campaign's storage, which is not shipped: per shape, every
                     finalist that completed both passes (config and figures) and the shipped one
                     (`from_storage` → `write`; studies/finalists/h200.json beside the table)
    check            per shape: the config the table serves for it (the table's row; it is added when it is not
                     a finalist) and the finalists, built and timed interleaved in `rounds` rounds (default 6; no
                     added rounds: every config gets the same evidence), in one evaluator session
    verdict          the shipped config's median against the best finalist's: it holds when it is at most `band`
                     (default 1.5 %, the issue's measured band between sessions) behind; a shipped config that
                     fails to run here fails the check
    select, confirm  the best finalist is chosen on the even rounds (0, 2, ...) and both are compared on the odd
                     ones. Choosing and judging on the same rounds favours whichever finalist drew high: the best of
                     n noisy medians sits above its true speed (by about σ for n = 5), so a table of true winners
                     would read as ~σ behind. With fewer than 2 rounds both use the one round.

Nothing is stored: a check measures a table, it does not change it.
"""
from __future__ import annotations

import datetime
import json
import math
import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from space import Shape

from . import retime
from .campaign_passes import ATTR, Finalist, PassResult
from .campaign_table import short_config

FORMAT = "autotune-finalists"
VERSION = 1
DEFAULT_BAND = 0.015
DEFAULT_ROUNDS = 6  # 3 to choose the best finalist, 3 to compare it with the served config


@dataclass(frozen=True)
class ShapeFinalists:
    """One shape's campaign finalists: `finalists` are (trial, config_key, first-pass TFLOPS, second-pass TFLOPS),
    best across both passes first; `shipped` is the config key the pass shipped."""

    study: str
    shape: Shape
    gpu_name: str
    arch: str
    shipped: str
    finalists: tuple

    def as_json(self) -> dict:
        return {"study": self.study, "shape": shape_fields(self.shape), "gpu_name": self.gpu_name,
                "arch": self.arch, "shipped": self.shipped,
                "finalists": [{"trial": t, "config_key": k, "first_tflops": a, "second_tflops": b}
                              for t, k, a, b in self.finalists]}

    @classmethod
    def from_json(cls, d: dict) -> "ShapeFinalists":
        return cls(d["study"], Shape(**d["shape"]), d["gpu_name"], d["arch"], d["shipped"],
                   tuple((int(f["trial"]), f["config_key"], float(f["first_tflops"]), float(f["second_tflops"]))
                         for f in d["finalists"]))


def shape_fields(shape: Shape) -> dict:
    return {"batch": shape.batch, "heads": shape.heads, "kv_heads": shape.kv_heads, "seqlen_q": shape.seqlen_q,
            "seqlen_k": shape.seqlen_k, "head_dim": shape.head_dim, "dtype": shape.dtype, "causal": shape.causal,
            "causal_align": shape.causal_align}


def from_studies(studies: Iterable) -> list[ShapeFinalists]:
    """The finalists of every study (objects with `study_name` and `user_attrs`) whose second pass shipped a
    config; a study without one is left out (it has nothing to check a row against)."""
    out = []
    for s in studies:
        attrs = s.user_attrs
        attr = attrs.get(ATTR) or {}
        result = PassResult.from_attr("", attr, s.study_name)
        if result.shipped is None:
            continue
        done = sorted((a for a in result.finalists if a.second), key=lambda a: a.figure, reverse=True)
        out.append(ShapeFinalists(s.study_name, Shape(**attrs["shape"]), attrs["gpu_name"], attrs["arch"],
                                  result.shipped.config_key,
                                  tuple((a.number, a.config_key, a.first, a.second) for a in done)))
    return sorted(out, key=lambda f: f.study)


def from_storage(url: str) -> list[ShapeFinalists]:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return from_studies(optuna.get_all_study_summaries(url))


def write(path: str | os.PathLike, items: list[ShapeFinalists], source: str) -> Path:
    """The finalists file: a header, then one line per shape (sorted by study), so it reviews like code."""
    path = Path(path)
    header = {"format": FORMAT, "version": VERSION, "source": source,
              "written": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    body = ",\n".join("  " + json.dumps(f.as_json(), sort_keys=True) for f in items)
    text = json.dumps(header, indent=1)[:-2] + ',\n "shapes": [\n' + body + "\n ]\n}\n"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


def merged(kept: list[ShapeFinalists], new: list[ShapeFinalists]) -> list[ShapeFinalists]:
    """`new` with those of `kept` (a finalists file's shapes) whose study `new` has not: a storage that tuned some
    shapes updates the shipped file as `autotune export --merge` updates the table. Sorted by study."""
    studies = {f.study for f in new}
    return sorted([*new, *(f for f in kept if f.study not in studies)], key=lambda f: f.study)


def read(path: str | os.PathLike) -> list[ShapeFinalists]:
    data = json.loads(Path(path).read_text())
    if data.get("format") != FORMAT or data.get("version") != VERSION:
        raise ValueError(f"{path}: expected a finalists file ({FORMAT!r} version {VERSION}), got format "
                         f"{data.get('format')!r} version {data.get('version')!r}")
    return [ShapeFinalists.from_json(d) for d in data["shapes"]]


def served_config(rows: list[dict], item: ShapeFinalists) -> str | None:
    """The config key the table (its rows as exported) serves for the item's shape and GPU: the row of the
    item's study, else the row of the same shape."""
    want = shape_fields(item.shape)
    same = [r for r in rows if r.get("gpu_name") == item.gpu_name and r.get("arch") == item.arch and
            all(r.get(k if k != "seqlen_q" else "seqlen", want[k]) == want[k] for k in want)]
    mine = [r for r in same if r.get("study") == item.study]
    row = (mine or same or [None])[0]
    return row["config_key"] if row else None


@dataclass(frozen=True)
class Verdict:
    shape_key: str
    served: str | None          # the table's config (None: the table has no row for the shape)
    served_tflops: float | None  # its median today (None: it failed, or there is no row)
    best: str | None            # the finalist with the best median today
    best_tflops: float | None
    band: float
    medians: dict = field(default_factory=dict)   # config key → median of the comparing rounds (None: failed)
    spread: float | None = None  # the median relative spread of the rounds (slowest - fastest / median)

    @property
    def ratio(self) -> float | None:
        if self.served_tflops is None or not self.best_tflops:
            return None
        return self.served_tflops / self.best_tflops

    @property
    def holds(self) -> bool:
        r = self.ratio
        return r is not None and r >= 1.0 - self.band

    def as_json(self) -> dict:
        return {"shape": self.shape_key, "served": self.served, "served_tflops": self.served_tflops,
                "best": self.best, "best_tflops": self.best_tflops, "ratio": self.ratio, "holds": self.holds,
                "band": self.band, "spread": self.spread, "medians": self.medians}


def judge(shape_key: str, served: str | None, medians: dict, band: float = DEFAULT_BAND,
          spread: float | None = None, chosen_on: dict | None = None) -> Verdict:
    """The verdict from today's medians (config key → TFLOPS, None for a config that failed); the best finalist is
    the one with the highest `chosen_on` figure (default: `medians` themselves; module docstring: select, confirm)
    and it is compared with the served config on `medians`."""
    ok = {k: v for k, v in (medians if chosen_on is None else chosen_on).items() if v and medians.get(k)}
    best = max(ok, key=ok.get) if ok else None
    return Verdict(shape_key, served, medians.get(served) if served else None, best,
                   medians.get(best) if best else None, band, dict(medians), spread)


def split_medians(rounds: list) -> tuple[float | None, float | None]:
    """(median of the even rounds, median of the odd rounds) of one config's TFLOPS per round (None: failed);
    one round serves as both."""
    if not rounds or any(not x for x in rounds):
        return None, None
    if len(rounds) < 2:
        return rounds[0], rounds[0]
    return statistics.median(rounds[0::2]), statistics.median(rounds[1::2])


def check_shape(item: ShapeFinalists, served: str | None, builder, evaluator, *, rounds: int = DEFAULT_ROUNDS,
                band: float = DEFAULT_BAND, log: Callable[[str], None] = print) -> Verdict:
    """Time the served config and the item's finalists interleaved (`rounds` rounds each) and judge."""
    keys = [k for _, k, _, _ in item.finalists]
    if served and served not in keys:
        keys.append(served)
    trials = [Finalist(i, 0.0, {"config_key": k}) for i, k in enumerate(keys)]
    retimed, _, notes = retime.retime_and_baselines(trials, builder, evaluator, item.shape, rounds=rounds,
                                                    max_rounds=rounds, log=lambda _: None)
    for note in notes:
        log(f"  note: {note}")
    by_number = {r.number: r for r in retimed}
    halves = {k: split_medians([o.tflops if o.ok else None for o in by_number[i].rounds] if i in by_number else [])
              for i, k in enumerate(keys)}
    spreads = sorted(r.relative_spread for r in retimed if r.ok and r.relative_spread is not None)
    spread = spreads[len(spreads) // 2] if spreads else None
    return judge(item.shape.key, served, {k: h[1] for k, h in halves.items()}, band, spread,
                 chosen_on={k: h[0] for k, h in halves.items()})


def markdown(verdicts: list[Verdict]) -> str:
    lines = ["| shape | served config | TFLOPS | best finalist (chosen on the even rounds) | TFLOPS | served / best "
             "| rounds' spread | holds |", "|---|---|---|---|---|---|---|---|"]
    for v in verdicts:
        other = "the same" if v.best == v.served else short_config(v.best)
        fig = (lambda x: f"{x:.1f}" if x else "failed")
        ratio = f"{v.ratio:.3f}" if v.ratio is not None else "-"
        spread = f"{100 * v.spread:.2f} %" if v.spread is not None else "-"
        lines.append(f"| {v.shape_key} | {short_config(v.served)} | {fig(v.served_tflops)} | {other} | "
                     f"{fig(v.best_tflops)} | {ratio} | {spread} | {'yes' if v.holds else '**no**'} |")
    held = sum(v.holds for v in verdicts)
    ratios = [v.ratio for v in verdicts if v.ratio is not None]
    worst = f"; served / best {min(ratios):.3f}-{max(ratios):.3f}, geometric mean " \
            f"{math.exp(sum(map(math.log, ratios)) / len(ratios)):.3f}" if ratios else ""
    band = verdicts[0].band if verdicts else DEFAULT_BAND
    lines += ["", f"{held} of {len(verdicts)} row(s) within {100 * band:.1f} % of their best finalist{worst} "
                  "(TFLOPS: medians of the odd rounds)"]
    return "\n".join(lines)


__all__ = ["DEFAULT_BAND", "DEFAULT_ROUNDS", "FORMAT", "ShapeFinalists", "Verdict", "check_shape", "from_storage",
           "from_studies", "judge", "markdown", "read", "served_config", "split_medians", "write"]
