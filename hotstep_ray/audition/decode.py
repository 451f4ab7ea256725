"""Codes -> audio without the DiT: FSQ -> detokenizer -> 25 Hz latents -> Oobleck VAE (tiled).

The HOT-Step "pure-LM preview" (`POST /codes-decode`): deterministic, no sampler, no adapter.
Shapes: codes [T5] -> FSQ output [1, T5, 2048] -> latents [1, 5*T5, 64] -> audio [2, 5*T5*1920]
float32 at 48 kHz stereo (one code = 0.2 s = 9600 samples).

The VAE decode is tiled so a 10-minute song fits a few GiB: a clip up to `whole_max_frames`
(default: one tile) is decoded in one piece (exactly the plain diffusers decode); a longer one is
cut into equal tiles (core a multiple of 32 frames, `overlap_frames` of context each side, clipped
at the ends) decoded `tile_batch` at a time, each keeping only its core. With overlap >= the
decoder's receptive field (about 8 frames) the result equals the whole decode. Interior tiles
share one shape, so cuDNN autotuning and `torch.compile` see few shapes.

The fast path (`fast=True`, the default on CUDA; `hotstep_ray.models.oobleck_fast`) folds weight
norm, fuses each Snake into one kernel and replays a CUDA graph per window shape. It tiles with
windows of exactly `tile_frames` but the last, which ends flush with the clip and holds only its
core and left context, rounded up to `tail_step` frames (as the preprocessing encoder does): one
graph serves every full window of every long clip, and a few more the tails.
`warm()` captures that window's graph first: all graphs share one memory pool, and the first
(largest) capture sizes it, so shorter shapes captured later fit in its blocks.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from hotstep_ray.audio.io import encode_audio, wav_header
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
from hotstep_ray.preprocess.vae_tiles import TAIL_STEP, Window, plan_windows

log = logging.getLogger(__name__)

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
        overlap_frames: int = 16,  # 2x the decoder's receptive field (~8 frames)
        tile_batch: int = 1,
        whole_max_frames: int | None = None,
        tail_step: int = TAIL_STEP,
        compile: bool = False,
        fast: bool | None = None,
        fast_options: OobleckFastOptions | None = None,
    ) -> None:
        """`fast`: None = on for CUDA, off on the CPU. `fast_options` tune it (`compile` is
        folded into them). `whole_max_frames`: longest clip decoded in one piece; None = one
        tile. The fast path refuses more than `tile_frames`: its CUDA graphs share one pool
        sized by the tile window (`warm`), which a longer whole decode would grow. `tail_step`:
        the fast path's last window is rounded up to this many frames (`_windows`)."""
        if tile_frames < _TILE_QUANTUM or overlap_frames < 0 or tile_batch < 1 or tail_step < 1:
            raise ValueError(
                "tile_frames >= 32, overlap_frames >= 0, tile_batch >= 1, tail_step >= 1"
            )
        if 2 * overlap_frames >= tile_frames:
            raise ValueError(f"tile_frames ({tile_frames}) must exceed 2 x overlap_frames")
        param = next(vae.parameters())
        self.device, self.dtype = param.device, param.dtype
        use_fast = fast_default(self.device) if fast is None else fast
        whole_max = tile_frames if whole_max_frames is None else whole_max_frames
        if use_fast and whole_max > tile_frames:
            raise ValueError(
                f"whole_max_frames ({whole_max}) must not exceed tile_frames ({tile_frames}) "
                "on the fast path: no decode shape may be larger than the tile window"
            )
        self.vae = vae.eval().requires_grad_(False)
        self.hop = int(np.prod(vae.config.downsampling_ratios))  # samples per latent frame
        self.tile_frames, self.overlap, self.tail_step = tile_frames, overlap_frames, tail_step
        self.tile_batch, self.whole_max = tile_batch, whole_max
        self.fast: FastOobleck | None = None
        if use_fast:
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

    @torch.no_grad()
    def warm(self) -> float:
        """Capture the CUDA graph of the largest decode shape, [tile_batch, C, tile_frames]
        zeros, now: it is decoded `capture_after` times (ShapeGraphs captures a shape on that
        call). All graphs share one pool and the first capture sizes it, so every shorter
        shape captured later (a whole short clip, a last partial batch) reuses its blocks; a
        30 s clip (750 frames) captured before the 768-frame window nearly doubled the pool
        (4.16 GiB reserved). Returns the seconds taken; 0.0 (nothing run) without graphs."""
        if self.fast is None or not self.fast.uses_graphs:
            return 0.0
        start = time.perf_counter()
        channels = int(self.vae.config.decoder_input_channels)
        z = torch.zeros(
            self.tile_batch, channels, self.tile_frames, device=self.device, dtype=self.dtype
        )
        for _ in range(max(1, self.fast.options.capture_after)):
            self._decode(z)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - start

    def plan(self, frames: int) -> TilePlan:
        if frames <= self.whole_max:
            return TilePlan(0, frames, frames)
        if self.fast is not None:
            windows = self._windows(frames)
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

    def _windows(self, frames: int) -> list[Window]:
        """The fast path's windows: `tile_frames` long but the last, which holds only its core
        and `overlap` of left context, rounded up to `tail_step` frames. Before, the last window
        was a full tile: a 240 s song (6000 frames) decoded 9 x 768 = 6912 frames, its last
        window 768 for 96 new ones; now 8 x 768 + 128 = 6272 (9% less). Each tail length is a
        CUDA graph of its own (at most tile / tail_step of them), smaller than the tile's, so
        it reuses the tile graph's pool (`warm`)."""
        return plan_windows(frames, self.tile_frames, self.overlap, tail_step=self.tail_step)

    def _decode_windows(self, z: torch.Tensor) -> torch.Tensor:
        """[B, 64, T] -> float32 [B, 2, T * hop] in `_windows` (two shapes at most: the tile
        and the song's tail), windows of one length `tile_batch` per call, each keeping its
        core."""
        batch, frames = z.shape[0], z.shape[-1]
        out = torch.empty(batch, 2, frames * self.hop, device=self.device)
        by_length: dict[int, list[Window]] = defaultdict(list)
        for window in self._windows(frames):
            by_length[window.stop - window.start].append(window)
        groups = [
            same[i : i + self.tile_batch]
            # the tile's windows first: without `warm`, its graph is still the pool's first
            for same in (by_length[n] for n in sorted(by_length, reverse=True))
            for i in range(0, len(same), self.tile_batch)
        ]
        for group in groups:
            stacked = torch.cat([z[:, :, w.start : w.stop] for w in group], dim=0)
            audio = self._decode(stacked)  # [len(group) * B, 2, window * hop]
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

    def warm(self) -> float:
        """Capture the VAE's tile-window graph before the first request (TiledVaeDecoder.warm):
        seconds taken, 0.0 on the CPU / without CUDA graphs."""
        with self._lock:
            return self.vae.warm()

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
    """[C, T] float audio -> 16-bit PCM WAV bytes. Clip, scale, round and interleave happen on
    the audio's device, so only 2 bytes per sample cross to the host (a 240 s song: 46 MB); from
    CUDA through a reused page-locked buffer, then one copy into the returned `bytes`."""
    pcm = _pcm16(audio)
    header = wav_header(int(audio.shape[0]), sample_rate_hz, int(audio.shape[1]), "pcm16")
    if pcm.device.type != "cuda":  # one copy: header + the int16 buffer (.cpu(): no-op on CPU)
        return b"".join((header, pcm.cpu().numpy()))
    return _pcm16_from_cuda(pcm, header)


def _pcm16(audio: torch.Tensor) -> torch.Tensor:
    """[C, T] float -> int16 [T, C] (interleaved) on the audio's device: clip to [-1, 1],
    * 32767, round half to even (torch.round). The first op makes the only float32 temporary of
    the audio's size (92 MB for 240 s); the rest run in place on it."""
    if audio.dtype == torch.float32:
        scaled = audio.clamp(-1.0, 1.0)
    else:  # the float32 copy is the temporary; clip it in place (clip commutes with the cast)
        scaled = audio.float().clamp_(-1.0, 1.0)
    scaled.mul_(32767.0).round_()
    pcm = torch.empty(audio.shape[1], audio.shape[0], dtype=torch.int16, device=audio.device)
    # Cast and interleave in one pass, no int16 [C, T] in between; exact: whole numbers in
    # [-32767, 32767]
    pcm.T.copy_(scaled)
    return pcm


@dataclass
class _Staging:
    """One CUDA device's page-locked host buffer (uint8) and the lock of whoever fills it."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    buffer: torch.Tensor | None = None


_STAGING: dict[torch.device, _Staging] = {}
_STAGING_LOCK = threading.Lock()  # guards _STAGING itself
_STAGING_QUANTUM = 1 << 20  # buffers grow in whole MiB


@contextmanager
def _pinned(device: torch.device, size: int) -> Iterator[torch.Tensor]:
    """A pinned host buffer of >= `size` bytes for `device`, held exclusively while in use.

    Pageable destinations make CUDA copy through its own small pinned bounce buffer and fault
    in fresh pages every call; a page-locked one is written by DMA at full bus speed. One per
    device, grown to the longest song seen (600 s: 110 MiB) and never shrunk, so a replica
    pins its longest WAV once."""
    with _STAGING_LOCK:
        staging = _STAGING.setdefault(device, _Staging())
    with staging.lock:
        if staging.buffer is None or staging.buffer.numel() < size:
            staging.buffer = None  # the old pages go back before the bigger buffer is pinned
            grown = -(-size // _STAGING_QUANTUM) * _STAGING_QUANTUM
            staging.buffer = torch.empty(grown, dtype=torch.uint8, pin_memory=True)
        yield staging.buffer


def _pcm16_from_cuda(pcm: torch.Tensor, header: bytes) -> bytes:
    """int16 [T, C] on a CUDA device -> header + its bytes, through the device's pinned buffer."""
    size = pcm.numel() * 2
    with _pinned(pcm.device, size) as buffer:
        host = buffer[:size]
        host.view(torch.int16).view(pcm.shape).copy_(pcm, non_blocking=True)
        # Wait for this stream's copy only (not the whole device: other replicas share it).
        done = torch.cuda.Event()
        done.record(torch.cuda.current_stream(pcm.device))
        done.synchronize()
        return b"".join((header, host.numpy()))  # the one host copy, before the buffer is reused


def encode(audio: torch.Tensor, fmt: str) -> bytes:
    """[C, T] float audio (any device) -> WAV (fast path) or FLAC bytes."""
    if fmt == "wav":
        return pcm16_wav(audio)
    return encode_audio(audio.float().cpu().numpy(), SAMPLE_RATE_HZ, FORMATS[fmt])


def replica_codes_decoder(
    checkpoints: str | Path,
    *,
    dit: str | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype | str | None = None,
) -> CodesDecoder:
    """The CodesDecoder of one Serve replica, its tile-window CUDA graph already captured
    (`CodesDecoder.warm`): the replica's first request does not pay the capture, and the
    largest graph sizes the shared graph pool before any shorter clip's graph."""
    decoder = CodesDecoder.from_checkpoints(checkpoints, dit=dit, device=device, dtype=dtype)
    seconds = decoder.warm()
    if seconds > 0:  # 0.0: nothing to capture (CPU, no CUDA graphs)
        reserved = torch.cuda.memory_reserved(decoder.device) / 2**30
        log.info(
            "codes decoder warmed on %s in %.2f s (%.2f GiB reserved)",
            decoder.device,
            seconds,
            reserved,
        )
    return decoder
