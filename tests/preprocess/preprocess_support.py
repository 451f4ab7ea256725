"""Songs, sidecars and datasets of the preprocessing tests (conftest.py holds the fixtures).

A module of its own, not conftest.py: `from conftest import ...` takes whichever folder's
conftest Python imported first."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import soundfile as sf

from hotstep_ray.core.contracts import CreateDatasetInput
from hotstep_ray.core.storage import Storage
from hotstep_ray.dataset.store import build_dataset, create_dataset

LEFT_HZ, RIGHT_HZ = 440.0, 660.0
SONGS = (  # name, seconds, sample rate: three rates so resampling is on the path
    ("alpha.wav", 0.4, 44100),
    ("beta.flac", 0.6, 48000),
    ("sub/gamma.wav", 0.5, 22050),
)
TAG = "zqx"


def tone(seconds: float, rate: int, channels: int = 2) -> np.ndarray:
    """[T, C] float: 440 Hz left, 660 Hz right (extra channels: 880, 1100, ... Hz), 0.3 peak."""
    t = np.arange(int(round(seconds * rate))) / rate
    freqs = [LEFT_HZ, RIGHT_HZ, 880.0, 1100.0, 1320.0, 1540.0][:channels]
    return np.stack([0.3 * np.sin(2 * math.pi * f * t) for f in freqs], axis=1)


def write_tone(path: Path, seconds: float, rate: int, channels: int = 2) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = tone(seconds, rate, channels)
    sf.write(str(path), data[:, 0] if channels == 1 else data, rate)
    return path


def write_sidecar(path: Path, caption: str, genre: str = "", lyrics: str = "") -> None:
    text = f"caption: {caption}\n"
    text += f"genre: {genre}\n" if genre else ""
    text += "bpm: 120\n"
    text += f"lyrics:\n{lyrics}\n" if lyrics else ""
    path.with_suffix(".txt").write_text(text, encoding="utf-8")


def make_song_folder(root: Path) -> Path:
    for name, seconds, rate in SONGS:
        path = write_tone(root / name, seconds, rate)
        genre = "synthwave" if name.startswith("alpha") else ""
        lyrics = "la la la\nna na" if name.startswith("beta") else ""
        write_sidecar(path, f"test tone {Path(name).stem}", genre, lyrics)
    return root


def new_dataset(storage: Storage, source: Path, build: bool = True) -> str:
    detail = create_dataset(
        storage, CreateDatasetInput(source_dir=str(source), custom_tag=TAG, genre_ratio=0)
    )
    if build:
        build_dataset(storage, detail.slug)
    return detail.slug


def snapshot(folder: Path) -> dict[str, tuple[int, bytes]]:
    """name -> (mtime_ns, bytes) of every file in a folder."""
    return {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(folder.iterdir())}
