"""The DiT's conditioning for one song: caption + lyrics -> AR rollouts -> [L, 2048] per latent.

MiniMax released no audio -> code encoder, so the default ("sampled") conditioning is a rollout of
the composer LM + depth decoder from the song's MM3 caption and lyrics, as at inference. It is
content-misaligned with the target audio by design (the DiT learns the caption's style, not the
exact notes). Teacher-forced ("aligned") conditioning from RVQ codes lives in `aligned.py`.

Rollouts run in independent 60 s segments (HOT-Step's `mm3-condition`: a one-shot rollout of a
whole song stops early on EOS, covering 65-84 % of it). Segment k starts at frame 1500 k, gets
seed `seed + k` and a contiguous share of the lyric lines, and conditions latents
[latent_length(first frame), latent_length(first frame + frames emitted)). The segment starts are
SEAMS: the conditioning jumps to an unrelated rollout there, so training crops must lie inside one
segment (`data.py`; seed trap 17). Latents a segment did not reach (early EOS) stay zero and are
outside every span, so no crop uses them.

The rollout itself is the diffusers reference, run block by block (`MiniMaxMusic3TokenizeStep`,
`MiniMaxMusic3AutoregressiveStep`): its prompt template and cleaning (caption lines by
`splitlines()`, lyric lines by `split("\\n")`: seed trap 6), AR CFG 1.5 / top-50, the depth
decoder, and the un-emitted warm-up iteration (seed trap 4) are used as they are, with a CPU
`torch.Generator` per segment so a seed reproduces the same frames on any device.

Condition encoding: the condition encoder's mix + Conv1d runs per segment (or in 3072-frame chunks
with 128 frames of context), then ONE plain nearest resample maps the segment's F frames onto its
exact latent span (`mode="nearest"`, never "nearest-exact": they disagree on 100 of 689 positions
of a 200-frame window; seed trap 7). Output: float16 [L, 2048], latent-major.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from diffusers.modular_pipelines.minimax_music3.encoders import (
    MiniMaxMusic3AutoregressiveStep,
    MiniMaxMusic3TokenizeStep,
    _clean_caption,
    _normalize_lyrics,
)
from diffusers.modular_pipelines.modular_pipeline import PipelineState

from hotstep_ray.core.errors import InputError
from hotstep_ray.core.storage import Storage
from hotstep_ray.dataset.sidecar import stem_key
from hotstep_ray.mm3 import FRAME_HZ, MAX_FRAMES, SEGMENT_S, latent_length

CAPTION_SUFFIX = ".mm3.txt"
INSTRUMENTAL = "[instrumental]"  # HOT-Step's stand-in: the reference refuses empty lyrics
ENCODE_CHUNK_FRAMES = 3072
ENCODE_CONTEXT_FRAMES = 128


class Mm3CaptionError(InputError):
    """A song has no usable MM3 structured caption (the ACE caption is never substituted)."""


# -- caption and lyrics ---------------------------------------------------------------------------
def caption_key(audio_key: str) -> str:
    """`sub/song.flac` -> `sub/song.mm3.txt`, next to the audio."""
    return stem_key(audio_key) + CAPTION_SUFFIX


def read_caption(source: Storage, audio_key: str) -> str:
    """The song's MM3 structured caption (Global Metadata / Vocal Details / Arrangement), as
    written: the reference cleans it line by line with `splitlines()`. A BOM is dropped. Missing
    or blank -> `Mm3CaptionError`; never the ACE caption, which describes another model's input."""
    key = caption_key(audio_key)
    if not source.exists(key):
        raise Mm3CaptionError(
            f"no MM3 caption {source.url_of(key)}: write the song's structured caption there "
            "(the ACE caption is not used for MM3)"
        )
    text = source.read_bytes(key).decode("utf-8-sig")
    if not text.strip():
        raise Mm3CaptionError(f"MM3 caption {source.url_of(key)} is empty")
    return text


def song_lyrics(lyrics: str | None, is_instrumental: bool = False) -> str:
    """Lyrics as the template takes them; empty or instrumental -> "[instrumental]"."""
    if is_instrumental or not (lyrics or "").strip():
        return INSTRUMENTAL
    return lyrics or ""


def split_lyrics(lyrics: str, parts: int) -> list[str]:
    """Contiguous shares of the lyric lines for `parts` segments, proportional to line count.
    Lines split with `split("\\n")` like the reference's lyric normaliser (seed trap 6: mixing
    in `splitlines()` would drop or add a trailing newline); an empty share -> "[instrumental]"."""
    if parts <= 1:
        return [lyrics]
    lines = lyrics.split("\n")
    bounds = [round(k * len(lines) / parts) for k in range(parts + 1)]
    shares = ["\n".join(lines[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)]
    return [share if share.strip() else INSTRUMENTAL for share in shares]


def prompt_text(caption: str, lyrics: str) -> str:
    """The conditional prompt string, built by the reference's own cleaners (for logs and tests;
    the rollout tokenizes through the reference block)."""
    return (
        f"<|im_start|><|caption_start|>{_clean_caption(caption)}<|caption_end|>"
        f"<|lyrics_start|>{_normalize_lyrics(lyrics)}<|lyrics_end|><|im_end|><|audio_start|>"
    )


# -- the conditioning models -----------------------------------------------------------------------
@dataclass
class ConditionModels:
    tokenizer: object
    language_model: torch.nn.Module
    rvq_depth_decoder: torch.nn.Module
    condition_encoder: torch.nn.Module
    device: torch.device

    def components(self) -> SimpleNamespace:
        """What the diffusers MM3 blocks read from a pipeline: the three models, the frame rate
        and the execution device."""
        return SimpleNamespace(
            tokenizer=self.tokenizer,
            language_model=self.language_model,
            rvq_depth_decoder=self.rvq_depth_decoder,
            frame_rate=float(FRAME_HZ),
            _execution_device=self.device,
        )


def tokenize(models: ConditionModels, caption: str, lyrics: str) -> torch.Tensor:
    """[2, P] prompt ids (conditional row, then the audio-CFG row) from the reference block."""
    state = PipelineState()
    state.set("prompt", caption)
    state.set("lyrics", lyrics)
    MiniMaxMusic3TokenizeStep()(models.components(), state)
    return state.get("text_ids")


@torch.no_grad()
def rollout(
    models: ConditionModels, caption: str, lyrics: str, frames: int, seed: int
) -> torch.Tensor:
    """Frame hidden states [F, 8 * H] (F <= frames; fewer on EOS) of one sampled rollout."""
    state = PipelineState()
    state.set("text_ids", tokenize(models, caption, lyrics))
    # +0.5 frame: the block takes int(duration * 25), which must not round down to frames - 1.
    state.set("audio_duration", (frames + 0.5) / FRAME_HZ)
    state.set("generator", torch.Generator(device="cpu").manual_seed(int(seed)))
    MiniMaxMusic3AutoregressiveStep()(models.components(), state)
    return state.get("frame_hiddens")[0]


# -- condition encoding ------------------------------------------------------------------------------
def resample_nearest(features: torch.Tensor, length: int) -> torch.Tensor:
    """[C, F] -> [C, length] by plain nearest (source index floor(j * F / length)), as the
    reference condition encoder resamples. Not "nearest-exact" (seed trap 7)."""
    return F.interpolate(features.unsqueeze(0), size=int(length), mode="nearest")[0]


@torch.no_grad()
def frame_projection(encoder: torch.nn.Module, hiddens: torch.Tensor) -> torch.Tensor:
    """[F, 8 * H] frame hidden states -> [C, F]: the encoder's layer mix, scale and Conv1d (k3)
    before its resample, taken from `encoder.proj` with a forward hook so the module's own math
    runs. Chunks of 3072 frames carry 128 frames of context each side (the conv needs 1)."""
    param = next(encoder.parameters())
    captured: list[torch.Tensor] = []
    handle = encoder.proj.register_forward_hook(lambda _m, _i, out: captured.append(out))
    pieces = []
    try:
        total = hiddens.shape[0]
        for start in range(0, total, ENCODE_CHUNK_FRAMES):
            end = min(total, start + ENCODE_CHUNK_FRAMES)
            lo = max(0, start - ENCODE_CONTEXT_FRAMES)
            hi = min(total, end + ENCODE_CONTEXT_FRAMES)
            captured.clear()
            encoder(hiddens[lo:hi].unsqueeze(0).to(device=param.device, dtype=param.dtype))
            pieces.append(captured[0][0, :, start - lo : end - lo].float())
    finally:
        handle.remove()
    return torch.cat(pieces, dim=-1)


def encode_span(encoder: torch.nn.Module, hiddens: torch.Tensor, length: int) -> torch.Tensor:
    """[F, 8 * H] -> [length, C] float32 conditioning for a span of `length` latents."""
    return resample_nearest(frame_projection(encoder, hiddens), length).T.contiguous()


# -- whole songs ---------------------------------------------------------------------------------
@dataclass
class SongCondition:
    condition: torch.Tensor  # [L, C] float16, latent-major; zeros outside the spans
    span_starts: list[int]  # latent index where each segment's conditioning starts
    span_ends: list[int]  # ... and ends (exclusive); crops must lie inside one span
    frames_wanted: list[int] = field(default_factory=list)
    frames_emitted: list[int] = field(default_factory=list)
    eos_hit: list[bool] = field(default_factory=list)
    aligned: bool = False

    def to_meta(self) -> dict:
        return {
            "cond_latents": int(self.condition.shape[0]),
            "cond_dim": int(self.condition.shape[1]),
            "span_starts": self.span_starts,
            "span_ends": self.span_ends,
            "n_segments": len(self.span_starts),
            "frames_wanted": self.frames_wanted,
            "frames_emitted": self.frames_emitted,
            "eos_hit": self.eos_hit,
            "aligned": self.aligned,
        }


def frames_for(duration_s: float) -> int:
    """AR frames a song of `duration_s` needs: round(duration * 25), capped at 9000 (6 min)."""
    return max(1, min(round(duration_s * FRAME_HZ), MAX_FRAMES))


def plan_segments(total_frames: int, segment_s: float = SEGMENT_S) -> list[tuple[int, int]]:
    """(first frame, frame count) of each rollout segment."""
    size = max(1, round(segment_s * FRAME_HZ))
    return [(s, min(size, total_frames - s)) for s in range(0, total_frames, size)]


def sampled_condition(
    models: ConditionModels,
    caption: str,
    lyrics: str,
    duration_s: float,
    seed: int,
    segment_s: float = SEGMENT_S,
) -> SongCondition:
    """Independent seeded rollouts per segment, encoded onto their latent spans."""
    total = frames_for(duration_s)
    segments = plan_segments(total, segment_s)
    shares = split_lyrics(lyrics, len(segments))
    out_dim = int(models.condition_encoder.config.out_dim)
    condition = torch.zeros(latent_length(total), out_dim, dtype=torch.float16)
    result = SongCondition(condition, [], [])
    for index, ((first, count), share) in enumerate(zip(segments, shares, strict=True)):
        hiddens = rollout(models, caption, share, count, seed + index)
        emitted = int(hiddens.shape[0])
        start, end = latent_length(first), latent_length(first + emitted)
        if end > start:
            encoded = encode_span(models.condition_encoder, hiddens, end - start)
            condition[start:end] = encoded.to(torch.float16)
            result.span_starts.append(start)
            result.span_ends.append(end)
        result.frames_wanted.append(count)
        result.frames_emitted.append(emitted)
        result.eos_hit.append(emitted < count)
    return result
