"""What the DiT recipe's `setup` resolves before it builds a run: the settings beyond the
contract, the device and its memory budget, the fit, the adapter spec and its seeded injection,
the blocks' compile mode, the run folder and a warm start, the trigger, the optimizer and the LR
schedule, and the opening log.

Also what an entry point resolves before that: `resolve_resume` (`--resume` as a checkpoint, a
run folder or "latest") and `latest_unfinished` (an interrupted or paused run the user may want
to continue), both by the run's log (`dit_log.read_progress`) and its newest checkpoint
(`dit_state.newest_checkpoint`); `check_warm_start` and `check_trigger_request`, which refuse a
warm start that cannot fit and a trigger the tensors were not made with before any model loads.

Warm start (`init_adapter`): "latest" is the newest FINISHED run of this artist on this DiT
(its `adapters/dit-<shorthand>/` folder) with this run's adapter type
(`warm_start.latest_finished_run`, the LM trainer's rule too); none: the run starts fresh and
says so. A run the user names must exist and be of this type. Either way an adapter whose
shapes differ from this run's (rank, LoKR dim/factor, MLP targets, trained layers) is refused,
never silently dropped: the user matches its settings, names another, or passes
`init_adapter=""`. The run always logs one line naming what it starts from.

Trigger: the DiT trains on text conditions encoded at preprocess time, with each song's tag
already in its caption, so the adapter answers to that tag only; a `trigger` (or position) that
differs from the tensors' is refused rather than stamped into the export's metadata."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

from hotstep_ray.core import layout
from hotstep_ray.core.contracts import TrainDitOptions, schedule_steps
from hotstep_ray.core.errors import HotstepError, InputError
from hotstep_ray.core.events import EventLog, MetricEvent
from hotstep_ray.core.storage import Storage
from hotstep_ray.training import (
    adapters,
    dit_data,
    dit_log,
    dit_state,
    dit_vram,
    export,
)
from hotstep_ray.training import warm_start as warm_runs
from hotstep_ray.training.adapters import AdapterSpec
from hotstep_ray.training.engine import graph_mode
from hotstep_ray.training.optim import HybridOptimizer, build_optimizer
from hotstep_ray.training.schedule import LrSchedule
from hotstep_ray.training.speed import SpeedOptions

FOLD_MODES = ("auto", "on", "off")


@dataclass
class DitSettings:
    """Run settings that are not part of the `TrainDitOptions` contract."""

    dit_folder: str | None = None  # explicit DiT checkpoint folder (else from the cache's meta)
    checkpoints_dir: str | None = None  # where DiT folders live (official or diffusers layout)
    artist: str = ""  # adapter folder name; "" = options.adapter_name or the dataset slug
    trigger: str | None = None  # None = the variant's preprocess_meta custom_tag
    trigger_position: str | None = None  # None = the cache's tag_position, else prepend
    lora_dropout: float = 0.0
    zero_groups: tuple[str, ...] = ()  # projection groups exported as zeros (e.g. "q", "k")
    milestone_every_epochs: int = 0  # also a milestone every N epochs (0 = off)
    export_interval_s: float = 60.0  # at most one best-export per interval (the last one always)
    # Seconds between epoch-end checkpoints; None = the user's `options.checkpoint_every_s`. For
    # callers with a policy of their own (the main job's recipe, tests).
    checkpoint_interval_s: float | None = None
    checkpoint_every_steps: int = 0  # also checkpoint every N optimizer steps (0 = off)
    step_event_interval_s: float = 1.0  # rate limit of per-step metric events
    vram_budget_gb: float | None = None  # None: CUDA free memory - reserve; CPU unlimited
    device: str | None = None  # None: cuda if available else cpu
    window_rule: str = "sdpa"  # sliding-window convention (models.acestep_wrappers)
    # Run an optimizer window's micro-batches as fewer, larger ones when memory allows
    # (`dit_vram.fold_factor`; same draws, same loss): auto = on CUDA, off on the CPU.
    fold_accum: str = "auto"  # FOLD_MODES
    run_key: str | None = None  # fixed run folder (the Ray driver picks it for every worker)
    resume: str | None = None  # storage key of a checkpoint folder to continue from
    job_id: str = ""  # the job that trains the run, recorded in its log ("" = none)
    # Storage key Ray's rank 0 appends its events to; None = the job's events.jsonl (`job_id`)
    events_key: str | None = None
    rank: int = 0
    world_size: int = 1
    speed: SpeedOptions = field(default_factory=SpeedOptions)  # adapter forwards, flat gradients

    def __post_init__(self) -> None:
        if isinstance(self.speed, dict):  # `ray_dit` ships the settings as `asdict`'s dict
            self.speed = SpeedOptions(**self.speed)


def fit_run(
    options: TrainDitOptions,
    settings: DitSettings,
    dims: dit_vram.DitDims,
    spec: AdapterSpec,
    cache: dit_data.TensorCache,
    device: torch.device,
    compiled: bool,
) -> dit_vram.VramFit:
    """Crop, checkpointed layers and batch for this device's memory budget (`dit_vram.fit`);
    `compiled`: the blocks will run torch.compile'd (they keep fewer activations). Also checks
    `fold_accum`, the other memory-bound choice (`DitRun`'s fold factor)."""
    fit = dit_vram.fit(
        dims,
        spec,
        options,
        longest_song=cache.longest,
        songs=len(cache.songs),
        condition_len=cache.condition_len,
        budget_bytes=budget_bytes(settings, options, device),
        compiled=compiled,
        speed=settings.speed,
    )
    if settings.fold_accum not in FOLD_MODES:
        raise InputError(f"fold_accum {settings.fold_accum!r}: expected auto, on or off")
    return fit


def block_mode(
    requested: str,
    mode: str,
    ckpt_layers: int,
    dropout: float,
    blocks: int,
    events: EventLog | None,
) -> str:
    """The DiT blocks' compile mode once the fit is known (`engine.graph_mode`), logged."""
    chosen = graph_mode(requested, mode, ckpt_layers, dropout)
    if events and requested == "step-graph" and chosen != "step-graph":
        events.log(
            "compile step-graph: checkpointed layers and adapter dropout are not captured "
            "(their recompute and random draws live outside the graph); compiled blocks instead",
            "warn",
        )
    if events and chosen != "off":
        events.log(
            f"torch.compile ({chosen}) of the {blocks} DiT blocks: the first step of each new "
            "crop/batch shape compiles (about a minute), then steps run at full speed",
        )
    return chosen


def pick_device(settings: DitSettings) -> torch.device:
    if settings.device:
        return torch.device(settings.device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def budget_bytes(
    settings: DitSettings, options: TrainDitOptions, device: torch.device
) -> float | None:
    """Bytes the run may use: the given budget, else the GPU's free memory minus the reserve."""
    budget = None if settings.vram_budget_gb is None else settings.vram_budget_gb * dit_vram.GB
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        available = free - options.vram_reserve_mb * 1e6
        budget = available if budget is None else min(budget, available)
    return budget


def adapter_spec(
    options: TrainDitOptions, settings: DitSettings, dims: dit_vram.DitDims
) -> AdapterSpec:
    """The options' adapter on the top `layers` of the DiT, with `lora_dropout` (LoRA only)."""
    base = AdapterSpec.from_options(options)
    trained = dit_vram.trained_layers(options, dims)
    if base.kind != "lora" and settings.lora_dropout:
        raise InputError(f"lora_dropout {settings.lora_dropout} is LoRA's; a LoKR adapter has none")
    update: dict[str, Any] = {"dropout": settings.lora_dropout if base.kind == "lora" else 0.0}
    if trained < dims.layers:
        update["layers_to_train"] = tuple(range(dims.layers - trained, dims.layers))
    return AdapterSpec.model_validate({**base.model_dump(), **update})


def inject_adapter(
    transformer: torch.nn.Module,
    spec: AdapterSpec,
    speed: SpeedOptions,
    seed: int,
    device: torch.device,
) -> None:
    """Seeded adapter init (peft draws LoRA A / LoKR w1 from the global RNG): every worker of a
    run and every rerun start from the same weights; the global RNG is left as it was."""
    devices = [device] if device.type == "cuda" else []
    with adapters.global_rng(), torch.random.fork_rng(devices=devices):
        torch.manual_seed(dit_data.derived_seed(seed, "adapter-init"))
        adapters.inject(transformer, spec, speed)


def build_dit_optimizer(
    trainable: list[tuple[str, torch.nn.Parameter]], options: TrainDitOptions
) -> HybridOptimizer:
    """Hybrid Muon/AdamW over the adapter's named parameters, as the options say."""
    return build_optimizer(
        trainable,
        options.optimizer,
        options.effective_learning_rate,
        options.effective_weight_decay,
        muon_lr_scale=options.muon_lr_scale,
        muon_momentum=options.muon_momentum,
        muon_ns_steps=options.muon_ns_steps,
        muon_min_dim=options.muon_min_dim,
        muon_ns_precision=options.muon_ns_precision,
    )


def build_schedule(
    options: TrainDitOptions, settings: DitSettings, cache: dit_data.TensorCache, batch: int
) -> LrSchedule:
    """LR schedule over this rank's optimizer steps (warmup and total as `schedule_steps`)."""
    plan = dit_data.plan_epoch(cache.repeats, batch, options.seed, 1, options.order)
    micro_batches = len(dit_data.shard_plan(plan, settings.rank, settings.world_size))
    per_epoch, total, warmup = schedule_steps(
        micro_batches, options.epochs, 1, options.grad_accum, options.warmup_ratio
    )
    return LrSchedule(total_steps=total, warmup_steps=warmup, steps_per_epoch=per_epoch)


def resolve_trigger(
    settings: DitSettings, cache: dit_data.TensorCache, dataset: str = ""
) -> tuple[str | None, str]:
    """The tag the tensors were preprocessed with (the cache's meta or file headers), whatever
    the dataset says now; a `settings.trigger`/`trigger_position` that differs is refused
    (`check_trigger`): the export's metadata names what the adapter was trained on."""
    tag, position = cache.trigger()
    check_trigger(settings, tag, position, dataset)
    return tag or None, settings.trigger_position or position


def check_trigger(settings: DitSettings, tag: str | None, position: str, dataset: str = "") -> None:
    """Refuse a trigger word or position other than the tensors' (`tag`, `position`): the text
    conditions, trigger included, were encoded at preprocess time, so another word would only
    be written into the export's metadata, naming a word the adapter never saw."""
    given, where = settings.trigger, settings.trigger_position
    slug = dataset or "SLUG"
    if given is not None and (given.strip() or None) != (tag or None):
        wanted = given.strip()
        change = f"--tag {wanted}" if wanted else "no --tag"
        raise InputError(
            f"--trigger {given!r}: the DiT trains on text conditions encoded at preprocess time "
            f"with the tag {tag or 'none'!r}, which a trigger given now cannot reach; change the "
            f"dataset's tag (`hotstep-ray dataset build <songs folder> {change}`) and re-run "
            f"`hotstep-ray preprocess run {slug}`, or leave --trigger out"
        )
    if where is not None and tag and where != position:
        raise InputError(
            f"--trigger-position {where}: the tensors were preprocessed with the tag {tag!r} "
            f"at position {position} (encoded at preprocess time); change it with `hotstep-ray dataset "
            f"build <songs folder> --tag-position {where}` and re-run `hotstep-ray preprocess "
            f"run {slug}`, or leave --trigger-position out"
        )


def cache_trigger(storage: Storage, cache_key: str) -> tuple[str | None, str]:
    """`TensorCache.trigger` read from the meta and the files' headers only (no tensors): what
    an entry point checks a requested trigger against before anything loads."""
    meta_key = f"{cache_key}/{dit_data.META_FILE}"
    meta = storage.read_json(meta_key) if storage.exists(meta_key) else {}
    if meta.get("custom_tag"):
        return str(meta["custom_tag"]), str(meta.get("tag_position") or "prepend")
    tags: Counter[tuple[str, str]] = Counter()
    for file_key in storage.list(cache_key):
        name = file_key.rsplit("/", 1)[-1]
        if not name.endswith(".safetensors") or name.startswith("."):
            continue
        with storage.open(file_key) as handle:
            size = int.from_bytes(handle.read(8), "little")
            header = json.loads(handle.read(size)).get("__metadata__") or {}
        if header.get("custom_tag"):
            tags[(str(header["custom_tag"]), str(header.get("tag_position", "")))] += 1
    if not tags:
        return None, str(meta.get("tag_position") or "prepend")
    (tag, position), _ = tags.most_common(1)[0]
    return tag, position or "prepend"


def check_trigger_request(
    storage: Storage, settings: DitSettings, dataset: str, variant_key: str
) -> None:
    """`check_trigger` against the tensor cache of `dataset`/`variant_key`, before any model or
    tensor loads (the CLI; Ray workers would only fail after starting)."""
    if settings.trigger is None and settings.trigger_position is None:
        return
    tag, position = cache_trigger(storage, layout.tensor_dir(dataset, variant_key))
    check_trigger(settings, tag, position, dataset)


def checkpoint_interval_s(options: TrainDitOptions, settings: DitSettings) -> float:
    """Seconds between epoch-end checkpoints: the caller's `settings.checkpoint_interval_s`, else
    the user's `options.checkpoint_every_s`."""
    if settings.checkpoint_interval_s is not None:
        return settings.checkpoint_interval_s
    return options.checkpoint_every_s


def artist_of(options: TrainDitOptions, settings: DitSettings, dataset: str) -> str:
    return layout.check_name(settings.artist or options.adapter_name or dataset, "artist")


def run_folder(
    options: TrainDitOptions, storage: Storage, settings: DitSettings, dataset: str, dit_name: str
) -> tuple[str, str, str]:
    """(adapter base, artist, run key): `adapters/dit-<shorthand>/<artist>/<run>/`, the run
    folder fixed by `settings.run_key` (one for every worker) or a new one."""
    artist = artist_of(options, settings, dataset)
    base = layout.dit_adapter_base(dit_name)
    if settings.run_key:
        return base, artist, settings.run_key
    if settings.world_size > 1:
        raise InputError("several workers need one run folder: pass settings.run_key")
    return base, artist, layout.new_run_dir(storage, base, artist)


def check_run_folder(options: TrainDitOptions, storage: Storage, settings: DitSettings) -> None:
    """Refuse to train into a named run folder (`run_key`) that already holds a run unless the
    request continues it (`resume`) or replaces it (`overwrite`): its adapter and log would be
    overwritten by a run from scratch. Entry points call this; Ray's restarted workers, which
    reuse their own folder, do not."""
    key = settings.run_key
    if key and not settings.resume and not options.overwrite and storage.list(key):
        raise InputError(
            f"{storage.url_of(key)} already holds a run: pass --resume {key} to continue it, "
            "--overwrite to replace it, or no --run-key for a new folder"
        )


def runs_parent(
    options: TrainDitOptions, storage: Storage, settings: DitSettings, dataset: str
) -> str:
    """`adapters/dit-<shorthand>/<artist>`: where this request's runs go, before any model is
    loaded (the DiT's name from the tensor cache's meta, as `setup` resolves it)."""
    meta_key = f"{layout.tensor_dir(dataset, options.variant_key)}/{dit_data.META_FILE}"
    meta = storage.read_json(meta_key) if storage.exists(meta_key) else {}
    folder = dit_data.resolve_dit_folder(
        meta, options.variant_key, settings.dit_folder, settings.checkpoints_dir
    )
    return f"{layout.dit_adapter_base(folder.name)}/{artist_of(options, settings, dataset)}"


def latest_run(storage: Storage, parent: str) -> str | None:
    """The name-last run folder under `parent` (stamps sort by time), whatever it holds: a run
    killed before its first export has no weights yet. Calibration output is not a run."""
    runs = [
        key
        for key in storage.list(parent)
        if layout.is_run_stamp(name := key.rsplit("/", 1)[-1])
        and not name.endswith("-calibrated")
        and storage.is_dir(key)
    ]
    return max(runs, key=warm_runs.run_order) if runs else None


@dataclass(frozen=True)
class UnfinishedRun:
    """A run that can be continued: killed (or still training), or paused by `max_steps`."""

    run_key: str
    state: str  # "interrupted" (no final log: killed, or still training) | "paused"
    checkpoint: dit_state.SavedCheckpoint  # the newest one: what a resume continues from
    epochs_logged: int  # epochs its log records (a kill loses those after the checkpoint)
    job_id: str  # the job that trained it ("" = not recorded)

    def stopped_at(self) -> str:
        """`epoch N` (what the checkpoint holds), plus the epochs the log saw beyond it."""
        saved = self.checkpoint
        where = (
            f"epoch {saved.epochs_done}"
            if saved.window == 0
            else f"step {saved.step} (in epoch {saved.epoch})"
        )
        lost = self.epochs_logged - saved.epochs_done
        return where + (f" (its log reached epoch {self.epochs_logged})" if lost > 0 else "")


def unfinished_run(storage: Storage, run_key: str) -> UnfinishedRun | None:
    """The run in `run_key` when it can be continued; None when it finished or has no
    checkpoint."""
    progress = dit_log.read_progress(storage, run_key)
    if progress is not None and progress.state == "finished":
        return None
    saved = dit_state.newest_checkpoint(storage, run_key)
    if saved is None or saved.stop_reason not in ("", "max_steps"):
        return None
    return UnfinishedRun(
        run_key=run_key,
        state="paused" if progress is not None and progress.state == "paused" else "interrupted",
        checkpoint=saved,
        epochs_logged=progress.epochs_run if progress is not None else saved.epochs_done,
        job_id=progress.job_id if progress is not None else "",
    )


def latest_unfinished(storage: Storage, parent: str) -> UnfinishedRun | None:
    """The latest run under `parent` when it can be continued (an older one that can is not
    offered: the latest run is the one the user last asked for)."""
    run_key = latest_run(storage, parent)
    return unfinished_run(storage, run_key) if run_key else None


def resolve_resume(storage: Storage, settings: DitSettings, parent: str) -> UnfinishedRun | None:
    """`settings.resume` as the user gave it, made a checkpoint key. A checkpoint folder stays
    as it is (into `settings.run_key`, else a new folder); a run folder (key or URL) or "latest"
    (the latest run under `parent`) continues in that folder from its newest checkpoint, which
    is returned. Refused when the run finished or wrote no checkpoint."""
    given = settings.resume
    if not given:
        return None
    if given == "latest":
        run_key = latest_run(storage, parent)
        if run_key is None:
            raise InputError(f"--resume latest: no run under {storage.url_of(parent)} yet")
    else:
        run_key = _as_key(storage, given)
        if dit_state.saved_checkpoint(storage, run_key) is not None:
            settings.resume = run_key  # a checkpoint folder itself
            return None
    run = unfinished_run(storage, run_key)
    if run is None:
        raise InputError(_not_resumable(storage, given, run_key))
    settings.resume = run.checkpoint.key
    settings.run_key = settings.run_key or run.run_key
    return run


def _as_key(storage: Storage, given: str, flag: str = "--resume") -> str:
    """A storage key from a key or a URL/path under the root (as the CLI prints runs)."""
    if "://" in given or given.startswith("/"):
        try:
            return storage.key_of(given)
        except HotstepError as exc:
            raise InputError(f"{flag} {given}: {exc}") from exc
    return given.strip("/")


def _not_resumable(storage: Storage, given: str, run_key: str) -> str:
    url = storage.url_of(run_key)
    progress = dit_log.read_progress(storage, run_key)
    if progress is not None and progress.state == "finished":
        return (
            f"--resume {given}: {url} finished ({progress.stop_reason or 'done'}): there is "
            "nothing to continue; leave out --resume for a new run"
        )
    if progress is not None:
        return (
            f"--resume {given}: {url} stopped before its first checkpoint (one is written after "
            "epoch 1, then as --checkpoint-every-s/--checkpoint-every-epochs say): start a new "
            "run"
        )
    return f"--resume {given}: {url} holds no DiT run and no checkpoint"


def init_adapter(
    options: TrainDitOptions,
    settings: DitSettings,
    storage: Storage,
    transformer: torch.nn.Module,
    base: str,
    artist: str,
    run_key: str,
    events: EventLog | None,
) -> str | None:
    """Warm start (module docstring): loads the adapter `init_adapter` resolves to and logs one
    line naming it, or the line saying the run starts fresh. Returns the key loaded, None when
    the adapter starts fresh. A resumed run loads nothing here (its checkpoint holds the
    adapter). Stages without train export the adapter as it starts: refused when nothing is
    loaded and nothing is resumed."""
    key = None
    if not settings.resume:
        key = _load_init_adapter(options, storage, transformer, base, artist, run_key, events)
    if "train" not in options.stages and not settings.resume and key is None:
        raise InputError(
            "stages without train export the adapter as it starts, and nothing was loaded: pass "
            "--resume with a trained run's checkpoint (or --init-adapter with one to re-export)"
        )
    return key


def warm_start(
    options: TrainDitOptions, storage: Storage, base: str, artist: str, run_key: str = ""
) -> warm_runs.TrainedRun | None:
    """The adapter `options.init_adapter` names: "latest" = the newest finished run of `artist`
    under `base` of this adapter type, other than `run_key` (None when there is none); "" =
    None; else that folder, which must hold weights of this adapter type."""
    value = options.init_adapter
    if not value:
        return None
    if value == "latest":
        return warm_runs.latest_finished_run(
            storage, base, artist, options.adapter_type, exclude=run_key
        )
    key = _as_key(storage, value, "--init-adapter")
    found = warm_runs.trained_run(storage, key)
    if found is None:
        raise InputError(f"--init-adapter {value}: no adapter weights at {storage.url_of(key)}")
    if found.adapter_type != options.adapter_type:
        raise InputError(
            f"--init-adapter {value}: {storage.url_of(key)} is a {found.adapter_type} adapter and "
            f"this run trains {options.adapter_type}: pass --adapter-type {found.adapter_type}, "
            "another run, or --init-adapter '' to start from scratch"
        )
    return found


def fit_problems(options: TrainDitOptions, config: dict[str, Any], base: str) -> list[str]:
    """How an earlier run's adapter (its log's resolved `config`) differs in shape from the one
    `options` train on `base`: what would make loading it fail. Fields the log lacks are not
    compared (the load itself checks every tensor)."""
    wanted: dict[str, Any] = {"target_mlp": options.target_mlp}
    if options.is_lokr:
        wanted.update(
            lokr_dim=options.lokr_dim,
            lokr_factor=options.lokr_factor,
            lokr_decompose_both=options.lokr_decompose_both,
        )
    else:
        wanted["rank"] = options.rank
    total = config.get("n_layers_total")
    if total:  # the log's `layers` is the trained count, 0 already resolved to every layer
        wanted["layers"] = options.layers or int(total)
    problems = [
        f"{name.replace('_', '-')} {config[name]} vs {value}"
        for name, value in wanted.items()
        if name in config and config[name] != value
    ]
    dit_name = config.get("dit_name")
    if dit_name and layout.dit_adapter_base(str(dit_name)) != base:
        problems.insert(0, f"base {layout.dit_shorthand(str(dit_name))} vs {base.rsplit('/')[-1]}")
    return problems


def _cannot_continue(storage: Storage, key: str, reasons: str) -> InputError:
    return InputError(
        f"cannot continue from {storage.url_of(key)} ({reasons}): match its settings, name "
        "another run with --init-adapter, or pass --init-adapter '' to start from scratch"
    )


def check_warm_start(
    options: TrainDitOptions, storage: Storage, settings: DitSettings, dataset: str
) -> None:
    """Refuse, before any model loads, a warm start whose adapter cannot fit this run (by the
    earlier run's log; `_load_init_adapter` checks the tensors themselves)."""
    if settings.resume or not options.init_adapter:
        return
    parent = runs_parent(options, storage, settings, dataset)
    base, artist = parent.rsplit("/", 1)
    start = warm_start(options, storage, base, artist, settings.run_key or "")
    if start is not None and (problems := fit_problems(options, start.config, base)):
        raise _cannot_continue(storage, start.key, "; ".join(problems))


def _load_init_adapter(
    options: TrainDitOptions,
    storage: Storage,
    transformer: torch.nn.Module,
    base: str,
    artist: str,
    run_key: str,
    events: EventLog | None,
) -> str | None:
    start = warm_start(options, storage, base, artist, run_key)
    if start is None:
        if events:
            events.log(
                warm_runs.fresh_start_line(base, artist, options.adapter_type)
                if options.init_adapter
                else "no warm start (init adapter ''): starting fresh"
            )
        return None
    if problems := fit_problems(options, start.config, base):
        raise _cannot_continue(storage, start.key, "; ".join(problems))
    try:
        export.load_exported(transformer, storage, start.key, rename=export.ACESTEP_OFFICIAL_NAMES)
    except InputError as exc:  # shapes the log did not tell (or no log)
        raise _cannot_continue(storage, start.key, str(exc)) from exc
    if events:
        events.log(warm_runs.warm_start_line(storage, start))
    return start.key


def announce(
    events: EventLog | None,
    *,
    options: TrainDitOptions,
    spec: AdapterSpec,
    dims: dit_vram.DitDims,
    fit: dit_vram.VramFit,
    dit_name: str,
    variant: str,
    optimizer_split: str,
    schedule: LrSchedule,
    fold: int,
    cache: dit_data.TensorCache,
) -> None:
    """The run's opening log line, the fit's notes, and the `vram` and `data` metric events."""
    if events is None:
        return
    events.log(
        f"train-dit {spec.kind} on {dit_name} ({variant}): "
        f"{fit.trained_layers}/{dims.layers} layers, crop {fit.crop_frames} frames, "
        f"batch {fit.batch}, {fit.ckpt_layers} layers checkpointed, "
        f"optimizer {options.optimizer} ({optimizer_split}), {schedule.total_steps} steps"
        + (
            f"; each step's {options.grad_accum} micro-batches run {fold} at a "
            f"time (batch {fit.batch * fold} per forward, same loss)"
            if fold > 1
            else ""
        )
    )
    for note in fit.notes:
        events.log(note, "warn")
    events.emit(MetricEvent(metric="vram", **fit.to_dict()))
    events.emit(
        MetricEvent(
            metric="data",
            **cache.summary(),
            batch=fit.batch,
            steps_per_epoch=schedule.steps_per_epoch,
            total_steps=schedule.total_steps,
            warmup_steps=schedule.warmup_steps,
        )
    )
