"""Decode one song into what the VAE eats: 48 kHz stereo, PLANAR float32 `[2, T]`.

Planar means row 0 is the whole left channel and row 1 the whole right channel (never the
interleaved `[T, 2]` buffer reshaped: that turns a song into a 2x slow-motion copy one octave
down, the seed's trap 13). `load_audio` already returns `[C, T]` planar.

Documented outcomes (each an `AudioError` with this message prefix, or a normal result):
- 0-byte file                      -> "empty file (0 bytes)"
- undecodable / corrupt bytes      -> "cannot decode audio ..." (libsndfile's reason)
- valid header, no frames          -> "no audio frames"
- more than 2 channels (5.1, ...)  -> "N channels: only mono or stereo is supported ..."
- shorter than one latent frame    -> "too short: ... (< 40 ms, one 25 Hz latent frame)"
- mono                             -> duplicated to both channels
- any rate (8 kHz, 44.1 kHz, 96 kHz, ...) -> resampled to 48 kHz (`audio/resample.py`, libsoxr)
- longer than `max_duration_s`     -> cut at exactly max_duration_s (0 = never cut); only the
  needed part of the file (plus a short filter tail) is decoded, so a 20-minute file costs no
  more than a 4-minute one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hotstep_ray.audio.channels import to_stereo as _to_stereo
from hotstep_ray.audio.io import load_audio, probe_audio
from hotstep_ray.audio.resample import resample
from hotstep_ray.core.contracts import SAMPLE_RATE_HZ, PreprocessNormalize
from hotstep_ray.core.errors import InputError
from hotstep_ray.core.storage import Storage

HOP_SAMPLES = 1920  # VAE samples per latent frame at 48 kHz (2*4*4*6*10) -> 25 Hz
# Extra input decoded past the cut so the resampler's filter sees real signal at the cut point
# (libsoxr HQ's transient: ~8 ms from an 8 kHz source, under 2 ms from 44.1 kHz; 50 ms is ample).
_TAIL_S = 0.05


class AudioError(InputError):
    """This file cannot become a training sample; the message says why (recorded per sample)."""


@dataclass(frozen=True)
class PreparedAudio:
    audio: np.ndarray  # [2, T] float32, planar, 48 kHz
    source_rate_hz: int
    source_channels: int
    source_duration_s: float  # the whole file, from its header
    truncated: bool  # cut at max_duration_s
    gain_db: float  # peak-normalisation gain applied (0.0 when off or silent)

    @property
    def duration_s(self) -> float:
        return self.audio.shape[1] / SAMPLE_RATE_HZ


def check_channels(channels: int) -> None:
    if channels not in (1, 2):
        raise AudioError(
            f"{channels} channels: only mono or stereo is supported (downmix to stereo first)"
        )


def to_stereo(audio: np.ndarray) -> np.ndarray:
    """[C, T] -> [2, T]: mono duplicated, stereo unchanged, anything else refused."""
    check_channels(audio.shape[0])
    return _to_stereo(audio)


def peak_normalize(audio: np.ndarray, target_db: float) -> tuple[np.ndarray, float]:
    """Scale so max |x| = 10^(target_db / 20); silence is left alone. Returns (audio, gain dB)."""
    peak = float(np.max(np.abs(audio))) if audio.size else 0.0
    if peak <= 0.0 or not math.isfinite(peak):
        return audio, 0.0
    gain = 10.0 ** (target_db / 20.0) / peak
    return (audio * np.float32(gain)).astype(np.float32, copy=False), 20.0 * math.log10(gain)


def prepare_audio(
    storage: Storage,
    key: str,
    max_duration_s: float = 240.0,
    normalize: PreprocessNormalize = "peak",
    target_db: float = -1.0,
) -> PreparedAudio:
    """Decode `key`, check channels, resample to 48 kHz stereo planar, cut, peak-normalise."""
    try:
        size = storage.size(key)
    except (OSError, FileNotFoundError) as exc:
        raise AudioError(f"cannot read {storage.url_of(key)}: {exc}") from exc
    if size == 0:
        raise AudioError("empty file (0 bytes)")
    try:
        info = probe_audio(storage, key)
    except InputError as exc:
        raise AudioError(str(exc)) from exc
    check_channels(info.channels)  # refuse before decoding a possibly huge multichannel file
    read_s = max_duration_s + _TAIL_S if max_duration_s > 0 else 0.0
    try:
        raw, rate = load_audio(storage, key, read_s)  # [C, T] float32 planar at the file's rate
    except InputError as exc:
        raise AudioError(str(exc)) from exc
    if raw.shape[1] == 0:
        raise AudioError("no audio frames")
    stereo = to_stereo(raw)
    audio = resample(stereo, rate, SAMPLE_RATE_HZ)  # [2, T'] float32 at 48 kHz
    truncated = False
    if max_duration_s > 0:
        limit = int(round(max_duration_s * SAMPLE_RATE_HZ))
        truncated = audio.shape[1] > limit
        audio = audio[:, :limit]
    if audio.shape[1] < HOP_SAMPLES:
        raise AudioError(
            f"too short: {audio.shape[1] / SAMPLE_RATE_HZ * 1000:.1f} ms "
            "(< 40 ms, one 25 Hz latent frame)"
        )
    if not np.all(np.isfinite(audio)):
        raise AudioError("decoded audio contains NaN or Inf")
    gain_db = 0.0
    if normalize == "peak":
        audio, gain_db = peak_normalize(audio, target_db)
    return PreparedAudio(
        audio=np.ascontiguousarray(audio, dtype=np.float32),
        source_rate_hz=int(rate),
        source_channels=int(raw.shape[0]),
        source_duration_s=float(info.duration_s),
        truncated=truncated,
        gain_db=gain_db,
    )
