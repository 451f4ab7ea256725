"""The one sample-rate converter: libsoxr (through `soxr`), for preprocessing (to 48 kHz for the
VAE) and labeling (to 44.1 kHz for Essentia and the captioners' MP3).

`HQ` is libsoxr's 20-bit recipe: linear phase, passband flat to ~0.93 of the lower Nyquist
(-3 dB near 0.95), stopband from the Nyquist on. The one-shot call trims the filter delay, so
output sample k sits at input time k / new_hz, and returns `round(T * new_hz / orig_hz)` samples.
Samples outside the signal count as zero: the first and last few milliseconds see a one-sided
filter, as with every FIR resampler. Channels run one contiguous row at a time (planar input
needs no interleaving copy; on one core that is also faster than libsoxr's interleaved path).
"""

from __future__ import annotations

import numpy as np
import soxr

QUALITY = "HQ"
# Names this converter in the tensor cache's settings, so caches made by another one re-encode.
RESAMPLER = f"soxr-{QUALITY}"


def resample(audio: np.ndarray, orig_hz: int, new_hz: int, quality: str = QUALITY) -> np.ndarray:
    """`[T]` or planar `[C, T]` float audio at `orig_hz` -> float32 of the same shape at `new_hz`
    (`round(T * new_hz / orig_hz)` samples; a float32 copy when the rates are equal)."""
    if orig_hz <= 0 or new_hz <= 0:
        raise ValueError(f"sample rates must be positive, got {orig_hz} -> {new_hz}")
    audio = np.asarray(audio, dtype=np.float32)
    if audio.ndim not in (1, 2) or (audio.ndim == 2 and audio.shape[0] == 0):
        raise ValueError(f"expected [T] or [C, T] audio, got shape {audio.shape}")
    if orig_hz == new_hz:
        return audio.copy()
    if audio.ndim == 1:
        return soxr.resample(np.ascontiguousarray(audio), orig_hz, new_hz, quality=quality)
    rows = [soxr.resample(np.ascontiguousarray(row), orig_hz, new_hz, quality) for row in audio]
    return np.stack(rows)
