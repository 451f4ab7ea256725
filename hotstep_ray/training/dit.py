"""DiT adapter training, the recipe: `setup(...)` -> `train(run)` -> `save(run)`.

Plain Python: tests run it on the CPU with the tiny DiT; `ray_dit.py` runs the same functions in
each Ray Train worker (one GPU each, gradients averaged across workers).

setup   read the tensor cache; load the DiT (bf16 on CUDA, fp32 on CPU) keeping only the
        transformer and the null condition on the device; size the run to the GPU (`dit_vram.fit`:
        crop, then checkpointing, then batch); inject the LoRA/LoKR adapter (fp32 master weights)
        into the top `layers`; hybrid Muon/AdamW; the LR schedule (lr(0)=0, warmup max(50 steps,
        5 %) capped at half the run, cosine to 10 %); the stop rule and milestones; resume from
        a checkpoint when asked.
train   per optimizer step: one seeded stream (seed, step, rank) draws every crop, timestep, CFG
        coin and noise of the window, so a resumed run redraws exactly what an uninterrupted one
        would; `grad_accum` micro-batches weighted by their sample share; gradient all-reduce
        (several workers); global-norm clip; LR; optimizer step. A non-finite loss or gradient norm
        stops the run before the step, so the last checkpoint and the exported adapter stay good.
        Per epoch: 5-epoch moving average (target stop), milestones, best export, the log.
save    PEFT folder (LoRA) or LyCORIS `lokr_weights.safetensors` (LoKR), BF16, official module
        names, trigger in `__metadata__`, under `adapters/dit-<shorthand>/<artist>/<run>/` next to
        `dit_train_log.json`; exported when the 5-epoch average improves (at most once per
        `export_interval_s`, the last best always) or the target is hit. Resumable checkpoints go
        to `<run>/checkpoint/` (or through `ray.train.report`), milestones to `<run>/milestones/`.

Attention: the DiT's SDPA with the dense band mask on sliding layers, padded keys masked by the
models layer's processor. `prepare` builds a run around an already loaded model and cache (the
GPU bench uses it with random full-size models).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint as activation_checkpoint

from hotstep_ray.core import layout
from hotstep_ray.core.contracts import LATENT_HZ, TrainDitOptions, schedule_steps
from hotstep_ray.core.errors import InputError
from hotstep_ray.core.events import EventLog, MetricEvent
from hotstep_ray.core.storage import Storage
from hotstep_ray.models.acestep_dit import AceStepModels, load_acestep_dit
from hotstep_ray.models.acestep_ops import TrainBatch
from hotstep_ray.training import (
    adapters,
    compiling,
    dit_data,
    dit_loss,
    dit_vram,
    export,
)
from hotstep_ray.training.accumulate import micro_batch_weights
from hotstep_ray.training.adapters import AdapterSpec
from hotstep_ray.training.checkpoint import load_checkpoint, model_fingerprint, save_checkpoint
from hotstep_ray.training.dit_data import resolve_dit_folder  # noqa: F401  (re-exported)
from hotstep_ray.training.dit_log import (  # noqa: F401  (FORMAT, runtime_info: re-exported)
    FORMAT,
    LOG_FILE,
    PRODUCER,
    resolved_config,
    runtime_info,
    write_log,
)
from hotstep_ray.training.engine import (  # noqa: F401  (compile_mode, graph_mode: re-exported)
    GRAPH_MODES,
    StepEngine,
    StepWork,
    compile_mode,
    graph_mode,
)
from hotstep_ray.training.optim import HybridOptimizer, build_optimizer
from hotstep_ray.training.schedule import LrSchedule, MilestoneTracker, StopRule
from hotstep_ray.training.speed import SpeedOptions

CHECKPOINT_DIR = "checkpoint"
MILESTONE_DIR = "milestones"
MA_WINDOW = 5


@dataclass
class DitSettings:
    """Run settings that are not part of the `TrainDitOptions` contract."""

    dit_folder: str | None = None  # explicit DiT checkpoint folder (else from the cache's meta)
    checkpoints_dir: str | None = None  # where DiT folders live (official or diffusers layout)
    artist: str = ""  # adapter folder name; "" = options.adapter_name or the dataset slug
    trigger: str | None = None  # None = the variant's preprocess_meta custom_tag
    trigger_position: str | None = None  # None = the cache's tag_position, else prepend
    lora_dropout: float = 0.0
    zero_groups: tuple[str, ...] = ()  # projection groups exported as zeros (e.g. "q", "k")
    milestone_every_epochs: int = 0  # also a milestone every N epochs (0 = off)
    export_interval_s: float = 60.0  # at most one best-export per interval (the last one always)
    checkpoint_interval_s: float = 300.0  # epoch-end checkpoints at most this often
    checkpoint_every_steps: int = 0  # also checkpoint every N optimizer steps (0 = off)
    step_event_interval_s: float = 1.0  # rate limit of per-step metric events
    vram_budget_gb: float | None = None  # None: CUDA free memory - reserve; CPU unlimited
    device: str | None = None  # None: cuda if available else cpu
    window_rule: str = "sdpa"  # sliding-window convention (models.acestep_wrappers)
    # Run an optimizer window's micro-batches as fewer, larger ones when memory allows
    # (`dit_vram.fold_factor`; same draws, same loss): auto = on CUDA, off on the CPU.
    fold_accum: str = "auto"  # FOLD_MODES
    run_key: str | None = None  # fixed run folder (the Ray driver picks it for every worker)
    resume: str | None = None  # storage key of a checkpoint folder to continue from
    rank: int = 0
    world_size: int = 1
    speed: SpeedOptions = field(default_factory=SpeedOptions)  # adapter forwards, flat gradients

    def __post_init__(self) -> None:
        if isinstance(self.speed, dict):  # `ray_dit` ships the settings as `asdict`'s dict
            self.speed = SpeedOptions(**self.speed)


FOLD_MODES = ("auto", "on", "off")


@dataclass
class TrainState:
    """Everything the loop needs to continue exactly where it stopped (saved in checkpoints)."""

    epoch: int = 1  # current epoch, 1-based
    window: int = 0  # next optimizer window inside the epoch
    step: int = 0  # optimizer steps done
    epoch_loss: float = 0.0  # Σ loss·samples over the epoch so far (this rank)
    epoch_raw: float = 0.0
    epoch_samples: int = 0
    epoch_frames: int = 0
    epoch_grad_norms: list[float] = field(default_factory=list)
    epoch_ms: float = 0.0
    best_ma5: float = math.inf
    best_epoch: int = 0
    saved_ma5: float | None = None
    saved_epoch: int = 0
    saved_reason: str = ""
    stop_reason: str = ""
    target_stop: dict[str, Any] | None = None
    audio_seconds: float = 0.0  # trained so far (all ranks)
    history: list[dict[str, Any]] = field(default_factory=list)
    milestones: list[dict[str, Any]] = field(default_factory=list)
    resumes: list[dict[str, int]] = field(default_factory=list)
    holdout: list[dict[str, Any]] = field(default_factory=list)  # [{epoch, loss}] held-out songs
    last_export: float = 0.0  # wall clock of the last best-export (not resumed)
    last_checkpoint: float = 0.0


@dataclass
class DitRun:
    options: TrainDitOptions
    settings: DitSettings
    storage: Storage
    dataset: str
    cache_key: str
    cache: dit_data.TensorCache
    models: AceStepModels
    dit_folder: str
    dit_name: str
    dims: dit_vram.DitDims
    spec: AdapterSpec
    fit: dit_vram.VramFit
    loss: dit_loss.LossConfig
    optimizer: HybridOptimizer
    schedule: LrSchedule
    stop: StopRule
    milestones: MilestoneTracker
    run_key: str
    device: torch.device
    autocast: torch.dtype | None  # bf16 autocast on CUDA, None on CPU
    null_condition: torch.Tensor  # [1, 1, H_enc] on the device
    frames: int  # fixed frame length of every micro-batch
    fingerprint: str
    trigger: str | None
    trigger_position: str
    events: EventLog | None = None
    state: TrainState = field(default_factory=TrainState)
    pending_best: dict[str, Any] | None = None  # CPU snapshot of a best adapter not yet exported
    checkpoint_hook: Callable[[DitRun], None] | None = None
    holdout: Any = None  # calibration.holdout.HoldoutEval when songs are held out
    params: list[torch.nn.Parameter] = field(default_factory=list)  # the trainable adapter
    engine: StepEngine = field(init=False)  # how steps run: compile mode, graphs, fold, prefetch
    started: float = field(default_factory=time.time)

    @property
    def transformer(self) -> torch.nn.Module:
        return self.models.transformer

    @property
    def is_main(self) -> bool:
        return self.settings.rank == 0

    @property
    def checkpoint_key(self) -> str:
        return f"{self.run_key}/{CHECKPOINT_DIR}"


@dataclass
class DitResult:
    run_key: str
    stop_reason: str
    epochs_run: int
    steps: int
    final_loss: float | None
    best_ma5: float | None
    saved_reason: str
    log: dict[str, Any]


# =============================================================================== setup


def _device(settings: DitSettings) -> torch.device:
    if settings.device:
        return torch.device(settings.device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _budget_bytes(settings: DitSettings, options: TrainDitOptions, device: torch.device):
    """Bytes the run may use: the given budget, else the GPU's free memory minus the reserve."""
    budget = None if settings.vram_budget_gb is None else settings.vram_budget_gb * dit_vram.GB
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        available = free - options.vram_reserve_mb * 1e6
        budget = available if budget is None else min(budget, available)
    return budget


def adapter_spec(
    options: TrainDitOptions, settings: DitSettings, dims: dit_vram.DitDims
) -> AdapterSpec:
    base = AdapterSpec.from_options(options)
    trained = dit_vram.trained_layers(options, dims)
    if base.kind != "lora" and settings.lora_dropout:
        raise InputError(f"lora_dropout {settings.lora_dropout} is LoRA's; a LoKR adapter has none")
    update: dict[str, Any] = {"dropout": settings.lora_dropout if base.kind == "lora" else 0.0}
    if trained < dims.layers:
        update["layers_to_train"] = tuple(range(dims.layers - trained, dims.layers))
    return AdapterSpec.model_validate({**base.model_dump(), **update})


class _SelectiveCheckpoint:
    """diffusers calls `_gradient_checkpointing_func(block, *args)` for every block while
    `gradient_checkpointing` is on; this recomputes only the chosen blocks (non-reentrant, so the
    key masks that stay set on the processors are re-read identically in backward)."""

    def __init__(self, blocks: set[int]) -> None:
        self.blocks = blocks

    def __call__(self, block: torch.nn.Module, *args: Any) -> torch.Tensor:
        if id(block) in self.blocks:
            return activation_checkpoint(block, *args, use_reentrant=False)
        return block(*args)


def _install_checkpointing(transformer: torch.nn.Module, ckpt_layers: int, trained: int) -> None:
    """Checkpoint the lowest `ckpt_layers` of the trained top layers."""
    layers = transformer.layers
    first = len(layers) - trained
    chosen = {id(layers[first + i]) for i in range(ckpt_layers)}
    transformer.gradient_checkpointing = bool(chosen)
    transformer._gradient_checkpointing_func = _SelectiveCheckpoint(chosen)


def _resolve_trigger(settings: DitSettings, cache: dit_data.TensorCache) -> tuple[str | None, str]:
    """--trigger wins, else the tag the tensors were preprocessed with (the cache's meta or file
    headers), whatever the dataset says now."""
    tag, position = cache.trigger()
    trigger = settings.trigger if settings.trigger is not None else tag
    return trigger or None, settings.trigger_position or position


def setup(
    options: TrainDitOptions,
    storage: Storage,
    dataset: str,
    settings: DitSettings | None = None,
    events: EventLog | None = None,
) -> DitRun:
    """Everything `train` needs, resolved and logged (see the module docstring)."""
    settings = settings or DitSettings()
    if not options.variant_key:
        raise InputError("variant_key is required: the tensor-cache variant to train on")
    dtype = torch.bfloat16 if _device(settings).type == "cuda" else torch.float32
    cache_key = layout.tensor_dir(dataset, options.variant_key)
    cache = dit_data.load_cache(storage, cache_key)
    held = None
    if options.holdout_fraction:  # songs kept out of training for a per-epoch held-out loss
        from hotstep_ray.calibration import holdout

        cache, held, split = holdout.split_cache(cache, options.holdout_fraction, options.seed)
    folder = dit_data.resolve_dit_folder(
        cache.meta, options.variant_key, settings.dit_folder, settings.checkpoints_dir
    )
    # Loaded on the CPU: `prepare` moves only the transformer (and the null condition) over.
    models = load_acestep_dit(folder, device="cpu", dtype=dtype, window_rule=settings.window_rule)
    run = prepare(options, storage, dataset, cache, models, str(folder), settings, events)
    run.cache_key = cache_key
    if settings.resume:
        restore(run, storage, settings.resume)
    if held is not None:
        run.holdout = holdout.dit_evaluator(run, held, split)
        _log(run, f"held out of training: {', '.join(split.held_out)}")
    _announce(run)
    return run


def prepare(
    options: TrainDitOptions,
    storage: Storage,
    dataset: str,
    cache: dit_data.TensorCache,
    models: AceStepModels,
    dit_folder: str,
    settings: DitSettings,
    events: EventLog | None = None,
) -> DitRun:
    """A run around an already loaded cache and model (the GPU bench passes random full-size
    models and a synthetic cache): fit, adapter, optimizer, schedule."""
    device = _device(settings)
    models.transformer.to(device)
    null_condition = models.condition_encoder.null_condition_emb.detach().to(device)
    dims = dit_vram.DitDims.from_config(models.config)

    # size the run to the GPU (compiled blocks keep fewer activations), then build the adapter
    mode = compile_mode(options.compile, device)
    spec = adapter_spec(options, settings, dims)
    fit = dit_vram.fit(
        dims,
        spec,
        options,
        longest_song=cache.longest,
        songs=len(cache.songs),
        condition_len=cache.condition_len,
        budget_bytes=_budget_bytes(settings, options, device),
        compiled=mode != "off",
        speed=settings.speed,
    )
    if settings.fold_accum not in FOLD_MODES:
        raise InputError(f"fold_accum {settings.fold_accum!r}: expected auto, on or off")
    fingerprint = model_fingerprint(models.transformer)
    # Seeded adapter init (peft draws LoRA A / LoKR w1 from the global RNG): every worker of a
    # run and every rerun start from the same weights.
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(dit_data.derived_seed(options.seed, "adapter-init"))
        adapters.inject(models.transformer, spec, settings.speed)
    _install_checkpointing(models.transformer, fit.ckpt_layers, fit.trained_layers)
    models.transformer.train()  # LoRA dropout; the DiT itself has none (attention_dropout 0)

    dit_name = Path(dit_folder).name
    artist = layout.check_name(settings.artist or options.adapter_name or dataset, "artist")
    base = layout.dit_adapter_base(dit_name)
    if settings.run_key:
        run_key = settings.run_key
    elif settings.world_size > 1:
        raise InputError("several workers need one run folder: pass settings.run_key")
    else:
        run_key = layout.new_run_dir(storage, base, artist)
    warm = _init_adapter(options, storage, models, base, artist, run_key, events)
    if "train" not in options.stages and not settings.resume and warm is None:
        raise InputError(
            "stages without train export the adapter as it starts, and nothing was loaded: pass "
            "--resume with a trained run's checkpoint (or --init-adapter with one to re-export)"
        )

    trainable = adapters.trainable_parameters(models.transformer)
    optimizer = build_optimizer(
        trainable,
        options.optimizer,
        options.effective_learning_rate,
        options.effective_weight_decay,
        muon_lr_scale=options.muon_lr_scale,
        muon_momentum=options.muon_momentum,
        muon_ns_steps=options.muon_ns_steps,
        muon_min_dim=options.muon_min_dim,
        muon_ns_precision=options.muon_ns_precision,
    )
    trigger, position = _resolve_trigger(settings, cache)
    run = DitRun(
        options=options,
        settings=settings,
        storage=storage,
        dataset=dataset,
        cache_key="",
        cache=cache,
        models=models,
        dit_folder=dit_folder,
        dit_name=dit_name,
        dims=dims,
        spec=spec,
        fit=fit,
        loss=dit_loss.LossConfig.from_options(options, models.variant.kind, cache.channel_std),
        optimizer=optimizer,
        schedule=build_schedule(options, settings, cache, fit.batch),
        stop=StopRule(options.epochs, options.target_loss, MA_WINDOW),
        milestones=MilestoneTracker(
            step=options.milestone_step,
            keep=options.milestone_keep,
            every_epochs=settings.milestone_every_epochs,
        ),
        run_key=run_key,
        device=device,
        autocast=torch.bfloat16 if device.type == "cuda" else None,
        null_condition=null_condition,
        frames=dit_data.batch_frames(cache, fit.crop_frames),
        fingerprint=fingerprint,
        trigger=trigger,
        trigger_position=position,
        events=events if settings.rank == 0 else None,
        params=[param for _, param in trainable],
    )
    mode = graph_mode(options.compile, mode, fit.ckpt_layers, spec.dropout)
    if options.compile == "step-graph" and mode != "step-graph":
        _log(
            run,
            "compile step-graph: checkpointed layers and adapter dropout are not captured "
            "(their recompute and random draws live outside the graph); compiled blocks instead",
            "warn",
        )
    if mode != "off":
        compile_blocks(models.transformer, "default" if mode == "step-graph" else mode)
        _log(
            run,
            f"torch.compile ({mode}) of the {len(models.transformer.layers)} DiT blocks: the "
            "first step of each new crop/batch shape compiles (about a minute), then steps run "
            "at full speed",
        )
    run.engine = StepEngine(
        params=run.params,
        optimizer=optimizer,
        set_lr=lambda step: run.schedule.apply(run.optimizer, step),
        prepare=lambda window, step: prepare_window(run, window, step),
        work=lambda prepared: step_work(run, prepared),
        loss=lambda inputs, shared, cast_cache: group_loss(run, inputs, shared, cast_cache),
        device=device,
        mode=mode,
        speed=settings.speed,
        world_size=settings.world_size,
        grad_clip=options.grad_clip,
        recompile=lambda mode: compile_blocks(run.transformer, mode),
        log=lambda message, level: _log(run, message, level),
    )
    run.engine.fold = fold_factor(run)
    return run


def fold_factor(run: DitRun) -> int:
    """Planned micro-batches per forward for the run's fit and GPU budget (`dit_vram.
    fold_factor`) when `fold_accum` is on (auto: on CUDA), else 1."""
    mode = run.settings.fold_accum
    if mode == "off" or (mode == "auto" and run.device.type != "cuda"):
        return 1
    return dit_vram.fold_factor(
        run.dims,
        run.spec,
        run.fit,
        run.options.grad_accum,
        run.cache.condition_len,
        run.fit.budget,
        compiled=run.engine.mode != "off",
        speed=run.settings.speed,
    )


def compile_blocks(transformer: torch.nn.Module, mode: str, backend: str = "inductor") -> None:
    """torch.compile every transformer block in place (Inductor fuses the norm, modulation,
    LoRA and activation elementwise chains; the blocks share their graphs). One graph per
    (sliding|full layer, first layer, crop, batch), well within the raised recompile limit.
    `backend` "aot_eager" (tests): dynamo + AOTAutograd without Inductor's code generation."""
    compiling.compile_each(transformer.layers, mode, backend)


def build_schedule(
    options: TrainDitOptions, settings: DitSettings, cache: dit_data.TensorCache, batch: int
) -> LrSchedule:
    """LR schedule over this rank's optimizer steps (warmup and total as `schedule_steps`)."""
    plan = dit_data.plan_epoch(cache.repeats, batch, options.seed, 1, options.order)
    micro_batches = len(dit_data.shard_plan(plan, settings.rank, settings.world_size))
    per_epoch, total, warmup = schedule_steps(
        micro_batches, options.epochs, 1, options.grad_accum, options.warmup_ratio
    )
    return LrSchedule(total_steps=total, warmup_steps=warmup, steps_per_epoch=per_epoch)


def _init_adapter(
    options: TrainDitOptions,
    storage: Storage,
    models: AceStepModels,
    base: str,
    artist: str,
    run_key: str,
    events: EventLog | None,
) -> str | None:
    """Warm start: `init_adapter` "latest" = the newest earlier run of this artist (skipped when
    none exists or its shapes differ), "" = from scratch, else a storage key. Returns the key
    loaded, None when the adapter starts fresh."""
    if not options.init_adapter:
        return None
    if options.init_adapter == "latest":  # never a `-calibrated` folder (calibration output)
        key = layout.latest_run_dir(storage, f"{base}/{artist}", skip_calibrated=True)
        key = key or layout.resolve_adapter(storage, base, artist)
        if key is None or key == run_key or key.endswith("-calibrated"):
            return None
    else:
        key = options.init_adapter
    try:
        export.load_exported(models.transformer, storage, key, rename=export.ACESTEP_OFFICIAL_NAMES)
    except InputError as exc:
        if options.init_adapter != "latest":
            raise
        if events:
            events.log(f"init adapter {key} does not fit this run, starting fresh: {exc}", "warn")
        return None
    if events:
        events.log(f"adapter initialised from {key}")
    return key


def check_run_folder(options: TrainDitOptions, storage: Storage, settings: DitSettings) -> None:
    """Refuse to train into a named run folder (`run_key`) that already holds a run unless the
    request continues it (`resume`) or replaces it (`overwrite`): its adapter and log would be
    overwritten by a run from scratch. Entry points call this; Ray's restarted workers, which
    reuse their own folder, do not."""
    key = settings.run_key
    if key and not settings.resume and not options.overwrite and storage.list(key):
        raise InputError(
            f"{storage.url_of(key)} already holds a run: pass --resume with its checkpoint to "
            "continue it, --overwrite to replace it, or no --run-key for a new folder"
        )


def _announce(run: DitRun) -> None:
    if run.events is None:
        return
    split = run.optimizer.split_summary()
    run.events.log(
        f"train-dit {run.spec.kind} on {run.dit_name} ({run.models.variant.name}): "
        f"{run.fit.trained_layers}/{run.dims.layers} layers, crop {run.fit.crop_frames} frames, "
        f"batch {run.fit.batch}, {run.fit.ckpt_layers} layers checkpointed, "
        f"optimizer {run.options.optimizer} ({split}), {run.schedule.total_steps} steps"
        + (
            f"; each step's {run.options.grad_accum} micro-batches run {run.engine.fold} at a "
            f"time (batch {run.fit.batch * run.engine.fold} per forward, same loss)"
            if run.engine.fold > 1
            else ""
        )
    )
    for note in run.fit.notes:
        run.events.log(note, "warn")
    run.events.emit(MetricEvent(metric="vram", **run.fit.to_dict()))
    run.events.emit(
        MetricEvent(
            metric="data",
            **run.cache.summary(),
            batch=run.fit.batch,
            steps_per_epoch=run.schedule.steps_per_epoch,
            total_steps=run.schedule.total_steps,
            warmup_steps=run.schedule.warmup_steps,
        )
    )


# =============================================================================== train


def epoch_windows(run: DitRun, epoch: int) -> list[list[tuple[int, ...]]]:
    """This rank's optimizer windows of `epoch` (micro-batches of song indices)."""
    plan = dit_data.plan_epoch(
        run.cache.repeats, run.fit.batch, run.options.seed, epoch, run.options.order
    )
    shard = dit_data.shard_plan(plan, run.settings.rank, run.settings.world_size)
    return dit_data.windows(shard, run.options.grad_accum)


@dataclass
class WindowDraws:
    """Every random choice of one optimizer window, made before its first forward."""

    crops: list[list[dit_data.Crop]]
    t: list[torch.Tensor]  # per micro-batch [b]
    cfg_drop: list[torch.Tensor]  # per micro-batch [b] bool
    weights: list[torch.Tensor]  # per micro-batch [b], window-normalised


def draw_window(run: DitRun, window: list[tuple[int, ...]], step: int) -> WindowDraws:
    rng = dit_data.generator(run.options.seed, "step", step, run.settings.rank)
    crops, ts, drops, weights = [], [], [], []
    for micro_batch in window:
        crops.append(
            [
                dit_data.draw_crop(
                    run.cache.songs[song],
                    song,
                    run.fit.crop_frames,
                    run.options.genre_ratio,
                    rng,
                    run.dims.patch,
                )
                for song in micro_batch
            ]
        )
        t = dit_loss.sample_timesteps(len(micro_batch), run.loss, rng)
        ts.append(t)
        drops.append(dit_loss.sample_cfg_drop(len(micro_batch), run.loss.cfg_ratio, rng))
        weights.append(dit_loss.timestep_weights(t, run.loss))
    return WindowDraws(crops, ts, drops, dit_loss.normalize_window(weights, run.loss))


def fold_groups(micro_batches: int, fold: int) -> list[range]:
    """The planned micro-batches of a window, `fold` at a time: one forward each."""
    return [range(i, min(i + fold, micro_batches)) for i in range(0, micro_batches, fold)]


@dataclass
class PreparedWindow:
    """A window's draws and its forwards' inputs assembled on the host: what the engine makes
    for the next step while the GPU still runs this step's backward, so the gap between two
    steps' kernels holds no host assembly (on CUDA the tensors are pinned, so the copy at the
    next step's start does not wait for the stream)."""

    step: int
    window: list[tuple[int, ...]]
    draws: WindowDraws
    host: list[TrainBatch]  # one per fold group


def prepare_window(run: DitRun, window: list[tuple[int, ...]], step: int) -> PreparedWindow:
    draws = draw_window(run, window, step)
    host = []
    for group in fold_groups(len(window), run.engine.fold):
        crops = [c for i in group for c in draws.crops[i]]
        # pinned on CUDA (torch's host cache reuses the blocks): its copy to the GPU does not
        # wait for the stream to drain
        host.append(
            dit_data.assemble(run.cache, crops, run.frames, pin_memory=run.device.type == "cuda")
        )
    return PreparedWindow(step, list(window), draws, host)


def micro_batch_loss(
    run: DitRun,
    crops: list[dit_data.Crop],
    t: torch.Tensor,
    cfg_drop: torch.Tensor,
    weights: torch.Tensor,
    noise_seeds: list[tuple[tuple[Any, ...], int]],
) -> dit_loss.LossOutput:
    """Assemble, move and run one micro-batch (no backward; the tests and the bench). `noise_seeds`:
    (seed parts, rows) per planned micro-batch it holds, so a folded one draws the same noise row
    for row."""
    batch = dit_data.batch_to(dit_data.assemble(run.cache, crops, run.frames), run.device)
    noise = draw_noise(run, noise_seeds, batch.target_latents.shape[1:])
    return micro_batch_forward(run, batch, t, noise, cfg_drop, weights, run.loss.channel_weights)


def draw_noise(
    run: DitRun, noise_seeds: list[tuple[tuple[Any, ...], int]], shape: torch.Size
) -> torch.Tensor:
    """[rows, *shape] float32 on the device: each planned micro-batch's rows from its own seed."""
    return torch.cat(
        [
            torch.randn(
                (rows, *shape),
                generator=dit_data.generator(*seed, device=run.device),
                device=run.device,
                dtype=torch.float32,
            )
            for seed, rows in noise_seeds
        ]
    )


def micro_batch_forward(
    run: DitRun,
    batch: TrainBatch,
    t: torch.Tensor,
    noise: torch.Tensor,
    cfg_drop: torch.Tensor,
    weights: torch.Tensor,
    channel: torch.Tensor | None,
    cast_cache: bool = True,
) -> dit_loss.LossOutput:
    """The loss of one micro-batch already on the device (no backward). `channel`: the channel
    balance weights ([64] or None). `cast_cache` False inside a CUDA-graph capture."""
    autocast = torch.autocast(
        run.device.type,
        dtype=run.autocast,
        enabled=run.autocast is not None,
        cache_enabled=cast_cache,
    )
    with autocast:
        return dit_loss.flow_matching_loss(
            run.models,
            batch,
            t,
            noise,
            cfg_drop,
            sample_weights=weights.to(run.device),
            channel_weights=None if channel is None else channel.to(run.device),
            null_condition=run.null_condition,
        )


# A fold group's inputs as the engine takes them: the TrainBatch fields, then t, cfg_drop,
# weights and noise; the one shared input is the channel weights.
_BATCH_FIELDS = tuple(f.name for f in dataclasses.fields(TrainBatch))


def step_work(run: DitRun, prepared: PreparedWindow) -> StepWork:
    """A prepared window as the engine's work: the draws are made per planned micro-batch, and
    `fold` of them run as one forward, weighted by its share of the window's samples; the noise
    is drawn here, on the device."""
    draws, window, step, rank = prepared.draws, prepared.window, prepared.step, run.settings.rank
    groups = fold_groups(len(window), run.engine.fold)
    inputs = []
    for group, host in zip(groups, prepared.host, strict=True):
        seeds = [((run.options.seed, "noise", step, rank, i), len(window[i])) for i in group]
        inputs.append(
            [
                *(getattr(host, name) for name in _BATCH_FIELDS),
                torch.cat([draws.t[i] for i in group]),
                torch.cat([draws.cfg_drop[i] for i in group]),
                torch.cat([draws.weights[i] for i in group]),
                draw_noise(run, seeds, host.target_latents.shape[1:]),
            ]
        )
    shares = micro_batch_weights([sum(len(window[i]) for i in group) for group in groups])
    key = input_shapes(prepared, run.engine.fold, run.transformer.training)
    return StepWork(inputs, shares, [run.loss.channel_weights], key)


def group_loss(run: DitRun, inputs: list, shared: list, cast_cache: bool) -> dit_loss.LossOutput:
    """One fold group's loss from its `step_work` inputs on the device."""
    batch = TrainBatch(**dict(zip(_BATCH_FIELDS, inputs, strict=False)))
    t, cfg_drop, weights, noise = inputs[len(_BATCH_FIELDS) :]
    return micro_batch_forward(run, batch, t, noise, cfg_drop, weights, shared[0], cast_cache)


def input_shapes(prepared: PreparedWindow, fold: int, training: bool) -> tuple:
    """What picks a step's graphs (compiled blocks, and the step graph it keys): every fold
    group's host tensors (shape and dtype, or None for an absent mask), the fold, and the
    module mode."""

    def signature(batch: TrainBatch) -> tuple:
        values = (getattr(batch, f.name) for f in dataclasses.fields(batch))
        return tuple(None if v is None else (tuple(v.shape), v.dtype) for v in values)

    return (tuple(signature(batch) for batch in prepared.host), fold, training)


@dataclass
class StepResult:
    loss: float
    raw_loss: float
    grad_norm: float
    lr_factor: float
    samples: int
    frames: int
    ms: float
    finite: bool


def guarded_step(
    run: DitRun, window: list[tuple[int, ...]], next_window: list[tuple[int, ...]] | None = None
) -> StepResult:
    """`optimizer_step`, redone without CUDA graphs when they fail in one of the first steps
    (`StepEngine.guarded`)."""
    return run.engine.guarded(run.state.step, lambda: optimizer_step(run, window, next_window))


def optimizer_step(
    run: DitRun,
    window: list[tuple[int, ...]],
    next_window: list[tuple[int, ...]] | None = None,
) -> StepResult:
    """One optimizer step over `grad_accum` micro-batches (see the module docstring), run by the
    engine. `next_window`: the next step's window, whose inputs are prepared while this step's
    backward runs on the GPU."""
    started = time.perf_counter()
    step, rank = run.state.step, run.settings.rank
    if run.spec.dropout > 0:  # peft's dropout draws from the global RNG
        torch.manual_seed(dit_data.derived_seed(run.options.seed, "dropout", step, rank))
    prepared = run.engine.take(window, step)
    outcome = run.engine.run_step(step, prepared, next_window)
    if outcome.finite:
        run.state.step += 1
    frames = sum(crop.frames for crops in prepared.draws.crops for crop in crops)
    samples = sum(len(micro_batch) for micro_batch in window)
    ms = (time.perf_counter() - started) * 1000
    factor = run.schedule.factor(step)
    return StepResult(
        outcome.loss,
        outcome.raw_loss,
        outcome.grad_norm,
        factor,
        samples,
        frames,
        ms,
        outcome.finite,
    )


def train(
    run: DitRun,
    *,
    max_steps: int | None = None,
) -> DitResult:
    """Run epochs until the epoch cap, the target (ma5), a non-finite loss or `max_steps`
    optimizer steps (in total, counting resumed ones); then export and log (see `finish`)."""
    state, options = run.state, run.options
    if "train" not in options.stages:
        state.stop_reason = "skipped"
    last_event = 0.0
    while not state.stop_reason:
        plan = epoch_windows(run, state.epoch)
        while state.window < len(plan):
            upcoming = plan[state.window + 1] if state.window + 1 < len(plan) else None
            result = guarded_step(run, plan[state.window], upcoming)
            if not result.finite:
                state.stop_reason = "non_finite"
                _log(
                    run,
                    f"non-finite loss {result.loss} / grad norm {result.grad_norm} at step "
                    f"{state.step + 1}: stopped; the last checkpoint and export are kept",
                    "error",
                )
                break
            state.window += 1
            _account(run, result)
            last_event = _step_event(run, result, last_event, state.window == len(plan))
            if _steps_due(run) and state.window < len(plan):  # epoch ends checkpoint below
                save_state(run)
            if max_steps is not None and state.step >= max_steps:
                state.stop_reason = "max_steps"
                save_state(run)
                break
        if state.stop_reason:
            break
        end_epoch(run)
    return finish(run)


def _steps_due(run: DitRun) -> bool:
    every = run.settings.checkpoint_every_steps
    return bool(every) and run.state.step % every == 0


def _account(run: DitRun, result: StepResult) -> None:
    state = run.state
    state.epoch_loss += result.loss * result.samples
    state.epoch_raw += result.raw_loss * result.samples
    state.epoch_samples += result.samples
    state.epoch_frames += result.frames
    state.epoch_grad_norms.append(result.grad_norm)
    state.epoch_ms += result.ms
    state.audio_seconds += result.frames * run.settings.world_size / LATENT_HZ


def _step_event(run: DitRun, result: StepResult, last: float, force: bool) -> float:
    now = time.time()
    if run.events is None or (not force and now - last < run.settings.step_event_interval_s):
        return last
    total = run.schedule.total_steps
    eta = result.ms * max(0, total - run.state.step)
    extra: dict[str, Any] = {
        "raw_loss": result.raw_loss,
        "audio_s_per_s": result.frames * run.settings.world_size / LATENT_HZ / (result.ms / 1000),
        "crop": run.fit.crop_frames,
        "batch": run.fit.batch,
    }
    if run.device.type == "cuda":
        extra["vram_mb"] = torch.cuda.max_memory_allocated(run.device) / 1e6
    run.events.emit(
        MetricEvent(
            metric="step",
            epoch=run.state.epoch,
            epochs=run.options.epochs,
            step=run.state.step,
            total_steps=total,
            loss=result.loss,
            lr=result.lr_factor * run.options.effective_learning_rate,
            grad_norm=result.grad_norm,
            step_ms=result.ms,
            eta_ms=eta,
            **extra,
        )
    )
    return now


def _global_sums(run: DitRun) -> tuple[float, float, int]:
    """Epoch loss sums over every worker."""
    state = run.state
    values = torch.tensor(
        [state.epoch_loss, state.epoch_raw, state.epoch_samples], dtype=torch.float64
    )
    if run.settings.world_size > 1:
        import torch.distributed as dist

        values = values.to(run.device)
        dist.all_reduce(values)
        values = values.cpu()
    return float(values[0]), float(values[1]), int(values[2])


def _agree(run: DitRun, flag: bool) -> bool:
    """True when any worker says so (checkpoints are collective under Ray: every worker must
    reach the same `save_state` calls)."""
    if run.settings.world_size <= 1:
        return flag
    import torch.distributed as dist

    value = torch.tensor([int(flag)], device=run.device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def end_epoch(run: DitRun) -> None:
    """Epoch bookkeeping: moving average and stop rule, milestones, best export, log, checkpoint."""
    state, options = run.state, run.options
    loss_sum, raw_sum, samples = _global_sums(run)
    loss = loss_sum / max(1, samples)
    decision = run.stop.end_epoch(state.epoch, loss)
    ma5 = decision.moving_average if decision.moving_average is not None else loss
    record = {
        "epoch": state.epoch,
        "loss": loss,
        "ma5": ma5,
        "raw_loss": raw_sum / max(1, samples),
        "lr": run.schedule.factor(max(0, state.step - 1)) * options.effective_learning_rate,
        "grad_norm": statistics.median(state.epoch_grad_norms) if state.epoch_grad_norms else 0.0,
        "ms": state.epoch_ms,
        "audio_s": state.epoch_frames * run.settings.world_size / LATENT_HZ,
    }
    state.history.append(record)
    if run.events:
        run.events.emit(
            MetricEvent(
                metric="epoch",
                epoch=state.epoch,
                epochs=options.epochs,
                step=state.step,
                total_steps=run.schedule.total_steps,
                loss=loss,
                lr=record["lr"],
                grad_norm=record["grad_norm"],
                step_ms=state.epoch_ms,
                ma5=ma5,
                raw_loss=record["raw_loss"],
            )
        )
    if run.holdout is not None:
        from hotstep_ray.calibration.holdout import dit_epoch_end

        with compiling.eager(run.engine.mode):
            dit_epoch_end(run)
    if run.is_main:
        _milestone(run, state.epoch, ma5)
        improved = math.isfinite(ma5) and ma5 < state.best_ma5
        if improved:
            state.best_ma5, state.best_epoch = ma5, state.epoch
        if decision.reason == "target":
            state.target_stop = {"epoch": state.epoch, "loss": loss, "ma5": ma5}
            save(run, "target")
        elif improved:
            if time.time() - state.last_export >= run.settings.export_interval_s:
                save(run, "best")
            else:
                run.pending_best = {
                    "state": {
                        k: v.cpu() for k, v in adapters.adapter_state_dict(run.transformer).items()
                    },
                    "epoch": state.epoch,
                    "ma5": ma5,
                }
    if decision.stop:
        state.stop_reason = decision.reason or "epochs"
    state.epoch += 1
    state.window = 0
    state.epoch_loss = state.epoch_raw = state.epoch_ms = 0.0
    state.epoch_samples = state.epoch_frames = 0
    state.epoch_grad_norms = []
    due = (
        _steps_due(run) or time.time() - state.last_checkpoint >= run.settings.checkpoint_interval_s
    )
    if _agree(run, bool(state.stop_reason) or due):
        save_state(run)
    if run.is_main:
        write_log(run)


def _milestone(run: DitRun, epoch: int, ma5: float) -> None:
    decision = run.milestones.observe(epoch, ma5)
    for evicted in decision.evict:
        run.storage.delete(f"{run.run_key}/{MILESTONE_DIR}/{evicted.name}", recursive=True)
        run.state.milestones = [m for m in run.state.milestones if m["name"] != evicted.name]
    if decision.save is None or "export" not in run.options.stages:
        return
    key = f"{run.run_key}/{MILESTONE_DIR}/{decision.save.name}"
    _export(run, key, {"hot_step_milestone": decision.save.name})
    entry = {"name": decision.save.name, "epoch": epoch, "loss": ma5, "path": key}
    run.state.milestones.append(entry)
    if run.events:
        run.events.emit(
            MetricEvent(metric="milestone", epoch=epoch, loss=ma5, path=run.storage.url_of(key))
        )


def finish(run: DitRun) -> DitResult:
    """Export the best adapter still pending, then write the final log."""
    state = run.state
    if run.is_main:
        if run.pending_best is not None and state.stop_reason != "skipped":
            adapters.load_adapter_state(run.transformer, run.pending_best["state"])
            state.best_epoch, state.best_ma5 = run.pending_best["epoch"], run.pending_best["ma5"]
            save(run, "best")
        elif state.saved_reason == "" and state.stop_reason in ("max_steps", "skipped"):
            save(run, "final")  # no epoch finished yet: export what there is
        log = write_log(run, final=True)
    else:
        log = {}
    final = state.history[-1]["loss"] if state.history else None
    return DitResult(
        run_key=run.run_key,
        stop_reason=state.stop_reason,
        epochs_run=len(state.history),
        steps=state.step,
        final_loss=final,
        best_ma5=None if math.isinf(state.best_ma5) else state.best_ma5,
        saved_reason=state.saved_reason,
        log=log,
    )


# =============================================================================== save


def _export(run: DitRun, key: str, metadata: dict[str, str] | None = None) -> list[str]:
    meta = {
        "hot_step_dit_trainer": "v1",
        "hot_step_base_model": run.dit_name,
        "hot_step_variant": run.models.variant.name,
        **(metadata or {}),
    }
    common: dict[str, Any] = {
        "rename": export.ACESTEP_OFFICIAL_NAMES,
        "trigger": run.trigger,
        "trigger_position": run.trigger_position,
        "drop_groups": run.settings.zero_groups,
        "metadata": meta,
    }
    if run.spec.kind == "lora":
        return export.export_lora(
            run.transformer, run.storage, key, base_model_name_or_path=run.dit_name, **common
        )
    extra = {"target_mlp": run.options.target_mlp}
    return export.export_lokr(run.transformer, run.storage, key, extra_config=extra, **common)


def save(run: DitRun, reason: str) -> list[str]:
    """Export the model's current adapter into the run folder (`saved_reason` best|target|final)."""
    if "export" not in run.options.stages or not run.is_main:
        return []
    state = run.state
    files = _export(run, run.run_key, {"hot_step_saved_reason": reason})
    state.saved_reason = reason
    state.saved_epoch = state.best_epoch if reason == "best" else len(state.history)
    state.saved_ma5 = None if math.isinf(state.best_ma5) else state.best_ma5
    state.last_export = time.time()
    run.pending_best = None
    return files


def save_state(run: DitRun) -> None:
    """A resumable checkpoint: through the hook (Ray) or into `<run>/checkpoint/`."""
    run.state.last_checkpoint = time.time()
    if run.checkpoint_hook is not None:
        run.checkpoint_hook(run)
    elif run.is_main:
        write_checkpoint(run, run.storage, run.checkpoint_key)


def write_checkpoint(run: DitRun, storage: Storage, key: str) -> str:
    extra = {
        "state": asdict(run.state),
        "stop": run.stop.state_dict(),
        "milestones": run.milestones.state_dict(),
        "fit": run.fit.to_dict(),
        "run_key": run.run_key,
    }
    return save_checkpoint(
        storage,
        key,
        model=run.transformer,
        optimizer=run.optimizer,
        step=run.state.step,
        epoch=run.state.epoch,
        config=resolved_config(run),
        extra=extra,
        fingerprint=run.fingerprint,
    )


def _adopt_fit(run: DitRun, saved: dict[str, Any]) -> None:
    """Resume with the checkpoint's crop, batch and checkpointing (the data streams and the LR
    schedule depend on them), even when this GPU's own fit differs (a restart on another node),
    as long as the memory model says they fit here."""
    keys = ("crop_frames", "batch", "ckpt_layers", "trained_layers")
    if all(saved[k] == getattr(run.fit, k) for k in keys):
        return
    if saved["trained_layers"] != run.fit.trained_layers:
        raise InputError(
            f"checkpoint trains {saved['trained_layers']} layers, this run "
            f"{run.fit.trained_layers}: pass the same --layers to resume"
        )
    plan = dit_vram.Plan(
        saved["crop_frames"],
        saved["batch"],
        saved["ckpt_layers"],
        saved["trained_layers"],
        run.cache.condition_len,
    )
    compiled = run.engine.mode != "off"
    need = dit_vram.estimate(
        run.dims, run.spec, plan, saved["batch"] > 1, compiled, run.settings.speed
    )
    if run.fit.budget is not None and need.total > run.fit.budget:
        raise dit_vram.VramFitError(
            f"the checkpoint's crop {plan.crop_frames} / batch {plan.batch} / "
            f"{plan.ckpt_layers} checkpointed layers need {need.total / dit_vram.GB:.1f} GB; "
            f"{run.fit.budget / dit_vram.GB:.1f} GB is available here"
        )
    run.fit = replace(
        run.fit,
        crop_frames=plan.crop_frames,
        batch=plan.batch,
        ckpt_layers=plan.ckpt_layers,
        estimate=need,
        notes=(*run.fit.notes, "crop/batch/checkpointing taken from the checkpoint"),
    )
    run.frames = dit_data.batch_frames(run.cache, plan.crop_frames)
    _install_checkpointing(run.transformer, plan.ckpt_layers, plan.trained_layers)
    if plan.ckpt_layers > 0 and run.engine.graphs:  # recompute is not captured
        # blocks compiled with graph trees (reduce-overhead) are compiled again
        run.engine.drop_graphs(recompile=run.engine.mode == "reduce-overhead")
        _log(run, "the checkpoint's fit checkpoints layers: compiled blocks without CUDA graphs")
    run.schedule = build_schedule(run.options, run.settings, run.cache, plan.batch)
    run.engine.fold = fold_factor(run)  # sized for the adopted fit, not this GPU's own


def restore(run: DitRun, storage: Storage, key: str) -> None:
    """Continue from the checkpoint at `key`: adapter, optimizer, loop state, stop rule and
    milestones, with the checkpoint's crop/batch/checkpointing."""
    loaded = load_checkpoint(
        storage, key, model=run.transformer, optimizer=run.optimizer, fingerprint=run.fingerprint
    )
    extra = loaded.extra
    _adopt_fit(run, extra["fit"])
    state = TrainState(**extra["state"])
    state.last_export = state.last_checkpoint = 0.0
    if state.stop_reason == "max_steps":  # a deliberate pause, not an end
        state.stop_reason = ""
    state.resumes = [*state.resumes, {"step": state.step, "epoch": state.epoch}]
    run.state = state
    run.stop.load_state_dict(extra["stop"])
    run.milestones.load_state_dict(extra["milestones"])
    _log(run, f"resumed from {storage.url_of(key)} at step {state.step} (epoch {state.epoch})")


def _log(run: DitRun, message: str, level: str = "info") -> None:
    if run.events:
        run.events.log(message, level)  # type: ignore[arg-type]
