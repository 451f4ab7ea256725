"""The per-sample steps both executors run, as plain functions: decode, encode a batch, build
outputs. The plain path calls them in a loop; the Ray path calls the same functions inside its
tasks and actors, so the two produce the same files.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from hotstep_ray.core.contracts import LATENT_HZ, PreprocessOptions
from hotstep_ray.core.storage import Storage
from hotstep_ray.preprocess.audio_prep import HOP_SAMPLES, PreparedAudio, prepare_audio
from hotstep_ray.preprocess.cache import SampleOutputs, build_outputs, failed_outputs, file_checksum
from hotstep_ray.preprocess.items import VAE_BATCH_FRAMES, EncodeItem, EncoderSettings
from hotstep_ray.preprocess.plan import (
    RunPlan,
    SampleJob,
    caption_prompt,
    genre_prompt,
    lyric_prompt,
)

if TYPE_CHECKING:  # the model libraries load only where an Encoder lives
    from hotstep_ray.preprocess.encode import Encoder


@dataclass
class Decoded:
    job: SampleJob
    audio: np.ndarray | None  # [2, S] float32 planar at 48 kHz; None when decoding failed
    facts: dict[str, Any]  # source facts for the meta entry (checksum, rate, channels, ...)
    error: str = ""


def decode_job(job: SampleJob, opts: PreprocessOptions) -> Decoded:
    """Read, checksum and prepare one source file; any failure becomes `error`."""
    source = Storage(job.source_root)
    facts: dict[str, Any] = {}
    try:
        if job.src_size < 0:
            raise FileNotFoundError(f"missing source file {job.audio_path}")
        facts["checksum"] = file_checksum(source, job.source_key)
        prepared = prepare_audio(
            source, job.source_key, opts.max_duration_s, opts.normalize, opts.target_db
        )
    except Exception as exc:  # recorded per sample; the run goes on
        return Decoded(job, None, facts, f"{type(exc).__name__}: {exc}")
    facts.update(audio_facts(prepared))
    return Decoded(job, prepared.audio, facts)


def audio_facts(prepared: PreparedAudio) -> dict[str, Any]:
    return {
        "source_rate_hz": prepared.source_rate_hz,
        "source_channels": prepared.source_channels,
        "source_duration_s": round(prepared.source_duration_s, 6),
        "truncated": prepared.truncated,
        "gain_db": round(prepared.gain_db, 6),
    }


def prompts_for(job: SampleJob, duration_s: float, compat: str) -> dict[str, str | None]:
    return {
        "caption": caption_prompt(job, duration_s),
        "lyric": lyric_prompt(job, compat),
        "genre": genre_prompt(job, duration_s),
    }


def encoder_settings(
    opts: PreprocessOptions, vae_batch_frames: int = VAE_BATCH_FRAMES
) -> EncoderSettings:
    return EncoderSettings(
        vae_chunk_frames=opts.vae_chunk_frames,
        vae_overlap_frames=opts.vae_overlap_frames,
        max_caption_tokens=opts.max_caption_tokens,
        max_lyric_tokens=opts.max_lyric_tokens,
        vae_batch_frames=vae_batch_frames,
        seed=opts.seed,
        codes_fast_pass=opts.codes_fast_pass,
        codes_recheck_margin=opts.codes_recheck_margin,
        memory_cap_gib=opts.gpu_memory_cap_gib,
    )


def plan_info(plan: RunPlan) -> dict[str, Any]:
    """Run-wide facts each sample's outputs record (small, picklable)."""
    return {
        "variant_key": plan.paths.variant_key,
        "model_variant": plan.paths.model_variant,
        "fingerprint": plan.fingerprint,
        "dtype": plan.options.dtype,
        "sidestep_pt": plan.options.sidestep_pt,
        "compat": plan.options.compat,
    }


def encode_decoded(
    encoder: Encoder, decoded: Sequence[Decoded], info: dict[str, Any]
) -> list[SampleOutputs]:
    """Encode one batch of decoded samples (failed decodes pass straight through)."""
    outputs: dict[int, SampleOutputs] = {}
    ready: list[int] = []
    items: list[EncodeItem] = []
    prompt_sets = []
    for index, item in enumerate(decoded):
        if item.audio is None:
            outputs[index] = failed_outputs(item.job, item.error, item.facts)
            continue
        duration_s = (item.audio.shape[1] // HOP_SAMPLES) / LATENT_HZ  # whole frames encoded
        prompts = prompts_for(item.job, duration_s, info["compat"])
        ready.append(index)
        prompt_sets.append(prompts)
        items.append(
            EncodeItem(
                sample_id=item.job.sample_id,
                audio=item.audio,
                caption_prompt=prompts["caption"] or "",
                lyric_prompt=prompts["lyric"] or "",
                genre_prompt=prompts["genre"],
            )
        )
    results = encoder.encode_safe(items) if items else []
    for index, prompts, result in zip(ready, prompt_sets, results, strict=True):
        job, facts = decoded[index].job, decoded[index].facts
        if isinstance(result, Exception):
            outputs[index] = failed_outputs(job, f"{type(result).__name__}: {result}", facts)
        else:
            outputs[index] = build_outputs(job, result, facts, prompts, info)
    return [outputs[i] for i in range(len(decoded))]
