"""The MM3 commands' contracts, torch-free so the CLI can build its options from them without
loading torch (`cli/mm3_cmd.py`): `mm3 preprocess`, `mm3 train-dit`, `mm3 train-lm`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from hotstep_ray.core.contracts import Options, TagPosition
from hotstep_ray.mm3 import FRAME_HZ, MAX_FRAMES, WINDOW_LATENTS

MAX_DURATION_S = MAX_FRAMES / FRAME_HZ  # 360 s: the LM's frame cap
CropMode = Literal["random", "beginning"]


class Mm3PreprocessOptions(Options):
    mode: Literal["sampled", "aligned"] = Field(
        default="sampled", description="sampled (60 s rollouts) or aligned (from codes)."
    )
    seed: int = Field(default=42, description="Rollout seed; segment k uses seed + k.")
    segment_s: float = Field(
        default=60.0, description="Rollout segment length, seconds.", gt=0, le=MAX_DURATION_S
    )
    max_duration_s: float = Field(
        default=MAX_DURATION_S,
        description="Cut songs here (s; 0 = the whole file, still <= 360 s, the LM's cap).",
        ge=0,
    )
    codes_dir: str = Field(
        default="",
        description="Aligned mode: folder of <stem>.codes or <stem>.npy ('' = next to the audio).",
    )
    codes_warmup_row: bool = Field(
        default=True, description="The codes files start with HOT-Step's un-emitted warm-up row."
    )
    sample_ids: list[str] | None = None
    overwrite: bool = Field(default=False, description="Redo songs whose cache is current.")
    lm_dtype: Literal["bfloat16", "float32"] = Field(
        default="bfloat16", description="Composer LM dtype."
    )
    device: str = Field(default="", description="cuda, cuda:1, cpu ('' = cuda when available).")
    variant_key: str = Field(default="", description="Cache folder ('' = mm3-<mode>-s<seed>).")

    @property
    def resolved_variant_key(self) -> str:
        return self.variant_key or f"mm3-{self.mode}-s{self.seed}"


class Mm3TrainOptions(Options):
    variant_key: str = Field(
        default="mm3-sampled-s42", description="Cache folder from mm3 preprocess."
    )
    adapter_name: str = Field(
        default="", description="Artist folder of the run ('' = the dataset slug)."
    )
    rank: int = Field(default=32, ge=1, le=512)
    alpha: float = Field(default=32.0, gt=0)
    learning_rate: float = Field(
        default=1e-4, description="Peak learning rate (SimpleTuner uses 5e-5).", gt=0, le=1
    )
    weight_decay: float = Field(default=0.01, ge=0, le=1)
    grad_clip: float = Field(default=1.0, description="Global-norm clip; 0 = off.", ge=0)
    steps: int = Field(default=200, ge=1)
    warmup_steps: int | None = Field(
        default=None, description="Warm-up steps (unset: max(1, steps / 20)).", ge=0
    )
    crop_latents: int = Field(
        default=WINDOW_LATENTS,
        description="Crop length in latents (689 = one 8 s DiT window).",
        ge=8,
    )
    crop_mode: CropMode = "random"
    batch: int = Field(default=1, ge=1, le=64)
    grad_accum: int = Field(default=1, ge=1, le=256)
    seed: int = 42
    # HOT-Step suggests +1.0 ... +1.5
    logit_mean: float = Field(default=0.0, description="> 0 biases training toward clean crops.")
    logit_std: float = Field(default=1.0, gt=0)
    gradient_checkpointing: bool = False
    dtype: Literal["bfloat16", "float32"] = Field(
        default="bfloat16", description="Frozen base dtype (the LoRA stays float32)."
    )
    device: str = ""
    delta_every: int = Field(
        default=50, description="||dW||/||W|| report every N steps (0 = only at the end).", ge=0
    )
    save_every: int = Field(
        default=0, description="Resumable checkpoint every N steps (the end always).", ge=0
    )
    export_every: int = Field(
        default=0, description="Filtered snapshot every N steps (ear ladder).", ge=0
    )
    eval_every: int = Field(
        default=0, description="Fixed stratified-sigma eval every N steps (and at step 0).", ge=0
    )
    eval_n: int = Field(default=24, ge=1)
    sign_check: bool = Field(
        default=False, description="Refuse to train unless loss(x0 - noise) < loss(noise - x0)."
    )
    trigger: str = ""
    trigger_position: TagPosition = "prepend"
    resume: str = Field(
        default="", description="Storage key of a checkpoint/ folder to continue (local runs)."
    )
    vram_reserve_mb: int = Field(
        default=2048, description="Ray: allocator slack added to the request.", ge=0
    )

    @property
    def warmup(self) -> int:
        return self.warmup_steps if self.warmup_steps is not None else max(1, self.steps // 20)


class Mm3LmTrainOptions(Options):
    # folder of <file stem>.codes / .npy (aligned.py format); required
    codes_dir: str = ""
    codes_warmup_row: bool = True  # the files start with the un-emitted warm-up row
    adapter_name: str = Field(default="", description="Run folder prefix ('' = the dataset slug).")
    sample_ids: list[str] | None = None  # train on these samples only
    rank: int = Field(default=16, ge=1, le=512)
    alpha: float = Field(default=32.0, gt=0)
    learning_rate: float = Field(default=8e-5, description="Peak learning rate.", gt=0, le=1)
    weight_decay: float = Field(default=0.01, ge=0, le=1)
    grad_clip: float = Field(default=1.0, description="Global-norm clip; 0 = off.", ge=0)
    optimizer: Literal["adamw", "muon"] = "adamw"
    steps: int = Field(default=800, ge=1)
    warmup_steps: int = Field(default=0, ge=0)
    grad_accum: int = Field(default=1, ge=1, le=256)
    max_frames: int = Field(
        default=1500, description="Frames (25 Hz) per crop; 0 = whole songs.", ge=0
    )
    crop_mode: CropMode = "random"
    supervise_eos: bool = True  # EOS target when a crop reaches the song's end
    seed: int = 42
    gradient_checkpointing: bool = False
    dtype: Literal["bfloat16", "float32"] = Field(
        default="bfloat16", description="Frozen base dtype (the LoRA stays float32)."
    )
    device: str = ""
    trigger: str = ""
