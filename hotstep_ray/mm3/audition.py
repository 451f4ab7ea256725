"""MM3 audition: one song rendered twice from the same seed, by the base DiT and with an MM3 LoRA.

Generation is the diffusers MM3 modular pipeline, run as its two halves:

    compose:  caption + lyrics -> tokenize -> composer LM + depth decoder (AR CFG 1.5, top-50)
              -> frame_hiddens [1, F, 8 x H]                              (once per request)
    render:   frame_hiddens -> 200-frame windows (hop 100, latent carry over 172 latents)
              -> flow DiT (30 Euler steps, CFG 1.7, uncond = zeros) -> vocoder -> [2, T] 44.1 kHz
              (twice: base, then adapter)

Both renders get a fresh CPU generator seeded with the request's seed (the composer gets its own,
seeded the same), so the two sides see the same conditioning and the same noise and differ only by
the adapter. The adapter is a ComfyUI-format MM3 LoRA (`mm3_lora.safetensors` of a run,
`export.py`), loaded into a peft LoRA of its rank on the resident DiT; the base side runs with the
adapter switched off (`adapters.set_enabled(False)`: peft computes the frozen layer alone), which is
byte-identical to a DiT that never carried one (the test checks the WAV bytes).

An MM3 composer-LM adapter (`lm_adapter`: a PEFT run folder of `mm3 train-lm`, or its name for
the newest run) changes the COMPOSE half: the adapter side is then composed again, same seed, with
the composer LoRA switched on, and rendered with the DiT adapter when one is named too; the base
side is always base composer + base DiT.

`Mm3Audition` is a plain class (scripts, tests); `serve_apps/mm3_app.py` wraps it in Ray Serve.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import Field
from safetensors.torch import load as load_safetensors

from hotstep_ray.audio.io import wav_header
from hotstep_ray.audition.errors import NotFoundError
from hotstep_ray.core import layout
from hotstep_ray.core.contracts import Options
from hotstep_ray.core.errors import InputError
from hotstep_ray.core.storage import Storage
from hotstep_ray.mm3 import SAMPLE_RATE_HZ
from hotstep_ray.mm3 import checkpoint as ckpt
from hotstep_ray.mm3.condition import song_lyrics
from hotstep_ray.mm3.export import COMFY_PREFIX, MM3_TARGETS, load_comfy
from hotstep_ray.mm3.preprocess import resolve_device
from hotstep_ray.mm3.sampler import DEFAULT_GUIDANCE, DEFAULT_STEPS
from hotstep_ray.training import adapters

SLOTS = ("base", "adapter")


class Mm3AuditionRequest(Options):
    caption: str = Field(min_length=1, max_length=20_000)  # the MM3 structured caption
    lyrics: str = Field(default="", max_length=20_000)  # "" -> "[instrumental]" (seed trap 6)
    duration_s: float = Field(default=30.0, gt=0, le=360)  # upper bound; the LM may stop early
    seed: int = Field(default=42, ge=0, lt=2**63)
    steps: int = Field(default=DEFAULT_STEPS, ge=1, le=200)  # Euler steps per window
    guidance: float = Field(default=DEFAULT_GUIDANCE, ge=1.0, le=20.0)  # DiT CFG
    adapter: str = ""  # run folder / .safetensors key, or an artist (newest run); "" = base only
    adapter_scale: float = Field(default=1.0, ge=0.0, le=4.0)
    lm_adapter: str = ""  # composer PEFT run folder key, or a run name (newest); "" = none
    lm_adapter_scale: float = Field(default=1.0, ge=0.0, le=4.0)


@dataclass
class Mm3AbResult:
    preview_id: str
    seed: int
    sample_rate_hz: int
    frames: int  # AR frames the composer emitted (25 Hz)
    duration_s: float
    adapter_key: str | None  # storage key of the LoRA file heard on the adapter side
    timings_ms: dict[str, float]
    audio: dict[str, bytes] = field(default_factory=dict)  # slot -> WAV bytes
    lm_adapter_key: str | None = None  # run folder of the composer LoRA on the adapter side

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "previewId": self.preview_id,
            "seed": self.seed,
            "sampleRateHz": self.sample_rate_hz,
            "frames": self.frames,
            "durationS": self.duration_s,
            "adapter": self.adapter_key,
            "lmAdapter": self.lm_adapter_key,
            "slots": sorted(self.audio),
            "timingsMs": self.timings_ms,
        }


def wav_bytes(audio: np.ndarray, rate_hz: int = SAMPLE_RATE_HZ) -> bytes:
    """[C, T] float audio -> a 32-bit float WAV whose bytes depend on the samples alone."""
    data = np.ascontiguousarray(audio.T, dtype="<f4").tobytes()  # interleaved frames
    return wav_header(int(audio.shape[0]), rate_hz, int(audio.shape[1]), "float32") + data


def resolve_adapter_key(storage: Storage, adapter: str) -> str:
    """A `.safetensors` key, a run folder key (its `mm3_lora.safetensors`) or an artist name
    (the newest run in `adapters/mm3-dit/<artist>/`)."""
    if adapter.endswith(".safetensors") and storage.exists(adapter):
        return adapter
    if storage.exists(f"{adapter}/{layout.MM3_DIT_WEIGHTS}"):
        return f"{adapter}/{layout.MM3_DIT_WEIGHTS}"
    if "/" not in adapter and layout._NAME_RE.match(adapter):
        run = layout.latest_mm3_dit_run(storage, adapter)
        if run:
            return f"{run}/{layout.MM3_DIT_WEIGHTS}"
    raise NotFoundError(
        f"no MM3 LoRA {adapter!r}: give a .safetensors key, a run folder under "
        f"{layout.mm3_dit_adapter_base()}/ or an artist name there"
    )


def file_metadata(data: bytes) -> dict[str, str]:
    """The `__metadata__` strings of a safetensors file's header (8-byte length, then JSON)."""
    size = int.from_bytes(data[:8], "little")
    return dict(json.loads(data[8 : 8 + size]).get("__metadata__") or {})


def file_rank(tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None) -> int:
    """The per-module LoRA rank of a ComfyUI MM3 file (fused qkv A has 3 r rows)."""
    if metadata and str(metadata.get("rank", "")).isdigit():
        return int(metadata["rank"])
    ranks = {
        t.shape[0] for k, t in tensors.items() if k.endswith("lora_A.weight") and "to_qkv" not in k
    }
    if len(ranks) != 1:
        raise InputError(f"cannot tell the LoRA rank of this file (A ranks {sorted(ranks)})")
    return ranks.pop()


class Mm3Audition:
    """Resident MM3 models and the A/B render. Thread-safe (one render at a time)."""

    def __init__(
        self,
        checkpoints: str | Path,
        storage: Storage,
        device: str = "",
        dtype: str | None = None,
    ) -> None:
        from diffusers.modular_pipelines import SequentialPipelineBlocks
        from diffusers.modular_pipelines.minimax_music3.decoders import (
            MiniMaxMusic3VocoderDecodeStep,
        )
        from diffusers.modular_pipelines.minimax_music3.modular_blocks_minimax_music3 import (
            MiniMaxMusic3CoreDenoiseStep,
            MiniMaxMusic3SemanticGenerationStep,
        )

        self.paths = ckpt.Mm3Paths.find(checkpoints)
        self.paths.require("condition")
        self.paths.require("render")
        self.storage = storage
        self.device = resolve_device(device)
        # bf16 on a GPU (the release's LM dtype); float32 on the CPU, where bf16 is slow.
        name = dtype or ("bfloat16" if self.device.type == "cuda" else "float32")
        self.dtype = getattr(torch, name)
        where = str(self.device)
        self.composer = MiniMaxMusic3SemanticGenerationStep().init_pipeline()
        self.composer.update_components(
            tokenizer=ckpt.load_tokenizer(self.paths),
            language_model=ckpt.load_language_model(self.paths, self.dtype, where),
            rvq_depth_decoder=ckpt.load_depth_decoder(self.paths, self.dtype, where),
        )
        blocks = SequentialPipelineBlocks.from_blocks_dict(
            {"denoise": MiniMaxMusic3CoreDenoiseStep(), "decode": MiniMaxMusic3VocoderDecodeStep()}
        )
        self.flow = blocks.init_pipeline()
        self.transformer = ckpt.load_transformer(self.paths, self.dtype, where).eval()
        self.flow.update_components(
            condition_encoder=ckpt.load_condition_encoder(self.paths, where),
            transformer=self.transformer,
            vocoder=ckpt.load_vocoder(self.paths, where),
            scheduler=ckpt.load_scheduler(self.paths),
        )
        self.adapter_key: str | None = None
        self._lock = threading.Lock()

    # -- the two halves --------------------------------------------------------------------------
    def compose(self, caption: str, lyrics: str, duration_s: float, seed: int) -> torch.Tensor:
        """[1, F, 8 x H] frame hidden states of one seeded composer rollout."""
        return self.composer(
            prompt=caption,
            lyrics=song_lyrics(lyrics),
            audio_duration=float(duration_s),
            generator=torch.Generator(device="cpu").manual_seed(int(seed)),
            output="frame_hiddens",
        )

    def render(self, hiddens: torch.Tensor, seed: int, steps: int, guidance: float) -> np.ndarray:
        """[2, T] float32 audio at 44.1 kHz from frame hiddens, noise seeded by `seed`."""
        from diffusers.guiders import ClassifierFreeGuidance

        self.flow.update_components(guider=ClassifierFreeGuidance(guidance_scale=guidance))
        audio = self.flow(
            frame_hiddens=hiddens,
            generator=torch.Generator(device="cpu").manual_seed(int(seed)),
            num_inference_steps=int(steps),
            output="audios",
        )
        return np.asarray(audio, dtype=np.float32)[0]

    # -- adapters ----------------------------------------------------------------------------------
    def load_adapter(self, adapter: str, scale: float = 1.0) -> str:
        """Put the LoRA `adapter` (see `resolve_adapter_key`) on the resident DiT; returns its
        key. A file of another rank replaces the DiT with a fresh copy from disk first."""
        key = resolve_adapter_key(self.storage, adapter)
        data = self.storage.read_bytes(key)
        tensors = load_safetensors(data)
        if not any(k.startswith(COMFY_PREFIX) for k in tensors):
            raise InputError(f"{key} is not an MM3 ComfyUI LoRA (no {COMFY_PREFIX}* keys)")
        metadata = file_metadata(data)
        rank = file_rank(tensors, metadata)
        if adapters.has_adapter(self.transformer):
            if adapters.adapter_info(self.transformer).spec.rank != rank:
                self.transformer = ckpt.load_transformer(
                    self.paths, self.dtype, str(self.device)
                ).eval()
                self.flow.update_components(transformer=self.transformer)
        if not adapters.has_adapter(self.transformer):
            spec = adapters.AdapterSpec(kind="lora", rank=rank, alpha=rank, targets=MM3_TARGETS)
            adapters.inject(self.transformer, spec)
            self.transformer.eval()
        load_comfy(self.transformer, tensors)
        adapters.set_scale(self.transformer, scale)
        self.adapter_key = key
        return key

    def _set_adapter(self, enabled: bool) -> None:
        if adapters.has_adapter(self.transformer):
            adapters.set_enabled(self.transformer, enabled)

    def load_lm_adapter(self, adapter: str, scale: float = 1.0) -> str:
        """Put the composer LoRA `adapter` (a PEFT run folder key, or a run name -> its newest
        `adapters/mm3-lm-adapters/<name>-<stamp>`) on the resident LM; returns the folder key.
        A file of another rank replaces the LM with a fresh copy from disk first."""
        from hotstep_ray.mm3.lm_train import LM_TARGETS
        from hotstep_ray.training import export

        key = adapter.rstrip("/")
        if not self.storage.exists(f"{key}/{export.LORA_WEIGHTS_FILE}"):
            found = None
            if "/" not in key and layout._NAME_RE.match(key):
                found = layout.latest_mm3_lm_run(self.storage, key)
            if found is None:
                raise NotFoundError(
                    f"no MM3 composer LoRA {adapter!r}: give a run folder under "
                    f"{layout.mm3_lm_adapter_base()}/ or its name"
                )
            key = found
        config_key = f"{key}/{export.LORA_CONFIG_FILE}"
        if not self.storage.exists(config_key):
            raise InputError(f"{key} has no {export.LORA_CONFIG_FILE}")
        rank = int(self.storage.read_json(config_key)["r"])
        lm = self.composer.language_model
        if adapters.has_adapter(lm) and adapters.adapter_info(lm).spec.rank != rank:
            lm = ckpt.load_language_model(self.paths, self.dtype, str(self.device))
            self.composer.update_components(language_model=lm)
        if not adapters.has_adapter(lm):
            spec = adapters.AdapterSpec(kind="lora", rank=rank, alpha=rank, targets=LM_TARGETS)
            adapters.inject(lm, spec)
            lm.eval()
        export.load_exported(lm, self.storage, key)
        adapters.set_scale(lm, scale)
        return key

    def _set_lm_adapter(self, enabled: bool) -> None:
        lm = self.composer.language_model
        if adapters.has_adapter(lm):
            adapters.set_enabled(lm, enabled)

    # -- A/B -----------------------------------------------------------------------------------------
    def generate(self, request: Mm3AuditionRequest) -> Mm3AbResult:
        """Compose once, render base (adapter off) and, when one is named, the adapter side."""
        with self._lock, torch.inference_mode():
            timings: dict[str, float] = {}
            began = time.perf_counter()
            adapter_key = lm_key = None
            if request.adapter:
                adapter_key = self.load_adapter(request.adapter, request.adapter_scale)
            if request.lm_adapter:
                lm_key = self.load_lm_adapter(request.lm_adapter, request.lm_adapter_scale)
            args = (request.caption, request.lyrics, request.duration_s, request.seed)
            self._set_lm_adapter(False)
            hiddens = self.compose(*args)
            timings["compose"] = 1000 * (time.perf_counter() - began)
            composed = {"base": hiddens, "adapter": hiddens}
            if lm_key:  # the adapter side is composed by the adapted LM, same seed
                began = time.perf_counter()
                self._set_lm_adapter(True)
                composed["adapter"] = self.compose(*args)
                self._set_lm_adapter(False)
                timings["compose_adapter"] = 1000 * (time.perf_counter() - began)
            audio: dict[str, bytes] = {}
            has_side = bool(adapter_key or lm_key)
            sides = [("base", False)] + ([("adapter", True)] if has_side else [])
            for slot, enabled in sides:
                began = time.perf_counter()
                self._set_adapter(enabled)
                samples = self.render(composed[slot], request.seed, request.steps, request.guidance)
                audio[slot] = wav_bytes(samples)
                timings[slot] = 1000 * (time.perf_counter() - began)
            self._set_adapter(False)
        return Mm3AbResult(
            preview_id=uuid.uuid4().hex[:12],
            seed=request.seed,
            sample_rate_hz=SAMPLE_RATE_HZ,
            frames=int(hiddens.shape[1]),
            duration_s=samples.shape[-1] / SAMPLE_RATE_HZ,
            adapter_key=adapter_key,
            timings_ms=timings,
            audio=audio,
            lm_adapter_key=lm_key,
        )


# -- previews on storage ---------------------------------------------------------------------------
def save_preview(storage: Storage, result: Mm3AbResult) -> str:
    """`previews/<id>/{base,adapter}.wav` + `meta.json`; returns the folder key."""
    folder = layout.preview_dir(result.preview_id)
    for slot, data in result.audio.items():
        storage.write_bytes(f"{folder}/{slot}.wav", data)
    storage.write_json(f"{folder}/meta.json", {"kind": "mm3-audition", **result.to_json_dict()})
    return folder


def read_preview(storage: Storage, preview_id: str, slot: str) -> bytes:
    if slot not in SLOTS:
        raise NotFoundError(f"preview slot {slot!r}: expected one of {SLOTS}")
    key = f"{layout.preview_dir(preview_id)}/{slot}.wav"
    if not storage.exists(key):
        raise NotFoundError(f"preview {preview_id!r} has no {slot} audio")
    return storage.read_bytes(key)
