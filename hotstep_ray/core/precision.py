"""TF32 tensor-core matmuls for a block of float32 work, with the previous settings restored.

Only the `fp32_precision` knobs are touched: torch >= 2.9 refuses to mix them with the legacy
`allow_tf32` flags in one process. The knobs are CUDA's; CPU float32 matmuls are unaffected, so
code under this context gives IEEE float32 results on the CPU (what the CPU tests check)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def tf32_matmuls() -> Iterator[None]:
    """CUDA float32 matmuls (and cuDNN convolutions) run on TF32 tensor cores inside the block:
    operands rounded to a 10-bit mantissa, products accumulated in float32."""
    knobs = [torch.backends.cuda.matmul]
    if hasattr(torch.backends.cudnn, "conv"):
        knobs.append(torch.backends.cudnn.conv)
    saved = [knob.fp32_precision for knob in knobs]
    try:
        for knob in knobs:
            knob.fp32_precision = "tf32"
        yield
    finally:
        for knob, value in zip(knobs, saved, strict=True):
            knob.fp32_precision = value
