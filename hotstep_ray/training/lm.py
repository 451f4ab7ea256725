"""5 Hz LM adapter training (ACE-Step 1.5 planner, Qwen3 0.6B/1.7B/4B): setup -> train -> save.

Plain Python; `ray_lm` runs the same three steps in Ray Train workers.

setup   load the LM folder (its config.json decides the size, never its name), the tokenizer, and
        `lm_codes.jsonl`; render songs in the trained layout (over-length ones skipped); plan the
        micro-batches; fit activation checkpointing to the GPU; inject LoRA/LoKR on q/k/v/o/gate/
        up/down, optionally starting from an earlier run (`init_adapter`, identity-checked);
        build hybrid Muon/AdamW, the warmup + cosine schedule, the stop rule, milestones.
train   epochs of windows of `grad_accum` micro-batches; per window: Σ per-song mean CE /
        songs in the window, backward, clip, schedule, step. Epoch loss = mean over songs. Stop on
        the epoch cap, the target on the 5-epoch moving average, or a non-finite loss.
save    the kept adapter (the best epoch, or the epoch that hit the target) as a PEFT folder
        (LoRA) or LyCORIS file (LoKR), BF16, trigger in `__metadata__`, plus `lm_train_log.json`,
        under `adapters/lm-06b|lm-17b|lm-4b/<artist>/<run>/`.

Stages (`options.stages`): `extract` writes/refreshes `lm_codes.jsonl` from the tensor cache
(`lm_data.extract_codes`, unchanged rows reused); `train` trains; `export` writes the adapter. Train
without export keeps the resumable checkpoint in `<run>/checkpoint/` (and skips milestones); export
alone (`run_key` = that run) exports the adapter it kept. `holdout_fraction` keeps songs out of
training and reports their loss per epoch as `eval` events (`holdout`). `calibrate` is not a
stage of this trainer: `calibration.after_train.run_lm_then_calibrate` trains, then calibrates.

Compile (`LmEngine.compile`, `compile_mode`): auto | off | default | reduce-overhead; auto is default
on CUDA and off on the CPU, where compiling is refused. Each decoder layer is compiled on its own with
static shapes (`lm_loss.compile_layers`); rows are then padded to 64-token widths (`row_multiple`)
so a run has few shapes, and the held-out loss runs the layers eagerly.

Warm start (`resolve_start`): `init_adapter="latest"` is the newest FINISHED run of the artist
on this LM size (`warm_start.latest_finished_run`, the DiT trainer's rule) of the adapter type
asked for, or of any type when none was (its type, rank and alpha are then adopted); with none
the run starts fresh. A start that cannot fit (`check_identity`) is refused before the weights
load, and the run logs one line naming what it starts from.

Trigger: prompts are rendered from text at train time, so a run trigger (`LmTrainSpec.trigger`)
replaces every row's tag in the caption the adapter learns from (a row whose caption has its own
tag baked in refuses another).

bf16 weights with fp32 adapter masters under autocast on CUDA; float32 on CPU. Resumable
checkpoints (`training.checkpoint`) are taken at epoch ends; a resumed run equals an
uninterrupted one (data order is a function of (seed, epoch)): it continues with the options and
trigger in its checkpoint, and names each other value it was given as ignored
(`options_from_checkpoint`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator
from torch import nn

from hotstep_ray.core import layout
from hotstep_ray.core.contracts import (
    LM_ACTIVATION_BUDGET_DEFAULT,
    LM_COMPILE_DEFAULT,
    LmCompileMode,
    TrainLmOptions,
)
from hotstep_ray.core.errors import InputError
from hotstep_ray.core.events import EventLog, MetricEvent
from hotstep_ray.core.storage import Storage
from hotstep_ray.models import lm_tokenizer
from hotstep_ray.training import (
    adapters,
    checkpoint,
    compiling,
    export,
    flat_grads,
    holdout,
    lm_loss,
    lm_vram,
    warm_start,
)
from hotstep_ray.training import lm_data as data
from hotstep_ray.training.adapters import AdapterSpec
from hotstep_ray.training.optim import build_optimizer
from hotstep_ray.training.schedule import LrSchedule, MilestoneTracker, StopRule

LOG_FILE = warm_start.LM_LOG_FILE  # "lm_train_log.json": what tells a finished run (warm_start)
LOG_FORMAT = "hot-step-lm-train-v1"
CHECKPOINT_DIR = "checkpoint"  # resumable state under the run folder, removed after export
MILESTONE_DIR = layout.MILESTONE_DIR
MAX_LEN_CAP = 16384
CompileMode = LmCompileMode  # the modes live in core.contracts with their default


class LmEngine(BaseModel):
    """How to run (not what to learn): placement, batching, memory, speed."""

    model_config = ConfigDict(extra="forbid")

    device: str = ""  # "" = cuda when present, else cpu
    batching: data.Batching = "single"  # single | bucket (options.batch songs) | pack
    pack_tokens: int = Field(default=0, ge=0)  # row capacity when packing; 0 = 8192 or longest
    # Round row widths up to a multiple of this (fewer compiled shapes); 0 = when the layers are
    # compiled, the multiple of 64-512 that minimises compiles + padding over the run's epochs
    # (`lm_data.pick_pad_multiple`), else 1. Pads are never targets and no real token attends to
    # them.
    pad_multiple: int = Field(default=0, ge=0)
    checkpointing: str = "auto"  # auto | none | full | <layers>
    ce_chunk: int = Field(default=lm_loss.DEFAULT_CE_CHUNK, ge=1)
    attention: str = "sdpa"  # sdpa | varlen | flex_attention | eager
    # torch.compile of each decoder layer (`compile_mode`): auto = reduce-overhead (Inductor +
    # CUDA graphs) on one CUDA GPU when no layer is checkpointed, default when some are or under
    # DDP (`compiling.with_graphs`), off on the CPU, and off for a run too short to repay its
    # compiles (`lm_data.compile_pays`).
    # Compiled layers with graphs are the fastest mode on one GPU; the first step of each new
    # row width compiles (docs/BENCHMARKS.md, rows `lm-4b-modes` and `lm-4b-song`, and the LM
    # table's note on compiling).
    compile: CompileMode = LM_COMPILE_DEFAULT
    # Share of the compiled layers' saved activations that AOTAutograd may keep; below 1 its
    # partitioner recomputes the cheapest ops (norms, SiLU, casts) in the backward instead
    # (torch._functorch activation_memory_budget): a little step time for less reserved memory
    # (row `lm-4b-song` runs at the default). Ignored when the layers run eagerly.
    activation_budget: float = Field(default=LM_ACTIVATION_BUDGET_DEFAULT, gt=0, le=1)
    vram_budget_gib: float = Field(default=0.0, ge=0)  # 0 = free GPU memory - reserve
    vram_reserve_gib: float = Field(default=1.5, ge=0)
    checkpoint_every: int = Field(default=1, ge=0)  # epochs between resumable checkpoints
    log_every: int = Field(default=10, ge=1)  # optimizer steps between step events
    cot_caption: bool = True  # the CoT repeats the caption (HOT-Step); False = metas only

    @field_validator("compile", mode="before")
    @classmethod
    def _compile_from_bool(cls, value: Any) -> Any:
        """Specs written before the modes had `compile: true/false`."""
        if isinstance(value, bool):
            return "default" if value else "off"
        return value


class LmTrainSpec(BaseModel):
    """Everything one run needs; JSON-able so Ray ships it to workers."""

    model_config = ConfigDict(extra="forbid")

    options: TrainLmOptions
    lm_dir: str  # local folder acestep-5Hz-lm-<size>/
    codes_key: str  # storage key of lm_codes.jsonl
    artist: str  # adapter folder name
    trigger: str = ""  # "" = each row's custom_tag; else this tag for every song
    trigger_position: Literal["prepend", "append", "replace"] = "prepend"
    engine: LmEngine = Field(default_factory=LmEngine)
    run_key: str = ""  # "" = a fresh stamped run folder
    events_key: str = ""  # also append events as JSONL here (Ray workers)
    job_id: str = ""  # the job training the run, kept in its checkpoint (`adapters list`)

    def to_config(self) -> dict[str, Any]:
        """JSON dict that keeps which options were set explicitly (identity adoption needs it)."""
        out = self.model_dump(mode="json", exclude={"options"})
        out["options"] = self.options.model_dump(mode="json", exclude_unset=True)
        return out

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> LmTrainSpec:
        return cls(**{**config, "options": TrainLmOptions(**config["options"])})


# -- model folder, size, tokenizer ----------------------------------------------------------------
def resolve_lm_dir(checkpoints: str | Path, size: str, lm_model: str = "") -> Path:
    """`<checkpoints>/acestep-5Hz-lm-<size>` or the named folder (a path, or a name under
    checkpoints)."""
    if lm_model:
        path = Path(lm_model)
        folder = path if path.is_dir() else Path(checkpoints) / lm_model
    elif size in layout.LM_SIZE_FOLDERS:
        folder = Path(checkpoints) / f"acestep-5Hz-lm-{size}"  # the official folder name
    else:
        raise InputError(
            f"unknown LM size {size!r}; expected one of {list(layout.LM_SIZE_FOLDERS)}"
        )
    if not (folder / "config.json").is_file():
        raise InputError(f"{folder}: no LM checkpoint (config.json missing)")
    return folder


def present_lm_size(checkpoints: str | Path, preferred: str) -> str:
    """`preferred` when its official LM folder is in `checkpoints`, else the largest LM size that
    is (a tree with only the 1.7B trains the 1.7B rather than failing on the missing 4B); else
    `preferred`, whose folder `resolve_lm_dir` then reports missing."""
    present = [
        size
        for size in layout.LM_SIZE_FOLDERS
        if (Path(checkpoints) / f"acestep-5Hz-lm-{size}" / "config.json").is_file()
    ]
    if preferred in present or not present:
        return preferred
    return max(present, key=lambda size: float(size.rstrip("B")))


def lm_size_of(dims: lm_vram.LmDims, requested: str, explicit: bool = True) -> str:
    """The size label from the architecture (the folder's config.json). A known architecture
    wins over a size nobody asked for (`explicit=False`: the contract's default) and must match
    one that was asked for (else a mislabelled folder or the wrong --size: an error); an unknown
    architecture (a tiny test LM) keeps the requested size."""
    found = dims.size_label
    if found is not None and found != requested and explicit:
        raise InputError(
            f"the LM folder holds a {found} model (hidden {dims.hidden}, {dims.layers} layers), "
            f"not {requested}; pass --size {found}, leave --size out, or pick the right folder"
        )
    return found or requested


@functools.lru_cache(maxsize=4)
def _tokenizer(folder: str, stamp: float) -> Any:
    return lm_tokenizer.load_tokenizer(folder)


def load_tokenizer(folder: str | Path) -> Any:
    """The LM folder's tokenizer, cached per process (loading it takes seconds)."""
    path = Path(folder)
    return _tokenizer(str(path.resolve()), (path / "tokenizer.json").stat().st_mtime)


# -- adapter identity (init_adapter) --------------------------------------------------------------
@dataclass(frozen=True)
class AdapterIdentity:
    """What must match to continue training an adapter: the base architecture and the shapes."""

    hidden: int
    layers: int
    kind: str
    rank: int
    factor: int = -1  # LoKR only
    size: str = ""

    def describe(self) -> str:
        shape = f"r{self.rank}" if self.kind == "lora" else f"dim {self.rank} factor {self.factor}"
        return f"{self.kind} {shape} on LM {self.size or '?'} ({self.hidden} wide, {self.layers} layers)"


def model_identity(dims: lm_vram.LmDims, spec: AdapterSpec, size: str) -> AdapterIdentity:
    factor = spec.factor if spec.kind == "lokr" else -1
    return AdapterIdentity(dims.hidden, dims.layers, spec.kind, spec.rank, factor, size)


def _layer_index(name: str) -> int | None:
    found = re.search(r"layers[._](\d+)[._]", name)
    return int(found.group(1)) if found else None


def adapter_identity(storage: Storage, key: str) -> tuple[AdapterIdentity, dict[str, Any]]:
    """Identity of an exported adapter folder (from its tensors, metadata and training log) and
    the source's log config ({} when there is no log)."""
    kind, tensors, meta = export.read_adapter_file(storage, key)
    log_key = f"{key}/{LOG_FILE}" if key else LOG_FILE
    log = storage.read_json(log_key) if storage.exists(log_key) else {}
    config = log.get("config", {}) if isinstance(log, dict) else {}
    layers = 1 + max((i for i in map(_layer_index, tensors) if i is not None), default=-1)
    q_keys = [k for k in tensors if "q_proj" in k and _layer_index(k) == 0]
    if kind == "lora":
        a = next(tensors[k] for k in q_keys if k.endswith("lora_A.weight"))
        rank, hidden, factor = int(a.shape[0]), int(a.shape[1]), -1
    else:
        lokr = json.loads(meta.get("lokr_config", "{}"))
        parts = {k.rsplit(".", 1)[1]: tensors[k] for k in q_keys}
        w1 = parts.get("lokr_w1", parts.get("lokr_w1_b"))
        w2 = parts.get("lokr_w2", parts.get("lokr_w2_b"))
        rank, factor = int(lokr.get("linear_dim", 0)), int(lokr.get("factor", -1))
        hidden = int(w1.shape[1] * w2.shape[1]) if w1 is not None and w2 is not None else 0
    size = str(config.get("lm_size", "")) or lm_vram.KNOWN_SIZES.get((hidden, layers), "")
    return AdapterIdentity(hidden, layers, kind, rank, factor, size), config


def adopt_identity(
    options: TrainLmOptions, source: AdapterIdentity, config: dict[str, Any]
) -> TrainLmOptions:
    """Identity fields the caller did not set are taken from the source run (seed behaviour);
    explicitly set ones are kept (and then checked)."""
    given = options.model_fields_set
    update: dict[str, Any] = {}
    if "adapter_type" not in given:
        update["adapter_type"] = source.kind
    kind = update.get("adapter_type", options.adapter_type)
    if kind == "lora" and source.kind == "lora":
        if "rank" not in given:
            update["rank"] = source.rank
        if "alpha" not in given and config.get("alpha"):
            update["alpha"] = float(config["alpha"])
    if kind == "lokr" and source.kind == "lokr":
        if "lokr_dim" not in given:
            update["lokr_dim"] = source.rank
        if "lokr_factor" not in given:
            update["lokr_factor"] = source.factor
        if "lokr_alpha" not in given and config.get("lokr_alpha") is not None:
            update["lokr_alpha"] = float(config["lokr_alpha"])
    if not update:
        return options
    merged = {**options.model_dump(exclude_unset=True), **update}
    return TrainLmOptions(**merged)


def check_identity(source: AdapterIdentity, target: AdapterIdentity, where: str) -> None:
    """Refuse to continue an adapter of another base size, adapter type or rank."""
    problems = []
    if (source.hidden, source.layers) != (target.hidden, target.layers):
        problems.append(f"base LM {source.size or '?'} vs {target.size or '?'}")
    if source.kind != target.kind:
        problems.append(f"adapter type {source.kind} vs {target.kind}")
    elif source.rank != target.rank:
        problems.append(f"rank {source.rank} vs {target.rank}")
    elif source.kind == "lokr" and source.factor != target.factor:
        problems.append(f"LoKR factor {source.factor} vs {target.factor}")
    if problems:
        raise InputError(
            f"cannot continue from {where}: it is a {source.describe()}, this run trains a "
            f"{target.describe()} ({'; '.join(problems)}). Match its settings, pick another "
            "adapter with --init-adapter, or pass --init-adapter '' to start from scratch"
        )


def resolve_init_adapter(
    storage: Storage, options: TrainLmOptions, base: str, artist: str, exclude: str = ""
) -> tuple[Storage, warm_start.TrainedRun] | None:
    """(storage, run) of the adapter to start from, or None for scratch. `latest` = the newest
    FINISHED run of this artist under this size (`warm_start.latest_finished_run`, the DiT
    trainer's rule too) of the adapter type asked for, or of any type when none was asked for
    (its identity is then adopted), other than `exclude`; anything else a storage key or local
    folder holding weights."""
    value = options.init_adapter
    if not value:
        return None
    if value == "latest":
        kind = options.adapter_type if "adapter_type" in options.model_fields_set else None
        found = warm_start.latest_finished_run(storage, base, artist, kind, exclude=exclude)
        return (storage, found) if found else None
    with contextlib.suppress(Exception):
        if (run := warm_start.trained_run(storage, value)) is not None:
            return storage, run
    local = Path(value)
    if local.is_dir() and (run := warm_start.trained_run(Storage(local), "")) is not None:
        return Storage(local), run
    raise InputError(f"--init-adapter {value!r}: no adapter weights there")


@dataclass(frozen=True)
class StartPoint:
    """Where a run's adapter starts (`resolve_start`)."""

    options: TrainLmOptions  # after identity adoption
    identity: AdapterIdentity  # what this run trains
    init: tuple[Storage, str] | None  # the adapter to load first; None = fresh
    init_from: dict[str, Any]  # what the log records of it ({} = fresh)
    line: str  # the one line naming what the run starts from


def resolve_start(
    spec: LmTrainSpec, storage: Storage, dims: lm_vram.LmDims, size: str
) -> StartPoint:
    """The warm start of `spec` on an LM of `dims`/`size` (no weights loaded): the adapter
    `init_adapter` resolves to, the options with its identity adopted where not given, checked
    (`check_identity`: an adapter of another type, rank or base is refused), and the line the
    run logs. Called by `setup_lm`, and by the Ray driver to refuse before the job starts."""
    options = spec.options
    base = layout.lm_adapter_base(size)
    found = resolve_init_adapter(storage, options, base, spec.artist, exclude=spec.run_key)
    if found is None:
        kind = options.adapter_type if "adapter_type" in options.model_fields_set else None
        line = (
            warm_start.fresh_start_line(base, spec.artist, kind)
            if options.init_adapter
            else "no warm start (init adapter ''): starting fresh"
        )
        identity = model_identity(dims, AdapterSpec.from_options(options), size)
        return StartPoint(options, identity, None, {}, line)
    source_storage, run = found
    init = (source_storage, run.key)
    source, source_config = adapter_identity(*init)
    options = adopt_identity(options, source, source_config)
    identity = model_identity(dims, AdapterSpec.from_options(options), size)
    url = source_storage.url_of(run.key)
    check_identity(source, identity, url)
    init_from = {"url": url, "identity": source.describe(), "loss": run.loss}
    line = f"{warm_start.warm_start_line(source_storage, run)} ({source.describe()})"
    return StartPoint(options, identity, init, init_from, line)


# -- setup ---------------------------------------------------------------------------------------
@dataclass
class LmSetup:
    spec: LmTrainSpec
    options: TrainLmOptions  # after identity adoption
    storage: Storage
    device: torch.device
    dtype: torch.dtype
    model: nn.Module  # Qwen3ForCausalLM with the adapter injected
    module: nn.Module  # LmLossModule, or its DDP wrap
    tokenizer: Any
    dims: lm_vram.LmDims
    lm_size: str
    run_key: str
    examples: list[data.LmExample]
    skipped: list[data.SkippedSong]
    groups: list[data.Group]
    optimizer: Any
    schedule: LrSchedule
    vram: lm_vram.VramEstimate
    max_len: int
    max_len_source: str
    fingerprint: str
    identity: AdapterIdentity
    trigger: str = ""
    trigger_position: str = "prepend"
    budget: int | None = None  # bytes a step may use (None: not fitted, CPU)
    compile: str = "off"  # the resolved compile mode of the decoder layers (`compile_mode`)
    pad_multiple: int = 1  # the resolved row-width multiple (`row_multiple`)
    init_from: dict[str, Any] = field(default_factory=dict)
    held_out: list[data.LmExample] = field(default_factory=list)  # holdout_fraction's songs
    holdout: dict[str, Any] | None = None  # the split (HoldoutSplit.to_dict)
    rank: int = 0
    world: int = 1
    events: EventLog | None = None
    grad_flats: flat_grads.FlatGrads | None = None  # the CUDA-graph step's gradient buffers

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def emit(self, metric: str, **fields: Any) -> None:
        if self.events is not None and self.is_main:
            self.events.emit(MetricEvent(metric=metric, **fields))

    def log(self, message: str, level: Literal["info", "warn", "error"] = "info") -> None:
        if self.events is not None and self.is_main:
            self.events.log(message, level)


def _device(engine: LmEngine) -> torch.device:
    if engine.device:
        return torch.device(engine.device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def compile_mode(requested: str, device: torch.device) -> str:
    """The compile mode of the decoder layers: `auto` is `default` on CUDA and `off` elsewhere,
    where compiling is refused (`training.compiling`)."""
    return compiling.resolve_mode(requested, device, "the LM layers")


def row_multiple(engine: LmEngine, compiled: bool) -> int:
    """Row widths round up to this: the engine's `pad_multiple`, else 64 tokens when the layers
    are compiled (each new width is a new graph; `setup_lm` may then coarsen it with
    `lm_data.pick_pad_multiple`) and 1 (no padding beyond the longest row) when they run
    eagerly."""
    if engine.pad_multiple:
        return engine.pad_multiple
    return lm_loss.COMPILE_PAD_MULTIPLE if compiled else 1


def _budget(engine: LmEngine, device: torch.device) -> int | None:
    """Bytes a step may use: the engine's budget, else the device's free memory (taken before
    the model loads) minus the reserve; None on the CPU (nothing to fit)."""
    if engine.vram_budget_gib:
        return int(engine.vram_budget_gib * lm_vram.GIB)
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    return int(free - engine.vram_reserve_gib * lm_vram.GIB)


def _checkpoint_layers(
    engine: LmEngine, dims: lm_vram.LmDims, budget: int | None, **estimate: Any
) -> lm_vram.VramEstimate:
    mode = engine.checkpointing
    if mode == "auto":
        if budget is None:
            return lm_vram.estimate_vram(dims, checkpointed_layers=0, **estimate)
        return lm_vram.fit_checkpointing(dims, budget, **estimate)
    layers = {"none": 0, "full": dims.layers}.get(mode)
    if layers is None:
        try:
            layers = int(mode)
        except ValueError as exc:
            raise InputError(
                f"checkpointing must be auto, none, full or a layer count, got {mode!r}"
            ) from exc
    return lm_vram.estimate_vram(dims, checkpointed_layers=layers, **estimate)


def _fit_kwargs(options: TrainLmOptions, engine: LmEngine, dims: lm_vram.LmDims) -> dict[str, Any]:
    spec = AdapterSpec.from_options(options)
    count = lm_vram.adapter_params(dims, spec.kind, spec.rank, spec.factor, spec.decompose_both)
    return {
        "adapter_parameters": count,
        "ce_chunk": engine.ce_chunk,
        "optimizer": options.optimizer,
    }


def plan_data(
    spec: LmTrainSpec,
    storage: Storage,
    tokenizer: Any,
    dims: lm_vram.LmDims,
    options: TrainLmOptions,
    budget: int | None,
    pad_multiple: int = 1,
) -> data.DataPlan:
    """Read `lm_codes.jsonl`, decide max_len (the user's, else what fits the GPU with every layer
    checkpointed, else the cap), render, skip over-length songs, plan the groups (rows padded to
    `pad_multiple` tokens when the step size is taken)."""
    engine = spec.engine
    if not storage.exists(spec.codes_key):
        raise InputError(f"{storage.url_of(spec.codes_key)}: missing (run preprocess first)")
    songs, bad = data.load_lm_codes(storage, spec.codes_key)
    _check_run_trigger(spec, storage, songs)
    held: list[data.LmSong] = []
    split = None
    if options.holdout_fraction:
        split = holdout.split_holdout(
            [s.song_id for s in songs], options.holdout_fraction, options.seed
        )
        songs, held = holdout.partition_songs(songs, split)
    if options.max_len:
        max_len, source = options.max_len, "user"
    elif budget is not None:
        fit = _fit_kwargs(options, engine, dims)
        max_len, source = lm_vram.max_tokens(dims, budget, MAX_LEN_CAP, **fit), "auto"
    else:
        max_len, source = MAX_LEN_CAP, "cap"
    render = data.RenderOptions(
        trigger=spec.trigger,
        trigger_position=spec.trigger_position,
        loss_on_cot=options.loss_on_cot,
        cot_caption=engine.cot_caption,
    )
    plan = data.plan_data(
        tokenizer,
        songs,
        bad,
        render,
        max_len=max_len,
        batching=engine.batching,
        batch=options.batch,
        pack_tokens=engine.pack_tokens,
        pad_multiple=pad_multiple,
    )
    plan.max_len_source = source
    if split is not None:  # one example per held-out song (no repeats), rendered as in training
        if render.trigger:
            held = [replace(s, custom_tag="", tag_position="") for s in held]
        examples, too_long = data.build_examples(tokenizer, held, plan.max_len, render)
        plan.held_out = list({id(e): e for e in examples}.values())
        plan.skipped.extend(too_long)
        plan.holdout = split.to_dict()
    if not plan.examples:
        reasons = ", ".join(f"{s.song_id}: {s.reason}" for s in plan.skipped[:5]) or "no rows"
        raise InputError(f"no trainable songs in {storage.url_of(spec.codes_key)} ({reasons})")
    return plan


def _check_run_trigger(spec: LmTrainSpec, storage: Storage, songs: list[data.LmSong]) -> None:
    """A run trigger (`spec.trigger`) replaces each row's tag in the caption rendered at train
    time, so it reaches the prompts the adapter learns from; a row whose writer baked its tag
    into the caption (`trigger_applied`) keeps that tag, so another trigger would only be
    stamped into the export's metadata: refused."""
    if not spec.trigger:
        return
    baked = [s.song_id for s in songs if s.trigger_applied and s.custom_tag != spec.trigger]
    if baked:
        raise InputError(
            f"--trigger {spec.trigger!r}: {len(baked)} songs of {storage.url_of(spec.codes_key)} "
            f"carry their own tag baked into the caption ({', '.join(baked[:3])}), which a run "
            "trigger cannot replace; leave --trigger out, or write their codes without it"
        )


def read_dims(lm_dir: str | Path) -> lm_vram.LmDims:
    """The LM's shape numbers from its folder's config.json (no weights read)."""
    config = json.loads((Path(lm_dir) / "config.json").read_text(encoding="utf-8"))
    return lm_vram.LmDims.from_config(config)


def memory_plan(spec: LmTrainSpec, storage: Storage) -> lm_vram.VramEstimate:
    """The least memory one training worker needs (every layer checkpointed), computed without
    loading weights: what the Ray job asks for. `auto` compile counts as compiled (the workers are
    GPUs), so the rows are sized with the padding they will get."""
    dims = read_dims(spec.lm_dir)
    pad = row_multiple(spec.engine, spec.engine.compile != "off")
    tokenizer = load_tokenizer(spec.lm_dir)
    plan = plan_data(spec, storage, tokenizer, dims, spec.options, None, pad)
    fit = _fit_kwargs(spec.options, spec.engine, dims)
    return lm_vram.estimate_vram(
        dims,
        plan.step_tokens,
        targets=plan.step_targets,
        checkpointed_layers=dims.layers,
        **fit,
    )


def setup_lm(
    spec: LmTrainSpec,
    storage: Storage,
    *,
    rank: int = 0,
    world: int = 1,
    device: torch.device | None = None,
    events: EventLog | None = None,
    log_start: bool = True,
) -> LmSetup:
    """The run of `spec`, ready to train. With `log_start` it logs one line naming its warm
    start (or that it starts fresh); callers that load a checkpoint into it (whose own line
    names it), or whose driver logged the line already (Ray), pass False."""
    from hotstep_ray.models.text_models import load_lm

    engine = spec.engine
    device = device or _device(engine)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    mode = compile_mode(engine.compile, device)  # refuse before anything loads
    pad = row_multiple(engine, mode != "off")
    budget = _budget(engine, device)
    dims = read_dims(spec.lm_dir)
    size = lm_size_of(dims, spec.options.lm_size)
    # Where to start from, and the identity it implies: refused before the weights load.
    start = resolve_start(spec, storage, dims, size)
    options, identity, init, init_from = start.options, start.identity, start.init, start.init_from
    adapter_spec = AdapterSpec.from_options(options)
    tokenizer = load_tokenizer(spec.lm_dir)
    model = load_lm(spec.lm_dir, device=device, dtype=dtype)
    base = layout.lm_adapter_base(size)
    run_key = spec.run_key or layout.new_run_dir(storage, base, spec.artist)

    # Data, then the memory plan for the largest micro-batch.
    plan = plan_data(spec, storage, tokenizer, dims, options, budget, pad)
    if mode != "off" and not engine.pad_multiple:  # compiled, width multiple left to us
        pad = data.pick_pad_multiple(plan.examples, plan.groups, options.epochs)
        plan.step_tokens = data.largest_step(plan.examples, plan.groups, pad)
    eager_note = ""
    if engine.compile == "auto" and mode != "off":  # an explicit mode is kept
        if not data.compile_pays(plan.examples, plan.groups, options.epochs, pad):
            mode, pad = "off", row_multiple(engine, False)
            plan.step_tokens = data.largest_step(plan.examples, plan.groups, pad)
            eager_note = (
                f"{options.epochs} epochs of {len(plan.groups)} micro-batches: training eagerly, "
                "compiling would take longer than it saves (--compile default compiles anyway)"
            )
    vram = _checkpoint_layers(
        engine,
        dims,
        budget,
        tokens=plan.step_tokens,
        targets=plan.step_targets,
        **_fit_kwargs(options, engine, dims),
    )

    mode = compiling.with_graphs(engine.compile, mode, vram.checkpointed_layers, ddp=world > 1)

    # Adapter (seeded init), optional start weights, runtime switches.
    torch.manual_seed(options.seed)
    adapters.inject(model, adapter_spec)
    if init is not None:
        export.load_exported(model, *init)
    lm_loss.set_attention(model, engine.attention)
    lm_loss.set_layer_checkpointing(model.model.layers, vram.checkpointed_layers)
    if device.type == "cuda":  # bf16 activations meet fp32 adapter weights under autocast
        for _, layer in adapters.tuner_layers(model):
            layer.cast_input_dtype_enabled = False
    if mode != "off":  # after the switches above: the graphs are traced with them
        compiling.set_activation_budget(engine.activation_budget)
        lm_loss.compile_layers(model.model.layers, mode)
    # CUDA graphs: gradients outside the graph pool (`compiling.stable_grads`), as views of one
    # flat buffer (`FlatGrads`: the clip and the zeroing are then a few kernels, not lists of
    # ~500 LoRA tensors). Graphs run on one GPU only (`compiling.with_graphs`), so no DDP here.
    grad_flats = None
    if mode == "reduce-overhead":
        grad_flats = flat_grads.FlatGrads([p for _, p in adapters.trainable_parameters(model)])
    model.train()
    module: nn.Module = lm_loss.LmLossModule(model, engine.ce_chunk)
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel

        ids = [device.index] if device.type == "cuda" else None
        module = DistributedDataParallel(module, device_ids=ids)

    optimizer = build_optimizer(
        adapters.trainable_parameters(model),
        kind=options.optimizer,
        lr=options.learning_rate,
        weight_decay=options.weight_decay,
        muon_lr_scale=options.muon_lr_scale,
        muon_ns_steps=options.muon_ns_steps,
        muon_ns_precision=options.muon_ns_precision,
    )
    per_rank = math.ceil(len(plan.groups) / world)
    schedule = LrSchedule.from_counts(
        per_rank, options.epochs, 1, options.grad_accum, options.warmup_ratio
    )
    setup = LmSetup(
        spec=spec,
        options=options,
        storage=storage,
        device=device,
        dtype=dtype,
        model=model,
        module=module,
        tokenizer=tokenizer,
        dims=dims,
        lm_size=size,
        run_key=run_key,
        examples=plan.examples,
        skipped=plan.skipped,
        groups=plan.groups,
        optimizer=optimizer,
        schedule=schedule,
        vram=vram,
        max_len=plan.max_len,
        max_len_source=plan.max_len_source,
        fingerprint=checkpoint.model_fingerprint(model),
        identity=identity,
        trigger=plan.trigger,
        trigger_position=plan.trigger_position,
        budget=budget,
        compile=mode,
        pad_multiple=pad,
        init_from=init_from,
        held_out=plan.held_out,
        holdout=plan.holdout,
        rank=rank,
        world=world,
        events=events,
        grad_flats=grad_flats,
    )
    if log_start:
        setup.log(start.line)
    if eager_note:
        setup.log(eager_note)
    _announce(setup, optimizer.split_summary())
    return setup


def _announce(setup: LmSetup, split: str) -> None:
    real, padded = data.padding_stats(setup.examples, setup.groups, setup.pad_multiple)
    setup.emit("vram", **setup.vram.to_dict(), budget_mb=_budget_mb(setup))
    setup.emit(
        "data",
        samples=len(setup.examples),
        skipped=len(setup.skipped),
        skipped_long=sum(s.reason == "too-long" for s in setup.skipped),
        max_len=setup.max_len,
        batches=len(setup.groups),
        steps_per_epoch=setup.schedule.steps_per_epoch,
        total_steps=setup.schedule.total_steps,
        warmup_steps=setup.schedule.warmup_steps,
        trained_tokens=sum(e.n_targets for e in setup.examples),
        pad_pct=round(100 * padded / max(real + padded, 1), 2),
    )
    for song in setup.skipped:
        setup.log(f"skipped {song.song_id}: {song.reason} {song.detail}".rstrip(), "warn")
    if setup.holdout is not None:
        held = ", ".join(setup.holdout["held_out"])
        setup.log(f"held out of training ({len(setup.held_out)} rendered): {held}")
    setup.log(
        f"LM {setup.lm_size} on {setup.device} ({setup.dtype}); {setup.identity.describe()}; "
        f"optimizer {split}; {setup.vram.checkpointed_layers}/{setup.dims.layers} layers "
        f"checkpointed, est. peak {setup.vram.total / lm_vram.GIB:.1f} GiB"
    )
    if setup.compile != "off":
        shapes = {
            (len(g), data.row_width(setup.examples, g, setup.pad_multiple)) for g in setup.groups
        }
        setup.log(
            f"torch.compile ({setup.compile}) of the {setup.dims.layers} decoder layers, rows "
            f"padded to multiples of {setup.pad_multiple} tokens: the first step of each of the "
            f"{len(shapes)} [rows, width] shapes of this run compiles, then steps run compiled"
        )


def _budget_mb(setup: LmSetup) -> int:
    return round(setup.budget / lm_vram.MIB) if setup.budget else 0


# -- train ---------------------------------------------------------------------------------------
@dataclass
class LmTrainState:
    epoch: int = 0  # last completed epoch
    step: int = 0  # optimizer steps taken
    history: list[dict[str, Any]] = field(default_factory=list)
    best_loss: float = math.inf
    best_epoch: int = 0
    saved_epoch: int = 0
    saved_loss: float = math.nan
    saved_reason: str = ""
    saved_state: dict[str, torch.Tensor] = field(default_factory=dict)  # the adapter to export
    stop_reason: str = ""  # target | epochs | non_finite | "" (interrupted)
    target_epoch: int = 0
    milestones: list[dict[str, Any]] = field(default_factory=list)
    elapsed_ms: float = 0.0
    holdout: list[dict[str, Any]] = field(default_factory=list)  # [{epoch, loss}] held-out loss
    stop_rule: StopRule | None = None
    tracker: MilestoneTracker | None = None

    @property
    def finished(self) -> bool:
        return bool(self.stop_reason)


def new_state(setup: LmSetup) -> LmTrainState:
    options = setup.options
    return LmTrainState(
        stop_rule=StopRule(options.epochs, options.target_loss),
        tracker=MilestoneTracker(step=options.milestone_step, keep=options.milestone_keep),
    )


def _autocast(setup: LmSetup) -> contextlib.AbstractContextManager:
    if setup.cuda:
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _all_reduce_sum(setup: LmSetup, values: torch.Tensor) -> torch.Tensor:
    if setup.world > 1:
        import torch.distributed as dist

        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values


def _windows(groups: list[data.Group], size: int) -> Iterator[list[data.Group]]:
    for start in range(0, len(groups), size):
        yield groups[start : start + size]


def run_epoch(setup: LmSetup, state: LmTrainState, epoch: int) -> dict[str, Any]:
    """One epoch of optimizer steps; returns its log row {epoch, loss, lr, grad_norm, ms}."""
    options, engine = setup.options, setup.spec.engine
    started = time.perf_counter()
    order = data.epoch_groups(setup.groups, epoch, options.seed, options.order)
    mine = data.shard_groups(order, setup.rank, setup.world)
    params = [p for _, p in adapters.trainable_parameters(setup.model)]
    clip = options.grad_clip if options.grad_clip > 0 else math.inf
    loss_sum = torch.zeros((), device=setup.device)  # Σ per-song mean CE
    songs = 0
    norms: list[torch.Tensor] = []
    factor = 0.0
    keep_grads = setup.compile == "reduce-overhead"  # see `compiling.stable_grads`
    for window in _windows(mine, options.grad_accum):
        if setup.compile == "reduce-overhead":  # a new step: the last step's graph outputs are dead
            torch.compiler.cudagraph_mark_step_begin()
        in_window = sum(len(row) for group in window for row in group)
        window_loss = torch.zeros((), device=setup.device)
        for j, group in enumerate(window):
            batch = data.collate(setup.examples, group, pad_multiple=setup.pad_multiple)
            batch = batch.to(setup.device)
            last = j == len(window) - 1
            sync = contextlib.nullcontext() if last or setup.world == 1 else setup.module.no_sync()
            with sync:
                with _autocast(setup):
                    song_losses = lm_loss.batch_loss(setup.module, batch)
                (song_losses / in_window).backward()
            window_loss += song_losses.detach()
            songs += batch.n_songs
        flats = flat_grads.live(setup.grad_flats if keep_grads else None)
        norms.append(flat_grads.clip_grads(params, clip, flats))
        if not torch.isfinite(norms[-1]):  # stop before a NaN/Inf step can reach the adapter
            setup.optimizer.zero_grad(set_to_none=not keep_grads)
            setup.log(f"non-finite gradient at step {state.step}; stopping", "error")
            return {"epoch": epoch, "loss": math.nan, "lr": 0.0, "grad_norm": math.nan, "ms": 0.0}
        factor = setup.schedule.apply(setup.optimizer, state.step)
        setup.optimizer.step()
        flat_grads.zero_grads(setup.optimizer, flats, set_to_none=not keep_grads)
        loss_sum += window_loss
        state.step += 1
        if state.step % engine.log_every == 0:
            setup.emit(
                "step",
                epoch=epoch,
                step=state.step,
                total_steps=setup.schedule.total_steps,
                loss=(window_loss / in_window).item(),
                lr=options.learning_rate * factor,
                grad_norm=norms[-1].item(),
            )
    totals = _all_reduce_sum(
        setup, torch.stack([loss_sum, torch.tensor(float(songs), device=setup.device)])
    )
    grad_norm = torch.stack(norms).float().mean().item() if norms else math.nan
    return {
        "epoch": epoch,
        "loss": (totals[0] / totals[1]).item(),
        "lr": options.learning_rate * factor,
        "grad_norm": grad_norm,
        "ms": (time.perf_counter() - started) * 1000,
    }


def _snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.cpu() for k, v in adapters.adapter_state_dict(model).items()}


def end_epoch(setup: LmSetup, state: LmTrainState, row: dict[str, Any]) -> None:
    """Book-keeping after an epoch: best/target adapter, stop decision, milestones, events."""
    epoch, loss = row["epoch"], row["loss"]
    state.history.append(row)
    state.epoch = epoch
    state.elapsed_ms += row["ms"]
    # the best is an adapter training changed: never one only lr(0) = 0 steps touched
    best = math.isfinite(loss) and loss < state.best_loss and setup.schedule.moved(state.step)
    if best:
        state.best_loss, state.best_epoch = loss, epoch
    decision = state.stop_rule.end_epoch(epoch, loss)
    if decision.reason == "target":
        state.target_epoch = epoch
    if best or decision.reason == "target":  # keep the best epoch, or the one that hit the target
        state.saved_state = _snapshot(setup.model)
        state.saved_epoch, state.saved_loss = epoch, loss
        state.saved_reason = "target" if decision.reason == "target" else "best"
    if decision.stop:
        state.stop_reason = decision.reason or "epochs"
    _milestone(setup, state, epoch, loss)
    remaining = setup.options.epochs - epoch
    setup.emit(
        "epoch",
        epoch=epoch,
        epochs=setup.options.epochs,
        loss=loss,
        lr=row["lr"],
        grad_norm=row["grad_norm"],
        step_ms=row["ms"] / max(setup.schedule.steps_per_epoch, 1),
        eta_ms=remaining * state.elapsed_ms / max(len(state.history), 1),
        best=best,
        moving_average=decision.moving_average,
    )


def _milestone(setup: LmSetup, state: LmTrainState, epoch: int, loss: float) -> None:
    decision = state.tracker.observe(epoch, loss)
    if not setup.is_main or "export" not in setup.options.stages:
        return
    for old in decision.evict:
        setup.storage.delete(f"{setup.run_key}/{MILESTONE_DIR}/{old.name}", recursive=True)
        state.milestones = [m for m in state.milestones if m["name"] != old.name]
    if decision.save is not None:
        key = f"{setup.run_key}/{MILESTONE_DIR}/{decision.save.name}"
        files = export_adapter(setup, key)
        entry = {"name": decision.save.name, "loss": loss, "epoch": epoch, "path": key}
        state.milestones.append(entry)
        size = sum(setup.storage.size(f) for f in files)
        setup.emit("milestone", epoch=epoch, loss=loss, path=key, bytes=size)


EpochHook = Callable[[LmSetup, LmTrainState], None]


def train_lm(
    setup: LmSetup,
    state: LmTrainState | None = None,
    *,
    stop_after_epoch: int = 0,
    on_epoch: EpochHook | None = None,
) -> LmTrainState:
    """Train from `state` (fresh by default) until the stop rule says so, or through epoch
    `stop_after_epoch` (> 0: an interruption, for tests and preemption)."""
    state = state or new_state(setup)
    evaluator = holdout_evaluator(setup, state)
    while not state.finished:
        epoch = state.epoch + 1
        end_epoch(setup, state, run_epoch(setup, state, epoch))
        if evaluator is not None:
            with compiling.eager(setup.compile):
                loss = evaluator(epoch, setup.model)
            state.holdout.append({"epoch": epoch, "loss": loss})
        if on_epoch is not None:
            on_epoch(setup, state)
        if stop_after_epoch and epoch >= stop_after_epoch and not state.finished:
            break
    return state


def holdout_evaluator(setup: LmSetup, state: LmTrainState) -> holdout.HoldoutEval | None:
    """The per-epoch held-out loss (`holdout.HoldoutEval`, `eval` events) on the main rank when
    songs are held out; None otherwise. Its best continues a resumed run's."""
    if not setup.held_out or not setup.is_main:
        return None
    evaluator = holdout.HoldoutEval(
        holdout.lm_song_losses(setup.held_out, setup.spec.engine.ce_chunk),
        songs=len(setup.held_out),
        events=setup.events,
    )
    finite = [row["loss"] for row in state.holdout if math.isfinite(row["loss"])]
    evaluator.best = min(finite, default=math.inf)
    return evaluator


# -- resumable checkpoints -----------------------------------------------------------------------
def save_state(setup: LmSetup, state: LmTrainState, storage: Storage, key: str) -> str:
    """Checkpoint adapter, optimizer, RNG and the loop's state at `key` (main rank only)."""
    extra = {
        "history": state.history,
        "best": [state.best_loss, state.best_epoch],
        "saved": [state.saved_epoch, state.saved_loss, state.saved_reason, state.target_epoch],
        "saved_state": state.saved_state,
        "stop_reason": state.stop_reason,
        "milestones": state.milestones,
        "elapsed_ms": state.elapsed_ms,
        "holdout": state.holdout,
        "stop_rule": state.stop_rule.state_dict(),
        "tracker": state.tracker.state_dict(),
    }
    return checkpoint.save_checkpoint(
        storage,
        key,
        model=setup.model,
        optimizer=setup.optimizer,
        step=state.step,
        epoch=state.epoch,
        config={
            "options": setup.options.model_dump(mode="json"),
            "identity": setup.identity.__dict__,
            # what the prompts were rendered with: a resumed run renders them the same way
            "trigger": setup.spec.trigger,
            "trigger_position": setup.spec.trigger_position,
            "job": setup.spec.job_id,  # tells a live run from a killed one (`adapters list`)
        },
        extra=extra,
        fingerprint=setup.fingerprint,
    )


def load_state(setup: LmSetup, storage: Storage, key: str) -> LmTrainState:
    """The loop state of a checkpoint, with adapter, optimizer and RNG restored into `setup`."""
    manifest = checkpoint.read_manifest(storage, key)
    theirs = AdapterIdentity(**manifest["config"].get("identity", {}))
    check_identity(theirs, setup.identity, storage.url_of(key))
    restored = checkpoint.load_checkpoint(
        storage, key, model=setup.model, optimizer=setup.optimizer, fingerprint=setup.fingerprint
    )
    extra = restored.extra
    state = new_state(setup)
    state.epoch, state.step = restored.epoch, restored.step
    state.history = list(extra["history"])
    state.best_loss, state.best_epoch = extra["best"]
    state.saved_epoch, state.saved_loss, state.saved_reason, state.target_epoch = extra["saved"]
    state.saved_state = dict(extra["saved_state"])
    state.stop_reason = extra["stop_reason"]
    state.milestones = list(extra["milestones"])
    state.elapsed_ms = float(extra["elapsed_ms"])
    state.holdout = list(extra.get("holdout", []))
    state.stop_rule.load_state_dict(extra["stop_rule"])
    state.tracker.load_state_dict(extra["tracker"])
    return state


# -- save ----------------------------------------------------------------------------------------
def export_adapter(setup: LmSetup, key: str) -> list[str]:
    """The model's current adapter as PEFT (LoRA) or LyCORIS (LoKR), BF16, trigger metadata."""
    meta = {
        "hot_step_lm_trainer": "v1",
        "hotstep_ray.lm_size": setup.lm_size,
        "hotstep_ray.lm_hidden": setup.dims.hidden,
        "hotstep_ray.lm_layers": setup.dims.layers,
    }
    kwargs: dict[str, Any] = {
        "trigger": setup.trigger or None,
        "trigger_position": setup.trigger_position,
        "metadata": meta,
    }
    if setup.identity.kind == "lora":
        kwargs["base_model_name_or_path"] = setup.spec.lm_dir
    else:
        kwargs["metadata"] = {**meta, "hot_step_lm_lokr": "v1"}
        kwargs["extra_config"] = {"target_mlp": True}
    return export.export_adapter(setup.model, setup.storage, key, **kwargs)


@dataclass(frozen=True)
class LmRunResult:
    run_key: str  # "" when only the extract stage ran
    files: list[str]
    log: dict[str, Any]
    finished: bool
    # the calibration summary, filled in by `calibration.after_train` when `calibrate` ran
    calibration: dict[str, Any] | None = None


def train_log(setup: LmSetup, state: LmTrainState, peak_mb: int = 0) -> dict[str, Any]:
    """`lm_train_log.json`: the resolved config, per-epoch losses, what was kept and why."""
    options, engine = setup.options, setup.spec.engine
    config = {
        **options.model_dump(mode="json"),
        "lm_size": setup.lm_size,
        "lm_path": setup.spec.lm_dir,
        "lm": setup.dims.to_dict(),
        "codes": setup.storage.url_of(setup.spec.codes_key),
        "samples": len(setup.examples),
        "skipped_long": sum(s.reason == "too-long" for s in setup.skipped),
        "max_len": setup.max_len,
        "max_len_source": setup.max_len_source,
        "trigger": setup.trigger,
        "trigger_position": setup.trigger_position,
        "engine": engine.model_dump(mode="json"),
        "compile": setup.compile,
        "pad_multiple": setup.pad_multiple,
        "checkpointed_layers": setup.vram.checkpointed_layers,
        "device": str(setup.device),
        "dtype": str(setup.dtype).removeprefix("torch."),
        "world_size": setup.world,
        "identity": setup.identity.__dict__,
    }
    if setup.init_from:
        config.update(init_adapter=setup.init_from["url"], init_from_loss=setup.init_from["loss"])
    log: dict[str, Any] = {
        "format": LOG_FORMAT,
        "producer": export.PRODUCER,
        "created_at": datetime.now().astimezone().isoformat(timespec="seconds"),
        "config": config,
        "epochs": state.history,
        "final_loss": state.history[-1]["loss"] if state.history else None,
        "best_loss": state.best_loss if state.best_epoch else None,
        "best_epoch": state.best_epoch,
        "saved_loss": state.saved_loss if state.saved_epoch else None,
        "saved_epoch": state.saved_epoch,
        "saved_reason": state.saved_reason,
        "epochs_run": state.epoch,
        "stop_reason": state.stop_reason,
        "milestones": state.milestones,
        "skipped": [s.to_dict() for s in setup.skipped],
        "vram": {**setup.vram.to_dict(), "peak_mb": peak_mb, "budget_mb": _budget_mb(setup)},
        "total_ms": round(state.elapsed_ms),
    }
    if setup.holdout is not None:
        log["holdout"] = {**setup.holdout, "songs": len(setup.held_out), "epochs": state.holdout}
    if state.target_epoch:
        target = next(r for r in state.history if r["epoch"] == state.target_epoch)
        log["target_loss_stop"] = {"epoch": state.target_epoch, "loss": target["loss"]}
    return log


def _peak_mb(setup: LmSetup) -> int:
    if not setup.cuda:
        return 0
    return round(torch.cuda.max_memory_allocated(setup.device) / lm_vram.MIB)


def save_lm(setup: LmSetup, state: LmTrainState) -> LmRunResult:
    """Export the kept adapter and write the training log into the run folder (main rank)."""
    if not state.saved_state:
        if not any(math.isfinite(row["loss"]) for row in state.history):
            raise InputError("training produced no finite epoch loss; nothing to export")
        # Every step ran at learning rate 0: export what there is, and say it is unchanged.
        setup.log(
            f"the adapter never changed: all {state.step} steps ran at learning rate 0 (the "
            "schedule starts at 0); train more steps for a usable adapter",
            "warn",
        )
        state.saved_state = _snapshot(setup.model)
        state.saved_epoch, state.saved_reason = state.epoch, "final"
        state.saved_loss = state.history[-1]["loss"]
    files: list[str] = []
    if "export" in setup.options.stages:
        live = _snapshot(setup.model)
        adapters.load_adapter_state(setup.model, state.saved_state)
        files = export_adapter(setup, setup.run_key)
        adapters.load_adapter_state(setup.model, live)
        setup.log(
            f"exported the {state.saved_reason} adapter (epoch {state.saved_epoch}, loss "
            f"{state.saved_loss:.4f}) to {setup.storage.url_of(setup.run_key)}"
        )
    log = train_log(setup, state, _peak_mb(setup))
    log_key = f"{setup.run_key}/{LOG_FILE}"
    setup.storage.write_json(log_key, log)
    return LmRunResult(setup.run_key, [*files, log_key], log, state.finished)


# -- the whole run -------------------------------------------------------------------------------
def checkpoint_key(run_key: str) -> str:
    return f"{run_key}/{CHECKPOINT_DIR}"


def run_extract(
    spec: LmTrainSpec, storage: Storage, events: EventLog | None = None
) -> data.ExtractResult:
    """The `extract` stage: refresh `spec.codes_key` from the tensor cache it sits in."""
    tensors_dir, _, name = spec.codes_key.rpartition("/")
    if name != data.CODES_FILE:
        raise InputError(f"the extract stage writes {data.CODES_FILE}; codes_key is {name!r}")
    log = events.log if events is not None else None
    return data.extract_codes(storage, tensors_dir, overwrite=spec.options.overwrite, log=log)


def extract_only_result(extracted: data.ExtractResult) -> LmRunResult:
    """The result of a job whose only stage was `extract`: no run folder, the codes file."""
    summary = {k: v for k, v in extracted.__dict__.items() if k != "key"}
    return LmRunResult("", [extracted.key], {"extract": summary}, True)


# The train-lm flag of each option whose flag is not its field's name.
_FLAGS = {"learning_rate": "--lr", "lm_size": "--size"}


def _flag(name: str, value: Any) -> str:
    """An option as the train-lm command line writes it: `--epochs 10`, `--no-loss-on-cot`."""
    flag = _FLAGS.get(name, "--" + name.replace("_", "-"))
    if isinstance(value, bool):
        return flag if value else f"--no-{flag[2:]}"
    if isinstance(value, list):
        return f"{flag} {','.join(map(str, value))}"
    return f"{flag} {value!r}" if value == "" else f"{flag} {value}"


def _shown(name: str, value: Any) -> str:
    """The checkpoint's value, as the line that ignores a given one names it."""
    if isinstance(value, bool):
        return _flag(name, value)
    return repr(value) if value == "" else str(value)


def options_from_checkpoint(
    spec: LmTrainSpec, storage: Storage, events: EventLog | None = None
) -> LmTrainSpec:
    """`spec` with the options the checkpoint in `spec.run_key` was trained with, and its
    trigger, keeping this request's stages and calibration choices. The rule on resume: the run
    continues exactly as it was started (identity, data split, schedule and epoch count are one
    plan; a resumed run equals an uninterrupted one), so any other option given now is ignored,
    and each one that differs gets one warning line (`--epochs 10 ignored: the run continues
    with its own 40`). The weights come from the checkpoint, so no init adapter is loaded."""
    key = checkpoint_key(spec.run_key)
    if not storage.exists(f"{key}/{checkpoint.MANIFEST}"):
        raise InputError(
            f"{storage.url_of(spec.run_key)}: no training checkpoint to continue or export "
            "(a run trained with the export stage has none left: it is already exported)"
        )
    config = checkpoint.read_manifest(storage, key)["config"]
    saved = config.get("options") or {}
    keep = {"stages", "calibrate", "calibrate_repoint"}
    merged = {k: v for k, v in saved.items() if k not in keep}
    merged.update({k: getattr(spec.options, k) for k in keep}, init_adapter="")
    options = TrainLmOptions(**merged)
    ignored = []
    # the init adapter is moot (the checkpoint holds the weights), the adapter name a label the
    # CLI always fills in (the run folder names the run): neither is worth a line
    for name in sorted(spec.options.model_fields_set - keep - {"init_adapter", "adapter_name"}):
        given, own = getattr(spec.options, name), getattr(options, name)
        if given != own:
            ignored.append(
                f"{_flag(name, given)} ignored: the run continues with its own {_shown(name, own)}"
            )
    update: dict[str, Any] = {"options": options}
    for name, flag in (("trigger", "--trigger"), ("trigger_position", "--trigger-position")):
        if name not in config:  # a checkpoint written before the trigger was kept in it
            continue
        given, own = getattr(spec, name), config[name]
        if name in spec.model_fields_set and given != own:
            ignored.append(f"{flag} {given!r} ignored: the run continues with its own {own!r}")
        update[name] = own
    if events is not None:
        for line in ignored:
            events.log(line, "warn")
    return spec.model_copy(update=update)


def _train_and_save(
    spec: LmTrainSpec,
    storage: Storage,
    events: EventLog | None,
    resume: bool,
    stop_after_epoch: int,
) -> LmRunResult:
    """The train and/or export stages in this process."""
    stages = spec.options.stages
    from_checkpoint = resume or "train" not in stages
    if from_checkpoint:
        if not spec.run_key:
            what = "resume" if resume else "the export stage without train"
            raise InputError(f"{what} needs the run folder (run_key) of the trained run")
        spec = options_from_checkpoint(spec, storage, events)
    setup = setup_lm(spec, storage, events=events, log_start=not from_checkpoint)
    ckpt_key = checkpoint_key(setup.run_key)
    state = load_state(setup, storage, ckpt_key) if from_checkpoint else None
    if "train" in stages:
        every = spec.engine.checkpoint_every

        def keep(setup: LmSetup, state: LmTrainState) -> None:
            due = every and (state.epoch % every == 0 or state.epoch == stop_after_epoch)
            if due or state.finished:  # the finished state is what a later export reads
                save_state(setup, state, storage, ckpt_key)

        state = train_lm(setup, state, stop_after_epoch=stop_after_epoch, on_epoch=keep)
    assert state is not None
    if not state.finished:
        if "train" not in stages:
            raise InputError(
                f"{storage.url_of(setup.run_key)} stopped at epoch {state.epoch} before the "
                "end of training; resume it before exporting"
            )
        return LmRunResult(setup.run_key, [], train_log(setup, state), False)
    result = save_lm(setup, state)
    if "export" in stages:
        storage.delete(ckpt_key, recursive=True)
    return result


def run_lm_training(
    spec: LmTrainSpec,
    storage: Storage,
    *,
    events: EventLog | None = None,
    resume: bool = False,
    stop_after_epoch: int = 0,
) -> LmRunResult:
    """The stages of `spec.options.stages` in this process (module docstring). `resume=True`
    continues the checkpoint in `spec.run_key`; `stop_after_epoch` interrupts after that epoch
    (checkpoint kept, nothing exported, `finished=False`)."""
    if resume and not spec.run_key:
        raise InputError("resume needs the run folder (run_key) of the interrupted run")
    if spec.options.calibrate:  # composed above the trainer (module docstring)
        raise InputError(
            "this trainer does not calibrate: calibration.after_train.run_lm_then_calibrate "
            "trains, then calibrates"
        )
    stages = spec.options.stages
    if "extract" in stages:
        extracted = run_extract(spec, storage, events)
        if "train" not in stages and "export" not in stages:
            return extract_only_result(extracted)
    return _train_and_save(spec, storage, events, resume, stop_after_epoch)
