"""A loss plot as PNG bytes, with nothing but numpy, `zlib` and `struct` (no matplotlib).

One panel per series, side by side, each with its own y range (a DiT flow loss near 1-3 and an LM
cross-entropy near 12 would flatten each other on one axis): a white canvas, axes, light grid lines
at three y ticks, the first and last step under the x axis, a title, and the curve. Text is a
built-in 5-pixel-high font drawn at 2x, enough for upper-case titles and numbers.
"""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

WIDTH, HEIGHT = 800, 360
WHITE = (255, 255, 255)
BLACK = (30, 30, 30)
GRID = (225, 225, 225)
COLORS = ((31, 119, 180), (214, 39, 40), (44, 160, 44), (148, 103, 189))
_SCALE = 2  # font pixels per glyph pixel
_MARGIN = {"left": 74, "right": 18, "top": 34, "bottom": 40}

# 5-row glyphs, 3 columns wide (M and W 5), one string per row ("1" = ink); one blank column
# between glyphs. Unknown characters render as a space.
_GLYPHS: dict[str, tuple[str, ...]] = {
    "0": ("111", "101", "101", "101", "111"),
    "1": ("010", "110", "010", "010", "111"),
    "2": ("111", "001", "111", "100", "111"),
    "3": ("111", "001", "111", "001", "111"),
    "4": ("101", "101", "111", "001", "001"),
    "5": ("111", "100", "111", "001", "111"),
    "6": ("111", "100", "111", "101", "111"),
    "7": ("111", "001", "001", "001", "001"),
    "8": ("111", "101", "111", "101", "111"),
    "9": ("111", "101", "111", "001", "111"),
    ".": ("000", "000", "000", "000", "010"),
    ",": ("000", "000", "000", "010", "100"),
    "-": ("000", "000", "111", "000", "000"),
    "+": ("000", "010", "111", "010", "000"),
    ":": ("000", "010", "000", "010", "000"),
    "/": ("001", "001", "010", "100", "100"),
    "(": ("010", "100", "100", "100", "010"),
    ")": ("010", "001", "001", "001", "010"),
    "=": ("000", "111", "000", "111", "000"),
    "A": ("010", "101", "111", "101", "101"),
    "B": ("110", "101", "110", "101", "110"),
    "C": ("011", "100", "100", "100", "011"),
    "D": ("110", "101", "101", "101", "110"),
    "E": ("111", "100", "110", "100", "111"),
    "F": ("111", "100", "110", "100", "100"),
    "G": ("011", "100", "101", "101", "011"),
    "H": ("101", "101", "111", "101", "101"),
    "I": ("111", "010", "010", "010", "111"),
    "J": ("001", "001", "001", "101", "010"),
    "K": ("101", "101", "110", "101", "101"),
    "L": ("100", "100", "100", "100", "111"),
    "M": ("10001", "11011", "10101", "10001", "10001"),
    "N": ("110", "101", "101", "101", "101"),
    "O": ("010", "101", "101", "101", "010"),
    "P": ("110", "101", "110", "100", "100"),
    "Q": ("010", "101", "101", "110", "011"),
    "R": ("110", "101", "110", "101", "101"),
    "S": ("011", "100", "010", "001", "110"),
    "T": ("111", "010", "010", "010", "010"),
    "U": ("101", "101", "101", "101", "111"),
    "V": ("101", "101", "101", "101", "010"),
    "W": ("10001", "10001", "10101", "11011", "10001"),
    "X": ("101", "101", "010", "101", "101"),
    "Y": ("101", "101", "010", "010", "010"),
    "Z": ("111", "001", "010", "100", "111"),
}


@dataclass(frozen=True)
class Series:
    title: str
    points: Sequence[tuple[float, float]]  # (step, loss); non-finite losses are dropped


def png_bytes(pixels: np.ndarray) -> bytes:
    """An 8-bit RGB PNG of `pixels` ([H, W, 3] uint8): signature, IHDR, one IDAT, IEND."""
    height, width, _ = pixels.shape

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        )

    # Every scanline starts with its filter type; 0 (none) keeps the writer trivial.
    raw = np.concatenate(
        [np.zeros((height, 1), np.uint8), pixels.astype(np.uint8).reshape(height, width * 3)],
        axis=1,
    )
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB, no interlace
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw.tobytes(), 9))
        + chunk(b"IEND", b"")
    )


def loss_plot(series: Sequence[Series], width: int = WIDTH, height: int = HEIGHT) -> bytes:
    """PNG bytes of one panel per series (see the module docstring)."""
    canvas = np.full((height, width, 3), WHITE, np.uint8)
    count = max(1, len(series))
    panel_width = width // count
    for index, item in enumerate(series):
        _panel(canvas, item, index * panel_width, panel_width, COLORS[index % len(COLORS)])
    return png_bytes(canvas)


def _panel(canvas: np.ndarray, series: Series, x0: int, width: int, color) -> None:
    height = canvas.shape[0]
    left, right = x0 + _MARGIN["left"], x0 + width - _MARGIN["right"]
    top, bottom = _MARGIN["top"], height - _MARGIN["bottom"]
    _text(canvas, series.title.upper(), left, 10, BLACK)
    points = [(x, y) for x, y in series.points if math.isfinite(x) and math.isfinite(y)]
    if not points:
        _text(canvas, "NO DATA", left + 10, (top + bottom) // 2, BLACK)
        _axes(canvas, left, right, top, bottom)
        return
    xs = np.array([p[0] for p in points], float)
    ys = np.array([p[1] for p in points], float)
    y_lo, y_hi = float(ys.min()), float(ys.max())
    pad = 0.08 * (y_hi - y_lo) if y_hi > y_lo else 0.5
    y_lo, y_hi = y_lo - pad, y_hi + pad
    x_lo, x_hi = float(xs.min()), float(xs.max())
    if x_hi == x_lo:
        x_lo, x_hi = x_lo - 1, x_hi + 1

    def to_px(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        px = left + (x - x_lo) / (x_hi - x_lo) * (right - left)
        py = bottom - (y - y_lo) / (y_hi - y_lo) * (bottom - top)
        return np.round(px).astype(int), np.round(py).astype(int)

    for value in (y_lo + pad, (y_lo + y_hi) / 2, y_hi - pad):  # the data's min, middle, max
        _, (py,) = to_px(np.array([x_lo]), np.array([value]))
        canvas[py, left:right] = GRID
        label = f"{value:.4g}"
        _text(canvas, label, left - 6 - _text_width(label), py - 5, BLACK)
    _axes(canvas, left, right, top, bottom)
    for value in (x_lo, x_hi) if len(points) > 1 else (x_lo + 1,):
        (px,), _ = to_px(np.array([value]), np.array([y_lo]))
        canvas[bottom : bottom + 5, px] = BLACK
        label = f"{value:.0f}"
        _text(canvas, label, px - _text_width(label) // 2, bottom + 8, BLACK)
    _text(canvas, "STEP", (left + right) // 2 - _text_width("STEP") // 2, bottom + 24, BLACK)
    px, py = to_px(xs, ys)
    if len(points) == 1:
        canvas[py[0] - 2 : py[0] + 3, px[0] - 2 : px[0] + 3] = color
    for i in range(len(points) - 1):
        _line(canvas, px[i], py[i], px[i + 1], py[i + 1], color)


def _axes(canvas: np.ndarray, left: int, right: int, top: int, bottom: int) -> None:
    canvas[top : bottom + 1, left - 1 : left + 1] = BLACK
    canvas[bottom : bottom + 2, left - 1 : right + 1] = BLACK


def _line(canvas: np.ndarray, x0: int, y0: int, x1: int, y1: int, color) -> None:
    """A 2-pixel-wide segment: sample it once per pixel of its longer side."""
    steps = max(abs(x1 - x0), abs(y1 - y0)) + 1
    xs = np.round(np.linspace(x0, x1, steps)).astype(int)
    ys = np.round(np.linspace(y0, y1, steps)).astype(int)
    height, width, _ = canvas.shape
    for dx, dy in ((0, 0), (1, 0), (0, 1)):
        cx, cy = np.clip(xs + dx, 0, width - 1), np.clip(ys + dy, 0, height - 1)
        canvas[cy, cx] = color


def _advance(char: str) -> int:
    """Glyph columns plus the blank one after it."""
    glyph = _GLYPHS.get(char)
    return (len(glyph[0]) if glyph else 3) + 1


def _text_width(text: str) -> int:
    return sum(_advance(char) for char in text.upper()) * _SCALE


def _text(canvas: np.ndarray, text: str, x: int, y: int, color) -> None:
    height, width, _ = canvas.shape
    column = 0
    for char in text.upper():
        for row, bits in enumerate(_GLYPHS.get(char, ())):
            for col, bit in enumerate(bits):
                if bit != "1":
                    continue
                gx, gy = x + (column + col) * _SCALE, y + row * _SCALE
                if 0 <= gx and gx + _SCALE <= width and 0 <= gy and gy + _SCALE <= height:
                    canvas[gy : gy + _SCALE, gx : gx + _SCALE] = color
        column += _advance(char)
