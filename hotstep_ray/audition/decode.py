"""Codes -> audio without the DiT: FSQ -> detokenizer -> 25 Hz latents -> Oobleck VAE (tiled).

The HOT-Step "pure-LM preview" (`POST /codes-decode`): deterministic, no sampler, no adapter.
Shapes: codes [T5] -> FSQ output [1, T5, 2048] -> latents [1, 5*T5, 64] -> audio [2, 5*T5*1920]
float32 at 48 kHz stereo (one code = 0.2 s = 9600 samples).

The VAE decode is tiled so a 10-minute song fits a few GiB: a clip up to `whole_max_frames` is
decoded in one piece (exactly the plain diffusers decode); a longer one is cut into equal tiles
(core a multiple of 32 frames, `overlap_frames` of context each side, clipped at the ends) decoded
`tile_batch` at a time, each keeping only its core. With overlap >= the decoder's receptive field
(about 8 frames) the result equals the whole decode. Interior tiles share one shape, so cuDNN
autotuning and `torch.compile` see few shapes.

The fast path (`fast=True`, the default on CUDA; `hotstep_ray.models.oobleck_fast`) folds weight
norm, fuses each Snake into one kernel and replays a CUDA graph per window shape. It tiles with
windows of exactly `tile_frames` (the last one flush with the clip's end, as the preprocessing
encoder does), so every window of every long clip has one shape and one graph serves them all.
"""

from __future__ import annotations

import math
import struct
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from hotstep_ray.audio.io import encode_audio
from hotstep_ray.audition.checkpoints import load_codes_parts, pick
from hotstep_ray.audition.codes import (
    CODE_HZ,
    FRAMES_PER_CODE,
    MAX_SECONDS,
    DecodeResult,
    codes_sha1,
    parse_codes,
    validate_codes,
)
from hotstep_ray.core.errors import InputError
from hotstep_ray.models.acestep_dit import resolve_device_dtype
from hotstep_ray.models.oobleck_fast import (
    FastOobleck,
    OobleckFastOptions,
    fast_default,
    fold_weight_norm,
)
from hotstep_ray.models.text_models import load_vae
from hotstep_ray.preprocess.vae_tiles import plan_windows

SAMPLE_RATE_HZ = 48_000
FORMATS = {"wav": "WAV", "flac": "FLAC"}
_TILE_QUANTUM = 32  # tile cores are multiples of this many latent frames


__all__ = ["CodesDecoder", "TiledVaeDecoder", "fold_weight_norm", "encode", "pcm16_wav"]


@dataclass
class TilePlan:
    tiles: int  # number of tiles (0 = whole decode)
    core_frames: int  # frames each tile keeps
    window_frames: int  # core + 2 * overlap


class TiledVaeDecoder:
    """Latents [B, T, 64] -> audio [B, 2, T * hop] through an AutoencoderOobleck."""

    def __init__(
        self,
        vae: torch.nn.Module,
        *,
        tile_frames: int = 768,
        overlap_frames: int = 32,
        tile_batch: int = 1,
        whole_max_frames: int = 800,
        compile: bool = False,
        fast: bool | None = None,
        fast_options: OobleckFastOptions | None = None,
    ) -> None:
        """`fast`: None = on for CUDA, off on the CPU. `fast_options` tune it (`compile` is
        folded into them)."""
        if tile_frames < _TILE_QUANTUM or overlap_frames < 0 or tile_batch < 1:
            raise ValueError("tile_frames >= 32, overlap_frames >= 0, tile_batch >= 1")
        if 2 * overlap_frames >= tile_frames:
            raise ValueError(f"tile_frames ({tile_frames}) must exceed 2 x overlap_frames")
        self.vae = vae.eval().requires_grad_(False)
        self.hop = int(np.prod(vae.config.downsampling_ratios))  # samples per latent frame
        self.tile_frames, self.overlap = tile_frames, overlap_frames
        self.tile_batch, self.whole_max = tile_batch, whole_max_frames
        param = next(vae.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.fast: FastOobleck | None = None
        if fast_default(self.device) if fast is None else fast:
            options = fast_options or OobleckFastOptions()
            if compile:
                options = options.model_copy(update={"compile": True})
            self.fast = FastOobleck(self.vae, options)
            self._decode = self.fast.decode
            return
        fold_weight_norm(self.vae)
        self._decode = self.vae.decoder
        if compile:
            self._decode = torch.compile(self.vae.decoder, dynamic=False)
        if self.device.type == "cuda":
            torch.backends.cudnn.benchmark = True  # fixed tile shapes: autotune once per shape

    def describe(self) -> dict[str, object]:
        """The decode path, for logs and benchmark rows."""
        path = self.fast.describe() if self.fast else {"snake": "diffusers"}
        return {"fast": self.fast is not None, **path}

    def plan(self, frames: int) -> TilePlan:
        if frames <= self.whole_max:
            return TilePlan(0, frames, frames)
        if self.fast is not None:
            windows = plan_windows(frames, self.tile_frames, self.overlap)
            return TilePlan(len(windows), self.tile_frames - 2 * self.overlap, self.tile_frames)
        tiles = math.ceil(frames / self.tile_frames)
        core = math.ceil(frames / tiles / _TILE_QUANTUM) * _TILE_QUANTUM
        return TilePlan(math.ceil(frames / core), core, core + 2 * self.overlap)

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """[B, T, 64] -> float32 [B, 2, T * hop] on the VAE's device."""
        z = latents.to(self.device, self.dtype).transpose(1, 2)  # [B, 64, T]
        frames = z.shape[-1]
        plan = self.plan(frames)
        if plan.tiles == 0:
            return self._decode(z).float()
        if self.fast is not None:
            return self._decode_windows(z)
        # Tile i keeps [i*core, (i+1)*core) and sees `overlap` frames either side, clipped at the
        # clip's ends so the first and last samples match the whole decode (the conv's own zero
        # padding, not decoded zero latents). Windows of one length are decoded together.
        core, ov = plan.core_frames, self.overlap
        groups: dict[int, list[tuple[int, int, int]]] = {}  # length -> (tile, start, keep_from)
        for tile in range(plan.tiles):
            begin = tile * core
            start, stop = max(0, begin - ov), min(frames, begin + core + ov)
            groups.setdefault(stop - start, []).append((tile, start, begin - start))
        pieces: dict[int, torch.Tensor] = {}
        for length, members in groups.items():
            for first in range(0, len(members), self.tile_batch):
                chunk = members[first : first + self.tile_batch]
                windows = torch.cat([z[:, :, s : s + length] for _, s, _ in chunk], dim=0)
                audio = self._decode(windows)  # [len(chunk) * B, 2, length * hop]
                for j, (tile, _, keep) in enumerate(chunk):
                    kept = min(core, frames - tile * core)
                    rows = audio[j * z.shape[0] : (j + 1) * z.shape[0]]
                    pieces[tile] = rows[:, :, keep * self.hop : (keep + kept) * self.hop].float()
        return torch.cat([pieces[t] for t in range(plan.tiles)], dim=-1)

    def _decode_windows(self, z: torch.Tensor) -> torch.Tensor:
        """[B, 64, T] -> float32 [B, 2, T * hop] in windows of exactly `tile_frames` frames
        (one shape: one CUDA graph), `tile_batch` windows per call, each keeping its core."""
        batch, frames = z.shape[0], z.shape[-1]
        out = torch.empty(batch, 2, frames * self.hop, device=self.device)
        windows = plan_windows(frames, self.tile_frames, self.overlap)
        for first in range(0, len(windows), self.tile_batch):
            group = windows[first : first + self.tile_batch]
            stacked = torch.cat([z[:, :, w.start : w.stop] for w in group], dim=0)
            audio = self._decode(stacked)  # [len(group) * B, 2, tile_frames * hop]
            for j, w in enumerate(group):
                lo, hi = (w.keep_start - w.start) * self.hop, (w.keep_stop - w.start) * self.hop
                keep = slice(w.keep_start * self.hop, w.keep_stop * self.hop)
                out[:, :, keep] = audio[j * batch : (j + 1) * batch, :, lo:hi]
        return out


class CodesDecoder:
    """The plain class behind `POST /codes-decode`. Thread-safe (one decode at a time)."""

    def __init__(
        self,
        quantizer: torch.nn.Module,
        detokenizer: torch.nn.Module,
        vae: torch.nn.Module,
        *,
        max_seconds: float = MAX_SECONDS,
        **tiling,
    ) -> None:
        self.quantizer = quantizer.eval().requires_grad_(False)
        self.detokenizer = detokenizer.eval().requires_grad_(False)
        self.vae = TiledVaeDecoder(vae, **tiling)
        self.max_seconds = max_seconds
        param = next(detokenizer.parameters())
        self.device, self.dtype = param.device, param.dtype
        self._lock = threading.Lock()

    @classmethod
    def from_checkpoints(
        cls,
        checkpoints: str | Path,
        *,
        dit: str | None = None,
        vae: str | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | str | None = None,
        **options,
    ) -> CodesDecoder:
        """Load from a checkpoints folder: the detokenizer of `dit` (default: a turbo DiT) and
        the VAE `vae` (default: `vae/`)."""
        device, dtype = resolve_device_dtype(device, dtype)
        quantizer, detokenizer = load_codes_parts(pick(checkpoints, "dit", dit).path, device, dtype)
        vae_model = load_vae(pick(checkpoints, "vae", vae).path, device, dtype)
        return cls(quantizer, detokenizer, vae_model, **options)

    @torch.no_grad()
    def latents(self, codes: Sequence[int]) -> torch.Tensor:
        """Validated codes [T5] -> 25 Hz latents [1, 5 * T5, 64] (model dtype)."""
        indices = torch.tensor(list(codes), dtype=torch.long, device=self.device).view(1, -1, 1)
        quantized = self.quantizer.get_output_from_indices(indices)  # [1, T5, 2048]
        return self.detokenizer(quantized.to(self.dtype))

    def decode_tensor(self, codes: str | Sequence[int]) -> torch.Tensor:
        """Codes -> float32 [2, T5 * 9600] at 48 kHz on the model's device (validated;
        InputError on bad codes)."""
        values = parse_codes(codes)
        validate_codes(values, self.max_seconds)
        with self._lock:
            audio = self.vae.decode(self.latents(values))[0]
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
        return audio

    def decode_audio(self, codes: str | Sequence[int]) -> np.ndarray:
        """`decode_tensor` as a CPU numpy array."""
        return self.decode_tensor(codes).cpu().numpy()

    def decode(self, codes: str | Sequence[int], fmt: str = "wav") -> DecodeResult:
        """Codes -> an encoded 48 kHz stereo file (16-bit WAV or FLAC). `decode_ms` covers
        everything: decode, transfer and encoding."""
        if fmt not in FORMATS:
            raise InputError(f"format {fmt!r}: expected one of {sorted(FORMATS)}")
        values = parse_codes(codes)
        start = time.perf_counter()
        audio = self.decode_tensor(values)
        expected = len(values) * FRAMES_PER_CODE * self.vae.hop
        if audio.shape[-1] != expected:  # a VAE whose hop is not 1920 would land here
            raise RuntimeError(f"decoded {audio.shape[-1]} samples, expected {expected}")
        data = encode(audio, fmt)
        return DecodeResult(
            audio=data,
            format=fmt,
            sample_rate_hz=SAMPLE_RATE_HZ,
            channels=int(audio.shape[0]),
            num_samples=int(audio.shape[-1]),
            duration_s=len(values) / CODE_HZ,
            codes_count=len(values),
            codes_sha1=codes_sha1(values),
            decode_ms=round((time.perf_counter() - start) * 1000.0, 3),
        )


def pcm16_wav(audio: torch.Tensor, sample_rate_hz: int = SAMPLE_RATE_HZ) -> bytes:
    """[C, T] float audio -> 16-bit PCM WAV bytes. Clip, scale and interleave happen on the
    audio's device, so only 2 bytes per sample cross to the host (a 240 s song: 46 MB)."""
    channels = audio.shape[0]
    pcm = (audio.float().clamp(-1.0, 1.0) * 32767.0).round().to(torch.int16)
    pcm = pcm.T.contiguous()  # [T, C] interleaved, on the audio's device
    size = pcm.numel() * 2
    # One host buffer: the device copy lands straight after the 44-byte header, so a 240 s song
    # (46 MB) is copied to the host once and into `bytes` once (no staging + concatenation).
    out = np.empty(44 + size, dtype=np.uint8)
    torch.from_numpy(out[44:]).view(torch.int16).view(pcm.shape).copy_(pcm)
    header = struct.pack(
        "<4sI4s4sIHHIIHH4sI",
        b"RIFF",
        36 + size,
        b"WAVE",
        b"fmt ",
        16,  # fmt chunk size
        1,  # PCM
        channels,
        sample_rate_hz,
        sample_rate_hz * channels * 2,  # bytes per second
        channels * 2,  # block align
        16,  # bits per sample
        b"data",
        size,
    )
    out[:44] = np.frombuffer(header, dtype=np.uint8)
    return out.tobytes()


def encode(audio: torch.Tensor, fmt: str) -> bytes:
    """[C, T] float audio (any device) -> WAV (fast path) or FLAC bytes."""
    if fmt == "wav":
        return pcm16_wav(audio)
    return encode_audio(audio.float().cpu().numpy(), SAMPLE_RATE_HZ, FORMATS[fmt])
