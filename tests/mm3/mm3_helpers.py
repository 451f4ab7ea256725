"""Helpers of the MM3 tests (a module of its own: every test folder has a `conftest`, so
`from conftest import` would pick whichever was imported first)."""

from __future__ import annotations

import io

import numpy as np
import soundfile as sf
import torch

from hotstep_ray.core import layout
from hotstep_ray.core.storage import Storage
from hotstep_ray.mm3.data import MANIFEST, song_bytes


def wav_bytes(channels: np.ndarray, rate_hz: int) -> bytes:
    """[C, T] float audio -> 32-bit float WAV bytes (planar in, soundfile interleaves on write)."""
    buffer = io.BytesIO()
    sf.write(buffer, channels.T.astype(np.float32), rate_hz, subtype="FLOAT", format="WAV")
    return buffer.getvalue()


def sine(frequency_hz: float, seconds: float, rate_hz: int, amplitude: float = 0.5) -> np.ndarray:
    t = np.arange(int(seconds * rate_hz)) / rate_hz
    return (amplitude * np.sin(2 * np.pi * frequency_hz * t)).astype(np.float32)


def write_cache(
    storage: Storage,
    slug: str,
    variant: str,
    songs: list[tuple[str, torch.Tensor, torch.Tensor, list[tuple[int, int]]]],
) -> str:
    """Write an MM3 cache of (stem, latents [128, L], condition [L, C], spans) songs."""
    tensor_dir = layout.tensor_dir(slug, variant)
    entries = []
    for stem, latents, condition, spans in songs:
        data = song_bytes(
            latents, {"stem": stem}, condition, [s for s, _ in spans], [e for _, e in spans]
        )
        storage.write_bytes(f"{tensor_dir}/{stem}.safetensors", data)
        entries.append({"sample_id": stem, "stem": stem, "file": f"{stem}.safetensors", "ok": True})
    storage.write_json(f"{tensor_dir}/{MANIFEST}", {"samples": entries})
    return tensor_dir


def write_lora(storage: Storage, checkpoints, artist: str = "band", rank: int = 4) -> str:
    """A random, clearly non-zero MM3 LoRA on the tiny DiT, exported in the ComfyUI form to a run
    folder `adapters/mm3-dit/<artist>/<stamp>/`; returns the run folder key."""
    from hotstep_ray.mm3 import checkpoint as ckpt
    from hotstep_ray.mm3.export import MM3_TARGETS, export_comfy
    from hotstep_ray.training import adapters

    model = ckpt.load_transformer(ckpt.Mm3Paths.find(checkpoints), torch.float32)
    spec = adapters.AdapterSpec(kind="lora", rank=rank, alpha=rank, targets=MM3_TARGETS)
    adapters.inject(model, spec)
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for _, param in adapters.trainable_parameters(model):
            param.copy_(0.2 * torch.randn(param.shape, generator=gen))
    run = layout.new_run_dir(storage, layout.mm3_dit_adapter_base(), artist)
    export_comfy(model, storage, f"{run}/{layout.MM3_DIT_WEIGHTS}")
    return run
