"""Audio in and out: probe a header, decode to float32 `[C, T]`, encode to file bytes.

soundfile (libsndfile 1.2.2) reads WAV, FLAC, OGG/Vorbis/Opus and MP3; `.m4a`/`.aac` need an external
decoder and are reported as unreadable rather than guessed at.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from typing import Literal

import numpy as np
import soundfile as sf

from hotstep_ray.core.errors import InputError
from hotstep_ray.core.storage import Storage


@dataclass(frozen=True)
class AudioInfo:
    duration_s: float
    sample_rate_hz: int
    channels: int
    frames: int


def _source(storage: Storage, key: str):
    # Local files are opened by path (no copy); remote ones are read into memory once.
    return str(storage.local_path(key)) if storage.is_local else io.BytesIO(storage.read_bytes(key))


def probe_audio(storage: Storage, key: str) -> AudioInfo:
    """Header-only read of an audio file's length and format."""
    if storage.size(key) == 0:  # libsndfile would call it "Format not recognised"
        raise InputError(f"cannot read audio {storage.url_of(key)}: the file is empty (0 bytes)")
    try:
        info = sf.info(_source(storage, key))
    except Exception as exc:  # libsndfile raises RuntimeError/LibsndfileError for unknown formats
        raise InputError(f"cannot read audio {storage.url_of(key)}: {exc}") from exc
    return AudioInfo(
        duration_s=float(info.frames) / float(info.samplerate),
        sample_rate_hz=int(info.samplerate),
        channels=int(info.channels),
        frames=int(info.frames),
    )


def load_audio(storage: Storage, key: str, max_duration_s: float = 0.0) -> tuple[np.ndarray, int]:
    """Decode to float32 planar `[C, T]` at the file's own rate; `max_duration_s` > 0 truncates."""
    try:
        with sf.SoundFile(_source(storage, key)) as handle:
            rate = handle.samplerate
            frames = handle.frames
            if max_duration_s > 0:
                frames = min(frames, int(max_duration_s * rate))
            data = handle.read(frames, dtype="float32", always_2d=True)
    except Exception as exc:
        raise InputError(f"cannot decode audio {storage.url_of(key)}: {exc}") from exc
    return np.ascontiguousarray(data.T), int(rate)


# Frames per write call. libsndfile's Vorbis encoder (the bundled 1.2.2) crashes the process on
# one write of a minute or more of stereo audio (30 s passed, 60 s crashed, on this project's dev
# box); the same audio written in 1 s blocks encodes fine.
WRITE_BLOCK_FRAMES = 48_000


def encode_audio(audio: np.ndarray, sample_rate_hz: int, fmt: str = "WAV") -> bytes:
    """`[C, T]` float audio as file bytes (for writes through a Storage), written in blocks of
    `WRITE_BLOCK_FRAMES`."""
    buffer = io.BytesIO()
    data = np.clip(np.asarray(audio, dtype=np.float32), -1.0, 1.0).T
    subtype = "PCM_16" if fmt.upper() in ("WAV", "FLAC") else None
    with sf.SoundFile(
        buffer, "w", sample_rate_hz, data.shape[1], subtype=subtype, format=fmt
    ) as handle:
        for start in range(0, data.shape[0], WRITE_BLOCK_FRAMES):
            handle.write(data[start : start + WRITE_BLOCK_FRAMES])
    return buffer.getvalue()


# WAV sample formats written by hand: (format tag, bytes per sample). Format 3 is IEEE float.
_WAV_FORMATS = {"pcm16": (1, 2), "float32": (3, 4)}


def wav_header(
    channels: int, rate_hz: int, frames: int, sample_format: Literal["pcm16", "float32"]
) -> bytes:
    """The RIFF header for `frames` interleaved frames of `sample_format` that follow it.

    For the writers that skip libsndfile: the audition's 16-bit fast path (samples converted on
    the GPU) and byte-identical float WAVs (libsndfile's float WAVs carry a PEAK chunk with a
    timestamp). 16-bit PCM gets the canonical 44 bytes; float gets the `fact` chunk (its frame
    count) that the WAV spec asks of every non-PCM file."""
    tag, width = _WAV_FORMATS[sample_format]
    size = frames * channels * width
    fmt = struct.pack(
        "<HHIIHH", tag, channels, rate_hz, rate_hz * channels * width, channels * width, 8 * width
    )
    chunks = b"fmt " + struct.pack("<I", len(fmt)) + fmt
    if tag != 1:
        chunks += b"fact" + struct.pack("<II", 4, frames)
    chunks += b"data" + struct.pack("<I", size)
    return b"RIFF" + struct.pack("<I", 4 + len(chunks) + size) + b"WAVE" + chunks
