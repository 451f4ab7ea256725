"""Tiled VAE encode/decode with overlap-discard, batched across songs.

A song of T latent frames (T = samples // 1920) is cut into windows of exactly `chunk` frames
(shorter songs: one window of their own length). Each window keeps only its core frames; the
`overlap` frames on each side that see the window edge are thrown away, so a kept frame always
has >= `overlap` frames of real context on both sides (or the song edge, as untiled). Windows
start on latent-frame boundaries (multiples of 1920 samples), so the encoder's stride grid lines
up with the untiled run. The Oobleck encoder sees ~6.9 frames (13.2 k samples) each side, so any
overlap >= 7 reproduces the untiled encode up to float rounding; the default 48 is ample.

Because every full window has the same length, windows from many songs stack into one
`[N, 2, chunk * 1920]` batch: the GPU runs a few large convolutions instead of one per song.
Given a `FastOobleck` (hotstep_ray.models.oobleck_fast; the default on CUDA) the encoder runs
with folded weight norm, fused Snake kernels and one CUDA graph per batch shape (full batches of
full windows share one).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from hotstep_ray.preprocess.audio_prep import HOP_SAMPLES
from hotstep_ray.preprocess.items import VAE_BATCH_FRAMES, EncoderSettings

if TYPE_CHECKING:
    from hotstep_ray.models.oobleck_fast import FastOobleck

TAIL_STEP = 64  # last-window lengths are multiples of 64 frames (<= chunk / 64 extra shapes)
STD_FLOOR = 1e-4  # diffusers' OobleckDiagonalGaussianDistribution: std = softplus(scale) + 1e-4


@dataclass(frozen=True)
class Window:
    start: int  # first frame the window encodes
    stop: int  # one past its last frame
    keep_start: int  # frames [keep_start, keep_stop) of the song come from this window
    keep_stop: int


def plan_windows(frames: int, chunk: int, overlap: int, tail_step: int = 0) -> list[Window]:
    """Windows covering [0, frames): each `chunk` long (one shorter window for a short song),
    consecutive cores abutting, every core >= `overlap` frames from its window's inner edges.

    The last window ends flush with the song. `tail_step` 0: it is a full chunk, re-encoding
    frames its neighbour already did (a 240 s song in 1536-frame windows: 7680 frames encoded
    for 6000). `tail_step` > 0: it is only as long as its core plus `overlap` of left context,
    rounded up to a multiple of `tail_step` frames (a few shapes for the CUDA graphs): 6400."""
    if chunk <= 2 * overlap:
        raise ValueError(f"chunk ({chunk}) must exceed twice the overlap ({overlap})")
    if frames <= chunk:
        return [Window(0, frames, 0, frames)]
    windows = [Window(0, chunk, 0, chunk - overlap)]
    while windows[-1].keep_stop < frames:
        kept = windows[-1].keep_stop
        start = kept - overlap
        if start + chunk >= frames:  # last window: flush with the song end
            length = chunk
            if tail_step > 0:
                length = min(chunk, -(-(frames - start) // tail_step) * tail_step)
            windows.append(Window(frames - length, frames, kept, frames))
        else:
            windows.append(Window(start, start + chunk, kept, start + chunk - overlap))
    return windows


class SongUploads:
    """The songs of one encode on the VAE's device, in its dtype.

    Plain (and always off CUDA): every song crosses at once, `.to(device, dtype)`, before any
    window runs; from pageable memory each copy first waits for the GPU to go idle. `staged`
    (CUDA): the device buffers are allocated up front on the compute stream (their blocks stay
    that stream's to reuse), and a song crosses when `get` first asks for it: the CPU converts
    it to the VAE dtype into pinned memory, a side stream copies it, and the compute stream
    waits for that copy alone. The conversion and copy of song i + 1 then run while the GPU
    encodes song i. Same values either way (the same round-to-nearest conversion)."""

    def __init__(
        self,
        audios: list[torch.Tensor],
        device: torch.device,
        dtype: torch.dtype,
        staged: bool = False,
    ) -> None:
        self.staged = staged and device.type == "cuda"
        self.dtype = dtype
        if not self.staged:
            self.songs = [a.to(device=device, dtype=dtype, non_blocking=True) for a in audios]
            self.audios: list[torch.Tensor | None] = [None] * len(audios)  # every song sent
            return
        self.audios = list(audios)  # None once sent
        self.songs = [torch.empty(a.shape, device=device, dtype=dtype) for a in audios]
        self.main = torch.cuda.current_stream(device)
        self.side = torch.cuda.Stream(device)
        self.side.wait_stream(self.main)  # the new buffers' blocks may be read by queued work

    def get(self, song: int) -> torch.Tensor:
        """Song `song` on the device ([2, S], VAE dtype), sent first if it was not yet."""
        audio = self.audios[song]
        if audio is not None:
            host = torch.empty(audio.shape, dtype=self.dtype, pin_memory=True)
            host.copy_(audio)  # the dtype conversion, on the CPU while the GPU works
            target = self.songs[song]
            with torch.cuda.stream(self.side):
                target.copy_(host, non_blocking=True)
            target.record_stream(self.side)  # freed later on the compute stream: wait for both
            self.main.wait_stream(self.side)
            self.audios[song] = None
        return self.songs[song]


@torch.no_grad()
def encode_moments(
    vae: torch.nn.Module,
    audios: list[torch.Tensor],
    chunk: int,
    overlap: int,
    batch_frames: int = VAE_BATCH_FRAMES,
    fast: FastOobleck | None = None,
    tail_step: int = TAIL_STEP,
    staged_upload: bool = EncoderSettings.staged_upload,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """[2, S] float audio per song -> (mean [T, D], std [T, D]) float32 per song, T = S // 1920,
    D = latent channels (64), on the VAE's device. Windows of equal length from all songs run
    together, as many per forward as fit in `batch_frames` (at least one). `fast`: the
    prepared fast path of this same VAE. `staged_upload`: see `SongUploads` (default: the
    settings' default, `EncoderSettings.staged_upload`)."""
    if fast is not None and fast.vae is not vae:
        raise ValueError("`fast` wraps another VAE than `vae`")
    run_encoder = fast.encode if fast is not None else vae.encoder
    param = next(vae.parameters())
    device, dtype = param.device, param.dtype
    channels = int(vae.config.decoder_input_channels)  # the encoder emits 2 x this (mean, scale)
    # Each song crosses to the device once (in the VAE dtype); windows are then device slices.
    uploads = SongUploads(audios, device, dtype, staged_upload)
    frames = [audio.shape[-1] // HOP_SAMPLES for audio in audios]
    means = [torch.empty(t, channels, device=device) for t in frames]
    stds = [torch.empty(t, channels, device=device) for t in frames]
    by_length: dict[int, list[tuple[int, Window]]] = defaultdict(list)
    for song, count in enumerate(frames):
        for window in plan_windows(count, chunk, overlap, tail_step):
            by_length[window.stop - window.start].append((song, window))
    for length in sorted(by_length):
        jobs = by_length[length]
        per_forward = max(1, batch_frames // length)
        for first in range(0, len(jobs), per_forward):
            group = jobs[first : first + per_forward]
            batch = torch.stack(
                [
                    uploads.get(song)[:, w.start * HOP_SAMPLES : w.stop * HOP_SAMPLES]
                    for song, w in group
                ]
            )  # [N, 2, length * 1920]
            moments = run_encoder(batch).float()  # [N, 128, length]: mean ‖ raw scale
            mean, scale = moments.chunk(2, dim=1)
            std = F.softplus(scale) + STD_FLOOR
            for row, (song, w) in enumerate(group):
                lo, hi = w.keep_start - w.start, w.keep_stop - w.start
                means[song][w.keep_start : w.keep_stop] = mean[row, :, lo:hi].T
                stds[song][w.keep_start : w.keep_stop] = std[row, :, lo:hi].T
    return list(zip(means, stds, strict=True))


@torch.no_grad()
def decode_latents(
    vae: torch.nn.Module, latents: torch.Tensor, chunk: int = 384, overlap: int = 64
) -> torch.Tensor:
    """[T, 64] latents -> [2, T * 1920] float32 audio on the CPU, decoded in windows with the same
    overlap-discard plan (decode overlap 64 frames, as the reference app)."""
    param = next(vae.parameters())
    frames = latents.shape[0]
    out = torch.empty(2, frames * HOP_SAMPLES)
    for w in plan_windows(frames, chunk, overlap):
        z = latents[w.start : w.stop].T[None].to(device=param.device, dtype=param.dtype)
        audio = vae.decode(z).sample[0].float().cpu()  # [2, (stop - start) * 1920]
        lo, hi = (w.keep_start - w.start) * HOP_SAMPLES, (w.keep_stop - w.start) * HOP_SAMPLES
        out[:, w.keep_start * HOP_SAMPLES : w.keep_stop * HOP_SAMPLES] = audio[:, lo:hi]
    return out
