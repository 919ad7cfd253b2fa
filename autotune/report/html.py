"""One self-contained HTML page per study: plotly.js inlined once in <head>, every figure a div that draws
itself with it, so the file opens offline and can be mailed or attached to an issue as is."""
from __future__ import annotations

import datetime as dt
from html import escape

import plotly.io as pio
import plotly.offline

from . import style
from .data import HeaderInfo, OutcomeInfo, TopTableInfo

PLOT_ORDER = ("history", "importance", "parallel", "heatmap", "registers", "outcomes")
_PLOT_CONFIG = {"displaylogo": False, "responsive": True}

_CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1200px; color: #222; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; }
dl.header { display: grid; grid-template-columns: max-content auto; gap: 0.2em 1em; }
dl.header dt { font-weight: 600; }
dl.header dd { margin: 0; }
section { margin-top: 1.5em; }
table { border-collapse: collapse; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.5em; text-align: right; }
td.config { text-align: left; font-family: monospace; min-width: 24em; }
div.scroll { overflow-x: auto; }
.faster { color: #2ca02c; font-weight: 600; }
.slower { color: #d62728; }
.muted { color: #777; }
"""


def page(header: HeaderInfo, figures: dict, top: TopTableInfo, outcomes: OutcomeInfo,
         generated: dt.datetime | None = None) -> str:
    """`figures`: plot kind -> plotly Figure, for every kind of PLOT_ORDER."""
    generated = generated or dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    sections = []
    for kind in PLOT_ORDER:
        div = pio.to_html(figures[kind], full_html=False, include_plotlyjs=False, div_id=f"plot-{kind}",
                          config=_PLOT_CONFIG)
        extra = _reasons(outcomes) if kind == "outcomes" else ""
        sections.append(f'<section id="{kind}" class="plot">{div}{extra}</section>')
        if kind == "history":  # the table of winners reads best right after their history
            sections.append(f'<section id="top"><h2>{style.TITLES["top"]}</h2>{_top_table(top)}</section>')
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>autotune report: {escape(header.study)}</title><style>{_CSS}</style>"
        # plotly's own to_html sets this before the library: MathJax (never used here) must not be fetched.
        "<script>window.PlotlyConfig = {MathJaxConfig: 'local'};</script>"
        f"<script>{plotly.offline.get_plotlyjs()}</script></head>\n<body>"
        f"{_header(header, generated)}\n" + "\n".join(sections) + "\n</body></html>\n"
    )


def _header(h: HeaderInfo, generated: dt.datetime) -> str:
    rows = [  # (name, html)
        ("shape", escape(h.shape)),
        ("GPU", escape(f"{h.gpu_name or 'unknown GPU'} ({h.arch or 'unknown arch'})")),
        ("trials", f"{h.n_trials} ({h.n_configs} distinct configs, {h.n_complete} complete)"),
    ]
    if h.best_tflops is not None:
        best = f"<b>{h.best_tflops:.1f} TFLOPS</b> in trial {h.best_number}"
        if h.retimed_tflops is not None:
            best += f", <b>{h.retimed_tflops:.1f} TFLOPS</b> re-timed next to the baselines"
        rows.append(("best", f"{best}<br><code>{escape(h.best_config or '')}</code>"))
        versus = "; ".join(f"{escape(label)} {value:.1f} TFLOPS: {_ratio(h.vs_baseline[label])}"
                           for label, value in h.baselines.items())
        rows.append(("vs baselines", versus or '<span class="muted">none measured</span>'))
    else:
        rows.append(("best", '<span class="muted">no complete trial yet</span>'))
    rows += [("date", escape(_dates(h.first_trial, h.last_trial))),
             ("report written", escape(generated.isoformat(sep=" ")))]
    items = "".join(f"<dt>{name}</dt><dd>{value}</dd>" for name, value in rows)
    return f'<header><h1>autotune report: {escape(h.study)}</h1><dl class="header">{items}</dl></header>'


def _top_table(info: TopTableInfo) -> str:
    if info.placeholder:
        return f'<p class="muted">{escape(info.placeholder)}</p>'
    head = "".join(f"<th>{escape(c)}</th>" for c in info.columns)
    head += "".join(f"<th>vs {escape(label)}</th>" for label in info.baselines)
    body = []
    for r in info.rows:
        numbers = (r.registers, r.spill_bytes, r.smem_bytes, r.threads, _fmt(r.time_ms, 4), _fmt(r.tflops, 1))
        tds = f'<td>{r.rank}</td><td>{r.number}</td><td class="config">{_breakable(r.config)}</td>'
        tds += "".join(f"<td>{'' if v is None else escape(str(v))}</td>" for v in numbers)
        tds += "".join(f"<td>{_ratio(r.vs_baseline[label])}</td>" for label in info.baselines)
        body.append(f"<tr>{tds}</tr>")
    return (f'<div class="scroll"><table class="top"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody>'
            "</table></div>")


def _breakable(config_key: str) -> str:
    """Config keys are one long word: let the browser wrap them after each axis."""
    return ",<wbr>".join(escape(part) for part in config_key.split(","))


def _reasons(info: OutcomeInfo) -> str:
    repeats = info.counts.get("repeated", 0)
    note = (f'<p class="muted">{repeats} of the {info.total} trials proposed a config the study had already judged: '
            "they ran nothing, copied that result, and appear once in the other plots.</p>" if repeats else "")
    if not info.reasons:
        return note
    rows = "".join(f"<tr><td>{escape(status)}</td><td class=\"config\">{escape(reason)}</td><td>{n}</td></tr>"
                   for status, pairs in info.reasons.items() for reason, n in pairs)
    return ('<table class="reasons"><thead><tr><th>outcome</th><th>most common reasons</th><th>trials</th></tr>'
            f"</thead><tbody>{rows}</tbody></table>{note}")


def _ratio(x: float | None) -> str:
    if x is None:
        return ""
    return f'<span class="{"faster" if x >= 1 else "slower"}">{x:.2f}×</span>'


def _fmt(v, digits: int) -> str | None:
    return None if v is None else f"{v:.{digits}f}"


def _dates(first: dt.datetime | None, last: dt.datetime | None) -> str:
    if first is None:
        return "no trials"
    start = first.replace(microsecond=0).isoformat(sep=" ")
    return start if last is None else f"{start} to {last.replace(microsecond=0).isoformat(sep=' ')}"
