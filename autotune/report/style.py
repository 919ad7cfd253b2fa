"""Colours, marker shapes and titles both renderers use, so the HTML and the PNGs read the same way."""
from __future__ import annotations

TITLES = {
    "history": "Optimization history",
    "importance": "Parameter importances",
    "parallel": "Parallel coordinates (coloured by TFLOPS)",
    "heatmap": "Best TFLOPS per Br × Bc",
    "registers": "Registers vs min_blocks",
    "outcomes": "Trials by outcome",
    "top": "Top configurations",
}

STATUS_COLOURS = {
    "complete": "#2ca02c",
    "invalid": "#7f7f7f",
    "spilled": "#d62728",
    "compile_error": "#8c564b",
    "wrong": "#ff7f0e",
    "crashed": "#9467bd",
    "timeout": "#e377c2",
    "repeated": "#c7c7c7",
    "cancelled": "#17becf",
}
OTHER_COLOUR = "#bcbd22"

# registers plot: how each kind of build is marked (plotly symbol, matplotlib marker, colour, legend label)
KIND_MARKS = {
    "complete": ("circle", "o", "#1f77b4", "complete"),
    "spilled": ("x", "x", "#d62728", "spilled (pruned)"),
    "failed": ("triangle-up", "^", "#7f7f7f", "built, then failed (wrong / crashed / timeout)"),
}

TRIAL_COLOUR = "#1f77b4"
FAILED_COLOUR = "#7f7f7f"
BEST_COLOUR = "#ff7f0e"
BASELINE_COLOURS = {"SDPA flash (FA2)": "#d62728", "SDPA cuDNN": "#9467bd"}
COLOURSCALE = "Viridis"  # plotly name; matplotlib's "viridis" is the same map
MPL_CMAP = "viridis"


def status_colour(status: str) -> str:
    return STATUS_COLOURS.get(status, OTHER_COLOUR)


def jitter(number: int, width: float = 0.25) -> float:
    """A deterministic horizontal offset, so builds with equal (min_blocks, registers) do not hide each other."""
    return ((number * 0.618033988749895) % 1.0 - 0.5) * width
