"""DiT adapter training, the recipe: `setup(...)` -> `train(run)` -> `save(run)`.

Plain Python: tests run it on the CPU with the tiny DiT; `ray_dit.py` runs the same functions in
each Ray Train worker (one GPU each, gradients averaged across workers).

setup   read the tensor cache; load the DiT (bf16 on CUDA, fp32 on CPU) keeping only the
        transformer and the null condition on the device; size the run to the GPU (`dit_vram.fit`:
        crop, then checkpointing, then batch); inject the LoRA/LoKR adapter (fp32 master weights)
        into the top `layers`; hybrid Muon/AdamW; the LR schedule (lr(0)=0, warmup max(50 steps,
        5 %) capped at half the run, cosine to 10 %); the stop rule and milestones; resume from
        a checkpoint when asked. Its helpers and `DitSettings`: `dit_setup`.
train   per optimizer step: one seeded stream (seed, step, rank) draws every crop, timestep, CFG
        coin and noise of the window (`dit_windows`), so a resumed run redraws exactly what an
        uninterrupted one would; `grad_accum` micro-batches weighted by their sample share;
        gradient all-reduce (several workers); global-norm clip; LR; optimizer step, run by the
        step engine (`engine`: compiled blocks, CUDA graphs, prefetch). A non-finite loss or
        gradient norm stops the run before the step, so the last checkpoint and the exported
        adapter stay good. Per epoch: 5-epoch moving average (target stop), milestones, best
        export, the log (`dit_log`), the metric events (`dit_events`).
save    PEFT folder (LoRA) or LyCORIS `lokr_weights.safetensors` (LoKR), BF16, official module
        names, trigger in `__metadata__`, under `adapters/dit-<shorthand>/<artist>/<run>/` next to
        `dit_train_log.json`; exported when the 5-epoch average improves (at most once per
        `export_interval_s`, the last best always) or the target is hit (`dit_export`).
        Resumable checkpoints (`dit_state`: `TrainState`, fit adoption) go to `<run>/checkpoint/`
        (or through `ray.train.report`) at epoch ends: after the first, then every
        `checkpoint_every_s` / `checkpoint_every_epochs` (the options'); milestones go to
        `<run>/milestones/`.

The data is `dit_data`'s, the loss `dit_loss`'s, activation checkpointing `compiling`'s; those
modules take explicit arguments and none imports this one. Attention: the DiT's SDPA with the
dense band mask on sliding layers, padded keys masked by the models layer's processor. `prepare`
builds a run around an already loaded model and cache (the GPU bench: random full-size models).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from hotstep_ray.core import layout
from hotstep_ray.core.contracts import TrainDitOptions
from hotstep_ray.core.errors import InputError
from hotstep_ray.core.events import EventLog
from hotstep_ray.core.storage import Storage
from hotstep_ray.models.acestep_dit import AceStepModels, load_acestep_dit
from hotstep_ray.models.acestep_ops import TrainBatch
from hotstep_ray.training import (
    adapters,
    checkpoint,
    compiling,
    dit_data,
    dit_events,
    dit_export,
    dit_loss,
    dit_setup,
    dit_state,
    dit_vram,
    dit_windows,
    holdout,
)
from hotstep_ray.training.adapters import AdapterSpec
from hotstep_ray.training.checkpoint import model_fingerprint
from hotstep_ray.training.dit_data import resolve_dit_folder  # noqa: F401  (re-exported)
from hotstep_ray.training.dit_log import LOG_FILE, resolved_config, write_log  # noqa: F401
from hotstep_ray.training.dit_setup import DitSettings, adapter_spec, check_run_folder  # noqa: F401
from hotstep_ray.training.dit_state import DitResult, StepResult, TrainState
from hotstep_ray.training.dit_windows import Window
from hotstep_ray.training.engine import (  # noqa: F401
    COMPILE_MIN_STEPS,
    StepEngine,
    compile_mode,
    eager_for_short_run,
    graph_mode,
)
from hotstep_ray.training.optim import HybridOptimizer
from hotstep_ray.training.schedule import LrSchedule, MilestoneTracker, StopRule

MA_WINDOW = 5  # epochs in the moving average that the target and the best export read


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
    pending_best: dit_export.PendingBest | None = None  # a best adapter not yet exported
    checkpoint_hook: Callable[[DitRun], None] | None = None
    holdout: Any = None  # holdout.HoldoutEval when songs are held out
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
    def sampling(self) -> dit_windows.Sampling:
        """What the windows and their draws read, from the current fit (a resume may change it)."""
        return dit_windows.Sampling(
            self.cache,
            self.options,
            self.loss,
            self.fit.crop_frames,
            self.fit.batch,
            self.frames,
            self.dims.patch,
            self.engine.fold,
            self.settings.rank,
            self.settings.world_size,
            pin_memory=self.device.type == "cuda",
        )

    @property
    def checkpoint_key(self) -> str:
        return f"{self.run_key}/{dit_state.CHECKPOINT_DIR}"


# =============================================================================== setup


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
    dtype = torch.bfloat16 if dit_setup.pick_device(settings).type == "cuda" else torch.float32
    cache_key = layout.tensor_dir(dataset, options.variant_key)
    started = time.perf_counter()
    cache = dit_data.load_cache(storage, cache_key)
    cached = time.perf_counter()
    held = None
    if options.holdout_fraction:  # songs kept out of training for a per-epoch held-out loss
        cache, held, split = holdout.split_cache(cache, options.holdout_fraction, options.seed)
    folder = dit_data.resolve_dit_folder(
        cache.meta, options.variant_key, settings.dit_folder, settings.checkpoints_dir
    )
    # Loaded on the CPU: `prepare` moves only the transformer (and the null condition) over.
    models = load_acestep_dit(folder, device="cpu", dtype=dtype, window_rule=settings.window_rule)
    loaded = time.perf_counter()
    run = prepare(options, storage, dataset, cache, models, str(folder), settings, events)
    run.cache_key = cache_key
    _log(
        run,
        f"set up in {time.perf_counter() - started:.1f} s: tensor cache {cached - started:.1f} s, "
        f"DiT read {loaded - cached:.1f} s, onto {run.device} with adapter and optimizer "
        f"{time.perf_counter() - loaded:.1f} s",
    )
    if settings.resume:
        restore(run, storage, settings.resume)
    if held is not None:
        run.holdout = holdout.dit_evaluator(run, held, split)
        _log(run, f"held out of training: {', '.join(split.held_out)}")
    dit_setup.announce(
        run.events,
        options=options,
        spec=run.spec,
        dims=run.dims,
        fit=run.fit,
        dit_name=run.dit_name,
        variant=run.models.variant.name,
        optimizer_split=run.optimizer.split_summary(),
        schedule=run.schedule,
        fold=run.engine.fold,
        cache=run.cache,
    )
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
    device = dit_setup.pick_device(settings)
    models.transformer.to(device)
    null_condition = models.condition_encoder.null_condition_emb.detach().to(device)
    dims = dit_vram.DitDims.from_config(models.config)

    # size the run to the GPU (compiled blocks keep fewer activations), then build the adapter
    mode = compile_mode(options.compile, device)
    spec = adapter_spec(options, settings, dims)
    fit = dit_setup.fit_run(options, settings, dims, spec, cache, device, compiled=mode != "off")
    steps = dit_setup.build_schedule(options, settings, cache, fit.batch).total_steps
    if eager_for_short_run(options.compile, mode, steps):  # refit: eager keeps more activations
        mode = "off"
        fit = dit_setup.fit_run(options, settings, dims, spec, cache, device, compiled=False)
        if events is not None and settings.rank == 0:
            events.log(
                f"{steps} optimizer steps: training eagerly, compiling would take longer than "
                f"it saves below {COMPILE_MIN_STEPS} steps (--compile default compiles anyway)"
            )
    fingerprint = model_fingerprint(models.transformer)
    dit_setup.inject_adapter(models.transformer, spec, settings.speed, options.seed, device)
    compiling.install_checkpointing(models.transformer, fit.ckpt_layers, fit.trained_layers)
    models.transformer.train()  # LoRA dropout; the DiT itself has none (attention_dropout 0)

    dit_name = Path(dit_folder).name
    base, artist, run_key = dit_setup.run_folder(options, storage, settings, dataset, dit_name)
    dit_setup.init_adapter(
        options, settings, storage, models.transformer, base, artist, run_key, events
    )

    trainable = adapters.trainable_parameters(models.transformer)
    optimizer = dit_setup.build_dit_optimizer(trainable, options)
    trigger, position = dit_setup.resolve_trigger(settings, cache)
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
        schedule=dit_setup.build_schedule(options, settings, cache, fit.batch),
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
    blocks = len(models.transformer.layers)
    mode = dit_setup.block_mode(
        options.compile, mode, fit.ckpt_layers, spec.dropout, blocks, run.events
    )
    if mode != "off":  # step-graph captures blocks compiled as "default"
        compile_blocks(models.transformer, "default" if mode == "step-graph" else mode)
    run.engine = StepEngine(
        params=run.params,
        optimizer=optimizer,
        set_lr=lambda step: run.schedule.apply(run.optimizer, step),
        prepare=lambda window, step: dit_windows.prepare_window(run.sampling, window, step),
        work=lambda prepared: dit_windows.step_work(
            run.sampling, prepared, run.transformer.training, run.device
        ),
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
    fit, compiled = run.fit, run.engine.mode != "off"
    accum, condition_len = run.options.grad_accum, run.cache.condition_len
    return dit_vram.fold_factor(
        run.dims, run.spec, fit, accum, condition_len, fit.budget, compiled, run.settings.speed
    )


def compile_blocks(transformer: torch.nn.Module, mode: str, backend: str = "inductor") -> None:
    """torch.compile every transformer block in place (Inductor fuses the norm, modulation,
    LoRA and activation elementwise chains; the blocks share their graphs). One graph per
    (sliding|full layer, first layer, crop, batch), well within the raised recompile limit.
    `backend` "aot_eager" (tests): dynamo + AOTAutograd without Inductor's code generation."""
    compiling.compile_each(transformer.layers, mode, backend)


# =============================================================================== train


def group_loss(run: DitRun, inputs: list, shared: list, cast_cache: bool) -> dit_loss.LossOutput:
    """The engine's `loss`: one fold group's loss from its `dit_windows.step_work` inputs."""
    batch, t, cfg_drop, weights, noise = dit_windows.unpack(inputs)
    return micro_batch_forward(run, batch, t, noise, cfg_drop, weights, shared[0], cast_cache)


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


def micro_batch_loss(
    run: DitRun,
    crops: list[dit_data.Crop],
    t: torch.Tensor,
    cfg_drop: torch.Tensor,
    weights: torch.Tensor,
    noise_seeds: dit_windows.NoiseSeeds,
) -> dit_loss.LossOutput:
    """Assemble, move and run one micro-batch (no backward; the tests and the bench). `noise_seeds`:
    (seed parts, rows) per planned micro-batch it holds, so a folded one draws the same noise row
    for row."""
    batch = dit_data.batch_to(dit_data.assemble(run.cache, crops, run.frames), run.device)
    noise = dit_windows.draw_noise(noise_seeds, batch.target_latents.shape[1:], run.device)
    return micro_batch_forward(run, batch, t, noise, cfg_drop, weights, run.loss.channel_weights)


def guarded_step(run: DitRun, window: Window, next_window: Window | None = None) -> StepResult:
    """`optimizer_step`, redone without CUDA graphs when they fail in one of the first steps
    (`StepEngine.guarded`)."""
    return run.engine.guarded(run.state.step, lambda: optimizer_step(run, window, next_window))


def optimizer_step(run: DitRun, window: Window, next_window: Window | None = None) -> StepResult:
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
    return StepResult(
        **dataclasses.asdict(outcome),  # loss, raw_loss, grad_norm, finite
        lr_factor=run.schedule.factor(step),
        samples=sum(len(micro_batch) for micro_batch in window),
        frames=sum(crop.frames for crops in prepared.draws.crops for crop in crops),
        ms=(time.perf_counter() - started) * 1000,
    )


def train(run: DitRun, *, max_steps: int | None = None) -> DitResult:
    """Run epochs until the epoch cap, the target (ma5), a non-finite loss or `max_steps`
    optimizer steps (in total, counting resumed ones); then export and log (see `finish`)."""
    state, options = run.state, run.options
    if "train" not in options.stages:
        state.stop_reason = "skipped"
    last_event = 0.0
    while not state.stop_reason:
        plan = dit_windows.epoch_windows(run.sampling, state.epoch)
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
            state.add_step(result, run.settings.world_size)
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


def _step_event(run: DitRun, result: StepResult, last: float, force: bool) -> float:
    """Emit the step's event at most once per `step_event_interval_s` (`force`: the epoch's
    last step); returns when one was last emitted."""
    now = time.time()
    if run.events is None or (not force and now - last < run.settings.step_event_interval_s):
        return last
    total, world_size = run.schedule.total_steps, run.settings.world_size
    event = dit_events.step_event(
        result, run.state, run.options, run.fit, total, world_size, run.device
    )
    run.events.emit(event)
    return now


def end_epoch(run: DitRun) -> None:
    """Epoch bookkeeping: moving average and stop rule, milestones, best export, log, checkpoint."""
    state, options, world_size = run.state, run.options, run.settings.world_size
    loss_sum, raw_sum, samples = dit_state.epoch_sums(state, world_size, run.device)
    loss = loss_sum / max(1, samples)
    decision = run.stop.end_epoch(state.epoch, loss)
    ma5 = decision.moving_average if decision.moving_average is not None else loss
    lr = run.schedule.factor(max(0, state.step - 1)) * options.effective_learning_rate
    record = state.close_epoch(loss, raw_sum / max(1, samples), ma5, lr, world_size)
    if run.events:
        total = run.schedule.total_steps
        run.events.emit(dit_events.epoch_event(record, state, options.epochs, total))
    if run.holdout is not None:
        with compiling.eager(run.engine.mode):
            holdout.dit_epoch_end(run)
    if run.is_main:
        write = (lambda key, meta: _export(run, key, meta)) if "export" in options.stages else None
        dit_export.milestone(
            run.milestones, state, run.storage, run.run_key, ma5, write, run.events
        )
        target = decision.reason == "target"
        moved = dit_export.adapter_moved(run.schedule.factor, state.step)
        interval_s = run.settings.export_interval_s
        chosen = dit_export.epoch_export(state, target, loss, ma5, interval_s, moved)
        if chosen == "hold":
            run.pending_best = dit_export.hold_best(run.transformer, state.epoch, ma5)
        elif chosen:
            save(run, chosen)
    if decision.stop:
        state.stop_reason = decision.reason or "epochs"
    every_s = dit_setup.checkpoint_interval_s(options, run.settings)
    due = _steps_due(run) or checkpoint.due(
        state.epoch, state.last_checkpoint, every_s, options.checkpoint_every_epochs, time.time()
    )
    state.next_epoch()
    if dit_state.any_rank(bool(state.stop_reason) or due, world_size, run.device):
        save_state(run)
    if run.is_main:
        write_log(run)


def finish(run: DitRun) -> DitResult:
    """Export the best adapter still pending, then write the final log."""
    state = run.state
    if run.is_main:
        pending = run.pending_best
        if pending is not None and state.stop_reason != "skipped":
            adapters.load_adapter_state(run.transformer, pending.state)
            state.best_epoch, state.best_ma5 = pending.epoch, pending.ma5
            save(run, "best")
        elif state.saved_reason == "" and state.stop_reason != "non_finite":
            # no epoch finished yet, or none changed the weights: export what there is
            if not dit_export.adapter_moved(run.schedule.factor, state.step) and run.events:
                run.events.log(dit_export.never_moved(state.step), "warn")
            save(run, "final")
        log = write_log(run, final=True)
    else:
        log = {}
    return DitResult.of(run.run_key, state, log)


# =============================================================================== save


def _export(run: DitRun, key: str, metadata: dict[str, str]) -> list[str]:
    return dit_export.export_adapter(
        run.transformer,
        run.storage,
        key,
        kind=run.spec.kind,
        base_model=run.dit_name,
        variant=run.models.variant.name,
        trigger=run.trigger,
        trigger_position=run.trigger_position,
        zero_groups=run.settings.zero_groups,
        target_mlp=run.options.target_mlp,
        metadata=metadata,
    )


def save(run: DitRun, reason: str) -> list[str]:
    """Export the model's current adapter into the run folder (`saved_reason` best|target|final)."""
    if "export" not in run.options.stages or not run.is_main:
        return []
    files = _export(run, run.run_key, {"hot_step_saved_reason": reason})
    dit_export.note_saved(run.state, reason)
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
    return dit_state.write_checkpoint(
        storage,
        key,
        model=run.transformer,
        optimizer=run.optimizer,
        state=run.state,
        stop=run.stop,
        milestones=run.milestones,
        fit=run.fit,
        run_key=run.run_key,
        config=resolved_config(run),
        fingerprint=run.fingerprint,
    )


def restore(run: DitRun, storage: Storage, key: str, shown: str = "") -> None:
    """Continue from the checkpoint at `key`: adapter, optimizer, loop state, stop rule and
    milestones, with the checkpoint's crop/batch/checkpointing. `shown`: the checkpoint as the
    log line names it (default: its URL)."""
    restored = dit_state.read_checkpoint(
        storage, key, model=run.transformer, optimizer=run.optimizer, fingerprint=run.fingerprint
    )
    _adopt_fit(run, restored.fit)
    run.state = restored.state
    run.stop.load_state_dict(restored.stop)
    run.milestones.load_state_dict(restored.milestones)
    state = run.state
    shown = shown or storage.url_of(key)
    _log(run, f"resumed from {shown} at step {state.step} (epoch {state.epoch})")


def _adopt_fit(run: DitRun, saved: dict[str, Any]) -> None:
    """Resume with the checkpoint's crop, batch and checkpointing (`dit_state.adopted_fit`), and
    everything sized from them: frame length, checkpointed blocks, graphs, schedule, fold."""
    compiled = run.engine.mode != "off"
    fit = dit_state.adopted_fit(
        run.fit, saved, run.dims, run.spec, run.cache.condition_len, compiled, run.settings.speed
    )
    if fit is None:
        return
    run.fit = fit
    run.frames = dit_data.batch_frames(run.cache, fit.crop_frames)
    compiling.install_checkpointing(run.transformer, fit.ckpt_layers, fit.trained_layers)
    if fit.ckpt_layers > 0 and run.engine.graphs:  # recompute is not captured
        # blocks compiled with graph trees (reduce-overhead) are compiled again
        run.engine.drop_graphs(recompile=run.engine.mode == "reduce-overhead")
        _log(run, "the checkpoint's fit checkpoints layers: compiled blocks without CUDA graphs")
    run.schedule = dit_setup.build_schedule(run.options, run.settings, run.cache, fit.batch)
    run.engine.fold = fold_factor(run)  # sized for the adopted fit, not this GPU's own


def _log(run: DitRun, message: str, level: str = "info") -> None:
    if run.events:
        run.events.log(message, level)  # type: ignore[arg-type]
