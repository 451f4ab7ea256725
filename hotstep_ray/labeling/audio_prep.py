"""Audio shaping shared by the analyzers and the caption providers: mono/stereo, 44.1 kHz, MP3."""

from __future__ import annotations

import io

import numpy as np
import soundfile as sf

ANALYSIS_RATE_HZ = 44_100  # what Essentia's rhythm and key extractors are tuned for
MP3_BITRATE_KBPS = 96
# libsndfile maps compression level 0..1 linearly onto 320..32 kbps (constant bit rate) and LAME
# snaps that to the nearest standard rate, so this level gives exactly 96 kbps.
_MP3_LEVEL = (320 - MP3_BITRATE_KBPS) / (320 - 32)


def essentia_standard():
    import essentia

    # Essentia logs an INFO line per import/algorithm (e.g. "no classifier models"); silence it.
    essentia.log.infoActive = False
    essentia.log.warningActive = False
    import essentia.standard as es

    return es


def resample(signal: np.ndarray, rate_hz: int, target_hz: int, quality: int = 4) -> np.ndarray:
    """Resample a 1-D float32 signal with libsamplerate (through Essentia).

    quality follows libsamplerate: 0 best sinc … 2 fastest sinc, 4 linear. Linear is the default
    because BPM and key only look below ~5 kHz, where linear interpolation is transparent, and it
    costs ~0.1 s per 4-minute song where the fastest sinc costs ~0.8 s.
    """
    signal = np.ascontiguousarray(signal, dtype=np.float32)
    if rate_hz == target_hz or signal.size == 0:
        return signal
    es = essentia_standard()
    algo = es.Resample(inputSampleRate=rate_hz, outputSampleRate=target_hz, quality=quality)
    return np.asarray(algo(signal), dtype=np.float32)


def to_mono(audio: np.ndarray) -> np.ndarray:
    """`[C, T]` -> `[T]` by averaging channels (what Essentia's MonoLoader does)."""
    audio = np.asarray(audio, dtype=np.float32)
    return audio if audio.ndim == 1 else audio.mean(axis=0, dtype=np.float32)


def to_stereo(audio: np.ndarray) -> np.ndarray:
    """`[C, T]` -> `[2, T]`: mono is duplicated, channels past the second are dropped."""
    audio = np.atleast_2d(np.asarray(audio, dtype=np.float32))
    return np.repeat(audio, 2, axis=0) if audio.shape[0] == 1 else audio[:2]


def encode_mp3(audio: np.ndarray, rate_hz: int) -> bytes:
    """`[C, T]` float audio -> 96 kbps CBR stereo 44.1 kHz MP3 bytes (libsndfile's LAME)."""
    stereo = to_stereo(audio)
    # The fastest sinc here: this audio is listened to by a model, so no linear-interp dulling.
    channels = [resample(ch, rate_hz, ANALYSIS_RATE_HZ, quality=2) for ch in stereo]
    data = np.clip(np.stack(channels, axis=1), -1.0, 1.0)
    buffer = io.BytesIO()
    sf.write(
        buffer,
        data,
        ANALYSIS_RATE_HZ,
        format="MP3",
        subtype="MPEG_LAYER_III",
        compression_level=_MP3_LEVEL,
        bitrate_mode="CONSTANT",
    )
    return buffer.getvalue()
