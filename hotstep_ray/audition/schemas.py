"""Request and result models of the audition API (snake_case or camelCase in, camelCase out).

Unknown keys are refused (a misspelt option is an error). Unlike the studio's audition form,
numbers out of range are refused too (4xx naming the field), never silently clamped: this is
the engine API, and a silent clamp would make an A/B receipt lie about what ran.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, StrictInt, field_validator

from hotstep_ray.core.contracts import Contract, Options

TriggerPlacement = Literal["prepend", "append", "replace"]
AudioFormat = Literal["wav", "flac"]
TIME_SIGNATURES = ("2", "3", "4", "6")


class Metas(Options):
    """Musical metas a user may pin; missing ones are planned by the LM (phase 1)."""

    bpm: int | None = Field(default=None, ge=30, le=300)
    keyscale: str | None = Field(default=None, max_length=32)  # "C major", "F# minor"
    timesignature: str | None = None  # numerator: 2, 3, 4 or 6 ("4/4" accepted)
    language: str = Field(default="en", max_length=16)

    @field_validator("timesignature", mode="before")
    @classmethod
    def _numerator(cls, value: object) -> str | None:
        if value is None or value == "":
            return None
        text = str(value).strip().split("/")[0]
        if text not in TIME_SIGNATURES:
            raise ValueError(f"timesignature {value!r}: expected one of {TIME_SIGNATURES}")
        return text


class LmSampling(Options):
    temperature: float = Field(
        default=0.85, ge=0.0, le=2.0, description="LM sampling temperature (0 = greedy)."
    )
    top_p: float = Field(default=0.9, gt=0.0, le=1.0, description="LM nucleus sampling.")
    top_k: int = Field(default=0, ge=0, le=64000, description="LM top-k (0 = off).")
    cfg_scale: float = Field(
        default=2.0, ge=0.0, le=10.0, description="LM classifier-free guidance (<= 1: off)."
    )
    rep_penalty: float = Field(
        default=1.0,
        ge=1.0,
        le=2.0,
        description="Repetition penalty over the last rep-window tokens (1 = off).",
    )
    rep_window: int = Field(
        default=64, ge=1, le=1024, description="Tokens the repetition penalty looks back over."
    )
    negative_prompt: str = Field(
        default="NO USER INPUT", max_length=4000, description="The CFG's negative caption."
    )
    max_cot_tokens: int = Field(
        default=384, ge=16, le=2048, description="Token limit of the LM's planning (metas) phase."
    )


class LmRequest(Metas, LmSampling):
    """`POST /lm`: plan codes for a caption (and lyrics) with the base LM or an LM adapter."""

    caption: str = Field(default="", max_length=4000)
    lyrics: str = Field(default="", max_length=20000)
    duration: float | None = Field(default=None, ge=1.0, le=600.0)  # seconds; None: LM plans it
    lm_seed: int | None = Field(default=None, ge=-1, le=2**63 - 1)  # None / -1: server picks
    lm_adapter: str = Field(default="", max_length=300)  # "" = base; catalogue id
    lm_adapter_scale: float = Field(default=1.0, ge=0.0, le=2.0)
    use_trigger: bool = True  # apply the adapter's resolved trigger word to the caption
    trigger: str | None = Field(default=None, max_length=200)  # manual override
    trigger_position: TriggerPlacement = "prepend"


class TriggerInfo(Contract):
    word: str = ""
    placement: TriggerPlacement = "prepend"
    source: Literal["override", "embedded", "folder", "none"] = "none"
    path: str = ""


class LmResult(Contract):
    codes: list[int]
    codes_count: int
    codes_sha1: str
    duration: float  # seconds = codes_count / 5
    caption: str  # as sent to the LM (trigger applied)
    lyrics: str
    bpm: int | None = None
    keyscale: str | None = None
    timesignature: str | None = None
    language: str | None = None
    cot: str  # the `<think>` block phase 2 was conditioned on
    phase1: bool  # whether the LM planned missing metas
    lm_seed: int
    lm_adapter: str
    lm_adapter_scale: float
    lm_size: str
    trigger: TriggerInfo | None = None
    lm_ms: float
    codes_per_s: float


class DecodeRequest(Options):
    """`POST /codes-decode`: `<|audio_code_N|>` tokens, a CSV string or a list of ints."""

    # Strict: a lax int would take true and "7" as codes 1 and 7 before parse_codes could refuse.
    audio_codes: str | list[StrictInt]
    format: AudioFormat = "wav"


class AuditionRequest(Metas, LmSampling):
    """`POST /audition`: the same-seed A/B of the base LM against an LM adapter."""

    caption: str = Field(min_length=1, max_length=4000)
    lyrics: str = Field(default="", max_length=20000)
    duration: float = Field(default=30.0, ge=1.0, le=600.0)
    seed: int | None = Field(default=None, ge=-1, le=2**63 - 1)
    lm_adapter: str = Field(default="", max_length=300)  # "" = base side only
    lm_adapter_scale: float = Field(default=1.0, ge=0.0, le=2.0)
    trigger: str | None = Field(default=None, max_length=200)
    trigger_position: TriggerPlacement = "prepend"
    format: AudioFormat = "wav"


class SideResult(Contract):
    slot: Literal["base", "adapter"]
    lm_adapter: str
    lm_adapter_scale: float
    ok: bool
    error: str = ""
    audio_url: str = ""
    codes_count: int = 0
    codes_sha1: str = ""
    duration: float = 0.0
    bpm: int | None = None
    keyscale: str | None = None
    timesignature: str | None = None
    lm_ms: float = 0.0
    decode_ms: float = 0.0


class AuditionResult(Contract):
    preview_id: str
    created_at: int  # epoch ms
    seed: int
    caption: str  # as sent (trigger applied)
    caption_input: str
    lyrics: str
    duration: float
    lm_size: str
    trigger: TriggerInfo | None = None
    sides: list[SideResult]
    identical: bool = False  # both sides produced the same codes: the adapter changed nothing
    warning: str = ""


class DitRequest(Metas):
    """`POST /dit-audition`: text2music through the DiT, base vs a DiT adapter, one seed."""

    caption: str = Field(min_length=1, max_length=4000)
    lyrics: str = Field(default="", max_length=20000)
    duration: float = Field(default=10.0, ge=1.0, le=600.0)
    seed: int | None = Field(default=None, ge=-1, le=2**63 - 1)
    steps: int | None = Field(default=None, ge=1, le=200)  # turbo: 8 (fixed table); base: 30
    guidance_scale: float = Field(default=7.0, ge=0.0, le=20.0)  # base/sft only
    shift: float | None = Field(default=None, ge=1.0, le=5.0)  # turbo 3.0, base 1.0
    dit_adapter: str = Field(default="", max_length=300)
    dit_adapter_scale: float = Field(default=1.0, ge=0.0, le=2.0)
    audio_codes: str | list[StrictInt] | None = None  # LM codes as context hints (cover path)
    base_side: bool = True  # also render without the adapter (the A/B)
    trigger: str | None = Field(default=None, max_length=200)
    trigger_position: TriggerPlacement = "prepend"
    format: AudioFormat = "wav"


class DitSide(Contract):
    slot: Literal["base-render", "adapter-render"]
    dit_adapter: str
    dit_adapter_scale: float
    ok: bool
    error: str = ""
    audio_url: str = ""
    render_ms: float = 0.0
    decode_ms: float = 0.0
    audio_sha1: str = ""  # of the decoded float32 samples' file bytes


class DitResult(Contract):
    preview_id: str
    created_at: int
    seed: int
    caption: str  # as rendered (trigger applied)
    caption_input: str
    duration: float
    dit_model: str
    sampler: str  # "turbo 8 steps, shift 3" / "base 30 steps, APG 7.0, shift 1"
    trigger: TriggerInfo | None = None
    sides: list[DitSide]
