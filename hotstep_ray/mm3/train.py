"""`mm3 train-dit`: LoRA on the diffusers MM3 DiT from the MM3 cache; setup -> train -> save.

Recipe (HOT-Step `mm3-train-dit` defaults, shared/reference/hotstep.md §7.5; mm3.md §3.3):
- LoRA r32 / alpha 32 on all eight sites of all 36 blocks (`to_q, to_k, to_v, to_out.0, ff_in,
  ff_out`, plus `proj_in`, `proj_out`) through the shared `training.adapters` (peft; B = 0, so
  step 0 is exactly the base model). Train ALL sites; the group filter is applied at export.
- AdamW (`training.optim`, weight decay 0.01), lr 1e-4, 200 steps, warmup max(1, steps / 20) from
  lr 0 then the shared cosine (`training.schedule`), global-norm clip 1.0, batch 1, grad-accum 1.
- Crops of 689 latents (one DiT window) drawn inside one conditioning segment (`data.py`,
  reject-and-redraw: seed trap 17).
- Objective `flow.py`: t = sigmoid(N(logit_mean, logit_std)), x_t = t x0 + (1 - t) noise, target
  x0 - noise, plain MSE (seed trap 1); every draw from a seeded CPU generator (seed trap 8).
- ||dW||/||W|| per group every `delta_every` steps and at the end, warning above 5 % (trap 16).

Outputs, in `adapters/mm3-dit/<artist>/<run stamp>/` (`core.layout.mm3_dit_adapter_base`):
    mm3_lora.safetensors             ComfyUI keys, q,k zeroed + proj_in/out dropped (trap 18)
    mm3_lora_unfiltered.safetensors  every trained group (ablations)
    mm3_lora_step<N>.safetensors     filtered snapshots (`export_every`)
    checkpoint/                      resumable adapter + optimizer (`training.checkpoint`)
    train_report.json                options, songs, losses, crop statistics, delta gate

`ray_train.py` runs this same recipe in a Ray Train worker (VRAM-aware placement, checkpoints
through `ray.train.report`, resume after a lost worker) through `Mm3Run.checkpoint_hook`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from hotstep_ray.core import layout
from hotstep_ray.core.errors import InputError
from hotstep_ray.core.events import EventLog, EventSink, MetricEvent
from hotstep_ray.core.jobs import Job
from hotstep_ray.core.storage import Storage
from hotstep_ray.mm3 import checkpoint as ckpt
from hotstep_ray.mm3 import flow
from hotstep_ray.mm3.data import (
    CropStats,
    Song,
    crop_tensors,
    draw_crop,
    has_valid_crop,
    load_songs,
)
from hotstep_ray.mm3.export import MM3_TARGETS, DeltaGate, base_norms, delta_gate, export_comfy
from hotstep_ray.mm3.options import Mm3TrainOptions
from hotstep_ray.mm3.preprocess import resolve_device
from hotstep_ray.training import adapters
from hotstep_ray.training.accumulate import micro_batch_weights
from hotstep_ray.training.checkpoint import load_checkpoint, model_fingerprint, save_checkpoint
from hotstep_ray.training.optim import build_optimizer
from hotstep_ray.training.schedule import LrSchedule

ADAPTER_BASE = layout.mm3_dit_adapter_base()  # adapters/mm3-dit
EVAL_BANDS = ((0.0, 0.33), (0.33, 0.67), (0.67, 1.0))  # sigma bands of the eval report


@dataclass
class Mm3Run:
    options: Mm3TrainOptions
    storage: Storage
    out_dir: str
    transformer: torch.nn.Module
    songs: list[Song]
    optimizer: Any
    schedule: LrSchedule
    norms: dict[str, float]
    fingerprint: str
    device: torch.device
    events: EventLog
    start_step: int = 0
    crop_stats: CropStats = field(default_factory=CropStats)
    losses: list[float] = field(default_factory=list)
    gates: list[dict[str, Any]] = field(default_factory=list)
    evals: list[dict[str, Any]] = field(default_factory=list)
    sign: dict[str, float] | None = None
    resumes: list[int] = field(default_factory=list)  # steps this run continued from
    # Called at every `save_every` step instead of writing `checkpoint/` (Ray reports it).
    checkpoint_hook: Callable[[Mm3Run, int], None] | None = None


# -- setup ----------------------------------------------------------------------------------------
def setup(
    storage: Storage,
    slug: str,
    checkpoints: str,
    options: Mm3TrainOptions,
    events: EventLog | None = None,
    transformer: torch.nn.Module | None = None,
    out_dir: str | None = None,
) -> Mm3Run:
    """Load the cache and the DiT, inject the LoRA, build optimizer and schedule (and resume).
    `out_dir` fixes the run folder (Ray: one folder for every attempt); default a new stamp."""
    events = events or EventLog()
    songs = load_songs(storage, layout.tensor_dir(slug, options.variant_key))
    usable = [s for s in songs if has_valid_crop(s, options.crop_latents)]
    for song in songs:
        if song not in usable:
            events.log(
                f"{song.stem}: no {options.crop_latents}-latent crop inside one segment; skipped",
                "warn",
            )
    if not usable:
        raise InputError(
            f"no song of {slug} has a {options.crop_latents}-latent crop inside one segment"
        )
    device = resolve_device(options.device)
    dtype = getattr(torch, options.dtype)
    if transformer is None:
        transformer = ckpt.load_transformer(ckpt.Mm3Paths.find(checkpoints), dtype, str(device))
    if next(transformer.parameters()).dtype != dtype:
        transformer = transformer.to(dtype=dtype)
    transformer = transformer.to(device)
    if options.gradient_checkpointing:
        transformer.enable_gradient_checkpointing()
    fingerprint = model_fingerprint(transformer)
    spec = adapters.AdapterSpec(
        kind="lora", rank=options.rank, alpha=options.alpha, targets=MM3_TARGETS
    )
    with torch.random.fork_rng(devices=[]):  # peft's Kaiming init of A: seeded, reproducible
        torch.manual_seed(options.seed)
        adapters.inject(transformer, spec)
    transformer.train()
    norms = base_norms(transformer)
    optimizer = build_optimizer(
        adapters.trainable_parameters(transformer),
        kind="adamw",
        lr=options.learning_rate,
        weight_decay=options.weight_decay,
    )
    schedule = LrSchedule(total_steps=options.steps, warmup_steps=options.warmup)
    artist = layout.check_name(options.adapter_name or slug, "adapter name")
    resumed_run = options.resume.rstrip("/")
    if resumed_run.endswith("/checkpoint"):  # a run's own checkpoint: continue in that run folder
        out_dir = out_dir or resumed_run.rsplit("/", 1)[0]
    run = Mm3Run(
        options=options,
        storage=storage,
        out_dir=out_dir or layout.new_run_dir(storage, ADAPTER_BASE, artist),
        transformer=transformer,
        songs=usable,
        optimizer=optimizer,
        schedule=schedule,
        norms=norms,
        fingerprint=fingerprint,
        device=device,
        events=events,
    )
    if options.resume:
        restore(run, storage, options.resume)
    trainable = sum(p.numel() for _, p in adapters.trainable_parameters(transformer))
    events.log(
        f"mm3 train-dit: {len(usable)} songs, LoRA r{options.rank}/a{options.alpha:g} "
        f"({trainable / 1e6:.1f} M params), {options.steps} steps, crop {options.crop_latents}"
    )
    return run


def restore(run: Mm3Run, storage: Storage, key: str) -> None:
    """Continue from the checkpoint folder `key` of `storage`: adapter, optimizer, step, losses.
    Every draw is seeded by its step (`flow.generator`), so the rest of the run is the one an
    uninterrupted run would have made."""
    state = load_checkpoint(
        storage, key, model=run.transformer, optimizer=run.optimizer, fingerprint=run.fingerprint
    )
    run.start_step = state.step
    run.losses = list((state.extra or {}).get("losses", []))
    run.resumes.append(state.step)
    run.events.log(f"resumed from {storage.url_of(key)} at step {state.step}")


# -- batches --------------------------------------------------------------------------------------
def song_for(run: Mm3Run, index: int) -> Song:
    """The song of global sample `index`: shuffled epochs over the usable songs, the permutation
    of epoch e seeded by (seed, e), so any index is reproducible without state."""
    count = len(run.songs)
    epoch, position = divmod(index, count)
    order = torch.randperm(
        count, generator=flow.generator(run.options.seed, epoch, 0, flow.STREAM_SONG)
    )
    return run.songs[int(order[position])]


def make_batch(run: Mm3Run, step: int, micro: int) -> tuple[torch.Tensor, ...]:
    """(x0 [B, 128, c], condition [B, c, C], t [B], noise [B, 128, c]) on the run's device."""
    opts = run.options
    xs, conds, times, noises = [], [], [], []
    for i in range(opts.batch):
        sample = micro * opts.batch + i
        song = song_for(run, (step * opts.grad_accum + micro) * opts.batch + i)
        crop_gen = flow.generator(opts.seed, step, sample, flow.STREAM_CROP)
        start = draw_crop(song, opts.crop_latents, crop_gen, opts.crop_mode, run.crop_stats)
        x0, cond = crop_tensors(song, start, opts.crop_latents)
        time_gen = flow.generator(opts.seed, step, sample, flow.STREAM_TIME)
        noise_gen = flow.generator(opts.seed, step, sample, flow.STREAM_NOISE)
        xs.append(x0)
        conds.append(cond)
        times.append(flow.sample_data_time(1, time_gen, opts.logit_mean, opts.logit_std))
        noises.append(torch.randn(x0.shape, generator=noise_gen, dtype=torch.float32))
    batch = (torch.stack(xs), torch.stack(conds), torch.cat(times), torch.stack(noises))
    return tuple(t.to(run.device) for t in batch)


def _autocast(run: Mm3Run):
    on_gpu = run.device.type == "cuda" and run.options.dtype == "bfloat16"
    return torch.autocast("cuda", dtype=torch.bfloat16, enabled=on_gpu)


# -- train ----------------------------------------------------------------------------------------
def train_step(run: Mm3Run, step: int) -> dict[str, float]:
    """One optimizer step (grad-accum micro-batches); returns loss, lr, grad norm, ms."""
    began = time.perf_counter()
    opts = run.options
    lr_factor = run.schedule.apply(run.optimizer, step)
    run.optimizer.zero_grad(set_to_none=True)
    weights = micro_batch_weights([opts.batch] * opts.grad_accum)
    total = 0.0
    for micro, weight in enumerate(weights):
        x0, cond, t, noise = make_batch(run, step, micro)
        with _autocast(run):
            loss = flow.flow_loss(run.transformer, x0, noise, t, cond)
        (loss * weight).backward()
        total += loss.item() * weight
    lr = opts.learning_rate * lr_factor
    return apply_update(
        run.transformer, run.optimizer, opts.grad_clip, run.device, total, lr, began
    )


def apply_update(
    model: torch.nn.Module,
    optimizer: Any,
    grad_clip: float,
    device: torch.device,
    loss: float,
    lr: float,
    began: float,
) -> dict[str, float]:
    """Clip the adapter's global grad norm (0 = off), step, and the step's record (the MM3 DiT
    and composer-LM trainers share it)."""
    params = [p for _, p in adapters.trainable_parameters(model)]
    norm = torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip > 0 else math.inf)
    optimizer.step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return {
        "loss": loss,
        "lr": lr,
        "grad_norm": float(norm),
        "step_ms": 1000 * (time.perf_counter() - began),
    }


@torch.no_grad()
def evaluate(run: Mm3Run) -> dict[str, Any]:
    """Fixed eval set: `eval_n` crops (own seed stream), sigma on the stratified grid
    (i + 0.5) / n, fixed noise; mean loss and the three sigma bands."""
    opts = run.options
    losses: list[tuple[float, float]] = []
    was_training = run.transformer.training
    run.transformer.eval()
    for i in range(opts.eval_n):
        song = run.songs[i % len(run.songs)]
        gen = flow.generator(opts.seed, 0, i, flow.STREAM_EVAL)
        start = draw_crop(song, opts.crop_latents, gen, "random")
        x0, cond = crop_tensors(song, start, opts.crop_latents)
        sigma = (i + 0.5) / opts.eval_n
        noise = torch.randn(x0.shape, generator=gen, dtype=torch.float32)
        t = torch.tensor([1.0 - sigma])
        with _autocast(run):
            loss = flow.flow_loss(
                run.transformer,
                x0[None].to(run.device),
                noise[None].to(run.device),
                t.to(run.device),
                cond[None].to(run.device),
            )
        losses.append((sigma, loss.item()))
    run.transformer.train(was_training)
    report: dict[str, Any] = {"loss": sum(v for _, v in losses) / len(losses)}
    for lo, hi in EVAL_BANDS:
        band = [v for s, v in losses if lo <= s < hi]
        report[f"sigma_{lo:.2f}_{hi:.2f}"] = sum(band) / len(band) if band else None
    return report


def check_delta(run: Mm3Run, step: int) -> DeltaGate:
    gate = delta_gate(run.transformer, run.norms)
    run.gates.append({"step": step, **gate.to_dict()})
    run.events.emit(MetricEvent(metric="eval", step=step, delta=gate.to_dict()))
    run.events.log(f"step {step}: {gate.summary()}", "warn" if gate.flagged else "info")
    return gate


def train(run: Mm3Run) -> DeltaGate:
    """The loop; returns the final delta gate."""
    opts = run.options
    if opts.sign_check:
        run.sign = sign_check_run(run)
    if opts.eval_every:
        run.evals.append({"step": run.start_step, **evaluate(run)})
    for step in range(run.start_step, opts.steps):
        metrics = train_step(run, step)
        done = step + 1
        run.losses.append(metrics["loss"])
        run.events.emit(MetricEvent(metric="step", step=done, total_steps=opts.steps, **metrics))
        if not math.isfinite(metrics["loss"]):
            raise FloatingPointError(f"non-finite loss at step {done}")
        if opts.delta_every and done % opts.delta_every == 0 and done < opts.steps:
            check_delta(run, done)
        if opts.eval_every and done % opts.eval_every == 0:
            run.evals.append({"step": done, **evaluate(run)})
        if opts.export_every and done % opts.export_every == 0 and done < opts.steps:
            export_comfy(
                run.transformer, run.storage, f"{run.out_dir}/mm3_lora_step{done}.safetensors"
            )
        if opts.save_every and done % opts.save_every == 0 and done < opts.steps:
            if run.checkpoint_hook is not None:
                run.checkpoint_hook(run, done)
            else:
                save_state(run, done)
    return check_delta(run, opts.steps)


def sign_check_run(run: Mm3Run) -> dict[str, float]:
    """Trap 1 on the frozen base (the LoRA starts at zero): the right target must win."""
    x0, cond, _, _ = make_batch(run, 0, 0)
    with _autocast(run):
        result = flow.sign_check(run.transformer, x0, cond, run.options.seed)
    run.events.log(
        f"sign check at sigma 0.9: loss(x0 - noise) {result['loss_target']:.4f} vs "
        f"loss(noise - x0) {result['loss_negated']:.4f}"
    )
    if result["loss_target"] >= result["loss_negated"]:
        raise ValueError(
            "sign check failed: the DiT is closer to noise - x0 than to x0 - noise; this is not "
            "the diffusers MM3 convention (or not MM3 weights)"
        )
    return result


# -- save -----------------------------------------------------------------------------------------
def save_state(
    run: Mm3Run, step: int, storage: Storage | None = None, key: str | None = None
) -> str:
    """Write the resumable checkpoint (default: `<run>/checkpoint/` in the run's storage)."""
    return save_checkpoint(
        storage or run.storage,
        f"{run.out_dir}/checkpoint" if key is None else key,
        model=run.transformer,
        optimizer=run.optimizer,
        step=step,
        epoch=0,
        config=run.options.model_dump(mode="json"),
        extra={"losses": run.losses},
        fingerprint=run.fingerprint,
    )


def save(run: Mm3Run, gate: DeltaGate) -> dict[str, str]:
    opts = run.options
    trigger = {"trigger": opts.trigger or None, "trigger_position": opts.trigger_position}
    out = {
        "lora": export_comfy(
            run.transformer, run.storage, f"{run.out_dir}/mm3_lora.safetensors", **trigger
        ),
        "lora_unfiltered": export_comfy(
            run.transformer,
            run.storage,
            f"{run.out_dir}/mm3_lora_unfiltered.safetensors",
            filtered=False,
            **trigger,
        ),
        "checkpoint": save_state(run, opts.steps),
    }
    report = {
        "options": opts.model_dump(mode="json"),
        "songs": [s.stem for s in run.songs],
        "losses": run.losses,
        "crop_stats": vars(run.crop_stats),
        "sign_check": run.sign,
        "evals": run.evals,
        "delta": gate.to_dict(),
        "delta_history": run.gates,
        "resumed_from": run.resumes,
    }
    out["report"] = f"{run.out_dir}/train_report.json"
    run.storage.write_json(out["report"], report)
    return out


def run_train_dit(
    storage: Storage,
    slug: str,
    checkpoints: str,
    options: Mm3TrainOptions | None = None,
    sinks: tuple[EventSink, ...] = (),
) -> dict[str, str]:
    """The whole recipe as one job (`jobs/<id>/`): setup -> train -> save."""
    options = options or Mm3TrainOptions()
    with Job(storage, "train-dit", dataset_id=slug, sinks=sinks) as job:
        job.phase("loading-models")
        run = setup(storage, slug, checkpoints, options, job.events)
        job.phase("train")
        gate = train(run)
        job.phase("export")
        paths = save(run, gate)
        job.events.log(f"MM3 LoRA written to {storage.url_of(paths['lora'])}")
        return paths
