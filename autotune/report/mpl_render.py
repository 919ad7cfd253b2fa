"""Static figures (matplotlib) from the plot infos of data.py, for terminals, README and CI artefacts.

Figures are built with `matplotlib.figure.Figure`, never pyplot: no global state, no display needed, and
saving a PNG uses the Agg canvas whatever backend the user configured.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.axes import Axes
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize
from matplotlib.figure import Figure

from . import style
from .data import (
    HeatmapInfo, HistoryInfo, ImportanceInfo, OutcomeInfo, ParallelInfo, RegistersInfo, TopTableInfo,
)

DPI = 110


def placeholder(ax: Axes, kind: str, text: str) -> None:
    ax.set_title(style.TITLES[kind])
    ax.text(0.5, 0.5, text, ha="center", va="center", wrap=True, transform=ax.transAxes, fontsize=11)
    ax.set_axis_off()


def history(info: HistoryInfo, ax: Axes) -> None:
    if info.placeholder:
        return placeholder(ax, "history", info.placeholder)
    ax.set_title(style.TITLES["history"])
    ax.scatter(info.numbers, info.tflops, s=18, color=style.TRIAL_COLOUR, label="trial", zorder=3)
    ax.step(info.numbers, info.best_so_far, where="post", color=style.BEST_COLOUR, lw=2, label="best so far")
    if info.failed_numbers:  # where the search spent trials without a speed: a rug along the bottom
        ax.scatter(info.failed_numbers, [0] * len(info.failed_numbers), marker="|", s=60, color=style.FAILED_COLOUR,
                   label=f"no TFLOPS ({len(info.failed_numbers)})", clip_on=False)
    for label, value in info.baselines.items():
        ax.axhline(value, ls="--", color=style.BASELINE_COLOURS.get(label, "black"), label=f"{label} {value:.0f}")
    ax.set_ylim(0, max(info.tflops + list(info.baselines.values())) * 1.1)
    ax.set_xlabel("trial")
    ax.set_ylabel("TFLOPS")
    ax.legend(loc="best", fontsize=8)
    ax.grid(alpha=0.3)


def importance(info: ImportanceInfo, ax: Axes) -> None:
    if info.placeholder:
        return placeholder(ax, "importance", info.placeholder)
    ax.set_title(style.TITLES["importance"])
    y = np.arange(len(info.params))[::-1]
    ax.barh(y, info.importances, color=style.TRIAL_COLOUR)
    ax.set_yticks(y, info.params)
    for yi, v in zip(y, info.importances):
        ax.text(v, yi, f" {v:.2f}", va="center", fontsize=8)
    ax.set_xlim(0, max(info.importances) * 1.2)
    ax.set_xlabel(f"importance ({info.evaluator}, {info.n_trials} complete trials)")


def parallel(info: ParallelInfo, ax: Axes) -> None:
    if info.placeholder:
        return placeholder(ax, "parallel", info.placeholder)
    ax.set_title(style.TITLES["parallel"])
    # Every axis scaled to [0, 1]; categorical axes place their ticks evenly, as plotly's do.
    columns = [("TFLOPS", np.asarray(info.tflops, float), None, None)]
    columns += [(a.name, np.asarray(a.values, float), a.tickvals, a.ticktext) for a in info.axes]
    scaled, labels = [], []
    for name, values, tickvals, ticktext in columns:
        lo, hi = (min(tickvals), max(tickvals)) if tickvals else (values.min(), values.max())
        span = (hi - lo) or 1.0
        scaled.append((values - lo) / span if hi > lo else np.full_like(values, 0.5))
        if tickvals:
            labels.append([((v - lo) / span if hi > lo else 0.5, t) for v, t in zip(tickvals, ticktext)])
        else:
            labels.append([(0.0, f"{lo:.0f}"), (1.0, f"{hi:.0f}")])
    ys = np.vstack(scaled)
    x = np.arange(len(columns))
    norm = Normalize(min(info.tflops), max(info.tflops))
    cmap = matplotlib.colormaps[style.MPL_CMAP]
    for k in np.argsort(info.tflops):  # best lines drawn last, on top
        ax.plot(x, ys[:, k], color=cmap(norm(info.tflops[k])), lw=1.2, alpha=0.8)
    for xi, ticks in zip(x, labels):
        ax.axvline(xi, color="black", lw=0.8)
        for y, text in ticks:
            ax.text(xi + 0.03, y, text, fontsize=7, va="center")
    ax.set_xticks(x, [c[0] for c in columns], rotation=30, ha="right", fontsize=8)
    ax.set_yticks([])
    ax.set_xlim(-0.2, len(columns) - 0.6)
    ax.set_ylim(-0.05, 1.05)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    ax.figure.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=ax, label="TFLOPS")


def heatmap(info: HeatmapInfo, ax: Axes) -> None:
    if info.placeholder:
        return placeholder(ax, "heatmap", info.placeholder)
    ax.set_title(style.TITLES["heatmap"])
    z = np.ma.masked_invalid(np.array([[np.nan if v is None else v for v in row] for row in info.best], float))
    image = ax.imshow(z, cmap=style.MPL_CMAP, origin="lower", aspect="auto")  # masked cells stay blank
    for i, row in enumerate(info.best):
        for j, v in enumerate(row):
            if v is not None:
                ax.text(j, i, f"{v:.0f}\nn={info.counts[i][j]}", ha="center", va="center", fontsize=8,
                        color="white" if image.norm(v) < 0.6 else "black")
    ax.set_xticks(range(len(info.cols)), [str(c) for c in info.cols])
    ax.set_yticks(range(len(info.rows)), [str(r) for r in info.rows])
    ax.set_xlabel("Bc (key columns per tile)")
    ax.set_ylabel("Br (query rows per CTA)")
    ax.figure.colorbar(image, ax=ax, label="TFLOPS")


def registers(info: RegistersInfo, ax: Axes) -> None:
    if info.placeholder:
        return placeholder(ax, "registers", info.placeholder)
    ax.set_title(style.TITLES["registers"])
    for kind, (_, marker, colour, label) in style.KIND_MARKS.items():
        pts = [p for p in info.points if p.kind == kind]
        if pts:
            ax.scatter([p.min_blocks + style.jitter(p.number) for p in pts], [p.registers for p in pts],
                       marker=marker, color=colour, s=30, label=f"{label} ({len(pts)})", zorder=3)
    for cap in info.caps:
        ax.plot(cap.min_blocks, cap.cap, ls=":", lw=1.5, label=f"cap 65536/({cap.threads}·min_blocks)")
    ax.set_xticks(info.min_blocks_values)
    ax.set_xlabel("min_blocks (__launch_bounds__)")
    ax.set_ylabel("registers per thread")
    ax.legend(fontsize=7, loc="best", framealpha=0.8)
    ax.grid(alpha=0.3)


def outcomes(info: OutcomeInfo, ax: Axes) -> None:
    if info.placeholder:
        return placeholder(ax, "outcomes", info.placeholder)
    ax.set_title(style.TITLES["outcomes"])
    names = list(info.counts)
    bars = ax.bar(names, [info.counts[n] for n in names], color=[style.status_colour(n) for n in names])
    ax.bar_label(bars, fontsize=8)
    ax.set_ylabel("trials")
    ax.tick_params(axis="x", labelrotation=30, labelsize=8)
    ax.set_ylim(0, max(info.counts.values()) * 1.2 + 1)


def top_table(info: TopTableInfo, ax: Axes) -> None:
    if info.placeholder:
        return placeholder(ax, "top", info.placeholder)
    ax.set_title(style.TITLES["top"])
    ax.set_axis_off()
    header = list(info.columns) + [f"vs {label}" for label in info.baselines]
    rows = [[r.rank, r.number, r.config.partition(":")[2] or r.config, _txt(r.registers), _txt(r.spill_bytes),
             _txt(r.smem_bytes), _txt(r.threads), _txt(r.time_ms, 4), _txt(r.tflops, 1)]
            + [_txt(r.vs_baseline[label], 2) for label in info.baselines] for r in info.rows]
    # Columns as wide as their longest text, the whole table stretched over the axes (nothing clipped); the
    # config column is monospaced (axis values line up row to row) and its glyphs are wider.
    chars = [max(len(str(c)) for c in column) + 2 for column in zip(header, *rows)]
    chars[2] = int(chars[2] * 1.3)
    table = ax.table(cellText=rows, colLabels=header, cellLoc="center", bbox=[0, 0, 1, 1],
                     colWidths=[c / sum(chars) for c in chars])
    table.auto_set_font_size(False)
    table.set_fontsize(7)
    for (row, col), cell in table.get_celld().items():
        if col == 2 and row > 0:
            cell.set_text_props(family="monospace")


DRAW = {"history": history, "importance": importance, "parallel": parallel, "heatmap": heatmap,
        "registers": registers, "outcomes": outcomes, "top": top_table}
SIZES = {"parallel": (12, 5), "top": (16, 0.28), "outcomes": (7, 4.5)}  # "top": height per row, see save_one
OVERVIEW = ("history", "importance", "parallel", "heatmap", "registers", "outcomes")


def save_one(kind: str, info, path: Path) -> Path:
    width, height = SIZES.get(kind, (8, 5))
    if kind == "top":
        height = 0.8 + height * (len(getattr(info, "rows", [])) + 1)
    fig = Figure(figsize=(width, height), layout="constrained")
    DRAW[kind](info, fig.add_subplot())
    fig.savefig(path, dpi=DPI)
    return path


def save_overview(infos: dict, path: Path, title: str = "") -> Path:
    """The six plots on one canvas: the image for a README."""
    fig = Figure(figsize=(18, 15), layout="constrained")
    if title:
        fig.suptitle(title, fontsize=13)
    for k, kind in enumerate(OVERVIEW):
        DRAW[kind](infos[kind], fig.add_subplot(3, 2, k + 1))
    fig.savefig(path, dpi=DPI)
    return path


def _txt(v, digits: int | None = None) -> str:
    if v is None:
        return ""
    return f"{v:.{digits}f}" if digits is not None else str(v)
