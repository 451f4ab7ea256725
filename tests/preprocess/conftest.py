"""Fixtures of the preprocessing tests: a tiny checkpoint tree, tone files, and one plain run.

The tiny VAE is the cost driver: its first encoder block runs 128 channels at 48 kHz, ~1 s of
CPU per second of audio on 2 cores. Every song here is therefore well under a second and the
one full run (`plain_run`) is shared by the whole session.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
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


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory) -> Path:
    """DiT + VAE + text encoder of `make_tiny_tree` (its LM folder is skipped: preprocessing
    never reads it and it is the slowest part to write)."""
    from hotstep_ray.models.text_models import TEXT_ENCODER_DIR, VAE_DIR
    from hotstep_ray.models.tiny_dit import write_tiny_dit
    from hotstep_ray.models.tiny_tree import (
        DIT_DIR,
        write_tiny_text_encoder,
        write_tiny_vae,
    )

    root = tmp_path_factory.mktemp("ckpt")
    dit = write_tiny_dit(root / DIT_DIR, variant="turbo", seed=0)
    hidden = json.loads((dit / "config.json").read_text())["text_hidden_dim"]
    write_tiny_vae(root / VAE_DIR, seed=1)
    write_tiny_text_encoder(root / TEXT_ENCODER_DIR, seed=2, hidden=hidden)
    return root


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


@dataclass
class PlainRun:
    storage: Storage
    slug: str
    source: Path
    ckpt: Path
    result: object  # PreprocessResult
    tensor_dir: Path


@pytest.fixture(scope="session")
def plain_run(tmp_path_factory, tiny_ckpt) -> PlainRun:
    """One plain-path run over SONGS with the Side-Step .pt files on (session-shared)."""
    from hotstep_ray.preprocess.plan import PreprocessRunOptions
    from hotstep_ray.preprocess.run import preprocess_dataset

    base = tmp_path_factory.mktemp("plain")
    source = make_song_folder(base / "songs")
    storage = Storage(base / "root")
    slug = new_dataset(storage, source)
    options = PreprocessRunOptions(sidestep_pt=True)
    result = preprocess_dataset(storage, slug, options, tiny_ckpt)
    tensor_dir = storage.local_path(f"tensors/{slug}/acestep-v15-turbo")
    return PlainRun(storage, slug, source, tiny_ckpt, result, tensor_dir)


def snapshot(folder: Path) -> dict[str, tuple[int, bytes]]:
    """name -> (mtime_ns, bytes) of every file in a folder."""
    return {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(folder.iterdir())}
