"""The DiT run's record: its resolved config (also in every checkpoint), runtime facts, and
`dit_train_log.json` (rewritten every epoch; `final` adds the ΔW report), and `read_progress`,
how far a run got by its log.

Importing this module loads no torch (the trainer's modules are imported where they are used):
`adapters list` reads run logs with it and stays quick.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from hotstep_ray import __version__
from hotstep_ray.core.errors import HotstepError

if TYPE_CHECKING:
    from hotstep_ray.core.storage import Storage

# A `training.dit.DitRun`, named only: dit imports this module, and this one reads the run's
# fields without needing its class.
DitRun = Any

FORMAT = "hotstep-ray-dit-train-v1"
PRODUCER = f"hotstep-ray {__version__} dit trainer"
LOG_FILE = "dit_train_log.json"


def resolved_config(run: DitRun) -> dict[str, Any]:
    options = run.options
    config = options.model_dump(mode="json")
    config.update(
        {
            "learning_rate": options.effective_learning_rate,
            "weight_decay": options.effective_weight_decay,
            "loss_weighting": options.effective_loss_weighting,
            "lokr_alpha": options.effective_lokr_alpha,
            "cfg_ratio": run.loss.cfg_ratio,
            "crop_frames": run.fit.crop_frames,
            "crop_source": run.fit.crop_source,
            "batch": run.fit.batch,
            "ckpt_layers": run.fit.ckpt_layers,
            "layers": run.fit.trained_layers,
            "n_layers_total": run.dims.layers,
            "lora_dropout": run.spec.dropout,
            "dit_path": run.dit_folder,
            "dit_name": run.dit_name,
            "variant": run.models.variant.name,
            "tensors": run.cache_key,
            "samples": run.cache.samples,
            "trigger": run.trigger,
            "trigger_position": run.trigger_position,
            "zero_groups": list(run.settings.zero_groups),
            "world_size": run.settings.world_size,
        }
    )
    return config


def runtime_info(run: DitRun) -> dict[str, Any]:
    import torch

    from hotstep_ray.training import kron_kernels

    info: dict[str, Any] = {
        "backend": run.device.type,
        "dtype": str(run.models.dtype).removeprefix("torch."),
        "autocast": None if run.autocast is None else str(run.autocast).removeprefix("torch."),
        "attention": "sdpa; dense band mask on sliding layers; padded keys masked",
        "window_rule": run.settings.window_rule,
        "compile": run.engine.mode,
        "fold_accum": run.engine.fold,  # planned micro-batches per forward
        "torch": torch.__version__,
        "world_size": run.settings.world_size,
    }
    if run.device.type == "cuda":
        info["device_name"] = torch.cuda.get_device_name(run.device)
    if run.spec.kind == "lokr":  # which w1 gradients took the Triton kernel (self-check verdicts)
        info["lokr_w1_kernel"] = kron_kernels.verdicts()
    return info


def write_log(run: DitRun, final: bool = False) -> dict[str, Any]:
    """`dit_train_log.json` in the run folder, rewritten every epoch."""
    import torch

    from hotstep_ray.training import dit_vram, export

    state = run.state
    vram = run.fit.to_dict()
    if run.device.type == "cuda":
        free, total = torch.cuda.mem_get_info(run.device)
        vram.update(
            peak_gb=round(torch.cuda.max_memory_allocated(run.device) / dit_vram.GB, 3),
            free_gb=round(free / dit_vram.GB, 3),
            total_gb=round(total / dit_vram.GB, 3),
        )
    log = {
        "format": FORMAT,
        "producer": PRODUCER,
        "created_at": datetime.fromtimestamp(run.started, UTC).isoformat(),
        "updated_at": datetime.now(UTC).isoformat(),
        "final": final,
        "job": run.settings.job_id,  # the job that trains the run: is it still alive?
        "config": resolved_config(run),
        "runtime": runtime_info(run),
        "vram": vram,
        "data": {
            **run.cache.summary(),
            "frames_per_batch": run.frames,
            "steps_per_epoch": run.schedule.steps_per_epoch,
            "total_steps": run.schedule.total_steps,
            "warmup_steps": run.schedule.warmup_steps,
        },
        "loss": run.loss.describe(),
        "optimizer": {"kind": run.options.optimizer, "split": run.optimizer.split_summary()},
        "epochs": state.history,
        "steps": state.step,
        "final_loss": state.history[-1]["loss"] if state.history else None,
        "best_loss": None if math.isinf(state.best_ma5) else state.best_ma5,
        "best_epoch": state.best_epoch,
        "epochs_run": len(state.history),
        "saved_ma5": state.saved_ma5,
        "saved_epoch": state.saved_epoch,
        "saved_reason": state.saved_reason,
        "stop_reason": state.stop_reason,
        "target_loss_stop": state.target_stop,
        "milestones": state.milestones,
        "resumes": state.resumes,
        "holdout": None if run.holdout is None else {**run.holdout.info, "epochs": state.holdout},
        "audio_seconds": state.audio_seconds,
        "total_ms": (time.time() - run.started) * 1000,
    }
    if final and "export" in run.options.stages and state.saved_reason:
        try:  # materialises every ΔW at once: up to ~10 GB for an XL LoRA r128
            log["delta_report"] = export.delta_report(run.transformer)
        except torch.OutOfMemoryError:
            log["delta_report"] = "skipped: out of GPU memory"
        flagged = [
            g["group"] for g in log.get("delta_report", []) if isinstance(g, dict) and g["flagged"]
        ]
        if flagged:
            if run.events:
                run.events.log(
                    f"ΔW/W median above 5 % in {flagged}: the adapter may overpower the base",
                    "warn",
                )
    run.storage.write_json(f"{run.run_key}/{LOG_FILE}", log)
    return log


@dataclass(frozen=True)
class RunProgress:
    """How far a DiT run got, by its `dit_train_log.json`."""

    run_key: str
    final: bool  # `finish` wrote the log: the run ended (or paused) on its own
    stop_reason: str
    epochs_run: int  # epochs the log records
    steps: int
    job_id: str  # the job that trained it ("" = not recorded)

    @property
    def state(self) -> str:
        """finished | paused (`max_steps`: a checkpoint to continue from) | unfinished (still
        training, or killed: only its job's liveness tells which)."""
        if not self.final:
            return "unfinished"
        return "paused" if self.stop_reason == "max_steps" else "finished"


def read_progress(storage: Storage, run_key: str) -> RunProgress | None:
    """The run's progress from its log; None when the folder holds no (readable) log."""
    key = f"{run_key}/{LOG_FILE}"
    try:
        if not storage.exists(key):
            return None
        log = storage.read_json(key)
    except (HotstepError, ValueError, OSError):
        return None
    if not isinstance(log, dict):
        return None
    return RunProgress(
        run_key=run_key,
        final=bool(log.get("final")),
        stop_reason=str(log.get("stop_reason") or ""),
        epochs_run=int(log.get("epochs_run") or 0),
        steps=int(log.get("steps") or 0),
        job_id=str(log.get("job") or ""),
    )
