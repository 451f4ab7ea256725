"""What an LM run keeps: its loop state, that state's resumable checkpoint, and at the end the
exported adapter and the training log.

state       `LmTrainState` (`new_state`): epochs and steps done, the per-epoch history, the
            adapter kept for export (the best epoch, or the epoch that hit the target) and
            why, the stop rule and the milestone tracker.
checkpoint  `save_state` / `load_state` at `checkpoint_key(run)` = `<run>/checkpoint/`
            (`training.checkpoint`: adapter, optimizer, RNG, plus the loop state): taken at
            epoch ends, removed after export; a resumed run equals an uninterrupted one (data
            order is a function of (seed, epoch)), and one of another identity is refused
            (`lm_start.check_identity`).
save        `save_lm`: the kept adapter as a PEFT folder (LoRA) or LyCORIS file (LoKR), BF16,
            trigger in `__metadata__` (`export_adapter`, milestones too), plus
            `lm_train_log.json` (`train_log`: the resolved config, per-epoch losses, what was
            kept and why), the file that tells a finished run (`warm_start`).

Separate from the loop (`lm`) because a run's files are written and read outside it too: the
Ray workers checkpoint through `ray.train.report` and export on rank 0 (`ray_lm`), and the
export stage reads a checkpoint without training.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import torch
from torch import nn

from hotstep_ray.core import layout
from hotstep_ray.core.errors import InputError
from hotstep_ray.core.storage import Storage
from hotstep_ray.training import adapters, checkpoint, export, lm_vram, warm_start
from hotstep_ray.training.lm_setup import LmSetup
from hotstep_ray.training.lm_start import AdapterIdentity, check_identity
from hotstep_ray.training.schedule import MilestoneTracker, StopRule

LOG_FILE = warm_start.LM_LOG_FILE  # "lm_train_log.json": what tells a finished run (warm_start)
LOG_FORMAT = "hot-step-lm-train-v1"
CHECKPOINT_DIR = layout.RUN_CHECKPOINT_DIR


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


def snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's adapter weights, copied to the CPU (what `LmTrainState.saved_state` keeps)."""
    return {k: v.cpu() for k, v in adapters.adapter_state_dict(model).items()}


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
        "vram": {**setup.vram.to_dict(), "peak_mb": peak_mb, "budget_mb": setup.budget_mb},
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
        state.saved_state = snapshot(setup.model)
        state.saved_epoch, state.saved_reason = state.epoch, "final"
        state.saved_loss = state.history[-1]["loss"]
    files: list[str] = []
    if "export" in setup.options.stages:
        live = snapshot(setup.model)
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


def checkpoint_key(run_key: str) -> str:
    return f"{run_key}/{CHECKPOINT_DIR}"
