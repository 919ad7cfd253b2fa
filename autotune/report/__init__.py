"""report: study reports. Per plot, a pure function computes what to show (data.py), then plotly (HTML) and
matplotlib (PNG) draw it.

Owns: reading a study into a view (view.py), the per-plot infos (data.py), the renderers (plotly_render.py,
mpl_render.py, html.py, style.py), the whole report of one study (report.py) and finding studies (select.py).

May import: no other layer (space/, optuna, plotly, matplotlib): it reads studies through Optuna and the trial
attributes of docs/CONTRACTS.md, never the search's code.

Public names: write_report, compute_infos, file_stem, ReportFiles, ReportInfos, load_view, StudyView,
TrialRecord, STATUSES; select.
"""
from .report import ReportFiles, ReportInfos, compute_infos, file_stem, write_report
from .view import STATUSES, StudyView, TrialRecord, load_view

__all__ = ["ReportFiles", "ReportInfos", "STATUSES", "StudyView", "TrialRecord", "compute_infos", "file_stem",
           "load_view", "write_report"]
