"""Shared helpers of the test_dit_* files: a synthetic tensor cache with the preprocess stage's
tensor names, the tiny DiT folder, and small fast options. No tests here; the other files import
it. Fixtures are registered under `name=` so importing them shadows no test parameter."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import torch
from safetensors.torch import save as save_safetensors_bytes

from hotstep_ray.core import layout
from hotstep_ray.core.contracts import TrainDitOptions
from hotstep_ray.core.storage import Storage
from hotstep_ray.models.tiny_dit import write_tiny_dit
from hotstep_ray.training.dit_data import TENSOR_NAMES

SLUG = "band"
SONG_FRAMES = (40, 64, 90)  # the 40-frame song is shorter than the test crop: it gets padded
CONDITION_LENGTHS = (8, 12, 10)


def song_tensors(
    frames: int, condition_len: int, seed: int, condition_dim: int = 64, genre: bool = False
) -> dict[str, torch.Tensor]:
    """A memorisable song: x0 is a fixed per-channel pattern (plus a little texture) tied to a
    random condition, so an adapter can learn condition -> x0."""
    g = torch.Generator().manual_seed(seed)
    pattern = 1.5 * torch.randn(1, 64, generator=g)
    target = pattern + 0.1 * torch.randn(frames, 64, generator=g)
    silence = 0.05 * torch.randn(frames, 64, generator=g)
    tensors = {
        TENSOR_NAMES["target"]: target,
        TENSOR_NAMES["context"]: torch.cat([silence, torch.ones(frames, 64)], dim=-1),
        TENSOR_NAMES["condition"]: torch.randn(condition_len, condition_dim, generator=g),
        TENSOR_NAMES["condition_mask"]: torch.ones(condition_len, dtype=torch.long),
    }
    if genre:
        tensors[TENSOR_NAMES["genre_condition"]] = torch.randn(
            condition_len + 2, condition_dim, generator=g
        )
        tensors[TENSOR_NAMES["genre_mask"]] = torch.ones(condition_len + 2, dtype=torch.long)
    return tensors


def write_cache(
    storage: Storage,
    variant: str = "turbo",
    frames: Sequence[int] = SONG_FRAMES,
    condition_lengths: Sequence[int] = CONDITION_LENGTHS,
    repeats: Sequence[int] | None = None,
    genre: bool = False,
    meta: dict | None = None,
    stats: bool = True,
) -> str:
    """Write `tensors/<SLUG>/<variant>/` with one safetensors file per song; returns the key."""
    key = layout.tensor_dir(SLUG, variant)
    for index, (count, length) in enumerate(zip(frames, condition_lengths, strict=True)):
        tensors = song_tensors(count, length, seed=100 + index, genre=genre)
        metadata = {"repeat": str(repeats[index])} if repeats else None
        storage.write_bytes(
            f"{key}/song{index}.safetensors", save_safetensors_bytes(tensors, metadata=metadata)
        )
    storage.write_json(f"{key}/preprocess_meta.json", meta or {"custom_tag": "zqx"})
    if stats:
        std = [0.5 + 0.01 * c for c in range(64)]
        storage.write_json(
            f"{key}/channel_stats.json", {"channel_std": std, "channel_mean": [0] * 64}
        )
    return key


def fast_options(**overrides) -> TrainDitOptions:
    """Small, quick settings for the tiny DiT: LoRA r4/α8 (scale 2: BF16 export is exact),
    crop 48 frames, batch 2, GA 2, no warm start."""
    values = {
        "adapter_type": "lora",
        "variant_key": "turbo",
        "rank": 4,
        "alpha": 8,
        "crop_frames": 48,
        "crop_min_frames": 128,
        "crop_max_frames": 1250,
        "batch": 2,
        "grad_accum": 2,
        "epochs": 20,
        "learning_rate": 3e-3,
        "optimizer": "adamw",
        "warmup_ratio": 0.05,
        "target_loss": 0.0,
        "milestone_step": 0.0,
        "init_adapter": "",
        "checkpoint_segments": 0,
    }
    values.update(overrides)
    return TrainDitOptions(**values)


def random_adapter_start(storage: Storage, tiny_dit_dir: Path, seed: int, **options) -> dict:
    """Adapter values for a tiny run (`fast_options(**options)`) with B != 0, so every step
    moves every factor: for tests that train two runs from the same start and compare them."""
    from hotstep_ray.training import adapters, dit

    probe = dit.setup(
        fast_options(**options), storage, SLUG, dit.DitSettings(checkpoints_dir=str(tiny_dit_dir))
    )
    generator = torch.Generator().manual_seed(seed)
    return {
        key: 0.05 * torch.randn(value.shape, generator=generator)
        for key, value in adapters.adapter_state_dict(probe.transformer).items()
    }


@pytest.fixture(scope="session", name="tiny_dit_dir")
def tiny_dit_dir_fixture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny turbo DiT, written once per session (folder name = the variant key)."""
    root = tmp_path_factory.mktemp("dit-checkpoints")
    write_tiny_dit(root / "turbo", "turbo", seed=0)
    write_tiny_dit(root / "base", "base", seed=1)
    return root


@pytest.fixture(name="single_thread")
def single_thread_fixture() -> Iterator[None]:
    """One intra-op thread: the shared CI box is oversubscribed (2 threads ran a tiny step 80x
    slower) and one thread makes CPU float math run-to-run identical."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def read_log(storage: Storage, run_key: str) -> dict:
    return json.loads(storage.read_text(f"{run_key}/dit_train_log.json"))
