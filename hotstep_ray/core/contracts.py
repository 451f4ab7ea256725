"""Typed contracts for every interface (CLI, HTTP, job specs), with every default in one place.

Python code uses snake_case; JSON on the wire is camelCase, matching the HOT-Step studio contract, so
each model accepts and emits both (`populate_by_name`, `by_alias`). Options models forbid unknown keys:
a misspelt option is an error, not a silently ignored value.

Defaults are the HOT-Step HTTP route values (what a bare `{}` request gets). Where its sources disagree
(route code vs type comments vs UI form), the comment next to the field says which one we took and why.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

# -- enums ---------------------------------------------------------------------------------------
TagPosition = Literal["prepend", "append", "replace"]
MergePolicy = Literal["fill_missing", "overwrite_caption", "overwrite_lyrics", "overwrite_all"]
FieldSource = Literal[
    "sidecar", "understand", "essentia", "genius", "llm", "tags", "filename", "user"
]
SampleLabelStatus = Literal["unlabeled", "labeled", "pending", "processing", "error"]
DatasetStatus = Literal["draft", "labeling", "labeled", "built", "error"]
PromptOverride = Literal["caption", "genre"]
JobKind = Literal[
    "scan",
    "label",
    "enhance-genius",
    "enhance-caption",
    "build",
    "preprocess",
    "train-lm",
    "train-dit",
    "audition",
    "lm-calibrate",
    "dit-calibrate",
    "mm3-codes",
    "mm3-train-lm",
    "make",  # the whole flow from a folder of songs (the studio's make job)
]
JobStatus = Literal["queued", "running", "done", "failed", "cancelled"]
TERMINAL_JOB_STATUSES: frozenset[str] = frozenset({"done", "failed", "cancelled"})
LmSize = Literal["0.6B", "1.7B", "4B"]
AdapterType = Literal["lora", "lokr"]
OptimizerName = Literal["adamw", "muon"]
# Muon's Newton-Schulz precision: "auto" = "bfloat16_batched" on CUDA (the bucketed step in
# bfloat16, torch.optim.Muon's precision), IEEE float32 elsewhere; "tf32" = float32 on TF32
# tensor cores; "bfloat16" = torch.optim.Muon's own step, per parameter (training.optim explains
# and measures each).
NsPrecision = Literal["float32", "tf32", "bfloat16", "bfloat16_batched"]
MuonNsPrecision = Literal["auto", NsPrecision]
SampleOrder = Literal["shuffle", "sequential"]
LossWeighting = Literal["none", "min_snr", "flow_snr"]
PreprocessDtype = Literal["f32", "bf16"]
PreprocessCompat = Literal["hotstep", "sidestep"]
PreprocessNormalize = Literal["none", "peak"]
TrainLmStage = Literal["extract", "train", "export"]
DitCompileMode = Literal["auto", "off", "default", "reduce-overhead", "step-graph"]
TrainDitStage = Literal["train", "export"]

AUDIO_EXTENSIONS: tuple[str, ...] = (".wav", ".mp3", ".flac", ".ogg", ".opus", ".m4a", ".aac")
# When two audio files share one sidecar stem, the first of this order owns it (HOT-Step rule).
AUDIO_PRIORITY: tuple[str, ...] = (".flac", ".wav", ".m4a", ".aac", ".ogg", ".opus", ".mp3")
MIN_RECOMMENDED_SAMPLES = 10
MAX_SCAN_FILES = 5000
LATENT_HZ = 25  # VAE latent frames per second (48 kHz / 1920)
CODE_HZ = 5  # 5 Hz LM audio codes per second
SAMPLE_RATE_HZ = 48_000


class Contract(BaseModel):
    """Base: snake_case in Python, camelCase on the wire, both accepted on input."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)

    def to_json_dict(self) -> dict:
        return self.model_dump(mode="json", by_alias=True)


class Options(Contract):
    """Options refuse unknown keys so a typo fails loudly."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


# -- datasets ------------------------------------------------------------------------------------
class SidecarFields(Contract):
    """Fields stored in a `<stem>.txt` sidecar (Side-Step's format)."""

    caption: str = ""
    genre: str = ""
    bpm: int | None = None
    key: str = ""  # "C minor"
    signature: str = ""  # "4/4" as written by the user; Side-Step keeps it verbatim
    language: str = ""
    is_instrumental: bool = False
    lyrics: str = ""
    custom_tag: str = ""
    repeat: int = Field(default=1, ge=1)
    prompt_override: PromptOverride | None = None


class Sample(SidecarFields):
    """One audio file of a dataset: sidecar-backed, studio-private and derived fields."""

    sample_id: str  # first 16 hex of sha1(lower-cased relative path, forward slashes)
    rel_path: str  # forward slashes, relative to the dataset source folder
    audio_path: str
    filename: str
    sidecar_path: str
    sidecar_exists: bool = False
    file_missing: bool = False
    # studio-private
    excluded: bool = False
    label_status: SampleLabelStatus = "unlabeled"
    error: str = ""
    has_audio_codes: bool = False
    sources: dict[str, FieldSource] = Field(default_factory=dict)
    # derived
    duration: float = 0.0  # seconds, measured from the audio header
    size_bytes: int = 0
    tag_artist: str = ""
    tag_title: str = ""
    tag_album: str = ""
    labeled_at: str = ""


class DatasetSummary(Contract):
    id: str
    slug: str
    name: str
    source_dir: str
    recursive: bool = True
    custom_tag: str = ""  # the trigger word; "" = none
    tag_position: TagPosition = "prepend"
    genre_ratio: int = Field(default=0, ge=0, le=100)
    default_artist: str = ""
    default_album: str = ""
    default_genre: str = ""
    default_language: str = "en"
    sample_count: int = 0
    labeled_count: int = 0
    excluded_count: int = 0
    status: DatasetStatus = "draft"
    built_at: str = ""
    dataset_json_path: str = ""
    album_name: str = ""
    created_at: str = ""
    updated_at: str = ""


class DatasetDetail(DatasetSummary):
    samples: list[Sample] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    active_job_id: str = ""
    preprocessed_variants: list[str] = Field(default_factory=list)


class CreateDatasetInput(Options):
    name: str = ""  # "" = the folder's basename
    source_dir: str
    recursive: bool = True
    custom_tag: str = ""
    tag_position: TagPosition = "prepend"
    genre_ratio: int = Field(default=0, ge=0, le=100)
    default_artist: str = ""
    default_album: str = ""
    default_genre: str = ""
    # Language is declared by the user, never guessed; ISO 639-1 ("english" is normalised to "en").
    default_language: str = "en"


class PatchSampleInput(Options):
    caption: str | None = None
    genre: str | None = None
    bpm: int | None = None
    key: str | None = None
    signature: str | None = None
    language: str | None = None
    is_instrumental: bool | None = None
    lyrics: str | None = None
    custom_tag: str | None = None
    repeat: int | None = Field(default=None, ge=1)
    prompt_override: PromptOverride | None = None
    excluded: bool | None = None


class ScanPreview(Contract):
    root: str
    audio_files: int
    with_sidecar: int
    with_caption: int
    has_dataset_json: bool
    extensions: dict[str, int]
    sample_names: list[str]  # at most 10
    warnings: list[str] = Field(default_factory=list)


class BuildOptions(Options):
    # "" = `datasets/<slug>/dataset.json` in storage; else a path inside the source folder or root.
    output_path: str = ""


# -- labeling ------------------------------------------------------------------------------------
class CaptionProviderChoice(Options):
    provider: str = "gemini"
    model: str = ""


# Seconds one song's analysis (decode included) may take before its process is killed and the
# sample fails: the longest stretch analysed costs a few CPU-seconds, so only an extractor that
# never returns (Essentia on some inputs) reaches it.
ANALYSIS_TIME_LIMIT_S = 120.0


class LabelOptions(Options):
    sample_ids: list[str] | None = None
    scope: Literal["all", "unlabeled"] = Field(
        default="unlabeled", description="Songs to label (unlabeled: those without a caption)."
    )
    use_essentia: bool = Field(default=True, description="BPM and key.")
    # The route defaults these to true (types.ts says false); a provider without credentials is
    # skipped with a warning unless the caller asked for it explicitly.
    use_genius: bool = Field(default=True, description="Lyrics (needs $GENIUS_ACCESS_TOKEN).")
    use_caption: bool = Field(default=True, description="Captions.")
    use_understand: bool = False
    merge_policy: MergePolicy = Field(
        default="fill_missing", description="What a new value may replace in the sidecars."
    )
    caption: CaptionProviderChoice | None = None
    allow_empty: bool = False
    analysis_time_limit_s: float = Field(
        default=ANALYSIS_TIME_LIMIT_S,
        gt=0,
        description="Seconds one song's analysis may take before it fails.",
    )


# -- preprocess ----------------------------------------------------------------------------------
class PreprocessOptions(Options):
    dit_model: str = Field(
        default="",
        description="DiT folder, path or variant (turbo, base, sft, xl-turbo); "
        "'' = the first one under the checkpoints folder.",
    )
    vae_model: str = Field(default="", description="VAE folder ('' = vae/ under the checkpoints).")
    text_encoder: str = Field(default="", description="Qwen3-Embedding folder ('' = found).")
    sample_ids: list[str] | None = None
    max_duration_s: float = Field(default=240.0, ge=0, description="Cut songs here (s); 0 = never.")
    normalize: PreprocessNormalize = "peak"
    target_db: float = Field(
        default=-1.0, ge=-60, le=0, description="Peak level after normalising (dBFS)."
    )
    dtype: PreprocessDtype = Field(default="f32", description="Stored tensor dtype.")
    compat: PreprocessCompat = Field(
        default="hotstep", description="hotstep (inference prompts) or sidestep."
    )
    # Route values (512 / 2048) win over the type comments (256 / 512): they are what runs.
    max_caption_tokens: int = Field(default=512, ge=16, le=4096)
    max_lyric_tokens: int = Field(default=2048, ge=16, le=4096)
    # HOT-Step's route: 384 frames (15.4 s, set by its C++ engine's memory). Ours encodes 1536
    # (61 s) per window in the same memory as its 4 x 384 batches, and re-encodes ~7% of a 240 s
    # song at the window edges instead of ~34% (speed: docs/BENCHMARKS.md); any value >= 64 works.
    vae_chunk_frames: int = Field(
        default=1536, ge=64, description="VAE window, latent frames (25/s)."
    )
    vae_overlap_frames: int = Field(  # route 48; the type comment's 64 is stale
        default=48, ge=0, description="Frames discarded each side of a window."
    )
    overwrite: bool = Field(default=False, description="Re-encode every sample, cached or not.")
    output_dir: str = Field(default="", description="Variant folder name ('' = the DiT's name).")
    # Ours, beyond the studio route: Side-Step's `<stem>.pt` beside each safetensors file (for
    # users who still train with Side-Step), and the posterior-noise seed mixed with each sample id.
    sidestep_pt: bool = Field(default=False, description="Also write Side-Step's <stem>.pt files.")
    seed: int = Field(default=0, ge=0, description="Posterior-noise seed (mixed with sample ids).")
    # 5 Hz codes are the float32 audio tokenizer's. "auto": on CUDA a TF32 pass, with the windows
    # within `codes_recheck_margin` FSQ levels of a floor boundary redone in float32, which keeps
    # the codes the float32 ones while the pass's error stays inside the margin (its measured
    # error and speed: docs/BENCHMARKS.md); "off": float32 throughout.
    codes_fast_pass: Literal["auto", "off", "tf32"] = Field(
        default="auto", description="5 Hz codes: auto (TF32 + float32 rechecks on CUDA)."
    )
    codes_recheck_margin: float = Field(
        default=0.02,
        ge=0,
        le=0.5,
        description="FSQ levels from a boundary that get a float32 recheck.",
    )
    # Per encoder process on CUDA: the allocator frees its cache rather than grow past it, so
    # actors that share a GPU keep to their share.
    gpu_memory_cap_gib: float = Field(
        default=0.0, ge=0, description="GiB per encoder process on CUDA (0 = no cap)."
    )


# -- training ------------------------------------------------------------------------------------
class CheckpointCadence(Options):
    """How often a trainer writes its resumable checkpoint (what a killed run continues from), at
    epoch ends: after the first epoch, then whenever `checkpoint_every_s` seconds (wall clock)
    have passed since the last one (0 = every epoch), every `checkpoint_every_epochs` epochs
    (0 = off), and at the end. A checkpoint at every epoch makes short epochs wait on writing
    the adapter, its optimizer moments and the kept best (and, on Ray, on a report, which waits
    for Ray Train's next poll). The cadence does not change the adapter: a resumed run takes the
    one given now."""

    checkpoint_every_s: float = Field(
        default=300.0,
        ge=0,
        le=86400,
        description="Seconds between resumable checkpoints, at epoch ends (0 = every epoch).",
    )
    checkpoint_every_epochs: int = Field(
        default=0, ge=0, le=2000, description="Also a checkpoint every N epochs (0 = off)."
    )


class TrainLmOptions(CheckpointCadence):
    """5 Hz LM adapter training. Defaults: HOT-Step route values."""

    # Route default 4B (the types comment says 0.6B; the route is what a bare request gets).
    lm_size: LmSize = "4B"
    lm_model: str = Field(
        default="",
        description="LM folder (a name under --checkpoints, or a path); its config.json sets the size.",
    )
    variant_key: str = ""
    adapter_name: str = ""
    # The LM recipe's own defaults (issue 7 and the seed's engine), not the studio route's
    # 150 epochs / target 0.1: a next-token loss over 64k code tokens never reaches 0.1, so that
    # target would silently mean "always run every epoch".
    target_loss: float = Field(
        default=4.0, ge=0, le=20, description="Stop when the 5-epoch mean loss gets here (0 = off)."
    )
    epochs: int = Field(default=75, ge=1, le=200)
    adapter_type: AdapterType = "lokr"
    rank: int = Field(default=16, ge=1, le=256, description="LoRA rank.")
    alpha: float = Field(default=32, ge=1, le=1024, description="LoRA alpha.")
    lokr_dim: int = Field(default=128, ge=4, le=4096)
    lokr_alpha: float = Field(default=128, ge=0, le=8192)
    lokr_factor: int = Field(default=6)
    lokr_decompose_both: bool = True
    optimizer: OptimizerName = "muon"
    muon_lr_scale: float = Field(default=20.0, ge=0.001, le=1000)
    muon_ns_steps: int = Field(default=5, ge=1, le=20)
    muon_ns_precision: MuonNsPrecision = Field(
        default="auto",
        description="Muon's Newton-Schulz (auto: bfloat16_batched on CUDA).",
    )
    learning_rate: float = Field(default=1e-4, gt=0, le=1)
    grad_accum: int = Field(default=2, ge=1, le=64)
    grad_clip: float = Field(default=1.0, ge=0, le=100)
    warmup_ratio: float = Field(default=0.05, ge=0, le=0.5)
    weight_decay: float = Field(default=0.01, ge=0, le=1)
    max_len: int = Field(
        default=0,
        ge=0,
        le=16384,
        description="Skip songs longer than this many tokens (0 = fit the GPU).",
    )
    batch: int = Field(
        default=1, ge=1, le=16, description="Songs per micro-batch (--batching bucket)."
    )
    seed: int = 42
    order: SampleOrder = "shuffle"
    loss_on_cot: bool = True
    milestone_step: float = Field(default=1.0, ge=0, le=5)  # loss rungs; 0 = off
    milestone_keep: int = Field(default=6, ge=0, le=64)
    stages: list[TrainLmStage] = Field(
        default_factory=lambda: ["extract", "train", "export"],
        description="Comma-separated: extract, train, export.",
    )
    overwrite: bool = Field(default=False, description="Extract: re-read every tensor file.")
    # "latest" = newest non-calibrated run of this name; "" = train from scratch; else a path.
    init_adapter: str = Field(
        default="latest", description="'latest', '' (from scratch) or a run folder."
    )
    calibrate: bool = Field(
        default=False, description="Calibrate milestones x scales after the export."
    )
    calibrate_repoint: bool = Field(
        default=True, description="The calibrated folder becomes what the artist resolves to."
    )
    # Songs kept out of training for a per-epoch held-out loss (`eval` events); 0 = off. Needs at
    # least 6 songs (training.holdout.MIN_SONGS).
    holdout_fraction: float = Field(
        default=0.0,
        ge=0,
        lt=1,
        description="Share of songs held out for a per-epoch loss (>= 6 songs).",
    )

    @model_validator(mode="after")
    def _check(self) -> TrainLmOptions:
        _check_lokr_factor(self.lokr_factor)
        if self.max_len and self.max_len < 512:
            raise ValueError("max_len must be 0 (auto) or 512-16384")
        return self


# Defaults of the torch-side run settings that the CLI shows in --help. They live here, torch-free,
# so `hotstep-ray --help` need not import torch; `training.lm_spec.LmEngine` and
# `calibration.lm_calibrate.LmCalibrationConfig` take their defaults from these names.
LmCompileMode = Literal["auto", "off", "default", "reduce-overhead"]
LM_COMPILE_DEFAULT: LmCompileMode = "auto"  # LmEngine.compile (each mode: training.lm_setup)
# LmEngine.batching: one song a micro-batch, songs of like length together, or packed into rows
LmBatching = Literal["single", "bucket", "pack"]
LM_ACTIVATION_BUDGET_DEFAULT = 0.8  # LmEngine.activation_budget: share of activations kept
LM_CALIBRATION_MAX_BATCH_DEFAULT = 4  # LmCalibrationConfig.max_batch: requests decoded together

# GPU shares of the audition engines, defined here once: the audition Serve replicas'
# (`audition.serve_app.AuditionAppConfig`; the shipped Serve YAMLs are checked against
# these) and the studio's audition job, which loads the same engines in its runner actor.
AUDITION_DECODER_GPUS = 0.25  # codes -> audio: ~1 GiB of weights; four share a card
AUDITION_LM_GPUS = 0.5  # the planner LM
AUDITION_DIT_GPUS = 0.5  # DiT text2music (DiT, VAE, text encoder)


class TrainDitOptions(CheckpointCadence):
    """DiT adapter training. Defaults: HOT-Step route values; `None` means "by adapter type"
    (LoKR and LoRA want different learning rates, weight decay and loss weighting)."""

    adapter_type: AdapterType = "lokr"
    adapter_name: str = ""
    variant_key: str = ""
    rank: int = Field(default=128, ge=1, le=256)
    alpha: float = Field(default=256, ge=1, le=1024)
    lokr_dim: int = Field(default=512, ge=4, le=4096)
    lokr_alpha: float = Field(default=512, ge=0, le=8192)  # 0 = same as dim
    lokr_factor: int = 6
    lokr_decompose_both: bool = True
    target_mlp: bool = True
    layers: int = Field(default=0, ge=0, le=64)  # 0 = every layer; K = the top K (never fitted)
    crop_frames: int = Field(default=0, ge=0, le=8192)  # 0 = auto-fit; 25 latent frames per s
    crop_min_frames: int = Field(default=375, ge=128, le=8192)
    crop_max_frames: int = Field(default=1250, ge=128, le=8192)
    target_loss: float = Field(default=0.1, ge=0, le=20)  # compared with the 5-epoch moving average
    epochs: int = Field(default=500, ge=1, le=2000)
    learning_rate: float | None = Field(default=None, gt=0, le=1)  # lokr 2e-3, lora 5e-4
    grad_accum: int = Field(default=4, ge=1, le=64)  # counts micro-batches
    grad_clip: float = Field(default=1.0, ge=0, le=100)
    warmup_ratio: float = Field(default=0.05, ge=0, le=0.5)
    weight_decay: float | None = Field(default=None, ge=0, le=1)  # lokr 1e-3, lora 1e-2
    loss_weighting: LossWeighting | None = None  # lokr none, lora flow_snr
    snr_gamma: float = Field(default=5.0, ge=1, le=100)
    t_bias: float = Field(default=0.5, ge=0, le=4)
    channel_balance: bool = True
    timestep_mu: float = -0.4
    timestep_sigma: float = Field(default=1.0, gt=0, le=4)
    t_min: float = Field(default=0.0, ge=0, le=1)
    t_max: float = Field(default=1.0, ge=0, le=1)
    cfg_ratio: float = Field(default=0.15, ge=0, le=1)
    genre_ratio: int = Field(default=30, ge=0, le=100)
    seed: int = 42
    order: SampleOrder = "shuffle"
    # The route sends 0.1, the UI form 0; we keep the route value (milestones are cheap to skip).
    milestone_step: float = Field(default=0.1, ge=0, le=5)
    milestone_keep: int = Field(default=6, ge=0, le=64)
    vram_reserve_mb: int = Field(default=2048, ge=0, le=16384)
    optimizer: OptimizerName = "muon"
    muon_lr_scale: float = Field(default=20.0, ge=0.001, le=1000)
    muon_momentum: float = Field(default=0.95, ge=0, lt=1)
    muon_ns_steps: int = Field(default=5, ge=1, le=20)
    muon_ns_precision: MuonNsPrecision = "auto"
    muon_min_dim: int = Field(default=16, ge=1)
    batch: int = Field(default=1, ge=1, le=16)
    checkpoint_segments: int = Field(default=1, ge=0, le=32)  # 1 = auto, 0 = off
    stages: list[TrainDitStage] = Field(default_factory=lambda: ["train", "export"])
    overwrite: bool = False  # train from scratch into an existing run folder (`run_key`)
    init_adapter: str = "latest"
    calibrate: bool = False
    calibrate_repoint: bool = True
    holdout_fraction: float = Field(default=0.0, ge=0, lt=1)  # as TrainLmOptions; 0 = off
    # torch.compile of each DiT block. "step-graph": compiled blocks, each step's forwards and
    # backwards replayed as one CUDA graph (training.step_graph); "reduce-overhead": a CUDA
    # graph per block call. "auto" on CUDA = step-graph when no layer is checkpointed and the
    # adapter has no dropout (LoKR never has), reduce-overhead with dropout, else "default";
    # off on the CPU (dit.graph_mode, docs/BENCHMARKS.md).
    compile: DitCompileMode = "auto"

    @model_validator(mode="after")
    def _check(self) -> TrainDitOptions:
        _check_lokr_factor(self.lokr_factor)
        if self.t_min >= self.t_max:
            raise ValueError(f"t_min ({self.t_min}) must be below t_max ({self.t_max})")
        if self.crop_min_frames > self.crop_max_frames:
            raise ValueError("crop_min_frames must not exceed crop_max_frames")
        return self

    @property
    def is_lokr(self) -> bool:
        return self.adapter_type == "lokr"

    @property
    def effective_learning_rate(self) -> float:
        if self.learning_rate is not None:
            return self.learning_rate
        return 2e-3 if self.is_lokr else 5e-4

    @property
    def effective_weight_decay(self) -> float:
        if self.weight_decay is not None:
            return self.weight_decay
        return 1e-3 if self.is_lokr else 1e-2

    @property
    def effective_loss_weighting(self) -> LossWeighting:
        if self.loss_weighting is not None:
            return self.loss_weighting
        return "none" if self.is_lokr else "flow_snr"

    @property
    def effective_lokr_alpha(self) -> float:
        return self.lokr_alpha or float(self.lokr_dim)


def _check_lokr_factor(factor: int) -> None:
    if factor != -1 and not 2 <= factor <= 64:
        raise ValueError(f"lokr_factor must be -1 or 2-64, got {factor}")


def schedule_steps(samples: int, epochs: int, batch: int, grad_accum: int, warmup_ratio: float):
    """Optimizer steps per epoch, total steps and warmup steps, as the seed's schedule preview
    computes them: steps/epoch = ceil(n / (batch·GA)); warmup = max(50, total·ratio), capped at
    half the run."""
    steps_per_epoch = max(1, math.ceil(samples / (batch * grad_accum)))
    total = steps_per_epoch * epochs
    warmup = min(max(50, int(total * warmup_ratio)), total // 2)
    return steps_per_epoch, total, warmup


# -- jobs ----------------------------------------------------------------------------------------
JOB_PHASES: dict[str, tuple[str, ...]] = {
    "scan": ("queued", "scan", "probe", "writing"),
    "build": ("queued", "scan", "probe", "build", "writing"),
    "label": ("queued", "essentia", "understand", "genius", "llm", "writing", "build"),
    "preprocess": ("queued", "loading-models", "preprocess", "stats"),
    "train-lm": ("queued", "loading-models", "extract", "train", "export"),
    "train-dit": ("queued", "loading-models", "train", "export"),
    "audition": (
        "queued",
        "audition-lm-base",
        "audition-lm-adapter",
        "audition-decode",
        "audition-render",
        "audition-writing",
    ),
    # the main job's stages (main_job.STAGES), the studio's make job
    "make": (
        "queued",
        "dataset",
        "label",
        "build",
        "checkpoints",
        "preprocess",
        "train-dit",
        "train-lm",
        "audition",
        "report",
    ),
}


class JobSummary(Contract):
    id: str
    dataset_id: str = ""
    kind: JobKind
    status: JobStatus = "queued"
    total: int = 0
    done: int = 0
    failed: int = 0
    current_sample_id: str = ""
    phase: str = "queued"
    error: str = ""
    created_at: int = 0  # epoch ms
    started_at: int = 0
    finished_at: int = 0


# -- the main job ---------------------------------------------------------------------------------
class MakeOptions(Options):
    """`hotstep-ray make SONGS_DIR` (and `demo`, on the bundled songs): songs -> dataset -> labels
    -> tensors -> DiT and LM adapters -> a same-seed A/B (`main_job.run_main_job`)."""

    model_config = ConfigDict(frozen=True)

    songs: str = Field(
        default="",
        description="Folder of your songs (.wav .mp3 .flac ...; local or s3://), searched "
        "recursively; '' = the bundled example songs.",
    )
    name: str = Field(default="", description="Dataset and adapter name ('' = the folder's name).")
    tag: str = Field(default="", description="Trigger word put in every caption ('' = none).")
    data: str = Field(default="./data", description="Storage root: a folder or s3://bucket/prefix.")
    ray_address: str | None = Field(
        default=None,
        description="Join this Ray cluster (unset: $RAY_ADDRESS, else start a local one).",
    )
    checkpoints: str | None = Field(
        default=None,
        description="Real ACE-Step 1.5 weights (unset: a tiny CPU checkpoint, written once).",
    )
    epochs: int | None = Field(
        default=None,
        ge=1,
        description="Epochs of both trainers (unset: 8 DiT / 4 LM tiny; the contracts' real).",
    )
    ray_train: bool | None = Field(
        default=None,
        description="Preprocess on Ray Data and train on Ray Train (1 worker each), or all in "
        "this process (the two trainers side by side on a GPU). Unset: on a Ray that is this "
        "machine with one GPU, preprocess and the DiT here and the LM on Ray Train beside it; "
        "else all on Ray.",
    )
    skip_train: bool = Field(default=False, description="Stop after preprocessing.")
    skip_audition: bool = Field(
        default=False, description="Train, but start no audition app (no A/B)."
    )
    retrain: bool = Field(
        default=False,
        description="Train new adapter runs even when nothing they depend on changed.",
    )


# -- models --------------------------------------------------------------------------------------
RandomDitLayout = Literal["2b", "xl", "none"]
RandomLmSize = Literal["0.6B", "1.7B", "4B", "none"]
WeightDtype = Literal["bf16", "fp16", "fp32"]


class MakeRandomOptions(Options):
    """`models make-random DIR`: a full-size ACE-Step 1.5 tree of random weights in the official
    layout (`models.random_tree`), for benchmarks and dry runs without the released weights."""

    dit: RandomDitLayout = Field(default="2b", description="DiT: 2B or XL turbo; none = no DiT.")
    lm: RandomLmSize = Field(default="1.7B", description="5 Hz LM size; none = no LM.")
    vae: bool = Field(default=True, description="Write vae/.")
    text_encoder: bool = Field(default=True, description="Write Qwen3-Embedding-0.6B/.")
    seed: int = Field(default=0, ge=0, description="Seed of the random weights.")
    dtype: WeightDtype = Field(default="bf16", description="Stored dtype of every weight.")
    device: str = Field(
        default="", description='Where the values are drawn: cuda, cpu ("" = cuda if present).'
    )
    force: bool = Field(
        default=False, description="Write into a non-empty folder, replacing the parts written."
    )
