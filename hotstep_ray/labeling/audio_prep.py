"""Audio shaping for the caption providers (44.1 kHz stereo MP3) and the loader of Essentia.
Resampling and channel layouts are the shared ones in `hotstep_ray.audio`."""

from __future__ import annotations

import io

import numpy as np
import soundfile as sf

from hotstep_ray.audio.channels import to_stereo
from hotstep_ray.audio.resample import resample

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


def encode_mp3(audio: np.ndarray, rate_hz: int) -> bytes:
    """`[C, T]` float audio -> 96 kbps CBR stereo 44.1 kHz MP3 bytes (libsndfile's LAME)."""
    data = np.clip(resample(to_stereo(audio), rate_hz, ANALYSIS_RATE_HZ), -1.0, 1.0)
    buffer = io.BytesIO()
    sf.write(
        buffer,
        data.T,
        ANALYSIS_RATE_HZ,
        format="MP3",
        subtype="MPEG_LAYER_III",
        compression_level=_MP3_LEVEL,
        bitrate_mode="CONSTANT",
    )
    return buffer.getvalue()
