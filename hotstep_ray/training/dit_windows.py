"""One DiT optimizer window, from plan to the step engine's inputs.

    epoch_windows   this rank's windows of an epoch: `grad_accum` micro-batches of song indices
    draw_window     every random choice of a window (crops, timesteps, CFG coins, weights) from
                    one stream seeded by (seed, "step", step, rank), so a resumed run redraws
                    exactly what an uninterrupted one would
    prepare_window  the draws and the fold groups assembled on the host (pinned on CUDA): what
                    the engine prepares for the next step while this step's backward runs
    step_work       the fold groups as the engine's flat input lists, the noise drawn on the
                    device from (seed, "noise", step, rank, micro-batch)
    input_shapes    what picks a step's graphs (compiled blocks and the step graph)

Everything they read of the run is one `Sampling`.

A fold group runs `fold` planned micro-batches as one forward; each planned micro-batch keeps its
own draws and noise seed, so folding changes the shapes, not the numbers.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from hotstep_ray.core.contracts import TrainDitOptions
from hotstep_ray.models.acestep_ops import TrainBatch
from hotstep_ray.training import dit_data, dit_loss
from hotstep_ray.training.accumulate import micro_batch_weights
from hotstep_ray.training.engine import StepWork

Window = list[tuple[int, ...]]  # micro-batches of song indices
NoiseSeeds = list[tuple[tuple[Any, ...], int]]  # (seed parts, rows) per planned micro-batch

# A fold group's inputs as the engine takes them: the TrainBatch fields, then t, cfg_drop,
# weights and noise; the one shared input is the channel weights.
BATCH_FIELDS = tuple(f.name for f in dataclasses.fields(TrainBatch))


@dataclass(frozen=True)
class Sampling:
    """What one rank's windows, their draws and their host batches are a function of. The recipe
    builds it from its run's current fit on each use (`DitRun.sampling`): a resume may adopt
    another crop, batch and fold."""

    cache: dit_data.TensorCache
    options: TrainDitOptions  # seed, order, grad_accum, genre_ratio
    loss: dit_loss.LossConfig  # timestep sampling, CFG ratio, weights, channel weights
    crop_frames: int
    batch: int  # songs per planned micro-batch
    frames: int  # padded frame length of every micro-batch (`dit_data.batch_frames`)
    patch: int  # crop starts on this frame grid
    fold: int = 1  # planned micro-batches per forward
    rank: int = 0
    world_size: int = 1
    pin_memory: bool = False  # host batches in pinned memory (CUDA)


def epoch_windows(sampling: Sampling, epoch: int) -> list[Window]:
    """This rank's optimizer windows of `epoch` (`dit_data.plan_epoch`, then `shard_plan`)."""
    options = sampling.options
    plan = dit_data.plan_epoch(
        sampling.cache.repeats, sampling.batch, options.seed, epoch, options.order
    )
    shard = dit_data.shard_plan(plan, sampling.rank, sampling.world_size)
    return dit_data.windows(shard, options.grad_accum)


@dataclass
class WindowDraws:
    """Every random choice of one optimizer window, made before its first forward."""

    crops: list[list[dit_data.Crop]]
    t: list[torch.Tensor]  # per micro-batch [b]
    cfg_drop: list[torch.Tensor]  # per micro-batch [b] bool
    weights: list[torch.Tensor]  # per micro-batch [b], window-normalised


def draw_window(sampling: Sampling, window: Window, step: int) -> WindowDraws:
    """The window's draws, in a fixed order from one generator: per micro-batch its crops
    (`genre_ratio`, starts on the `patch` grid), timesteps, CFG drops, then the weights."""
    cache, loss, options = sampling.cache, sampling.loss, sampling.options
    rng = dit_data.generator(options.seed, "step", step, sampling.rank)
    crops, ts, drops, weights = [], [], [], []
    for micro_batch in window:
        crops.append(
            [
                dit_data.draw_crop(
                    cache.songs[song],
                    song,
                    sampling.crop_frames,
                    options.genre_ratio,
                    rng,
                    sampling.patch,
                )
                for song in micro_batch
            ]
        )
        t = dit_loss.sample_timesteps(len(micro_batch), loss, rng)
        ts.append(t)
        drops.append(dit_loss.sample_cfg_drop(len(micro_batch), loss.cfg_ratio, rng))
        weights.append(dit_loss.timestep_weights(t, loss))
    return WindowDraws(crops, ts, drops, dit_loss.normalize_window(weights, loss))


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
    window: Window
    draws: WindowDraws
    host: list[TrainBatch]  # one per fold group


def prepare_window(sampling: Sampling, window: Window, step: int) -> PreparedWindow:
    """The step engine's `prepare`: the window's draws and one padded host batch per fold
    group (pinned on CUDA; torch's host cache reuses the blocks)."""
    draws = draw_window(sampling, window, step)
    host = []
    for group in fold_groups(len(window), sampling.fold):
        crops = [c for i in group for c in draws.crops[i]]
        host.append(
            dit_data.assemble(
                sampling.cache, crops, sampling.frames, pin_memory=sampling.pin_memory
            )
        )
    return PreparedWindow(step, list(window), draws, host)


def draw_noise(noise_seeds: NoiseSeeds, shape: torch.Size, device: torch.device) -> torch.Tensor:
    """[rows, *shape] float32 on `device`: each planned micro-batch's rows from its own seed."""
    return torch.cat(
        [
            torch.randn(
                (rows, *shape),
                generator=dit_data.generator(*seed, device=device),
                device=device,
                dtype=torch.float32,
            )
            for seed, rows in noise_seeds
        ]
    )


def step_work(
    sampling: Sampling, prepared: PreparedWindow, training: bool, device: torch.device
) -> StepWork:
    """The step engine's `work`: the draws are made per planned micro-batch, and `fold` of them
    run as one forward, weighted by its share of the window's samples; the noise is drawn here,
    on the device. The one shared input: the channel weights ([64] or None). `training`: the
    module mode, part of the graphs' key."""
    draws, window, step, fold = prepared.draws, prepared.window, prepared.step, sampling.fold
    groups = fold_groups(len(window), fold)
    inputs = []
    for group, host in zip(groups, prepared.host, strict=True):
        seeds = [
            ((sampling.options.seed, "noise", step, sampling.rank, i), len(window[i]))
            for i in group
        ]
        inputs.append(
            [
                *(getattr(host, name) for name in BATCH_FIELDS),
                torch.cat([draws.t[i] for i in group]),
                torch.cat([draws.cfg_drop[i] for i in group]),
                torch.cat([draws.weights[i] for i in group]),
                draw_noise(seeds, host.target_latents.shape[1:], device),
            ]
        )
    shares = micro_batch_weights([sum(len(window[i]) for i in group) for group in groups])
    key = input_shapes(prepared, fold, training)
    return StepWork(inputs, shares, [sampling.loss.channel_weights], key)


def unpack(inputs: list) -> tuple[TrainBatch, torch.Tensor, torch.Tensor, torch.Tensor, Any]:
    """One fold group's `step_work` inputs back as (batch, t, cfg_drop, weights, noise)."""
    batch = TrainBatch(**dict(zip(BATCH_FIELDS, inputs, strict=False)))
    t, cfg_drop, weights, noise = inputs[len(BATCH_FIELDS) :]
    return batch, t, cfg_drop, weights, noise


def input_shapes(prepared: PreparedWindow, fold: int, training: bool) -> tuple:
    """What picks a step's graphs (compiled blocks, and the step graph it keys): every fold
    group's host tensors (shape and dtype, or None for an absent mask), the fold, and the
    module mode."""

    def signature(batch: TrainBatch) -> tuple:
        values = (getattr(batch, f.name) for f in dataclasses.fields(batch))
        return tuple(None if v is None else (tuple(v.shape), v.dtype) for v in values)

    return (tuple(signature(batch) for batch in prepared.host), fold, training)
