"""Plain data passed into and out of the `Encoder` (no model imports, so Ray's decode and
write workers can unpickle rows without loading torch model libraries)."""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Mapping
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
CODES_FAST_PASSES = ("auto", "off", "tf32", "bf16")  # EncoderSettings.codes_fast_pass


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
    # outputs are unchanged either way). None = auto: on unless the allocator runs expandable
    # segments (`expandable_segments_active`), which already share freed blocks between stages
    # and pay for a release by mapping the pages again (H200, 8 x 240 s, expandable segments:
    # release on 1630 audio-s per GPU-s at 7.91 GiB, off 1755 at 7.93 GiB).
    release_cache_between_stages: bool | None = None
    # CUDA: each song crosses to the GPU just before its first VAE window, converted to the VAE
    # dtype by the CPU into pinned memory and copied on a side stream, so the next song's copy
    # runs while the GPU encodes (`vae_tiles.SongUploads`). An encoder actor gets its songs from
    # Ray Data in pageable memory, whose plain copies wait for the GPU to go idle (H200,
    # 8 x 240 s from pageable memory: off 1909 audio-s per GPU-s, on 1991; docs/BENCHMARKS.md).
    staged_upload: bool = True
    # 5 Hz codes (`hotstep_ray.models.fsq_fast`): pass 1 in reduced precision, then the windows
    # near an FSQ floor boundary recomputed in float32, so the codes stay the float32 ones.
    # "auto" = "tf32" on CUDA, "off" elsewhere; "off" | "tf32" (CUDA only) | "bf16".
    codes_fast_pass: str = "auto"
    # The safety band, in FSQ level units: windows whose brackets lie within this distance of an
    # integer are rechecked. It must exceed pass 1's bracket error; the GPU bench
    # (`bench/preprocess_bench.py`) reports the measured max as `codes_max_level_error`: TF32 on
    # an H200, 8 x 240 s, 0.0067-0.0072 levels, so 0.02 is ~3x that; 19.5 % of windows rechecked
    # (evenly spread brackets would give 1 - (1 - 2 * margin) ** 6 = 22 %).
    codes_recheck_margin: float = 0.02
    # Latent frames per audio-tokenizer call (songs of equal length share a call; the float32
    # recheck runs in chunks of as many windows): one 240 s song. Its pass-1 activations set the
    # encoder's memory peak (H200, 8 x 240 s from pageable memory: two songs per call 2027
    # audio-s per GPU-s at 8.10 GiB reserved, one song 2014 at 7.16 GiB; docs/BENCHMARKS.md).
    codes_frames_per_call: int = 6_000
    # CUDA: cap this process's caching allocator at this many GiB (0 = no cap), so an actor
    # sharing a GPU frees cached blocks instead of growing past its share. No-op off CUDA.
    memory_cap_gib: float = 0.0

    def __post_init__(self) -> None:
        if self.codes_fast_pass not in CODES_FAST_PASSES:
            raise ValueError(
                f"codes_fast_pass must be one of {CODES_FAST_PASSES}, got {self.codes_fast_pass!r}"
            )
        if not math.isfinite(self.codes_recheck_margin) or self.codes_recheck_margin < 0:
            raise ValueError(
                "codes_recheck_margin must be a finite number >= 0 (FSQ level units), got "
                f"{self.codes_recheck_margin!r}"
            )
        if self.codes_frames_per_call < 1:
            raise ValueError(
                f"codes_frames_per_call must be >= 1 latent frame, got {self.codes_frames_per_call!r}"
            )
        if not math.isfinite(self.memory_cap_gib) or self.memory_cap_gib < 0:
            raise ValueError(
                f"memory_cap_gib must be a finite number >= 0 (0 = no cap), got "
                f"{self.memory_cap_gib!r}"
            )


ALLOC_ENV = "PYTORCH_CUDA_ALLOC_CONF"
# Expandable segments: a stage's freed blocks grow and shrink in place and serve the next
# stage's other sizes, instead of each stage keeping blocks of its own (H200, 8 x 240 s, the
# defaults: 11.4 -> 7.9 GiB peak reserved per encoder process at the same speed).
ENCODER_ALLOC_CONF = "expandable_segments:True"


# The allocator's configuration variables, in the order torch reads them (the second is the
# newer, device-neutral name, used when the first is unset).
ALLOC_ENVS = (ALLOC_ENV, "PYTORCH_ALLOC_CONF")


def expandable_segments_active(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the CUDA caching allocator of this process runs expandable segments, as set by
    its configuration variables (torch reads them when CUDA starts)."""
    environ = os.environ if environ is None else environ
    for name in ALLOC_ENVS:
        for entry in environ.get(name, "").split(","):
            key, _, value = entry.partition(":")
            if key.strip() == "expandable_segments":
                return value.strip().lower() in ("true", "1")
    return False


def resolve_release(setting: bool | None, environ: Mapping[str, str] | None = None) -> bool:
    """`EncoderSettings.release_cache_between_stages` resolved: None -> on unless expandable
    segments are active."""
    return not expandable_segments_active(environ) if setting is None else bool(setting)


def allocator_env() -> dict[str, str]:
    """The environment an encoder process starts with (read by torch at CUDA start): ours,
    unless the user set their own allocator configuration under either name."""
    if any(name in os.environ for name in ALLOC_ENVS):
        return {}
    return {ALLOC_ENV: ENCODER_ALLOC_CONF}


def noise_seed(seed: int, sample_id: str) -> int:
    """A 63-bit generator seed from the run seed and the sample id (stable across processes,
    unlike Python's salted `hash`)."""
    digest = hashlib.sha256(f"{seed}:{sample_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)
