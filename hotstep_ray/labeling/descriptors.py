"""Cheap signal descriptors (numpy only) that let the offline captioner talk about a song.

Essentia gives tempo and key; these add how loud, how dense, how bright and how bass-heavy the mix
is, and how strongly it pulses on the beat. They are rough on purpose: each one feeds a word or two
of a caption, never a training label, so a fraction of a second per song is all they may cost.
"""

from __future__ import annotations

import numpy as np

_EPS = 1e-10
_ENVELOPE_HOP_S = 0.01  # 100 Hz onset envelope: fine enough for beat lags up to ~200 BPM
_FRAME = 2048  # spectral frames (46 ms at 44.1 kHz), taken back to back: a summary, not a sonogram
_MAX_SPECTRAL_FRAMES = 2000  # ~90 s worth, spread over the song, bounds the FFT cost
# Level rises smaller than this (dB per 10 ms) are the ripple of a steady tone or of noise, not a
# note or a hit; without the floor a sine "pulses" on every frame.
_FLUX_FLOOR_DB = 1.0
_ONSET_MIN_DB = 3.0


def _frame_rms_db(signal: np.ndarray, hop: int) -> np.ndarray:
    n = len(signal) // hop
    if n == 0:
        return np.zeros(0, np.float32)
    frames = signal[: n * hop].reshape(n, hop)
    return 10.0 * np.log10(np.mean(frames * frames, axis=1) + _EPS)


def _onset_envelope(signal: np.ndarray, rate: int) -> np.ndarray:
    """Positive log-energy flux: rises where notes and hits start."""
    level = _frame_rms_db(signal, max(1, int(rate * _ENVELOPE_HOP_S)))
    if len(level) < 2:
        return np.zeros(0)
    flux = np.diff(level)
    return np.where(flux > _FLUX_FLOOR_DB, flux, 0.0)


def _pulse_strength(envelope: np.ndarray, bpm: float | None) -> float:
    """Autocorrelation of the onset envelope at one and two beat periods, 0..1. Steady drums score
    high; rubato or beatless music scores low. Our stand-in for "danceability"."""
    if not bpm or len(envelope) < 4:
        return 0.0
    centred = envelope - envelope.mean()
    power = float(np.dot(centred, centred))
    if power <= _EPS:
        return 0.0
    lag = int(round(60.0 / bpm / _ENVELOPE_HOP_S))
    scores = []
    for k in (1, 2):
        if 0 < k * lag < len(centred):
            scores.append(float(np.dot(centred[: -k * lag], centred[k * lag :])) / power)
    return float(np.clip(max(scores, default=0.0), 0.0, 1.0))


def _onset_rate(envelope: np.ndarray) -> float:
    """Prominent onsets per second (local maxima well above the envelope's typical level)."""
    if len(envelope) < 3:
        return 0.0
    threshold = max(envelope.mean() + 1.5 * envelope.std(), _ONSET_MIN_DB)
    peaks = (envelope[1:-1] > threshold) & (envelope[1:-1] >= envelope[:-2])
    peaks &= envelope[1:-1] > envelope[2:]
    return float(peaks.sum()) / (len(envelope) * _ENVELOPE_HOP_S)


def _spectral(signal: np.ndarray, rate: int) -> dict[str, float]:
    n = len(signal) // _FRAME
    if n == 0:
        return {"brightness_hz": 0.0, "bass_share": 0.0, "treble_share": 0.0, "flatness": 0.0}
    picks = np.linspace(0, n - 1, num=min(n, _MAX_SPECTRAL_FRAMES)).astype(int)
    frames = signal[: n * _FRAME].reshape(n, _FRAME)[picks] * np.hanning(_FRAME)
    power = np.abs(np.fft.rfft(frames, axis=1)) ** 2 + _EPS
    freqs = np.fft.rfftfreq(_FRAME, 1.0 / rate)
    total = power.sum(axis=1)
    loud = total > total.max() * 1e-4  # silence says nothing about timbre
    power, total = power[loud], total[loud]
    weights = total / total.sum()
    centroid = (power * freqs).sum(axis=1) / total
    flatness = np.exp(np.mean(np.log(power), axis=1)) / np.mean(power, axis=1)
    return {
        "brightness_hz": float(np.dot(weights, centroid)),
        "bass_share": float(power[:, freqs < 150].sum() / total.sum()),
        "treble_share": float(power[:, freqs > 5000].sum() / total.sum()),
        "flatness": float(np.dot(weights, flatness)),
    }


def describe(signal: np.ndarray, rate: int, bpm: float | None) -> dict[str, float]:
    """Loudness (dBFS RMS), dynamic range (dB), energy and danceability (0..1), onset rate (/s),
    brightness (spectral centroid, Hz), bass/treble energy shares and spectral flatness."""
    signal = np.asarray(signal, dtype=np.float32)
    if signal.size == 0:
        return {}
    loudness = float(10.0 * np.log10(np.mean(signal.astype(np.float64) ** 2) + _EPS))
    levels = _frame_rms_db(signal, int(rate * 0.1))
    audible = levels[levels > -60.0]
    dynamic_range = (
        float(np.percentile(audible, 95) - np.percentile(audible, 10)) if audible.size else 0.0
    )
    envelope = _onset_envelope(signal, rate)
    onset_rate = _onset_rate(envelope)
    # Energy: loud and busy. -30 dBFS RMS is quiet, -8 is a loud master; 8 onsets/s is very busy.
    energy = 0.6 * np.clip((loudness + 30.0) / 22.0, 0, 1) + 0.4 * np.clip(onset_rate / 8.0, 0, 1)
    return {
        "loudness_db": round(loudness, 2),
        "dynamic_range_db": round(dynamic_range, 2),
        "energy": round(float(energy), 3),
        "danceability": round(_pulse_strength(envelope, bpm), 3),
        "onset_rate": round(onset_rate, 3),
        **{k: round(v, 4) for k, v in _spectral(signal, rate).items()},
    }
