"""`Encoder`: every model preprocessing runs, held on one device, turning prepared songs into the
tensors the trainers read.

Per song (shapes per sample; T latent frames at 25 Hz, T5 = ceil(T / 5) codes at 5 Hz):
- target_latents [T, 64]: VAE posterior sample, mean + std * noise, the noise drawn by a CPU
  generator seeded from (seed, sample id): the same draw on every rerun, device and batch.
- encoder_hidden_states [L, H] + mask [L]: the condition encoder over the caption prompt (full
  Qwen3-Embedding forward), the lyric prompt (token embeddings only) and one timbre token from
  `silence_latent[:750]` (what inference feeds without a reference). L = lyric + 1 + text tokens,
  no padding: batches pad to the longest and each row is cut back to its valid tokens (the
  condition encoder packs valid tokens first).
- context_latents [T, 128]: silence_latent[:T] ‖ ones (text2music context without LM hints).
- audio_codes [T5]: FSQ indices of the float32 audio tokenizer: on CUDA by default a TF32 pass
  whose windows near an FSQ floor boundary are recomputed in float32 (`fsq_fast`; same codes,
  `EncoderSettings.codes_fast_pass` / `codes_recheck_margin`).
- an optional genre variant of the condition (caption text = genre) for training-time swaps.

The VAE runs through `hotstep_ray.models.oobleck_fast` on CUDA by default (folded weight norm,
fused Snake, CUDA graphs per window-batch shape); `fast_vae=False` keeps the plain diffusers
modules (only weight norm folded), the CPU default.

Memory: the fast VAE's CUDA graphs allocate from their own pool; every other stage uses the
caching allocator, which keeps each stage's freed blocks reserved while the next stage asks for
other sizes. With `EncoderSettings.release_cache_between_stages` (default: on unless the
allocator runs expandable segments, as GPU encoder processes do) `encode` returns the unused
blocks after the VAE and conditions and after the codes stage, so the stages do not each keep their own
(`release_cached_blocks`, shared with the fast VAE's graph capture).
`EncoderSettings.memory_cap_gib` caps the allocator per process (`apply_memory_cap`).

Stage order: `encode_tensors` queues the VAE's work and launches the conditions behind it, so
their host time runs while the GPU is busy.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import torch

from hotstep_ray.models.acestep_dit import resolve_device_dtype
from hotstep_ray.models.fsq_fast import fast_codes_many, resolve_fast_pass
from hotstep_ray.models.lm_tokenizer import load_tokenizer
from hotstep_ray.models.oobleck_fast import (
    FastOobleck,
    OobleckFastOptions,
    fast_default,
    fold_weight_norm,
    release_cached_blocks,
)
from hotstep_ray.models.text_models import (
    embed_lyrics,
    encode_captions,
    load_text_encoder,
    load_vae,
    to_device,
)
from hotstep_ray.preprocess.dit_parts import DitEncoders, load_dit_encoders
from hotstep_ray.preprocess.items import (
    EncodedSample,
    EncodeItem,
    EncoderSettings,
    noise_seed,
    resolve_release,
)
from hotstep_ray.preprocess.model_paths import ModelPaths
from hotstep_ray.preprocess.vae_tiles import encode_moments

TIMBRE_FRAMES = 750  # 30 s of 25 Hz frames: the reference-audio length inference uses


__all__ = [
    "Encoder",
    "apply_memory_cap",
    "fold_weight_norm",
    "memory_cap_fraction",
    "release_cached_blocks",
    "repeat_frames",
]


def repeat_frames(frames: torch.Tensor, count: int) -> torch.Tensor:
    """[N, C] -> [count, C]: the first `count` frames, cycling from the start when N < count
    (the tiny test silence is 8 s; real songs with max_duration 0 can pass the real 600 s)."""
    if frames.shape[0] >= count:
        return frames[:count]
    reps = -(-count // frames.shape[0])
    return frames.repeat(reps, 1)[:count]


def memory_cap_fraction(cap_gib: float, total_bytes: int) -> float | None:
    """The `torch.cuda.set_per_process_memory_fraction` value for a cap of `cap_gib` GiB on a
    device of `total_bytes`; None for no cap (0)."""
    if cap_gib < 0:
        raise ValueError(f"memory cap must be >= 0 GiB, got {cap_gib}")
    if cap_gib == 0:
        return None
    cap_bytes = cap_gib * 2**30
    if cap_bytes > total_bytes:
        raise ValueError(
            f"memory cap {cap_gib} GiB exceeds the device's {total_bytes / 2**30:.1f} GiB"
        )
    return cap_bytes / total_bytes


def apply_memory_cap(cap_gib: float, device: torch.device) -> float | None:
    """On CUDA, cap the caching allocator of this process on `device` at `cap_gib` GiB: past it,
    the allocator frees its cached blocks and retries before it raises out-of-memory, so an actor
    sharing a GPU stays within its share. Returns the fraction set; None (nothing set) off CUDA
    or for 0."""
    device = torch.device(device)
    if device.type != "cuda" or cap_gib == 0:
        return None
    # torch takes an index here, not a bare "cuda": that is the current device
    index = device.index if device.index is not None else torch.cuda.current_device()
    total = torch.cuda.get_device_properties(index).total_memory
    fraction = memory_cap_fraction(cap_gib, total)
    torch.cuda.set_per_process_memory_fraction(fraction, index)
    return fraction


def to_host(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """CPU copies of device tensors. From CUDA: copies into pinned memory, queued without
    waiting, so the caller must `wait_for_host` before reading them (one wait for the whole
    batch instead of one per tensor, and pinned copies run at the link's speed, not through a
    pageable staging buffer). Tensors already on the CPU come back as they are."""
    out = []
    for tensor in tensors:
        if tensor.device.type != "cuda":
            out.append(tensor.cpu())
            continue
        host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        out.append(host.copy_(tensor, non_blocking=True))
    return out


def wait_for_host(device: torch.device) -> None:
    """Wait until `to_host`'s copies from `device` (its current stream) have landed."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


class Encoder:
    """The preprocessing models of one device. Plain Python: the Ray actor wraps one."""

    def __init__(
        self,
        vae: torch.nn.Module,
        text_encoder: torch.nn.Module,
        tokenizer,
        dit: DitEncoders,
        settings: EncoderSettings,
        device: torch.device,
        dtype: torch.dtype,
        *,
        fast_vae: bool | None = None,
        vae_options: OobleckFastOptions | None = None,
    ) -> None:
        """`fast_vae`: None = on for CUDA. Weight norm is folded either way (otherwise every
        forward recomputes g * v / |v| for all ~100 VAE convs, ~10% of a CPU encode)."""
        apply_memory_cap(settings.memory_cap_gib, device)
        self.release_cache = resolve_release(settings.release_cache_between_stages)
        # "auto" resolved once; "tf32" on a non-CUDA device fails here, not mid-batch.
        self.codes_fast_pass = resolve_fast_pass(settings.codes_fast_pass, device)
        # The last `codes` call's {"fast_pass", "windows", "rechecked"} (logs and the bench).
        self.last_codes_stats: dict[str, int | str] = {}
        fold_weight_norm(vae)
        use_fast = fast_default(device) if fast_vae is None else fast_vae
        self.fast_vae = FastOobleck(vae, vae_options) if use_fast else None
        self.vae, self.text_encoder, self.tokenizer, self.dit = vae, text_encoder, tokenizer, dit
        self.settings, self.device, self.dtype = settings, torch.device(device), dtype
        silence = dit.silence_latent  # [N, 64] float32 CPU
        # Inference's no-reference timbre input: silence_latent[:750] (not zeros). A short test
        # silence (the tiny tree's 200 frames) is used whole.
        timbre = silence[: min(TIMBRE_FRAMES, silence.shape[0])]
        self._timbre = timbre.to(device=device, dtype=dtype)  # [750, 64]

    @classmethod
    def load(
        cls,
        paths: ModelPaths,
        settings: EncoderSettings,
        device: torch.device | str | None = None,
        dtype: torch.dtype | str | None = None,
        **options,
    ) -> Encoder:
        """Load from checkpoint folders. Default: CUDA + bf16 if present, else CPU + float32.
        `options`: `fast_vae`, `vae_options` (see `__init__`)."""
        device, dtype = resolve_device_dtype(device, dtype)
        vae = load_vae(paths.vae, device=device, dtype=dtype)
        text_encoder = load_text_encoder(paths.text_encoder, device=device, dtype=dtype)
        tokenizer = load_tokenizer(paths.text_encoder)
        dit = load_dit_encoders(paths.dit, device, dtype)
        return cls(vae, text_encoder, tokenizer, dit, settings, device, dtype, **options)

    # -- stages ------------------------------------------------------------------------------
    def latents(self, items: Sequence[EncodeItem]) -> list[torch.Tensor]:
        """Posterior samples [T, 64] float32 on the device, one per item."""
        audios = [torch.as_tensor(item.audio, dtype=torch.float32) for item in items]
        moments = encode_moments(
            self.vae,
            audios,
            self.settings.vae_chunk_frames,
            self.settings.vae_overlap_frames,
            self.settings.vae_batch_frames,
            fast=self.fast_vae,
            staged_upload=self.settings.staged_upload,
        )
        # Nothing here waits for the GPU: the VAE's windows are queued, the noise is drawn on the
        # CPU meanwhile and crosses in pinned memory without a sync, so the caller's next stage
        # (the conditions) launches its work while the VAE still runs.
        out = []
        for item, (mean, std) in zip(items, moments, strict=True):
            generator = torch.Generator().manual_seed(
                noise_seed(self.settings.seed, item.sample_id)
            )
            noise = to_device(torch.randn(mean.shape, generator=generator), mean.device)
            out.append(mean + std * noise)
        return out

    def codes(
        self, latents: Sequence[torch.Tensor], fast_pass: str | None = None
    ) -> list[torch.Tensor]:
        """[T, 64] latents per song -> [ceil(T / 5)] int64 FSQ indices per song (the float32
        tokenizer's codes, silence-padded). Songs of equal length share a tokenizer call, up to
        `EncoderSettings.codes_frames_per_call` frames (fewer, larger calls are a little faster
        but peak higher). Rows never mix: the tokenizer pools each 5-frame window of each row on its own.

        `fast_pass`: None = the settings' choice, else "auto" | "off" | "tf32" | "bf16" ("off":
        the bench's float32 reference). Counts land in `last_codes_stats`."""
        mode = (
            self.codes_fast_pass if fast_pass is None else resolve_fast_pass(fast_pass, self.device)
        )
        margin = self.settings.codes_recheck_margin
        per_call = self.settings.codes_frames_per_call  # latent frames
        groups: dict[int, list[int]] = defaultdict(list)
        for index, z in enumerate(latents):
            groups[z.shape[0]].append(index)
        calls = []
        for frames, members in groups.items():
            rows = max(1, per_call // max(1, frames))
            calls += [members[i : i + rows] for i in range(0, len(members), rows)]
        out: list[torch.Tensor] = [torch.empty(0)] * len(latents)
        silence = self.dit.silence_latent.to(self.device)[None]  # [1, N, 64]
        stacks = [torch.stack([latents[i].float() for i in members]) for members in calls]
        # pass 1 call by call, then one float32 recheck of every call's boundary windows, in
        # chunks no larger than a call (one sync for the batch instead of three per call)
        results = fast_codes_many(
            self.dit.audio_tokenizer,
            stacks,
            silence,
            mode,
            margin,
            recheck_windows=per_call // self.dit.audio_tokenizer.pool_window_size,
        )
        for members, found in zip(calls, results, strict=True):
            for row, index in enumerate(members):
                out[index] = found.indices[row, :, 0].long()
        self.last_codes_stats = {
            "fast_pass": mode,
            "windows": sum(found.windows for found in results),
            "rechecked": sum(found.rechecked for found in results),
        }
        return out

    def conditions(
        self, captions: Sequence[str], lyrics: Sequence[str]
    ) -> list[tuple[torch.Tensor, int, int]]:
        """(encoder_hidden_states [L, H] float32, text tokens, lyric tokens) per row, unpadded."""
        s = self.settings
        text, text_mask = encode_captions(
            self.text_encoder, self.tokenizer, captions, max_length=s.max_caption_tokens
        )
        lyric, lyric_mask = embed_lyrics(
            self.text_encoder, self.tokenizer, lyrics, max_length=s.max_lyric_tokens
        )
        rows = len(captions)
        timbre = self._timbre[None].expand(rows, -1, -1)  # [B, 750, 64]
        order = torch.arange(rows, device=self.device)
        with torch.no_grad():
            states, mask = self.dit.condition_encoder(  # masks as long 0/1, as diffusers' pipeline
                text_hidden_states=text.to(self.dtype),
                text_attention_mask=text_mask.long(),
                lyric_hidden_states=lyric.to(self.dtype),
                lyric_attention_mask=lyric_mask.long(),
                refer_audio_acoustic_hidden_states_packed=timbre,
                refer_audio_order_mask=order,
            )
        # one sync for every row's counts (packed: the valid tokens come first)
        counts = torch.stack([mask.sum(-1), text_mask.sum(-1), lyric_mask.sum(-1)], -1).tolist()
        return [
            (states[row, :valid].float().clone(), text_count, lyric_count)  # not batch views
            for row, (valid, text_count, lyric_count) in enumerate(counts)
        ]

    # -- one batch ---------------------------------------------------------------------------
    def release_between_stages(self) -> None:
        """After a stage whose working set the next one does not reuse (`encode_tensors` calls it
        after the VAE and conditions, and after the codes; see `release_cached_blocks`)."""
        if self.release_cache:
            release_cached_blocks(self.device)

    def text_conditions(self, items: Sequence[EncodeItem]) -> tuple[list, dict]:
        """`conditions` of the batch's caption prompts, and of the genre prompts of the rows
        that have one: (per row, {row: genre conditions})."""
        conds = self.conditions(
            [item.caption_prompt for item in items], [item.lyric_prompt for item in items]
        )
        genre_rows = [i for i, item in enumerate(items) if item.genre_prompt]
        genre = {}
        if genre_rows:
            found = self.conditions(
                [items[i].genre_prompt or "" for i in genre_rows],
                [items[i].lyric_prompt for i in genre_rows],
            )
            genre = dict(zip(genre_rows, found, strict=True))
        return conds, genre

    @staticmethod
    def _finite_flags(latents: Sequence[torch.Tensor]) -> torch.Tensor:
        """[songs] bool on the device: whether each song's latents are all finite."""
        return torch.stack([torch.isfinite(z).all() for z in latents])

    @torch.no_grad()
    def encode_tensors(
        self, items: Sequence[EncodeItem], check_finite: bool = True
    ) -> tuple[list[torch.Tensor], list, dict, list[torch.Tensor]]:
        """The batch's device tensors: (latents, conditions, genre conditions, codes).
        `check_finite` refuses NaN or Inf latents (a benchmark on random weights turns it off).

        Order: `latents` only queues the VAE's work, so the conditions' host time (tokenizing,
        launches) runs while the GPU is still busy with it, up to their first sync (H200, 8 x
        240 s: 1877 -> 1918-1926 audio-s per GPU-s; a worker thread for the conditions was
        slower, 1143 ms per batch against 1010, as its Python held the GIL while the VAE
        waited to launch). The NaN check is then read with one sync."""
        latents = self.latents(items)
        finite = self._finite_flags(latents) if check_finite else None  # queued, not read
        conds, genre = self.text_conditions(items)
        if finite is not None:
            for item, ok in zip(items, finite.tolist(), strict=True):  # one sync
                if not ok:
                    raise FloatingPointError(f"{item.sample_id}: VAE latents contain NaN or Inf")
        self.release_between_stages()  # the VAE's non-graph and the conditions' blocks
        codes = self.codes(latents)
        self.release_between_stages()  # the float32 tokenizer's blocks, before the next batch's VAE
        return latents, conds, genre, codes

    @torch.no_grad()
    def encode(self, items: Sequence[EncodeItem], check_finite: bool = True) -> list[EncodedSample]:
        """Encode a batch (callers group similar lengths). Raises on any failure; `encode_safe`
        isolates failing samples. `check_finite`: see `encode_tensors`."""
        latents, conds, genre, codes = self.encode_tensors(items, check_finite)
        rows = len(items)
        genre_rows = sorted(genre)
        # Every result crosses in one go: queued copies, one wait (see `to_host`); the CPU
        # builds the context latents meanwhile.
        host = to_host(
            [*latents, *(c[0] for c in conds), *codes, *(genre[r][0] for r in genre_rows)]
        )
        silence = self.dit.silence_latent
        contexts = [
            torch.cat([repeat_frames(silence, z.shape[0]), torch.ones(z.shape[0], 64)], dim=-1)
            for z in latents
        ]
        wait_for_host(self.device)
        # host: rows latents, rows states, rows codes, then the genre states of `genre_rows`
        host_latents, host_states = host[:rows], host[rows : 2 * rows]
        host_codes = host[2 * rows : 3 * rows]
        host_genre = dict(zip(genre_rows, host[3 * rows :], strict=True))
        out = []
        for index, item in enumerate(items):
            _, s_text, s_lyric = conds[index]
            sample = EncodedSample(
                sample_id=item.sample_id,
                target_latents=host_latents[index],
                context_latents=contexts[index],
                encoder_hidden_states=host_states[index],
                audio_codes=host_codes[index],
                s_text=s_text,
                s_lyric=s_lyric,
            )
            if index in genre:
                sample.genre_hidden_states = host_genre[index]
                sample.s_text_genre = genre[index][1]
            out.append(sample)
        return out

    def encode_safe(self, items: Sequence[EncodeItem]) -> list[EncodedSample | Exception]:
        """`encode`, but a failing batch is retried one item at a time so one bad song (NaN
        latents, out of memory on an outlier) costs only its own result."""
        try:
            return list(self.encode(items))
        except Exception as exc:
            if len(items) == 1:
                return [exc]
        results: list[EncodedSample | Exception] = []
        for item in items:
            try:
                results.append(self.encode([item])[0])
            except Exception as exc:  # recorded per sample by the caller
                results.append(exc)
        return results
