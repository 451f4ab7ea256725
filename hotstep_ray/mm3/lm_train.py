"""`mm3 train-lm`: a LoRA on the MM3 composer LM (transformers Qwen3) from RVQ codes; the "LM side".

Recipe (data and sequence: `lm_data.py`; facts: shared/reference/mm3.md §1.5, §3.7, hotstep.md §7.3):
- Teacher forcing: embed(prompt) ++ frame embeddings of the song's codes (warm-up row dropped);
  position P - 1 (`<|audio_start|>`) predicts frame 0. Cross-entropy of the frozen head's rows
  {EOS} + the 16,384 semantic codes (the set the reference samples from) at positions
  [P - 1, P - 1 + F), plus EOS at P - 1 + F when the crop reaches the song's end. Mean over the
  supervised positions. The acoustic codes only enter as inputs (depth decoder frozen, no loss).
- LoRA r16 / alpha 32 (default) via the shared `training.adapters` (peft; B = 0, so step 0 is the
  base model) on q/k/v/o_proj and gate/up/down_proj of every composer layer.
- AdamW (`training.optim.build_optimizer`, weight decay 0.01; HOT-Step measured Muon at its x64
  scale blowing B up, so AdamW is the default), lr 8e-5, 800 steps, the shared warmup + cosine
  (`training.schedule.LrSchedule`), global-norm clip 1.0; one crop of at most `max_frames` frames
  per micro-step, songs in seeded shuffled epochs; every draw from a CPU generator seeded by
  (seed, step).
- Frozen base in bfloat16 on GPU (float32 for CPU tests); LoRA weights float32; loss in float32.

Output, `adapters/mm3-lm-adapters/<name>-<stamp>/` (`core.layout.new_mm3_lm_run_dir`):
    adapter_config.json, adapter_model.safetensors   PEFT LoRA (`training.export.export_lora`):
        BF16, keys `base_model.model.model.layers.N.{self_attn.q_proj, ..., mlp.down_proj}
        .lora_{A,B}.weight` (what `PeftModel.from_pretrained(Qwen3ForCausalLM)` and HOT-Step's
        runtime loader read), alpha/r folded into lora_B, `lora_alpha = r` in the config
    adapter_model.safetensors.json                  HOT-Step's sidecar (name, rank, steps, ...)
    train_log.json                                  options, songs, per-step losses / lr / |g|
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from hotstep_ray.core import layout
from hotstep_ray.core.errors import InputError
from hotstep_ray.core.events import EventLog, EventSink, MetricEvent
from hotstep_ray.core.jobs import Job
from hotstep_ray.core.storage import Storage
from hotstep_ray.mm3 import checkpoint as ckpt
from hotstep_ray.mm3 import flow
from hotstep_ray.mm3.lm_data import (
    HEAD_END,
    HEAD_MASKED,
    HEAD_START,
    LmSong,
    draw_crop,
    load_lm_songs,
    sequence,
)
from hotstep_ray.mm3.options import Mm3LmTrainOptions
from hotstep_ray.mm3.preprocess import resolve_device
from hotstep_ray.mm3.train import apply_update
from hotstep_ray.training import adapters, export
from hotstep_ray.training.optim import build_optimizer
from hotstep_ray.training.schedule import LrSchedule

LM_TARGETS = adapters.LM_ATTENTION_TARGETS + adapters.MLP_TARGETS  # q,k,v,o + gate,up,down
SIDECAR = "adapter_model.safetensors.json"
TRAIN_LOG = "train_log.json"


@dataclass
class Mm3LmRun:
    options: Mm3LmTrainOptions
    storage: Storage
    slug: str
    out_dir: str
    lm: torch.nn.Module  # Qwen3ForCausalLM with the LoRA injected
    depth: torch.nn.Module  # frozen depth decoder (frame embeddings only)
    head: torch.Tensor  # [HEAD_END - HEAD_START, H] float32 copy of the frozen head rows
    songs: list[LmSong]
    optimizer: Any
    schedule: LrSchedule
    device: torch.device
    events: EventLog
    steps_log: list[dict[str, float]] = field(default_factory=list)


# -- the loss ------------------------------------------------------------------------------------
def head_rows(lm: torch.nn.Module) -> torch.Tensor:
    """The frozen head's rows [151670, 168059) as float32 [16389, H] (`lm_data` HEAD_*)."""
    weight = lm.get_output_embeddings().weight
    if weight.shape[0] < HEAD_END:
        raise InputError(
            f"composer head has {weight.shape[0]} rows; the semantic codes need {HEAD_END}"
        )
    return weight[HEAD_START:HEAD_END].detach().float()


def semantic_loss(
    lm: torch.nn.Module,
    head: torch.Tensor,
    embeds: torch.Tensor,
    targets: torch.Tensor,
    prompt_len: int,
) -> torch.Tensor:
    """Mean cross-entropy (nats) of `targets` [M] at positions P - 1 .. P - 2 + M of the LM run on
    `embeds` [1, T, H]; logits over the head slice with the delimiter rows masked."""
    body = lm.get_decoder()  # Qwen3Model: embeddings in, final-normed hidden states out
    hidden = body(inputs_embeds=embeds).last_hidden_state[0]  # [T, H]
    hidden = hidden[prompt_len - 1 : prompt_len - 1 + targets.shape[0]].float()  # [M, H]
    logits = F.linear(hidden, head)  # [M, 16389] float32
    logits[:, list(HEAD_MASKED)] = -math.inf
    return F.cross_entropy(logits, targets)


def crop_for(run: Mm3LmRun, step: int, micro: int) -> tuple[LmSong, int, int]:
    """Song of global sample `step * grad_accum + micro` (shuffled epochs, the permutation of
    epoch e seeded by (seed, e)) and its crop (seeded by (seed, step, micro)): no RNG state."""
    opts = run.options
    index = step * opts.grad_accum + micro
    epoch, position = divmod(index, len(run.songs))
    order_gen = flow.generator(opts.seed, epoch, 0, flow.STREAM_SONG)
    song = run.songs[int(torch.randperm(len(run.songs), generator=order_gen)[position])]
    crop_gen = flow.generator(opts.seed, step, micro, flow.STREAM_CROP)
    first, count = draw_crop(song, opts.max_frames, crop_gen, opts.crop_mode)
    return song, first, count


def song_loss(run: Mm3LmRun, song: LmSong, first: int, count: int) -> torch.Tensor:
    embeds, targets, prompt_len = sequence(
        run.lm, run.depth, song, first, count, run.options.supervise_eos
    )
    on_gpu = run.device.type == "cuda" and run.options.dtype == "bfloat16"
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=on_gpu):
        return semantic_loss(run.lm, run.head, embeds, targets, prompt_len)


# -- setup ---------------------------------------------------------------------------------------
def setup(
    storage: Storage,
    slug: str,
    checkpoints: str,
    options: Mm3LmTrainOptions,
    events: EventLog | None = None,
    out_dir: str | None = None,
) -> Mm3LmRun:
    """Load tokenizer, composer and depth decoder; read the songs; inject the LoRA; build the
    optimizer and schedule."""
    events = events or EventLog()
    if not options.codes_dir:
        raise InputError("mm3 train-lm needs --codes DIR (a folder of <stem>.codes files)")
    paths = ckpt.Mm3Paths.find(checkpoints)
    paths.require("train-lm")
    device = resolve_device(options.device)
    dtype = getattr(torch, options.dtype)
    tokenizer = ckpt.load_tokenizer(paths)
    depth = ckpt.load_depth_decoder(paths, dtype, str(device)).eval().requires_grad_(False)
    songs = load_lm_songs(
        storage,
        slug,
        options.codes_dir,
        tokenizer,
        int(depth.config.audio_vocab_size),
        options.codes_warmup_row,
        options.sample_ids,
    )
    lm = ckpt.load_language_model(paths, dtype, str(device))
    if options.gradient_checkpointing:
        lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        lm.config.use_cache = False
    spec = adapters.AdapterSpec(
        kind="lora", rank=options.rank, alpha=options.alpha, targets=LM_TARGETS
    )
    with torch.random.fork_rng(devices=[]):  # peft's Kaiming init of A: seeded
        torch.manual_seed(options.seed)
        adapters.inject(lm, spec)
    lm.train()
    optimizer = build_optimizer(
        adapters.trainable_parameters(lm),
        kind=options.optimizer,
        lr=options.learning_rate,
        weight_decay=options.weight_decay,
    )
    name = layout.check_name(options.adapter_name or slug, "adapter name")
    run = Mm3LmRun(
        options=options,
        storage=storage,
        slug=slug,
        out_dir=out_dir or layout.new_mm3_lm_run_dir(storage, name),
        lm=lm,
        depth=depth,
        head=head_rows(lm),
        songs=songs,
        optimizer=optimizer,
        schedule=LrSchedule(total_steps=options.steps, warmup_steps=options.warmup_steps),
        device=device,
        events=events,
    )
    trainable = sum(p.numel() for _, p in adapters.trainable_parameters(lm))
    frames = sum(s.n_frames for s in songs)
    events.log(
        f"mm3 train-lm: {len(songs)} songs ({frames} frames), LoRA r{options.rank}/"
        f"a{options.alpha:g} ({trainable / 1e6:.2f} M params), {options.steps} steps, "
        f"max {options.max_frames or 'all'} frames per crop"
    )
    return run


# -- train ---------------------------------------------------------------------------------------
def train_step(run: Mm3LmRun, step: int) -> dict[str, float]:
    began = time.perf_counter()
    opts = run.options
    factor = run.schedule.apply(run.optimizer, step)
    run.optimizer.zero_grad(set_to_none=True)
    total = 0.0
    for micro in range(opts.grad_accum):
        song, first, count = crop_for(run, step, micro)
        loss = song_loss(run, song, first, count)
        (loss / opts.grad_accum).backward()
        total += loss.item() / opts.grad_accum
    lr = opts.learning_rate * factor
    return apply_update(run.lm, run.optimizer, opts.grad_clip, run.device, total, lr, began)


@torch.no_grad()
def full_song_losses(run: Mm3LmRun) -> dict[str, float]:
    """Teacher-forced loss of every song's first `max_frames` frames (fixed; for the log)."""
    was = run.lm.training
    run.lm.eval()
    out = {}
    for song in run.songs:
        limit = run.options.max_frames
        count = song.n_frames if limit <= 0 else min(song.n_frames, limit)
        out[song.stem] = song_loss(run, song, 0, count).item()
    run.lm.train(was)
    return out


def train(run: Mm3LmRun) -> None:
    opts = run.options
    for step in range(opts.steps):
        metrics = train_step(run, step)
        done = step + 1
        run.steps_log.append({"step": done, **metrics})
        run.events.emit(MetricEvent(metric="step", step=done, total_steps=opts.steps, **metrics))
        if not math.isfinite(metrics["loss"]):
            raise FloatingPointError(f"non-finite loss at step {done}")


# -- save ----------------------------------------------------------------------------------------
def save(run: Mm3LmRun, before: dict[str, float] | None = None) -> dict[str, str]:
    """PEFT folder + sidecar + train log in the run folder; returns their keys."""
    opts = run.options
    files = export.export_lora(
        run.lm,
        run.storage,
        run.out_dir,
        trigger=opts.trigger or None,
        metadata={"hotstep_ray.mm3": "composer-lm", "hotstep_ray.steps": opts.steps},
    )
    sidecar = {
        "name": f"{run.out_dir.rsplit('/', 1)[-1]}",
        "trigger": opts.trigger,
        "rank": opts.rank,
        "alpha": opts.alpha,
        "dataset": run.slug,
        "trainedSteps": opts.steps,
        "notes": "hotstep-ray mm3 train-lm; alpha/r folded into lora_B (lora_alpha = r)",
    }
    run.storage.write_json(f"{run.out_dir}/{SIDECAR}", sidecar)
    log = {
        "kind": "mm3_train_lm",
        "options": opts.model_dump(mode="json"),
        "songs": [
            {
                "stem": s.stem,
                "sample_id": s.sample_id,
                "frames": s.n_frames,
                "prompt_tokens": int(s.prompt_ids.shape[0]),
            }
            for s in run.songs
        ],  # fmt: skip
        "schedule": run.schedule.to_dict(),
        "steps": run.steps_log,
        "song_loss_before": before,
        "song_loss_after": full_song_losses(run),
    }
    run.storage.write_json(f"{run.out_dir}/{TRAIN_LOG}", log)
    return {
        "config": files[0],
        "weights": files[1],
        "sidecar": f"{run.out_dir}/{SIDECAR}",
        "log": f"{run.out_dir}/{TRAIN_LOG}",
        "run": run.out_dir,
    }


def run_train_lm(
    storage: Storage,
    slug: str,
    checkpoints: str,
    options: Mm3LmTrainOptions,
    sinks: tuple[EventSink, ...] = (),
) -> dict[str, str]:
    """The whole recipe as one job (`jobs/<id>/`, kind `mm3-train-lm`): setup -> train -> save."""
    with Job(storage, "mm3-train-lm", dataset_id=slug, sinks=sinks) as job:
        job.phase("loading-models")
        run = setup(storage, slug, checkpoints, options, job.events)
        before = full_song_losses(run)
        job.phase("train")
        train(run)
        job.phase("export")
        paths = save(run, before)
        job.events.log(f"MM3 composer LoRA written to {storage.url_of(paths['run'])}")
        return paths
