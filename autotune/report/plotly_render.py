"""Interactive figures (plotly) from the plot infos of data.py. Draws only what an info holds.

The top-configs table is not a figure here: the HTML report writes it as a real <table> (html.py).
"""
from __future__ import annotations

import plotly.graph_objects as go

from . import style
from .data import (
    HeatmapInfo, HistoryInfo, ImportanceInfo, OutcomeInfo, ParallelInfo, RegistersInfo,
)

_LAYOUT = dict(template="plotly_white", margin=dict(l=70, r=30, t=60, b=60), height=460)


def _figure(kind: str, **layout) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(title=style.TITLES[kind], **{**_LAYOUT, **layout})
    return fig


def placeholder(kind: str, text: str) -> go.Figure:
    """An empty plot that says why it is empty (still a drawn figure, so the report's layout holds)."""
    fig = _figure(kind, height=260)
    fig.add_annotation(text=text, showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5, font=dict(size=14))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig


def history(info: HistoryInfo) -> go.Figure:
    if info.placeholder:
        return placeholder("history", info.placeholder)
    fig = _figure("history", xaxis_title="trial", yaxis_title="TFLOPS")
    fig.add_trace(go.Scatter(x=info.numbers, y=info.tflops, mode="markers", name="trial",
                             marker=dict(color=style.TRIAL_COLOUR, size=7),
                             hovertemplate="trial %{x}<br>%{y:.1f} TFLOPS<extra></extra>"))
    fig.add_trace(go.Scatter(x=info.numbers, y=info.best_so_far, mode="lines", name="best so far",
                             line=dict(color=style.BEST_COLOUR, shape="hv", width=2)))
    if info.failed_numbers:  # where the search spent trials without a speed: a rug along the bottom
        fig.add_trace(go.Scatter(x=info.failed_numbers, y=[0] * len(info.failed_numbers), mode="markers",
                                 name=f"no TFLOPS ({len(info.failed_numbers)})",
                                 marker=dict(symbol="line-ns-open", color=style.FAILED_COLOUR, size=10),
                                 hovertemplate="trial %{x}: no TFLOPS<extra></extra>"))
    for label, value in info.baselines.items():
        fig.add_hline(y=value, line=dict(color=style.BASELINE_COLOURS.get(label, "black"), dash="dash"),
                      annotation_text=f"{label} {value:.0f}", annotation_position="top left")
    # Keep the baselines in view even when every trial is far below them.
    top = max(info.tflops + list(info.baselines.values()))
    fig.update_yaxes(range=[0, top * 1.1])
    return fig


def importance(info: ImportanceInfo) -> go.Figure:
    if info.placeholder:
        return placeholder("importance", info.placeholder)
    fig = _figure("importance", xaxis_title=f"importance ({info.evaluator}, {info.n_trials} complete trials)")
    fig.add_trace(go.Bar(x=info.importances[::-1], y=info.params[::-1], orientation="h",
                         marker_color=style.TRIAL_COLOUR, text=[f"{v:.2f}" for v in info.importances[::-1]],
                         textposition="outside", hovertemplate="%{y}: %{x:.3f}<extra></extra>"))
    fig.update_xaxes(range=[0, max(info.importances) * 1.2])
    return fig


def parallel(info: ParallelInfo) -> go.Figure:
    if info.placeholder:
        return placeholder("parallel", info.placeholder)
    dims = [dict(label="TFLOPS", values=info.tflops)]
    for axis in info.axes:
        dims.append(dict(label=axis.name, values=axis.values, tickvals=axis.tickvals, ticktext=axis.ticktext,
                         range=[-0.25, len(axis.ticktext) - 0.75]))
    fig = _figure("parallel", margin=dict(l=60, r=60, t=90, b=40))
    fig.add_trace(go.Parcoords(dimensions=dims, line=dict(color=info.tflops, colorscale=style.COLOURSCALE,
                                                          showscale=True, colorbar=dict(title="TFLOPS"))))
    return fig


def heatmap(info: HeatmapInfo) -> go.Figure:
    if info.placeholder:
        return placeholder("heatmap", info.placeholder)
    text = [[("" if v is None else f"{v:.0f}<br>n={n}") for v, n in zip(row, counts)]
            for row, counts in zip(info.best, info.counts)]
    fig = _figure("heatmap", xaxis_title="Bc (key columns per tile)", yaxis_title="Br (query rows per CTA)")
    # Categories as strings: Br/Bc are tile sizes, not a continuous scale; None cells stay blank.
    fig.add_trace(go.Heatmap(z=info.best, x=[str(c) for c in info.cols], y=[str(r) for r in info.rows],
                             text=text, texttemplate="%{text}", colorscale=style.COLOURSCALE,
                             colorbar=dict(title="TFLOPS"), hoverongaps=False,
                             hovertemplate="Br %{y} × Bc %{x}<br>best %{z:.1f} TFLOPS<extra></extra>"))
    fig.update_xaxes(type="category")
    fig.update_yaxes(type="category")
    return fig


def registers(info: RegistersInfo) -> go.Figure:
    if info.placeholder:
        return placeholder("registers", info.placeholder)
    fig = _figure("registers", xaxis_title="min_blocks (__launch_bounds__)", yaxis_title="registers per thread")
    for kind, (symbol, _, colour, label) in style.KIND_MARKS.items():
        pts = [p for p in info.points if p.kind == kind]
        if not pts:
            continue
        fig.add_trace(go.Scatter(
            x=[p.min_blocks + style.jitter(p.number) for p in pts], y=[p.registers for p in pts], mode="markers",
            name=f"{label} ({len(pts)})", marker=dict(symbol=symbol, color=colour, size=9, line=dict(width=1)),
            customdata=[[p.number, p.threads, p.status, p.spill_bytes] for p in pts],
            hovertemplate="trial %{customdata[0]} (%{customdata[2]})<br>%{y} registers, %{customdata[1]} threads"
                          "<br>spill %{customdata[3]} B<extra></extra>"))
    for cap in info.caps:
        fig.add_trace(go.Scatter(x=cap.min_blocks, y=cap.cap, mode="lines", line=dict(dash="dot", width=1.5),
                                 name=f"cap 65536/({cap.threads}·min_blocks)"))
    fig.update_xaxes(tickvals=info.min_blocks_values, range=[min(info.min_blocks_values) - 0.5,
                                                              max(info.min_blocks_values) + 0.5])
    return fig


def outcomes(info: OutcomeInfo) -> go.Figure:
    if info.placeholder:
        return placeholder("outcomes", info.placeholder)
    names = list(info.counts)
    fig = _figure("outcomes", yaxis_title="trials", height=380)
    fig.add_trace(go.Bar(x=names, y=[info.counts[n] for n in names], text=[info.counts[n] for n in names],
                         textposition="outside", marker_color=[style.status_colour(n) for n in names]))
    fig.update_yaxes(range=[0, max(info.counts.values()) * 1.2 + 1])
    return fig
