"""Fixtures of the preprocessing tests: a tiny checkpoint tree, tone files, and one plain run.

The tiny VAE is the cost driver: its first encoder block runs 128 channels at 48 kHz, ~1 s of
CPU per second of audio on 2 cores. Every song here is therefore well under a second and the
one full run (`plain_run`) is shared by the whole session.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from preprocess_support import make_song_folder, new_dataset

from hotstep_ray.core.storage import Storage


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
    from hotstep_ray.core.contracts import PreprocessOptions
    from hotstep_ray.preprocess.run import preprocess_dataset

    base = tmp_path_factory.mktemp("plain")
    source = make_song_folder(base / "songs")
    storage = Storage(base / "root")
    slug = new_dataset(storage, source)
    options = PreprocessOptions(sidestep_pt=True)
    result = preprocess_dataset(storage, slug, options, tiny_ckpt)
    tensor_dir = storage.local_path(f"tensors/{slug}/acestep-v15-turbo")
    return PlainRun(storage, slug, source, tiny_ckpt, result, tensor_dir)
