"""The DiT run's metric events as it trains: one per step (the recipe rate-limits them) and
one per epoch. CLI progress, the JSONL log and the API all read these."""

from __future__ import annotations

from typing import Any

import torch

from hotstep_ray.core.contracts import LATENT_HZ, TrainDitOptions
from hotstep_ray.core.events import MetricEvent
from hotstep_ray.training import dit_vram
from hotstep_ray.training.dit_state import StepResult, TrainState


def step_event(
    result: StepResult,
    state: TrainState,
    options: TrainDitOptions,
    fit: dit_vram.VramFit,
    total_steps: int,
    world_size: int,
    device: torch.device,
) -> MetricEvent:
    """The step just run: loss, LR, gradient norm, time and the ETA at this step's pace, audio
    seconds trained per second (all workers), the crop and batch, and peak memory on CUDA."""
    extra: dict[str, Any] = {
        "raw_loss": result.raw_loss,
        "audio_s_per_s": result.frames * world_size / LATENT_HZ / (result.ms / 1000),
        "crop": fit.crop_frames,
        "batch": fit.batch,
    }
    if device.type == "cuda":
        extra["vram_mb"] = torch.cuda.max_memory_allocated(device) / 1e6
    return MetricEvent(
        metric="step",
        epoch=state.epoch,
        epochs=options.epochs,
        step=state.step,
        total_steps=total_steps,
        loss=result.loss,
        lr=result.lr_factor * options.effective_learning_rate,
        grad_norm=result.grad_norm,
        step_ms=result.ms,
        eta_ms=result.ms * max(0, total_steps - state.step),
        **extra,
    )


def epoch_event(
    record: dict[str, Any], state: TrainState, epochs: int, total_steps: int
) -> MetricEvent:
    """The epoch just closed (`TrainState.close_epoch`'s record)."""
    return MetricEvent(
        metric="epoch",
        epoch=record["epoch"],
        epochs=epochs,
        step=state.step,
        total_steps=total_steps,
        loss=record["loss"],
        lr=record["lr"],
        grad_norm=record["grad_norm"],
        step_ms=record["ms"],
        ma5=record["ma5"],
        raw_loss=record["raw_loss"],
    )
