"""The MM3 commands' contracts, torch-free so the CLI can build its options from them without
loading torch (`cli/mm3_cmd.py`): `mm3 preprocess`, `mm3 train-dit`, `mm3 train-lm`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from hotstep_ray.core.contracts import Options, TagPosition
from hotstep_ray.mm3 import FRAME_HZ, MAX_FRAMES, WINDOW_LATENTS

MAX_DURATION_S = MAX_FRAMES / FRAME_HZ  # 360 s: the LM's frame cap
CropMode = Literal["random", "beginning"]
TriggerPosition = TagPosition


def _about(text: str, default, **bounds):  # a field with its --help text
    return Field(default=default, description=text, **bounds)


class Mm3PreprocessOptions(Options):
    mode: Literal["sampled", "aligned"] = _about(
        "sampled (60 s rollouts) or aligned (from codes).", "sampled"
    )
    seed: int = _about("Rollout seed; segment k uses seed + k.", 42)
    segment_s: float = _about("Rollout segment length, seconds.", 60.0, gt=0, le=MAX_DURATION_S)
    max_duration_s: float = _about(
        "Cut songs here (s; 0 = the whole file, still <= 360 s, the LM's cap).",
        MAX_DURATION_S,
        ge=0,
    )
    codes_dir: str = _about(
        "Aligned mode: folder of <stem>.codes or <stem>.npy ('' = next to the audio).", ""
    )
    codes_warmup_row: bool = _about(
        "The codes files start with HOT-Step's un-emitted warm-up row.", True
    )
    sample_ids: list[str] | None = None
    overwrite: bool = _about("Redo songs whose cache is current.", False)
    lm_dtype: Literal["bfloat16", "float32"] = _about("Composer LM dtype.", "bfloat16")
    device: str = _about("cuda, cuda:1, cpu ('' = cuda when available).", "")
    variant_key: str = _about("Cache folder ('' = mm3-<mode>-s<seed>).", "")

    @property
    def resolved_variant_key(self) -> str:
        return self.variant_key or f"mm3-{self.mode}-s{self.seed}"


class Mm3TrainOptions(Options):
    variant_key: str = _about("Cache folder from mm3 preprocess.", "mm3-sampled-s42")
    adapter_name: str = _about("Artist folder of the run ('' = the dataset slug).", "")
    rank: int = Field(default=32, ge=1, le=512)
    alpha: float = Field(default=32.0, gt=0)
    learning_rate: float = _about("Peak learning rate (SimpleTuner uses 5e-5).", 1e-4, gt=0, le=1)
    weight_decay: float = Field(default=0.01, ge=0, le=1)
    grad_clip: float = _about("Global-norm clip; 0 = off.", 1.0, ge=0)
    steps: int = Field(default=200, ge=1)
    warmup_steps: int | None = _about("Warm-up steps (unset: max(1, steps / 20)).", None, ge=0)
    crop_latents: int = _about(
        "Crop length in latents (689 = one 8 s DiT window).", WINDOW_LATENTS, ge=8
    )
    crop_mode: CropMode = "random"
    batch: int = Field(default=1, ge=1, le=64)
    grad_accum: int = Field(default=1, ge=1, le=256)
    seed: int = 42
    # HOT-Step suggests +1.0 ... +1.5
    logit_mean: float = _about("> 0 biases training toward clean crops.", 0.0)
    logit_std: float = Field(default=1.0, gt=0)
    gradient_checkpointing: bool = False
    dtype: Literal["bfloat16", "float32"] = _about(
        "Frozen base dtype (the LoRA stays float32).", "bfloat16"
    )
    device: str = ""
    delta_every: int = _about("||dW||/||W|| report every N steps (0 = only at the end).", 50, ge=0)
    save_every: int = _about("Resumable checkpoint every N steps (the end always).", 0, ge=0)
    export_every: int = _about("Filtered snapshot every N steps (ear ladder).", 0, ge=0)
    eval_every: int = _about("Fixed stratified-sigma eval every N steps (and at step 0).", 0, ge=0)
    eval_n: int = Field(default=24, ge=1)
    sign_check: bool = _about("Refuse to train unless loss(x0 - noise) < loss(noise - x0).", False)
    trigger: str = ""
    trigger_position: TriggerPosition = "prepend"
    resume: str = _about("Storage key of a checkpoint/ folder to continue (local runs).", "")
    vram_reserve_mb: int = _about("Ray: allocator slack added to the request.", 2048, ge=0)

    @property
    def warmup(self) -> int:
        return self.warmup_steps if self.warmup_steps is not None else max(1, self.steps // 20)


class Mm3LmTrainOptions(Options):
    # folder of <file stem>.codes / .npy (aligned.py format); required
    codes_dir: str = ""
    codes_warmup_row: bool = True  # the files start with the un-emitted warm-up row
    adapter_name: str = _about("Run folder prefix ('' = the dataset slug).", "")
    sample_ids: list[str] | None = None  # train on these samples only
    rank: int = Field(default=16, ge=1, le=512)
    alpha: float = Field(default=32.0, gt=0)
    learning_rate: float = _about("Peak learning rate.", 8e-5, gt=0, le=1)
    weight_decay: float = Field(default=0.01, ge=0, le=1)
    grad_clip: float = _about("Global-norm clip; 0 = off.", 1.0, ge=0)
    optimizer: Literal["adamw", "muon"] = "adamw"
    steps: int = Field(default=800, ge=1)
    warmup_steps: int = Field(default=0, ge=0)
    grad_accum: int = Field(default=1, ge=1, le=256)
    max_frames: int = _about("Frames (25 Hz) per crop; 0 = whole songs.", 1500, ge=0)
    crop_mode: CropMode = "random"
    supervise_eos: bool = True  # EOS target when a crop reaches the song's end
    seed: int = 42
    gradient_checkpointing: bool = False
    dtype: Literal["bfloat16", "float32"] = _about(
        "Frozen base dtype (the LoRA stays float32).", "bfloat16"
    )
    device: str = ""
    trigger: str = ""
