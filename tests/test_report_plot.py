"""The loss plot: a PNG of the asked size, one panel per run, each curve drawn in its own colour
inside its own panel; matplotlib loads only when a plot is drawn."""

from __future__ import annotations

import io
import math
import subprocess
import sys

import numpy as np
from PIL import Image

from hotstep_ray.report_plot import COLORS, HEIGHT, WIDTH, Series, loss_plot


def _pixels(data: bytes) -> np.ndarray:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    image = Image.open(io.BytesIO(data))
    assert image.mode == "RGB"  # 8-bit RGB, no alpha
    return np.asarray(image)


def _has_colour(pixels: np.ndarray, colour: str) -> bool:
    rgb = np.array([int(colour[i : i + 2], 16) for i in (1, 3, 5)])
    # antialiasing blends the line's edges; its middle is the colour itself, give or take 1
    return bool((np.abs(pixels.astype(int) - rgb).max(axis=2) <= 1).any())


def test_one_panel_per_series_each_curve_in_its_own_half():
    dit = Series("dit lokr loss, 8 epochs", [(s, 2.0 - 0.01 * s) for s in range(1, 33)])
    lm = Series("lm lora loss, 4 epochs", [(s, 12.0 / s) for s in range(1, 53)])
    pixels = _pixels(loss_plot([dit, lm]))
    assert pixels.shape == (HEIGHT, WIDTH, 3)
    left, right = pixels[:, : WIDTH // 2], pixels[:, WIDTH // 2 :]
    assert _has_colour(left, COLORS[0]) and not _has_colour(right, COLORS[0])
    assert _has_colour(right, COLORS[1]) and not _has_colour(left, COLORS[1])


def test_sizes_single_points_non_finite_losses_and_no_data():
    for width, height in ((800, 360), (333, 129), (1001, 257)):
        pixels = _pixels(loss_plot([Series("x", [(1, 1.0), (2, 0.5)])], width, height))
        assert pixels.shape == (height, width, 3)
    # NaN / inf points are dropped; a lone finite point is still drawn (as a marker)
    lone = Series("one", [(1, math.nan), (2, 0.7), (3, math.inf)])
    assert _has_colour(_pixels(loss_plot([lone])), COLORS[0])
    empty = _pixels(loss_plot([Series("nothing", [(1, math.nan)])]))
    assert empty.shape == (HEIGHT, WIDTH, 3) and not _has_colour(empty, COLORS[0])
    assert _pixels(loss_plot([])).shape == (HEIGHT, WIDTH, 3)


def test_importing_the_module_does_not_import_matplotlib():
    code = "import sys, hotstep_ray.report_plot; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
