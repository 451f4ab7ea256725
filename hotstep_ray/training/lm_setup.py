"""The LM recipe's setup: `setup_lm` turns an `LmTrainSpec` (`lm_spec`) into an `LmSetup`, the
run ready to train: the device and its memory budget, the data plan, activation checkpointing
fitted to the GPU, the compile mode, the model with its adapter injected (started from its warm
start, `lm_start`), the optimizer, the LR schedule, and the opening log. `memory_plan` is the
same plan without weights: what the Ray job asks for.

Data (`plan_data`): `lm_codes.jsonl` is read, songs held out (`holdout_fraction`), max_len
decided (the user's, else what fits the GPU with every layer checkpointed, else the cap), the
songs rendered in the trained layout (over-length ones skipped) and planned into micro-batches
(`lm_data`).

Compile (`LmEngine.compile`, `compile_mode`): auto | off | default | reduce-overhead; auto is
reduce-overhead (CUDA graphs) on one CUDA GPU when no layer is checkpointed, default when some are
or under DDP, off on the CPU (where compiling is refused) and off for a run too short to repay its
compiles. Each decoder layer is compiled on its own with static shapes
(`lm_loss.compile_layers`); rows are then padded to a width multiple (`row_multiple`) so a run has
few shapes, and the held-out loss runs the layers eagerly.

Trigger: prompts are rendered from text at train time, so a run trigger (`LmTrainSpec.trigger`)
replaces every row's tag in the caption the adapter learns from (a row whose caption has its own
tag baked in refuses another).

bf16 weights with fp32 adapter masters under autocast on CUDA; float32 on CPU.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import torch
from torch import nn

from hotstep_ray.core import layout
from hotstep_ray.core.contracts import TrainLmOptions
from hotstep_ray.core.errors import InputError
from hotstep_ray.core.events import EventLog, MetricEvent
from hotstep_ray.core.storage import Storage
from hotstep_ray.training import (
    adapters,
    capture_gate,
    checkpoint,
    compiling,
    export,
    flat_grads,
    holdout,
    lm_loss,
    lm_vram,
)
from hotstep_ray.training import lm_data as data
from hotstep_ray.training.adapters import AdapterSpec
from hotstep_ray.training.lm_spec import (
    LmEngine,
    LmTrainSpec,
    lm_size_of,
    load_tokenizer,
    read_dims,
)
from hotstep_ray.training.lm_start import AdapterIdentity, resolve_start
from hotstep_ray.training.optim import build_optimizer
from hotstep_ray.training.schedule import LrSchedule

MAX_LEN_CAP = 16384


# -- setup ---------------------------------------------------------------------------------------
@dataclass
class LmSetup:
    spec: LmTrainSpec
    options: TrainLmOptions  # after identity adoption
    storage: Storage
    device: torch.device
    dtype: torch.dtype
    model: nn.Module  # Qwen3ForCausalLM with the adapter injected
    module: nn.Module  # LmLossModule, or its DDP wrap
    tokenizer: Any
    dims: lm_vram.LmDims
    lm_size: str
    run_key: str
    examples: list[data.LmExample]
    skipped: list[data.SkippedSong]
    groups: list[data.Group]
    optimizer: Any
    schedule: LrSchedule
    vram: lm_vram.VramEstimate
    max_len: int
    max_len_source: str
    fingerprint: str
    identity: AdapterIdentity
    trigger: str = ""
    trigger_position: str = "prepend"
    budget: int | None = None  # bytes a step may use (None: not fitted, CPU)
    compile: str = "off"  # the resolved compile mode of the decoder layers (`compile_mode`)
    pad_multiple: int = 1  # the resolved row-width multiple (`row_multiple`)
    init_from: dict[str, Any] = field(default_factory=dict)
    held_out: list[data.LmExample] = field(default_factory=list)  # holdout_fraction's songs
    holdout: dict[str, Any] | None = None  # the split (HoldoutSplit.to_dict)
    rank: int = 0
    world: int = 1
    events: EventLog | None = None
    grad_flats: flat_grads.FlatGrads | None = None  # the CUDA-graph step's gradient buffers
    warmup: capture_gate.Warmup | None = None  # a shape's first steps hold the capture lock

    def __post_init__(self) -> None:
        if self.warmup is None:
            self.warmup = capture_gate.Warmup(self.device)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def budget_mb(self) -> int:
        return round(self.budget / lm_vram.MIB) if self.budget else 0

    def emit(self, metric: str, **fields: Any) -> None:
        if self.events is not None and self.is_main:
            self.events.emit(MetricEvent(metric=metric, **fields))

    def log(self, message: str, level: Literal["info", "warn", "error"] = "info") -> None:
        if self.events is not None and self.is_main:
            self.events.log(message, level)


def _device(engine: LmEngine) -> torch.device:
    if engine.device:
        return torch.device(engine.device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def compile_mode(requested: str, device: torch.device) -> str:
    """The compile mode of the decoder layers: `auto` is `default` on CUDA and `off` elsewhere,
    where compiling is refused (`training.compiling`)."""
    return compiling.resolve_mode(requested, device, "the LM layers")


def row_multiple(engine: LmEngine, compiled: bool) -> int:
    """Row widths round up to this: the engine's `pad_multiple`, else 64 tokens when the layers
    are compiled (each new width is a new graph; `setup_lm` may then coarsen it with
    `lm_data.pick_pad_multiple`) and 1 (no padding beyond the longest row) when they run
    eagerly."""
    if engine.pad_multiple:
        return engine.pad_multiple
    return lm_loss.COMPILE_PAD_MULTIPLE if compiled else 1


def _budget(engine: LmEngine, device: torch.device) -> int | None:
    """Bytes a step may use: the engine's budget, else the device's free memory (taken before
    the model loads) minus the reserve; None on the CPU (nothing to fit)."""
    if engine.vram_budget_gib:
        return int(engine.vram_budget_gib * lm_vram.GIB)
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    return int(free - engine.vram_reserve_gib * lm_vram.GIB)


def _checkpoint_layers(
    engine: LmEngine, dims: lm_vram.LmDims, budget: int | None, **estimate: Any
) -> lm_vram.VramEstimate:
    mode = engine.checkpointing
    if mode == "auto":
        if budget is None:
            return lm_vram.estimate_vram(dims, checkpointed_layers=0, **estimate)
        return lm_vram.fit_checkpointing(dims, budget, **estimate)
    layers = {"none": 0, "full": dims.layers}.get(mode)
    if layers is None:
        try:
            layers = int(mode)
        except ValueError as exc:
            raise InputError(
                f"checkpointing must be auto, none, full or a layer count, got {mode!r}"
            ) from exc
    return lm_vram.estimate_vram(dims, checkpointed_layers=layers, **estimate)


def _fit_kwargs(options: TrainLmOptions, engine: LmEngine, dims: lm_vram.LmDims) -> dict[str, Any]:
    spec = AdapterSpec.from_options(options)
    count = lm_vram.adapter_params(dims, spec.kind, spec.rank, spec.factor, spec.decompose_both)
    return {
        "adapter_parameters": count,
        "ce_chunk": engine.ce_chunk,
        "optimizer": options.optimizer,
    }


def plan_data(
    spec: LmTrainSpec,
    storage: Storage,
    tokenizer: Any,
    dims: lm_vram.LmDims,
    options: TrainLmOptions,
    budget: int | None,
    pad_multiple: int = 1,
) -> data.DataPlan:
    """Read `lm_codes.jsonl`, decide max_len (the user's, else what fits the GPU with every layer
    checkpointed, else the cap), render, skip over-length songs, plan the groups (rows padded to
    `pad_multiple` tokens when the step size is taken)."""
    engine = spec.engine
    if not storage.exists(spec.codes_key):
        raise InputError(f"{storage.url_of(spec.codes_key)}: missing (run preprocess first)")
    songs, bad = data.load_lm_codes(storage, spec.codes_key)
    _check_run_trigger(spec, storage, songs)
    held: list[data.LmSong] = []
    split = None
    if options.holdout_fraction:
        split = holdout.split_holdout(
            [s.song_id for s in songs], options.holdout_fraction, options.seed
        )
        songs, held = holdout.partition_songs(songs, split)
    if options.max_len:
        max_len, source = options.max_len, "user"
    elif budget is not None:
        fit = _fit_kwargs(options, engine, dims)
        max_len, source = lm_vram.max_tokens(dims, budget, MAX_LEN_CAP, **fit), "auto"
    else:
        max_len, source = MAX_LEN_CAP, "cap"
    render = data.RenderOptions(
        trigger=spec.trigger,
        trigger_position=spec.trigger_position,
        loss_on_cot=options.loss_on_cot,
        cot_caption=engine.cot_caption,
    )
    plan = data.plan_data(
        tokenizer,
        songs,
        bad,
        render,
        max_len=max_len,
        batching=engine.batching,
        batch=options.batch,
        pack_tokens=engine.pack_tokens,
        pad_multiple=pad_multiple,
    )
    plan.max_len_source = source
    if split is not None:  # one example per held-out song (no repeats), rendered as in training
        if render.trigger:
            held = [replace(s, custom_tag="", tag_position="") for s in held]
        examples, too_long = data.build_examples(tokenizer, held, plan.max_len, render)
        plan.held_out = list({id(e): e for e in examples}.values())
        plan.skipped.extend(too_long)
        plan.holdout = split.to_dict()
    if not plan.examples:
        reasons = ", ".join(f"{s.song_id}: {s.reason}" for s in plan.skipped[:5]) or "no rows"
        raise InputError(f"no trainable songs in {storage.url_of(spec.codes_key)} ({reasons})")
    return plan


def _check_run_trigger(spec: LmTrainSpec, storage: Storage, songs: list[data.LmSong]) -> None:
    """A run trigger (`spec.trigger`) replaces each row's tag in the caption rendered at train
    time, so it reaches the prompts the adapter learns from; a row whose writer baked its tag
    into the caption (`trigger_applied`) keeps that tag, so another trigger would only be
    stamped into the export's metadata: refused."""
    if not spec.trigger:
        return
    baked = [s.song_id for s in songs if s.trigger_applied and s.custom_tag != spec.trigger]
    if baked:
        raise InputError(
            f"--trigger {spec.trigger!r}: {len(baked)} songs of {storage.url_of(spec.codes_key)} "
            f"carry their own tag baked into the caption ({', '.join(baked[:3])}), which a run "
            "trigger cannot replace; leave --trigger out, or write their codes without it"
        )


def memory_plan(spec: LmTrainSpec, storage: Storage) -> lm_vram.VramEstimate:
    """The least memory one training worker needs (every layer checkpointed), computed without
    loading weights: what the Ray job asks for. `auto` compile counts as compiled (the workers are
    GPUs), so the rows are sized with the padding they will get."""
    dims = read_dims(spec.lm_dir)
    pad = row_multiple(spec.engine, spec.engine.compile != "off")
    tokenizer = load_tokenizer(spec.lm_dir)
    plan = plan_data(spec, storage, tokenizer, dims, spec.options, None, pad)
    fit = _fit_kwargs(spec.options, spec.engine, dims)
    return lm_vram.estimate_vram(
        dims,
        plan.step_tokens,
        targets=plan.step_targets,
        checkpointed_layers=dims.layers,
        **fit,
    )


def setup_lm(
    spec: LmTrainSpec,
    storage: Storage,
    *,
    rank: int = 0,
    world: int = 1,
    device: torch.device | None = None,
    events: EventLog | None = None,
    log_start: bool = True,
) -> LmSetup:
    """The run of `spec`, ready to train. With `log_start` it logs one line naming its warm
    start (or that it starts fresh); callers that load a checkpoint into it (whose own line
    names it), or whose driver logged the line already (Ray), pass False."""
    from hotstep_ray.models.text_models import load_lm

    started = time.perf_counter()
    engine = spec.engine
    device = device or _device(engine)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    mode = compile_mode(engine.compile, device)  # refuse before anything loads
    pad = row_multiple(engine, mode != "off")
    budget = _budget(engine, device)
    dims = read_dims(spec.lm_dir)
    size = lm_size_of(dims, spec.options.lm_size)
    # Where to start from, and the identity it implies: refused before the weights load.
    start = resolve_start(spec, storage, dims, size)
    options, identity, init, init_from = start.options, start.identity, start.init, start.init_from
    adapter_spec = AdapterSpec.from_options(options)
    tokenizer = load_tokenizer(spec.lm_dir)
    model = load_lm(spec.lm_dir, device=device, dtype=dtype)
    loaded = time.perf_counter()
    base = layout.lm_adapter_base(size)
    run_key = spec.run_key or layout.new_run_dir(storage, base, spec.artist)

    # Data, then the memory plan for the largest micro-batch.
    plan = plan_data(spec, storage, tokenizer, dims, options, budget, pad)
    if mode != "off" and not engine.pad_multiple:  # compiled, width multiple left to us
        pad = data.pick_pad_multiple(plan.examples, plan.groups, options.epochs)
        plan.step_tokens = data.largest_step(plan.examples, plan.groups, pad)
    eager_note = ""
    if engine.compile == "auto" and mode != "off":  # an explicit mode is kept
        if not data.compile_pays(plan.examples, plan.groups, options.epochs, pad):
            mode, pad = "off", row_multiple(engine, False)
            plan.step_tokens = data.largest_step(plan.examples, plan.groups, pad)
            eager_note = (
                f"{options.epochs} epochs of {len(plan.groups)} micro-batches: training eagerly, "
                "compiling would take longer than it saves (--compile default compiles anyway)"
            )
    vram = _checkpoint_layers(
        engine,
        dims,
        budget,
        tokens=plan.step_tokens,
        targets=plan.step_targets,
        **_fit_kwargs(options, engine, dims),
    )

    mode = compiling.with_graphs(engine.compile, mode, vram.checkpointed_layers, ddp=world > 1)

    # Adapter (seeded init), optional start weights, runtime switches.
    with adapters.global_rng():
        torch.manual_seed(options.seed)
        adapters.inject(model, adapter_spec)
    if init is not None:
        export.load_exported(model, *init)
    lm_loss.set_attention(model, engine.attention)
    lm_loss.set_layer_checkpointing(model.model.layers, vram.checkpointed_layers)
    if device.type == "cuda":  # bf16 activations meet fp32 adapter weights under autocast
        for _, layer in adapters.tuner_layers(model):
            layer.cast_input_dtype_enabled = False
    if mode != "off":  # after the switches above: the graphs are traced with them
        compiling.set_activation_budget(engine.activation_budget)
        lm_loss.compile_layers(model.model.layers, mode)
    # CUDA graphs: gradients outside the graph pool (`compiling.stable_grads`), as views of one
    # flat buffer (`FlatGrads`: the clip and the zeroing are then a few kernels, not lists of
    # ~500 LoRA tensors). Graphs run on one GPU only (`compiling.with_graphs`), so no DDP here.
    grad_flats = None
    if mode == "reduce-overhead":
        grad_flats = flat_grads.FlatGrads([p for _, p in adapters.trainable_parameters(model)])
    model.train()
    module: nn.Module = lm_loss.LmLossModule(model, engine.ce_chunk)
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel

        ids = [device.index] if device.type == "cuda" else None
        module = DistributedDataParallel(module, device_ids=ids)

    optimizer = build_optimizer(
        adapters.trainable_parameters(model),
        kind=options.optimizer,
        lr=options.learning_rate,
        weight_decay=options.weight_decay,
        muon_lr_scale=options.muon_lr_scale,
        muon_ns_steps=options.muon_ns_steps,
        muon_ns_precision=options.muon_ns_precision,
    )
    per_rank = math.ceil(len(plan.groups) / world)
    schedule = LrSchedule.from_counts(
        per_rank, options.epochs, 1, options.grad_accum, options.warmup_ratio
    )
    setup = LmSetup(
        spec=spec,
        options=options,
        storage=storage,
        device=device,
        dtype=dtype,
        model=model,
        module=module,
        tokenizer=tokenizer,
        dims=dims,
        lm_size=size,
        run_key=run_key,
        examples=plan.examples,
        skipped=plan.skipped,
        groups=plan.groups,
        optimizer=optimizer,
        schedule=schedule,
        vram=vram,
        max_len=plan.max_len,
        max_len_source=plan.max_len_source,
        fingerprint=checkpoint.model_fingerprint(model),
        identity=identity,
        trigger=plan.trigger,
        trigger_position=plan.trigger_position,
        budget=budget,
        compile=mode,
        pad_multiple=pad,
        init_from=init_from,
        held_out=plan.held_out,
        holdout=plan.holdout,
        rank=rank,
        world=world,
        events=events,
        grad_flats=grad_flats,
    )
    if log_start:
        setup.log(start.line)
    if eager_note:
        setup.log(eager_note)
    setup.log(
        f"set up in {time.perf_counter() - started:.1f} s: LM and tokenizer read onto {device} "
        f"{loaded - started:.1f} s, data and adapter {time.perf_counter() - loaded:.1f} s"
    )
    _announce(setup, optimizer.split_summary())
    return setup


def _announce(setup: LmSetup, split: str) -> None:
    real, padded = data.padding_stats(setup.examples, setup.groups, setup.pad_multiple)
    setup.emit("vram", **setup.vram.to_dict(), budget_mb=setup.budget_mb)
    setup.emit(
        "data",
        samples=len(setup.examples),
        skipped=len(setup.skipped),
        skipped_long=sum(s.reason == "too-long" for s in setup.skipped),
        max_len=setup.max_len,
        batches=len(setup.groups),
        steps_per_epoch=setup.schedule.steps_per_epoch,
        total_steps=setup.schedule.total_steps,
        warmup_steps=setup.schedule.warmup_steps,
        trained_tokens=sum(e.n_targets for e in setup.examples),
        pad_pct=round(100 * padded / max(real + padded, 1), 2),
    )
    for song in setup.skipped:
        setup.log(f"skipped {song.song_id}: {song.reason} {song.detail}".rstrip(), "warn")
    if setup.holdout is not None:
        held = ", ".join(setup.holdout["held_out"])
        setup.log(f"held out of training ({len(setup.held_out)} rendered): {held}")
    setup.log(
        f"LM {setup.lm_size} on {setup.device} ({setup.dtype}); {setup.identity.describe()}; "
        f"optimizer {split}; {setup.vram.checkpointed_layers}/{setup.dims.layers} layers "
        f"checkpointed, est. peak {setup.vram.total / lm_vram.GIB:.1f} GiB"
    )
    if setup.compile != "off":
        shapes = {
            (len(g), data.row_width(setup.examples, g, setup.pad_multiple)) for g in setup.groups
        }
        setup.log(
            f"torch.compile ({setup.compile}) of the {setup.dims.layers} decoder layers, rows "
            f"padded to multiples of {setup.pad_multiple} tokens: the first step of each of the "
            f"{len(shapes)} [rows, width] shapes of this run compiles, then steps run compiled"
        )
