"""Channel layouts shared by preprocessing and labeling: planar `[C, T]` float32 in and out."""

from __future__ import annotations

import numpy as np


def to_mono(audio: np.ndarray) -> np.ndarray:
    """`[C, T]` -> `[T]` by averaging channels (what Essentia's MonoLoader does); `[T]` as is."""
    audio = np.asarray(audio, dtype=np.float32)
    return audio if audio.ndim == 1 else audio.mean(axis=0, dtype=np.float32)


def to_stereo(audio: np.ndarray) -> np.ndarray:
    """`[T]` or `[C, T]` -> `[2, T]`: mono is duplicated, channels past the second are dropped
    (preprocessing refuses those first: `preprocess.audio_prep.to_stereo`)."""
    audio = np.atleast_2d(np.asarray(audio, dtype=np.float32))
    return np.repeat(audio, 2, axis=0) if audio.shape[0] == 1 else audio[:2]
