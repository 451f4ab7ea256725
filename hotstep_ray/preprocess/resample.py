"""`audio.resample` (libsoxr) for callers that hold torch tensors (mm3's preprocessing, the
benchmarks): `[C, T]` in, float32 `[C, T']` on the CPU out. The one resampler is
`hotstep_ray.audio.resample`; preprocessing's own decode path calls it on numpy directly."""

from __future__ import annotations

import torch

from hotstep_ray.audio import resample as _shared


def resample(audio: torch.Tensor, orig_hz: int, new_hz: int) -> torch.Tensor:
    """[C, T] float audio at `orig_hz` -> [C, round(T * new_hz / orig_hz)] float32 at `new_hz`."""
    if audio.ndim != 2:
        raise ValueError(f"expected [C, T] audio, got shape {tuple(audio.shape)}")
    samples = audio.detach().to("cpu", torch.float32).numpy()
    return torch.from_numpy(_shared.resample(samples, orig_hz, new_hz))
