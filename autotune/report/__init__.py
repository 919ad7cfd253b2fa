"""Study reports: per plot, a pure function computes what to show (data.py), then plotly (HTML) and matplotlib
(PNG) draw it. `write_report(study, out_dir)` does the whole thing for one study; `select.py` finds studies."""
from .report import ReportFiles, ReportInfos, compute_infos, file_stem, write_report
from .view import STATUSES, StudyView, TrialRecord, load_view

__all__ = ["ReportFiles", "ReportInfos", "STATUSES", "StudyView", "TrialRecord", "compute_infos", "file_stem",
           "load_view", "write_report"]
