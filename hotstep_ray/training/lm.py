"""5 Hz LM adapter training (ACE-Step 1.5 planner, Qwen3 0.6B/1.7B/4B), the recipe: setup -> train -> save.

Plain Python; `ray_lm` runs the same three steps in Ray Train workers.

setup   load the LM folder (its config.json decides the size, never its name), the tokenizer, and
        `lm_codes.jsonl`; render songs in the trained layout (over-length ones skipped); plan the
        micro-batches; fit activation checkpointing to the GPU; inject LoRA/LoKR on q/k/v/o/gate/
        up/down, optionally starting from an earlier run (`init_adapter`, identity-checked);
        build hybrid Muon/AdamW, the warmup + cosine schedule, the stop rule, milestones
        (`lm_setup.setup_lm`; the run's request and LM folder: `lm_spec`; its warm start:
        `lm_start`).
train   epochs of windows of `grad_accum` micro-batches; per window: Σ per-song mean CE /
        songs in the window, backward, clip, schedule, step. Epoch loss = mean over songs. Stop on
        the epoch cap, the target on the 5-epoch moving average, or a non-finite loss (`train_lm`,
        here).
save    the kept adapter (the best epoch, or the epoch that hit the target) as a PEFT folder
        (LoRA) or LyCORIS file (LoKR), BF16, trigger in `__metadata__`, plus `lm_train_log.json`,
        under `adapters/lm-06b|lm-17b|lm-4b/<artist>/<run>/` (`lm_save.save_lm`; the loop state
        and its resumable checkpoints live there too).

Stages (`options.stages`, `run_lm_training`): `extract` writes/refreshes `lm_codes.jsonl` from the tensor cache
(`lm_data.extract_codes`, unchanged rows reused); `train` trains; `export` writes the adapter. Train
without export keeps the resumable checkpoint in `<run>/checkpoint/` (and skips milestones); export
alone (`run_key` = that run) exports the adapter it kept. `holdout_fraction` keeps songs out of
training and reports their loss per epoch as `eval` events (`holdout`). `calibrate` is not a
stage of this trainer: `calibration.after_train.run_lm_then_calibrate` trains, then calibrates.

Resume: checkpoints are taken at epoch ends (`lm_save`); a resumed run equals an uninterrupted one
(data order is a function of (seed, epoch)): it continues with the options and trigger in its
checkpoint, and names each other value it was given as ignored (`options_from_checkpoint`).

The data is `lm_data`'s, the loss `lm_loss`'s, the memory model `lm_vram`'s; those and the modules
above (`lm_spec` -> `lm_start` -> `lm_setup` -> `lm_save`, each importing only those before it)
take explicit arguments, and none imports this one.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from hotstep_ray.core import layout
from hotstep_ray.core.contracts import CheckpointCadence, TrainLmOptions
from hotstep_ray.core.errors import InputError
from hotstep_ray.core.events import EventLog
from hotstep_ray.core.storage import Storage
from hotstep_ray.training import adapters, checkpoint, compiling, flat_grads, holdout, lm_loss
from hotstep_ray.training import lm_data as data
from hotstep_ray.training.lm_save import (
    LmRunResult,
    LmTrainState,
    checkpoint_key,
    export_adapter,
    load_state,
    new_state,
    save_lm,
    save_state,
    snapshot,
    train_log,
)
from hotstep_ray.training.lm_setup import LmSetup, setup_lm
from hotstep_ray.training.lm_spec import LmTrainSpec

MILESTONE_DIR = layout.MILESTONE_DIR


# -- train ---------------------------------------------------------------------------------------
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
        # a shape's first steps compile and capture: never beside another trainer's (capture_gate)
        shape = tuple(data.group_shape(setup.examples, g, setup.pad_multiple) for g in window)
        with setup.warmup.step(shape):
            if setup.compile == "reduce-overhead":  # a new step: the last one's outputs are dead
                torch.compiler.cudagraph_mark_step_begin()
            in_window = sum(len(row) for group in window for row in group)
            window_loss = torch.zeros((), device=setup.device)
            for j, group in enumerate(window):
                batch = data.collate(setup.examples, group, pad_multiple=setup.pad_multiple)
                batch = batch.to(setup.device)
                last = j == len(window) - 1
                sync = (
                    contextlib.nullcontext() if last or setup.world == 1 else setup.module.no_sync()
                )
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
                return {
                    "epoch": epoch,
                    "loss": math.nan,
                    "lr": 0.0,
                    "grad_norm": math.nan,
                    "ms": 0.0,
                }
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
        state.saved_state = snapshot(setup.model)
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


def checkpoint_cadence(options: TrainLmOptions) -> Callable[[LmTrainState], bool]:
    """The epoch-end rule of `contracts.CheckpointCadence` for one run: the returned function says
    whether the checkpoint of the epoch `state` just ended is due (the finished one's always),
    counting the seconds from the last one it said was."""
    last = 0.0

    def due(state: LmTrainState) -> bool:
        nonlocal last
        now = time.time()
        every_s, every_epochs = options.checkpoint_every_s, options.checkpoint_every_epochs
        if state.finished or checkpoint.due(state.epoch, last, every_s, every_epochs, now):
            last = now
            return True
        return False

    return due


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


# -- the whole run -------------------------------------------------------------------------------
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
    keep = {"stages", "calibrate", "calibrate_repoint", *CheckpointCadence.model_fields}
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
        due = checkpoint_cadence(spec.options)

        def keep(setup: LmSetup, state: LmTrainState) -> None:
            # the finished state is what a later export reads
            if due(state) or state.epoch == stop_after_epoch:
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
