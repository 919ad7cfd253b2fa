"""What each plot shows, computed from a `StudyView` without drawing anything.

One pure function per plot returns a small frozen dataclass (the "info"); the plotly and matplotlib renderers
draw only what the info holds, so tests check these objects instead of pixels (the split of
optuna/visualization/_slice.py). An info that cannot be drawn meaningfully carries a `placeholder` sentence
saying why; renderers show that sentence in place of the plot.

Per-config plots (importances, parallel coordinates, Br × Bc, registers, top table) use each config once:
a trial that repeats an earlier config copies its result and is left out (`StudyView.configs`).
"""
from __future__ import annotations

import datetime as dt
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import optuna

import space
from space.mma_sync import register_cap

from .view import FAMILY, STATUSES, StudyView, TrialRecord

# Study user attr `baselines`: key -> label. The history draws and the table compares the first two (the bars
# the issue names); the header lists every baseline the study measured.
BASELINE_LABELS = {"sdpa_flash": "SDPA flash (FA2)", "sdpa_cudnn": "SDPA cuDNN"}
ALL_BASELINE_LABELS = {**BASELINE_LABELS, "sdpa_efficient": "SDPA memory-efficient"}
# PED-ANOVA compares the top 10 % of complete trials with all of them: with fewer than ten there is no top
# decile to speak of, so below this the importance plot explains instead of guessing.
MIN_IMPORTANCE_TRIALS = 10
TOP_CONFIGS = 10
MAX_CAP_LINES = 4  # one register-cap curve per thread count; more than a few is clutter
NOT_APPLICABLE = "n/a"  # parallel-coordinates tick for an axis the trial's family does not have
COL_AXIS, BLOCKS_AXIS = "bc", "min_blocks"


# ---------------------------------------------------------------------------------------------- history
@dataclass(frozen=True)
class HistoryInfo:
    numbers: list[int]          # complete trials (repeats left out), in trial order
    tflops: list[float]
    best_so_far: list[float]    # running maximum over `tflops`
    failed_numbers: list[int]   # trials that produced no speed (any other outcome)
    baselines: dict[str, float]  # label -> TFLOPS, the lines to draw
    placeholder: str | None = None


def history_info(view: StudyView) -> HistoryInfo:
    done = sorted((t for t in view.configs if t.complete), key=lambda t: t.number)
    best, running = [], float("-inf")
    for t in done:
        running = max(running, t.tflops)
        best.append(running)
    return HistoryInfo(
        numbers=[t.number for t in done],
        tflops=[t.tflops for t in done],
        best_so_far=best,
        failed_numbers=sorted(t.number for t in view.configs if not t.complete),
        baselines=baseline_lines(view),
        placeholder=None if done else _no_complete(view),
    )


# ------------------------------------------------------------------------------------------ importances
@dataclass(frozen=True)
class ImportanceInfo:
    params: list[str]         # most important first
    importances: list[float]  # fractions summing to 1
    n_trials: int             # complete configs the evaluator saw
    evaluator: str
    placeholder: str | None = None


def importance_info(view: StudyView) -> ImportanceInfo:
    done = [t for t in view.configs if t.complete]
    name = "PED-ANOVA"  # Optuna's default evaluator: deterministic, no scikit-learn (fANOVA needs both)
    if len(done) < MIN_IMPORTANCE_TRIALS:
        return ImportanceInfo([], [], len(done), name,
                              f"Parameter importances need at least {MIN_IMPORTANCE_TRIALS} complete trials; "
                              f"this study has {len(done)}.")
    if len({t.tflops for t in done}) < 2:
        return ImportanceInfo([], [], len(done), name,
                              "Every complete trial has the same TFLOPS, so no parameter explains any variation.")
    values: dict[str, set] = {}
    for t in done:
        for p, v in t.params.items():
            values.setdefault(p, set()).add((type(v).__name__, v))
    params = sorted(p for p, vs in values.items() if len(vs) > 1)  # a constant explains nothing
    if not params:
        return ImportanceInfo([], [], len(done), name,
                              "No parameter takes more than one value among the complete trials.")
    # Complete trials only: a pruned build has no TFLOPS to attribute. Conditional (per-family) parameters are
    # fine: PED-ANOVA handles trials that lack some of them.
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # no "A new study created in memory" line
    try:
        study = optuna.create_study(direction="maximize")
        study.add_trials([optuna.trial.create_trial(params=t.params, distributions=t.distributions, value=t.tflops)
                          for t in done])
        scores = optuna.importance.get_param_importances(
            study, evaluator=optuna.importance.PedAnovaImportanceEvaluator(), params=params)
    except (ValueError, RuntimeError) as e:  # e.g. a parameter whose distribution changed during the study
        return ImportanceInfo([], [], len(done), name, f"Parameter importances could not be computed: {e}")
    finally:
        optuna.logging.set_verbosity(verbosity)
    ranked = sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))
    return ImportanceInfo([p for p, _ in ranked], [float(v) for _, v in ranked], len(done), name)


# ---------------------------------------------------------------------------------- parallel coordinates
@dataclass(frozen=True)
class ParallelAxis:
    name: str
    values: list[float]   # each trial's position: the index of its value in `ticktext`
    ticktext: list[str]   # the searched values in order (+ "n/a" when some trials' family lacks the axis)

    @property
    def tickvals(self) -> list[float]:
        return [float(i) for i in range(len(self.ticktext))]


@dataclass(frozen=True)
class ParallelInfo:
    axes: list[ParallelAxis]   # config axes in the family's order; TFLOPS is the colour (and the first axis)
    tflops: list[float]
    numbers: list[int]
    placeholder: str | None = None


def parallel_info(view: StudyView) -> ParallelInfo:
    done = sorted((t for t in view.configs if t.complete), key=lambda t: t.number)
    if not done:
        return ParallelInfo([], [], [], _no_complete(view))
    families = {t.config.get(FAMILY) for t in done}
    names = [n for n in axis_order(view) if n != FAMILY or len(families) > 1]  # one family: a constant axis
    axes = []
    for name in names:
        domain = list(view.domains.get(name) or [])
        for t in done:  # values outside the declared choices (hand-told trials) still get a tick
            if name in t.config and not any(_same(t.config[name], v) for v in domain):
                domain.append(t.config[name])
        ticks = [str(v) for v in domain] + ([NOT_APPLICABLE] if any(name not in t.config for t in done) else [])
        axes.append(ParallelAxis(name, [float(_index(domain, t.config[name])) if name in t.config
                                        else float(len(domain)) for t in done], ticks))
    return ParallelInfo(axes, [t.tflops for t in done], [t.number for t in done])


# ----------------------------------------------------------------------------------------- Br x Bc map
@dataclass(frozen=True)
class HeatmapInfo:
    rows: list[int]                   # Br values (y): query rows per CTA, whatever the family's axis is
    cols: list[Any]                   # Bc values (x)
    best: list[list[float | None]]    # best TFLOPS per cell, None where no config completed
    counts: list[list[int]]           # complete configs per cell
    best_numbers: list[list[int | None]]
    placeholder: str | None = None


def heatmap_info(view: StudyView) -> HeatmapInfo:
    configs = [t for t in view.configs if t.rows_per_block is not None and COL_AXIS in t.config]
    # Rows and columns span what was searched, so unexplored tiles show as blank cells rather than vanish.
    rows = sorted({t.rows_per_block for t in configs} | {v for v in view.domains.get("br", []) if _is_int(v)})
    cols = list(view.domains.get(COL_AXIS) or [])
    cols += sorted({t.config[COL_AXIS] for t in configs if not any(_same(t.config[COL_AXIS], c) for c in cols)})
    best = [[None] * len(cols) for _ in rows]
    counts = [[0] * len(cols) for _ in rows]
    numbers = [[None] * len(cols) for _ in rows]
    done = [t for t in configs if t.complete]
    for t in done:
        i, j = rows.index(t.rows_per_block), _index(cols, t.config[COL_AXIS])
        counts[i][j] += 1
        if best[i][j] is None or t.tflops > best[i][j]:
            best[i][j], numbers[i][j] = t.tflops, t.number
    placeholder = None
    if not done:
        placeholder = (_no_complete(view) if not view.complete
                       else "No complete trial has both a Br (rows per block) and a Bc value.")
    return HeatmapInfo(rows, cols, best, counts, numbers, placeholder)


# ------------------------------------------------------------------------------ registers vs min_blocks
KINDS = ("complete", "spilled", "failed")  # how a built config is marked


@dataclass(frozen=True)
class RegisterPoint:
    number: int
    min_blocks: int
    registers: int
    threads: int | None
    status: str
    kind: str                # one of KINDS: complete, spilled (ptxas spilled), failed (built, then failed)
    spill_bytes: int
    tflops: float | None


@dataclass(frozen=True)
class CapLine:
    threads: int
    min_blocks: list[int]
    cap: list[int]           # registers per thread that __launch_bounds__(threads, min_blocks) leaves


@dataclass(frozen=True)
class RegistersInfo:
    points: list[RegisterPoint]
    caps: list[CapLine]
    min_blocks_values: list[int]
    placeholder: str | None = None

    def count(self, kind: str) -> int:
        return sum(p.kind == kind for p in self.points)


def registers_info(view: StudyView) -> RegistersInfo:
    built = sorted((t for t in view.configs if t.built and _is_int(t.config.get(BLOCKS_AXIS))),
                   key=lambda t: t.number)
    points = [RegisterPoint(number=t.number, min_blocks=int(t.config[BLOCKS_AXIS]), registers=int(t.registers),
                            threads=t.threads, status=t.status, kind=_kind(t), spill_bytes=t.spill_bytes or 0,
                            tflops=t.tflops) for t in built]
    blocks = sorted({int(b) for b in view.domains.get(BLOCKS_AXIS, []) if _is_int(b)} | {p.min_blocks for p in points})
    # A cap curve helps only where it binds: below ptxas' 255 ceiling somewhere in the plotted range.
    caps = []
    for threads, _ in Counter(p.threads for p in points if p.threads).most_common(MAX_CAP_LINES):
        line = CapLine(threads, blocks, [register_cap(threads, b) for b in blocks])
        if min(line.cap, default=255) < 255:
            caps.append(line)
    caps.sort(key=lambda c: c.threads)
    placeholder = None
    if not points:
        placeholder = ("No trial reached the compiler (every trial was rejected before building)."
                       if view.trials else "The study has no trials yet.")
    return RegistersInfo(points, caps, blocks, placeholder)


def _kind(t: TrialRecord) -> str:
    if t.status == "spilled" or (t.spill_bytes or 0) > 0:
        return "spilled"
    return "complete" if t.complete else "failed"


# ------------------------------------------------------------------------------------------ top configs
@dataclass(frozen=True)
class TopRow:
    rank: int
    number: int
    config: str
    registers: int | None
    spill_bytes: int | None
    smem_bytes: int | None
    threads: int | None
    time_ms: float | None
    tflops: float
    vs_baseline: dict[str, float]  # baseline label -> our TFLOPS / theirs


@dataclass(frozen=True)
class TopTableInfo:
    rows: list[TopRow]
    baselines: dict[str, float]
    placeholder: str | None = None

    columns = ("rank", "trial", "config", "registers", "spill B", "smem B", "threads", "time ms", "TFLOPS")


def top_table_info(view: StudyView, limit: int = TOP_CONFIGS) -> TopTableInfo:
    done = sorted((t for t in view.configs if t.complete), key=lambda t: (-t.tflops, t.number))[:limit]
    lines = baseline_lines(view)
    rows = [TopRow(rank=i + 1, number=t.number, config=config_text(t), registers=t.registers,
                   spill_bytes=t.spill_bytes, smem_bytes=t.smem_bytes, threads=t.threads, time_ms=t.time_ms,
                   tflops=t.tflops, vs_baseline={label: t.tflops / v for label, v in lines.items()})
            for i, t in enumerate(done)]
    return TopTableInfo(rows, lines, None if rows else _no_complete(view))


# --------------------------------------------------------------------------------------------- outcomes
REPEATED = "repeated"  # as autotune/search/study.py's status_counts (and the search's summary) call them


@dataclass(frozen=True)
class OutcomeInfo:
    counts: dict[str, int]     # every known status (zeros kept, in STATUSES order), `repeated`, then any others
    reasons: dict[str, list[tuple[str, int]]]  # status -> most common reasons (numbers replaced by N)
    total: int
    placeholder: str | None = None


def outcome_info(view: StudyView, top_reasons: int = 5) -> OutcomeInfo:
    """Trials by outcome; a repeat of a judged config ran nothing, so it counts as `repeated`, not again."""
    found = Counter(t.status if t.original else REPEATED for t in view.trials)
    counts = {s: found.pop(s, 0) for s in (*STATUSES, REPEATED)}
    counts.update(sorted(found.items()))
    reasons: dict[str, Counter] = {}
    for t in view.configs:
        if t.status != "complete" and t.reason:
            reasons.setdefault(t.status, Counter()).update(reason_groups(t.reason))
    return OutcomeInfo(counts, {s: c.most_common(top_reasons) for s, c in reasons.items()}, len(view.trials),
                       None if view.trials else "The study has no trials yet.")


def reason_groups(reason: str) -> list[str]:
    """What a reason counts under: each rule of 'rows_per_warp, smem_optin_limit' (invalid configs list the
    rules they break), else its first line with numbers as N, so 'spills 96 B' and 'spills 128 B' group."""
    first = reason.strip().splitlines()[0] if reason.strip() else ""
    if re.fullmatch(r"\w+(, \w+)*", first):
        return first.split(", ")
    return [re.sub(r"\d+(\.\d+)?", "N", first)[:120]]


# ----------------------------------------------------------------------------------------------- header
@dataclass(frozen=True)
class HeaderInfo:
    study: str
    shape: str
    gpu_name: str | None
    arch: str | None
    first_trial: dt.datetime | None
    last_trial: dt.datetime | None
    n_trials: int
    n_configs: int                       # distinct configs judged (repeats left out)
    n_complete: int                      # complete distinct configs
    best_number: int | None
    best_config: str | None
    best_tflops: float | None            # as the trial measured it
    retimed_tflops: float | None         # the winner's final re-timing, next to the baselines (if the search did)
    baselines: dict[str, float]          # every baseline the study measured, label -> TFLOPS
    vs_baseline: dict[str, float] = field(default_factory=dict)  # best (re-timed if known) / baseline


def header_info(view: StudyView) -> HeaderInfo:
    starts = [t.datetime_start for t in view.trials if t.datetime_start]
    ends = [t.datetime_complete or t.datetime_start for t in view.trials if t.datetime_complete or t.datetime_start]
    best = view.best
    # The search's winner: the re-timing it chose (a tie keeps the simplest), else (studies from before ties)
    # the fastest re-timing; either may differ from the best trial.
    retimed = (next((r for r in view.retimed if r.chosen), None) or max(view.retimed, key=lambda r: r.tflops)
               if view.retimed else None)
    if retimed is not None:
        best = next((t for t in view.configs if t.number == retimed.trial), best)
    speed = retimed.tflops if retimed else (best.tflops if best else None)
    baselines = {ALL_BASELINE_LABELS.get(k, k): v for k, v in view.baselines.items()}
    return HeaderInfo(
        study=view.name, shape=shape_text(view.shape), gpu_name=view.gpu_name, arch=view.arch,
        first_trial=min(starts) if starts else None, last_trial=max(ends) if ends else None,
        n_trials=len(view.trials), n_configs=len(view.configs), n_complete=sum(t.complete for t in view.configs),
        best_number=best.number if best else None,
        best_config=(retimed.config_key if retimed else None) or (config_text(best) if best else None),
        best_tflops=best.tflops if best else None, retimed_tflops=retimed.tflops if retimed else None,
        baselines=baselines, vs_baseline={k: speed / v for k, v in baselines.items()} if speed else {},
    )


def shape_text(shape: dict[str, Any]) -> str:
    if not shape:
        return "unknown shape"
    parts = [f"batch {shape.get('batch', '?')}", f"heads {shape.get('heads', '?')}"]
    if shape.get("kv_heads") not in (None, shape.get("heads")):
        parts.append(f"kv_heads {shape['kv_heads']}")
    parts.append(f"seqlen {shape.get('seqlen_q', '?')}")
    if shape.get("seqlen_k") not in (None, shape.get("seqlen_q")):
        parts.append(f"seqlen_k {shape['seqlen_k']}")
    parts += [f"head_dim {shape.get('head_dim', '?')}", str(shape.get("dtype", "?")),
              "causal" if shape.get("causal") else "non-causal"]
    return " · ".join(parts)


def config_text(t: TrialRecord) -> str:
    if t.config_key:
        return t.config_key
    values = dict(t.config)
    family = values.pop(FAMILY, "")
    return f"{family}:" + ",".join(f"{k}={v}" for k, v in values.items())


def baseline_lines(view: StudyView) -> dict[str, float]:
    return {label: view.baselines[key] for key, label in BASELINE_LABELS.items() if key in view.baselines}


def axis_order(view: StudyView) -> list[str]:
    """`family`, then each family's axes in space/'s order (as the kernel lists them), then anything else."""
    seen: list[str] = []
    for t in view.trials:
        seen += [n for n in t.config if n not in seen]
    ordered = [FAMILY] if FAMILY in seen else []
    for fam in dict.fromkeys(t.config.get(FAMILY) for t in view.trials):
        if fam in space.FAMILIES:
            ordered += [a.name for a in space.get_family(fam).axes if a.name in seen and a.name not in ordered]
    return ordered + [n for n in seen if n not in ordered]


# -------------------------------------------------------------------------------------------- helpers
def _no_complete(view: StudyView) -> str:
    if not view.trials:
        return "The study has no trials yet."
    return f"None of the {len(view.trials)} trials completed, so there is no TFLOPS to show."


def _same(a, b) -> bool:
    return type(a) is type(b) and a == b  # True and 1 are different ticks


def _index(domain: list, value) -> int:
    return next(i for i, v in enumerate(domain) if _same(v, value))


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)
