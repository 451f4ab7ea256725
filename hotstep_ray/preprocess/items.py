"""Plain data passed into and out of the `Encoder` (no model imports, so Ray's decode and
write workers can unpickle rows without loading torch model libraries)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class EncodeItem:
    sample_id: str
    audio: np.ndarray | torch.Tensor  # [2, S] float32 planar at 48 kHz
    caption_prompt: str
    lyric_prompt: str
    genre_prompt: str | None = None


@dataclass
class EncodedSample:
    sample_id: str
    target_latents: torch.Tensor  # [T, 64] float32, CPU
    context_latents: torch.Tensor  # [T, 128] float32
    encoder_hidden_states: torch.Tensor  # [L, H] float32
    audio_codes: torch.Tensor  # [T5] int64
    s_text: int
    s_lyric: int
    genre_hidden_states: torch.Tensor | None = None  # [Lg, H]
    s_text_genre: int = 0


# Latent frames per VAE encoder forward ([N, 2, frames * 1920] audio; ~1 GiB of bf16 activations
# per 384 frames): one default 1536-frame window, or four 384-frame ones.
VAE_BATCH_FRAMES = 1536


@dataclass(frozen=True)
class EncoderSettings:
    vae_chunk_frames: int = 1536
    vae_overlap_frames: int = 48
    max_caption_tokens: int = 512
    max_lyric_tokens: int = 2048
    vae_batch_frames: int = VAE_BATCH_FRAMES
    seed: int = 0  # posterior-noise seed, mixed with each sample id
    # CUDA: hand the caching allocator's unused blocks back after the VAE and codes stages, so
    # an actor reserves about its largest stage instead of the sum of all (no-op on the CPU;
    # outputs are unchanged either way).
    release_cache_between_stages: bool = True


def noise_seed(seed: int, sample_id: str) -> int:
    """A 63-bit generator seed from the run seed and the sample id (stable across processes,
    unlike Python's salted `hash`)."""
    digest = hashlib.sha256(f"{seed}:{sample_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)
