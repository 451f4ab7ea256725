"""The DiT run's resumable state: the loop's counters and sums, and checkpoints of them.

`TrainState` adds up each optimizer step (`StepResult`) into the epoch's sums and closes an
epoch into its `history` record; `epoch_sums` and `any_rank` are the collectives the epoch's end
needs under several workers (every worker must reach the same checkpoint calls).

A checkpoint (`training.checkpoint`) holds the adapter, the optimizer and the RNG states; its
`extra` holds what the recipe adds: the loop state (`TrainState`), the stop rule's moving
average, the milestone tracker and the fit (crop, batch, checkpointed layers). A resume takes
the checkpoint's fit, because the data streams and the LR schedule depend on it, as long as the
memory model says it fits on this GPU (`adopted_fit`).

Where a run's checkpoints lie: `<run>/checkpoint/` (in this process), or under Ray Train's run
folder `ray_results/<run key, "/" as "_">/checkpoint_<step, 6 digits>/` (`--ray`);
`newest_checkpoint` finds the newest of either.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch

from hotstep_ray.core import layout
from hotstep_ray.core.contracts import LATENT_HZ
from hotstep_ray.core.errors import InputError
from hotstep_ray.core.storage import Storage
from hotstep_ray.training import dit_vram
from hotstep_ray.training.adapters import AdapterSpec
from hotstep_ray.training.checkpoint import (
    MANIFEST,
    CheckpointMismatchError,
    load_checkpoint,
    read_manifest,
    save_checkpoint,
)
from hotstep_ray.training.schedule import MilestoneTracker, StopRule
from hotstep_ray.training.speed import SpeedOptions

CHECKPOINT_DIR = layout.RUN_CHECKPOINT_DIR
FIT_KEYS = ("crop_frames", "batch", "ckpt_layers", "trained_layers")  # what a resume adopts


@dataclass
class StepResult:
    """One optimizer step on this rank."""

    loss: float  # weighted loss, the window's samples' mean
    raw_loss: float  # plain flow-matching MSE
    grad_norm: float  # before the clip
    lr_factor: float  # the schedule's factor of the step
    samples: int
    frames: int  # real latent frames trained
    ms: float
    finite: bool  # False: nothing was updated, the run stops


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

    def add_step(self, result: StepResult, world_size: int) -> None:
        """A finished step into the epoch's sums (this rank's) and the audio trained (all)."""
        self.epoch_loss += result.loss * result.samples
        self.epoch_raw += result.raw_loss * result.samples
        self.epoch_samples += result.samples
        self.epoch_frames += result.frames
        self.epoch_grad_norms.append(result.grad_norm)
        self.epoch_ms += result.ms
        self.audio_seconds += result.frames * world_size / LATENT_HZ

    def close_epoch(
        self, loss: float, raw_loss: float, ma5: float, lr: float, world_size: int
    ) -> dict[str, Any]:
        """The epoch's `history` record (losses over every worker, this rank's median gradient
        norm and time), appended and returned."""
        grad_norms = self.epoch_grad_norms
        record = {
            "epoch": self.epoch,
            "loss": loss,
            "ma5": ma5,
            "raw_loss": raw_loss,
            "lr": lr,
            "grad_norm": statistics.median(grad_norms) if grad_norms else 0.0,
            "ms": self.epoch_ms,
            "audio_s": self.epoch_frames * world_size / LATENT_HZ,
        }
        self.history.append(record)
        return record

    def next_epoch(self) -> None:
        """Move to the next epoch's first window with empty epoch sums."""
        self.epoch += 1
        self.window = 0
        self.epoch_loss = self.epoch_raw = self.epoch_ms = 0.0
        self.epoch_samples = self.epoch_frames = 0
        self.epoch_grad_norms = []


def epoch_sums(
    state: TrainState, world_size: int, device: torch.device
) -> tuple[float, float, int]:
    """(Σ loss·samples, Σ raw loss·samples, samples) of the epoch over every worker."""
    values = torch.tensor(
        [state.epoch_loss, state.epoch_raw, state.epoch_samples], dtype=torch.float64
    )
    if world_size > 1:
        import torch.distributed as dist

        values = values.to(device)
        dist.all_reduce(values)
        values = values.cpu()
    return float(values[0]), float(values[1]), int(values[2])


def any_rank(flag: bool, world_size: int, device: torch.device) -> bool:
    """True when any worker says so (checkpoints are collective under Ray: every worker must
    reach the same checkpoint calls)."""
    if world_size <= 1:
        return flag
    import torch.distributed as dist

    value = torch.tensor([int(flag)], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


@dataclass
class DitResult:
    """What `train` returns: how the run ended, and the final log (main rank; {} elsewhere)."""

    run_key: str
    stop_reason: str
    epochs_run: int
    steps: int
    final_loss: float | None
    best_ma5: float | None
    saved_reason: str
    log: dict[str, Any]

    @classmethod
    def of(cls, run_key: str, state: TrainState, log: dict[str, Any]) -> DitResult:
        return cls(
            run_key=run_key,
            stop_reason=state.stop_reason,
            epochs_run=len(state.history),
            steps=state.step,
            final_loss=state.history[-1]["loss"] if state.history else None,
            best_ma5=None if math.isinf(state.best_ma5) else state.best_ma5,
            saved_reason=state.saved_reason,
            log=log,
        )


@dataclass
class Restored:
    """What a checkpoint gives back besides the adapter and optimizer it loaded in place."""

    state: TrainState
    stop: dict[str, Any]  # `StopRule.state_dict()`
    milestones: dict[str, Any]  # `MilestoneTracker.state_dict()`
    fit: dict[str, Any]  # `VramFit.to_dict()` of the run that wrote it


def write_checkpoint(
    storage: Storage,
    key: str,
    *,
    model: Any,
    optimizer: Any,
    state: TrainState,
    stop: StopRule,
    milestones: MilestoneTracker,
    fit: dit_vram.VramFit,
    run_key: str,
    config: dict[str, Any],
    fingerprint: str,
) -> str:
    """A resumable checkpoint at `key` (`training.checkpoint.save_checkpoint`); returns the
    manifest key."""
    extra = {
        "state": asdict(state),
        "stop": stop.state_dict(),
        "milestones": milestones.state_dict(),
        "fit": fit.to_dict(),
        "run_key": run_key,
    }
    return save_checkpoint(
        storage,
        key,
        model=model,
        optimizer=optimizer,
        step=state.step,
        epoch=state.epoch,
        config=config,
        extra=extra,
        fingerprint=fingerprint,
    )


def read_checkpoint(
    storage: Storage, key: str, *, model: Any, optimizer: Any, fingerprint: str
) -> Restored:
    """Load the adapter and optimizer at `key` in place and return the loop state to continue
    with: wall clocks reset (the next export and checkpoint are due at once), a `max_steps`
    stop cleared (a deliberate pause, not an end) and this resume recorded."""
    loaded = load_checkpoint(
        storage, key, model=model, optimizer=optimizer, fingerprint=fingerprint
    )
    extra = loaded.extra
    state = TrainState(**extra["state"])
    state.last_export = state.last_checkpoint = 0.0
    if state.stop_reason == "max_steps":
        state.stop_reason = ""
    state.resumes = [*state.resumes, {"step": state.step, "epoch": state.epoch}]
    return Restored(state, extra["stop"], extra["milestones"], extra["fit"])


def adopted_fit(
    fit: dit_vram.VramFit,
    saved: dict[str, Any],
    dims: dit_vram.DitDims,
    spec: AdapterSpec,
    condition_len: int,
    compiled: bool,
    speed: SpeedOptions,
) -> dit_vram.VramFit | None:
    """The checkpoint's crop, batch and checkpointing in place of this GPU's own `fit` (a
    restart on another node may size the run differently); None when they are the same.
    Refused when the checkpoint trains other layers, or when the memory model says its fit
    does not fit the budget here."""
    if all(saved[k] == getattr(fit, k) for k in FIT_KEYS):
        return None
    if saved["trained_layers"] != fit.trained_layers:
        raise InputError(
            f"checkpoint trains {saved['trained_layers']} layers, this run "
            f"{fit.trained_layers}: pass the same --layers to resume"
        )
    plan = dit_vram.Plan(
        saved["crop_frames"],
        saved["batch"],
        saved["ckpt_layers"],
        saved["trained_layers"],
        condition_len,
    )
    need = dit_vram.estimate(dims, spec, plan, saved["batch"] > 1, compiled, speed)
    if fit.budget is not None and need.total > fit.budget:
        raise dit_vram.VramFitError(
            f"the checkpoint's crop {plan.crop_frames} / batch {plan.batch} / "
            f"{plan.ckpt_layers} checkpointed layers need {need.total / dit_vram.GB:.1f} GB; "
            f"{fit.budget / dit_vram.GB:.1f} GB is available here"
        )
    return replace(
        fit,
        crop_frames=plan.crop_frames,
        batch=plan.batch,
        ckpt_layers=plan.ckpt_layers,
        estimate=need,
        notes=(*fit.notes, "crop/batch/checkpointing taken from the checkpoint"),
    )


# =============================================================================== where they lie


def ray_checkpoint_name(step: int) -> str:
    """A Ray checkpoint's folder name: the optimizer steps it holds, so names sort by progress."""
    return f"checkpoint_{step:06d}"


@dataclass(frozen=True)
class SavedCheckpoint:
    """A resumable checkpoint found in storage, from its manifest alone (no tensors read)."""

    key: str
    step: int  # optimizer steps done
    epoch: int  # the epoch it continues in (1-based): epochs before it are done
    window: int  # the next optimizer window of that epoch (0: it starts the epoch)
    stop_reason: str  # the run's stop reason when it was written ("" = still training)

    @property
    def epochs_done(self) -> int:
        return self.epoch - 1


def saved_checkpoint(storage: Storage, key: str) -> SavedCheckpoint | None:
    """The checkpoint at `key`, None when there is none (or it is not one of ours)."""
    if not storage.exists(f"{key}/{MANIFEST}"):
        return None
    try:
        manifest = read_manifest(storage, key)
    except (CheckpointMismatchError, ValueError):
        return None
    extra = (manifest.get("tree") or {}).get("extra") or {}
    state = extra.get("state") if isinstance(extra, dict) else None
    state = state if isinstance(state, dict) else {}
    return SavedCheckpoint(
        key=key,
        step=int(manifest.get("step") or 0),
        epoch=int(manifest.get("epoch") or 1),
        window=int(state.get("window") or 0),
        stop_reason=str(state.get("stop_reason") or ""),
    )


def newest_checkpoint(storage: Storage, run_key: str) -> SavedCheckpoint | None:
    """The newest (most steps) resumable checkpoint of the run in `run_key`: its own
    `<run>/checkpoint/` or one of Ray Train's for it; None when the run wrote none."""
    found = [saved_checkpoint(storage, f"{run_key}/{CHECKPOINT_DIR}")]
    ray_run = layout.ray_run_dir(run_key)
    if storage.exists(ray_run):
        for key in storage.list(ray_run):
            if key.rsplit("/", 1)[-1].startswith("checkpoint_"):
                found.append(saved_checkpoint(storage, key))
    saved = [checkpoint for checkpoint in found if checkpoint is not None]
    return max(saved, key=lambda checkpoint: checkpoint.step) if saved else None
