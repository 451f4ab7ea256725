"""A loss plot as PNG bytes, drawn by matplotlib (Agg, no pyplot, no display needed).

One panel per series, side by side, each with its own y range (a DiT flow loss near 1-3 and an LM
cross-entropy near 12 would flatten each other on one axis): the curve over its steps, a light
grid, a title, and "step" / "loss" axis labels. matplotlib is imported inside `loss_plot`, so
importing this module (the CLI does, through `main_job`) stays cheap.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

WIDTH, HEIGHT = 800, 360  # pixels of the PNG
DPI = 100
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd")


@dataclass(frozen=True)
class Series:
    title: str
    points: Sequence[tuple[float, float]]  # (step, loss); non-finite losses are dropped


def loss_plot(series: Sequence[Series], width: int = WIDTH, height: int = HEIGHT) -> bytes:
    """PNG bytes (8-bit RGB, exactly `width` x `height` pixels) of one panel per series."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from PIL import Image  # matplotlib's own image dependency

    # Agg sizes its canvas as int(inches * dpi): a hair over the wanted size never truncates to
    # one pixel short.
    figure = Figure(figsize=((width + 1e-3) / DPI, (height + 1e-3) / DPI), dpi=DPI)
    figure.set_facecolor("white")
    canvas = FigureCanvasAgg(figure)
    axes = figure.subplots(1, max(1, len(series)), squeeze=False)[0]
    for index, item in enumerate(series):
        _panel(axes[index], item, COLORS[index % len(COLORS)])
    if not series:
        axes[0].set_axis_off()
    figure.tight_layout()
    canvas.draw()
    rgba = np.asarray(canvas.buffer_rgba())
    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(rgba[..., :3])).save(buffer, format="PNG")
    return buffer.getvalue()


def _panel(ax, series: Series, color: str) -> None:
    ax.set_title(series.title, fontsize=10)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.grid(True, color="#e1e1e1", linewidth=0.8)
    ax.set_axisbelow(True)
    points = [(x, y) for x, y in series.points if math.isfinite(x) and math.isfinite(y)]
    if not points:
        ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", va="center")
        return
    steps, losses = zip(*points, strict=True)
    ax.plot(steps, losses, color=color, linewidth=1.5, marker="o" if len(points) == 1 else None)
