"""Hear a DiT adapter: text2music through the DiT, base and adapter with one seed.

The condition (caption + metas through Qwen3-Embedding, lyrics through its token embeddings,
`silence_latent[:, :750]` as the timbre reference, as the reference app does with no reference
audio) is encoded once; each side runs the official sampler of the DiT's kind (turbo: the fixed
8-step table, no CFG; base/sft: Euler + APG guidance) from the same initial noise, then the VAE.
LM codes, when given, become the context hints (the cover path: detokenized codes as `src`).

The adapter is loaded onto a shared copy of the transformer (same weight tensors, new modules),
so the base side is the plain base DiT whatever is cached.
"""

from __future__ import annotations

import dataclasses
import hashlib
import secrets
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import torch

from hotstep_ray.audition import catalogue
from hotstep_ray.audition.checkpoints import pick
from hotstep_ray.audition.codes import CODE_HZ, DecodeResult, parse_codes, validate_codes
from hotstep_ray.audition.decode import SAMPLE_RATE_HZ, TiledVaeDecoder, encode
from hotstep_ray.audition.planner import AdapterCache, shared_copy
from hotstep_ray.audition.schemas import DitRequest, DitResult, DitSide, TriggerInfo
from hotstep_ray.core.errors import InputError
from hotstep_ray.core.storage import Storage
from hotstep_ray.models import acestep_ops as ops
from hotstep_ray.models import prompts
from hotstep_ray.models.acestep_dit import AceStepModels, load_acestep_dit, resolve_device_dtype
from hotstep_ray.models.lm_tokenizer import load_tokenizer
from hotstep_ray.models.text_models import (
    embed_lyrics,
    encode_captions,
    load_text_encoder,
    load_vae,
)

LATENT_HZ = 25
TIMBRE_FRAMES = 750  # 30 s of silence latents as the "no reference" timbre input


@dataclasses.dataclass
class LoadedDit:
    name: str
    transformer: torch.nn.Module
    key: str
    trigger: TriggerInfo


class DitAudition:
    """The plain class behind `POST /dit-audition`. One render at a time per instance."""

    def __init__(
        self,
        models: AceStepModels,
        text_encoder: torch.nn.Module,
        text_tokenizer: Any,
        vae: TiledVaeDecoder,
        *,
        dit_name: str,
        storage: Storage | None = None,
        max_adapters: int = 2,
    ) -> None:
        self.models, self.text_encoder, self.text_tokenizer = models, text_encoder, text_tokenizer
        self.vae, self.dit_name, self.storage = vae, dit_name, storage
        self.max_adapters = max_adapters
        self._adapters = AdapterCache(self.load_adapter, max_adapters)
        self._lock = threading.RLock()

    @classmethod
    def from_checkpoints(
        cls,
        checkpoints: str | Path,
        *,
        data: str | Storage | None = None,
        dit: str | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | str | None = None,
        max_adapters: int = 2,
        **tiling: Any,
    ) -> DitAudition:
        device, dtype = resolve_device_dtype(device, dtype)
        dit_info = pick(checkpoints, "dit", dit)
        text_info = pick(checkpoints, "text_encoder")
        return cls(
            load_acestep_dit(dit_info.path, device, dtype),
            load_text_encoder(text_info.path, device, dtype),
            load_tokenizer(text_info.path),
            TiledVaeDecoder(load_vae(pick(checkpoints, "vae").path, device, dtype), **tiling),
            dit_name=dit_info.name,
            storage=Storage(data) if isinstance(data, str) else data,
            max_adapters=max_adapters,
        )

    # -- adapters -------------------------------------------------------------------------------
    def load_adapter(self, adapter_id: str) -> LoadedDit:
        from hotstep_ray.training.export import ACESTEP_OFFICIAL_NAMES, load_exported

        if self.storage is None:
            raise InputError("this DiT audition has no storage root: adapters cannot be loaded")
        key = catalogue.resolve_dit_adapter(self.storage, adapter_id, self.dit_name)
        # Share the weights and the padding-mask holder the attention processors read.
        copy = shared_copy(self.models.transformer, share=[self.models.key_masks])
        load_exported(copy, self.storage, key, rename=ACESTEP_OFFICIAL_NAMES)
        copy.eval().requires_grad_(False)
        trigger = catalogue.resolve_trigger(self.storage, key)
        return LoadedDit(adapter_id, copy, key, trigger)

    def adapter(self, adapter_id: str) -> LoadedDit:
        """Cached `load_adapter`: the `max_adapters` most recently used stay loaded."""
        return self._adapters.get(adapter_id)

    # -- rendering ------------------------------------------------------------------------------
    def _condition(self, caption: str, request: DitRequest) -> tuple[torch.Tensor, torch.Tensor]:
        metas = prompts.build_dit_metadata(
            request.bpm, request.keyscale, request.timesignature, request.duration
        )
        caption_text, lyric_text = prompts.build_dit_text_inputs(
            caption, request.lyrics, request.language, metas
        )
        text, text_mask = encode_captions(self.text_encoder, self.text_tokenizer, [caption_text])
        lyric, lyric_mask = embed_lyrics(self.text_encoder, self.text_tokenizer, [lyric_text])
        silence = self.models.silence_latent
        timbre = silence[:, : min(TIMBRE_FRAMES, silence.shape[1])]  # [1, 750, 64]
        order = torch.zeros(1, dtype=torch.long, device=silence.device)
        return ops.encode_condition(
            self.models, text, text_mask, lyric, lyric_mask, timbre.to(text.dtype), order
        )

    def context_latents(self, request: DitRequest, frames: int) -> torch.Tensor:
        if frames > self.models.silence_latent.shape[1]:
            limit = self.models.silence_latent.shape[1] / LATENT_HZ
            raise InputError(
                f"duration {request.duration:g} s: this DiT renders at most {limit:g} s"
            )
        if request.audio_codes is None:
            return ops.text2music_context(self.models, 1, frames)
        codes = parse_codes(request.audio_codes)
        validate_codes(codes)
        indices = torch.tensor(codes, dtype=torch.long).view(1, -1)
        hints = ops.codes_to_latents(self.models, indices, num_frames=frames)  # [1, T, 64]
        return torch.cat([hints, torch.ones_like(hints)], dim=-1)

    def _sample(
        self,
        models: AceStepModels,
        cond: torch.Tensor,  # [1, L, H_enc] packed condition
        context: torch.Tensor,  # [1, T, 128] src latents | chunk mask
        request: DitRequest,
        seed: int,
    ) -> ops.GenerateOutput:
        if models.variant.is_turbo:
            if request.steps not in (None, ops.TURBO_STEPS):
                raise InputError(f"steps {request.steps}: the turbo sampler runs exactly 8")
            return ops.turbo_generate(models, cond, context, seed=seed, shift=request.shift or 3.0)
        return ops.base_generate(
            models,
            cond,
            context,
            seed=seed,
            steps=request.steps or 30,
            guidance_scale=request.guidance_scale,
            shift=request.shift or 1.0,
        )

    def sampler_name(self, request: DitRequest) -> str:
        if self.models.variant.is_turbo:
            return f"turbo 8 steps, shift {request.shift or 3.0:g}"
        return (
            f"{self.models.variant.kind} {request.steps or 30} steps, "
            f"APG {request.guidance_scale:g}, shift {request.shift or 1.0:g}"
        )

    @torch.no_grad()
    def render(
        self, request: DitRequest, adapter: LoadedDit | None = None
    ) -> tuple[DitResult, dict[str, DecodeResult]]:
        """Render the base side (if asked or no adapter) and the adapter side, same seed."""
        with self._lock:
            if adapter is None and request.dit_adapter:
                adapter = self.adapter(request.dit_adapter)
            return self._render(request, adapter)

    def _render(
        self, request: DitRequest, adapter: LoadedDit | None
    ) -> tuple[DitResult, dict[str, DecodeResult]]:
        seed = request.seed if request.seed is not None and request.seed >= 0 else None
        seed = secrets.randbits(31) if seed is None else seed
        trigger = None
        if adapter is not None:
            override = TriggerInfo(word=request.trigger or "", placement=request.trigger_position)
            trigger = catalogue.resolve_trigger(self.storage, adapter.key, override)
        elif request.trigger:
            trigger = TriggerInfo(
                word=request.trigger, placement=request.trigger_position, source="override"
            )
        caption = catalogue.apply_triggers(request.caption, [trigger] if trigger else [])
        frames = int(request.duration * LATENT_HZ)
        cond, _ = self._condition(caption, request)
        context = self.context_latents(request, frames)
        preview_id = uuid.uuid4().hex
        plan: list[tuple[str, LoadedDit | None]] = []
        if adapter is None or request.base_side:
            plan.append(("base-render", None))
        if adapter is not None:
            plan.append(("adapter-render", adapter))
        sides, audio = [], {}
        for slot, loaded in plan:
            models = self.models
            if loaded is not None:
                from hotstep_ray.training.adapters import set_scale

                set_scale(loaded.transformer, request.dit_adapter_scale)
                models = dataclasses.replace(self.models, transformer=loaded.transformer)
            start = time.perf_counter()
            latents = self._sample(models, cond, context, request, seed).latents
            rendered = time.perf_counter()
            wave = self.vae.decode(latents)[0]  # [2, T * 1920]
            data = encode(wave, request.format)
            done = time.perf_counter()
            audio[slot] = DecodeResult(
                audio=data,
                format=request.format,
                sample_rate_hz=SAMPLE_RATE_HZ,
                channels=int(wave.shape[0]),
                num_samples=int(wave.shape[-1]),
                duration_s=frames / LATENT_HZ,
                codes_count=frames // (LATENT_HZ // CODE_HZ),
                codes_sha1="",
                decode_ms=round((done - rendered) * 1000, 3),
            )
            sides.append(
                DitSide(
                    slot=slot,
                    dit_adapter=loaded.name if loaded else "",
                    dit_adapter_scale=request.dit_adapter_scale if loaded else 1.0,
                    ok=True,
                    audio_url=f"/previews/{preview_id}/{slot}",
                    render_ms=round((rendered - start) * 1000, 3),
                    decode_ms=audio[slot].decode_ms,
                    audio_sha1=hashlib.sha1(data).hexdigest(),
                )
            )
        result = DitResult(
            preview_id=preview_id,
            created_at=int(time.time() * 1000),
            seed=seed,
            caption=caption,
            caption_input=request.caption,
            duration=frames / LATENT_HZ,
            dit_model=self.dit_name,
            sampler=self.sampler_name(request),
            trigger=trigger,
            sides=sides,
        )
        return result, audio


__all__ = ["DitAudition", "LoadedDit"]
