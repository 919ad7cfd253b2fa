"""Compute every plot's info for one study, then write the HTML page and the PNGs beside it."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import optuna

from . import data, mpl_render, plotly_render
from .view import StudyView, load_view

PLOTLY = {"history": plotly_render.history, "importance": plotly_render.importance,
          "parallel": plotly_render.parallel, "heatmap": plotly_render.heatmap,
          "registers": plotly_render.registers, "outcomes": plotly_render.outcomes}


@dataclass(frozen=True)
class ReportInfos:
    header: data.HeaderInfo
    plots: dict  # kind -> info: history, importance, parallel, heatmap, registers, outcomes, top


@dataclass
class ReportFiles:
    study: str
    html: Path
    pngs: list[Path] = field(default_factory=list)


def compute_infos(view: StudyView) -> ReportInfos:
    return ReportInfos(data.header_info(view), {
        "history": data.history_info(view),
        "importance": data.importance_info(view),
        "parallel": data.parallel_info(view),
        "heatmap": data.heatmap_info(view),
        "registers": data.registers_info(view),
        "outcomes": data.outcome_info(view),
        "top": data.top_table_info(view),
    })


def file_stem(study_name: str) -> str:
    """A study name as a file name: anything but [A-Za-z0-9._-] becomes '_' (names may hold '/' or ':')."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", study_name).strip(".") or "study"


def write_report(study: optuna.Study | StudyView, out_dir: str | Path, png: bool = True) -> ReportFiles:
    """Writes <out_dir>/<study>.html and, with `png`, <out_dir>/<study>-<plot>.png (plus -overview.png)."""
    from . import html  # plotly.js is read only when a page is written

    view = study if isinstance(study, StudyView) else load_view(study)
    infos = compute_infos(view)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = file_stem(view.name)
    figures = {kind: render(infos.plots[kind]) for kind, render in PLOTLY.items()}
    files = ReportFiles(view.name, out / f"{stem}.html")
    files.html.write_text(html.page(infos.header, figures, infos.plots["top"], infos.plots["outcomes"]),
                          encoding="utf-8")
    if png:
        for kind, info in infos.plots.items():
            files.pngs.append(mpl_render.save_one(kind, info, out / f"{stem}-{kind}.png"))
        title = f"{view.name}: {infos.header.shape} on {infos.header.gpu_name or '?'} ({infos.header.arch or '?'})"
        files.pngs.append(mpl_render.save_overview(infos.plots, out / f"{stem}-overview.png", title))
    return files
