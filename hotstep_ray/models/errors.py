"""Errors raised while reading model checkpoints."""

from __future__ import annotations

from hotstep_ray.core.errors import HotstepError


class CheckpointError(HotstepError, ValueError):
    """A checkpoint folder or file is missing, truncated, of the wrong variant, or has
    missing/unexpected/wrong-shape/quantized tensors. The message names the file and what was
    expected versus what was found."""
