"""How the runner actor calls each stage: one small adapter per kind that knows the stage's own
signature, plus `dataset_entry` for stages exposing the convention

    fn(storage, slug, options, *, checkpoints_dir=..., events=<EventLog>)   # kwargs optional

Adapters run inside the job's runner actor (`jobs.JobRunner`), so Ray is already connected and
`ctx.events` reaches the job's `events.jsonl` and its live SSE stream.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from hotstep_ray.core import layout
from hotstep_ray.core.contracts import TrainDitOptions, TrainLmOptions
from hotstep_ray.core.errors import InputError
from hotstep_ray.core.events import EventLog, FollowJsonl
from hotstep_ray.core.jobs import Job
from hotstep_ray.core.storage import Storage


class ForwardLog(EventLog):
    """An EventLog that is also a sink: stages take one or the other (`events=`)."""

    def __call__(self, event: Any) -> None:
        self.emit(event)


@dataclass
class StageContext:
    storage: Storage
    slug: str
    options: BaseModel
    job: Job  # the studio job (phases, summary)
    events: ForwardLog  # the stage's events, folded into the studio job
    checkpoints_dir: str = ""


# Below this many songs the probes run in the runner itself: starting Ray workers for a dozen
# header reads costs more than the reads (seconds on a small box).
RAY_PROBE_MIN_FILES = 200


def build(ctx: StageContext, entry: Callable[..., Any]) -> dict[str, Any]:
    """Rescan (per-file probes as Ray tasks for big folders; progress as `probe`) and write
    `dataset.json`."""
    from hotstep_ray.dataset.scan import list_audio_keys
    from hotstep_ray.dataset.store import load_dataset, load_summary
    from hotstep_ray.distributed.map import RayMap

    job = ctx.job

    def progress(done: int, total: int) -> None:
        job.events.progress(done, total, phase="probe")

    job.phase("scan")
    summary = load_summary(ctx.storage, ctx.slug)
    count = len(list_audio_keys(Storage(summary.source_dir), summary.recursive))
    if count >= RAY_PROBE_MIN_FILES:
        map_fn: Callable[..., Any] = RayMap(num_cpus=0.25, on_progress=progress)
    else:
        map_fn = _counting_map(progress)
    detail = load_dataset(ctx.storage, ctx.slug, map_fn=map_fn)
    for warning in detail.warnings:
        job.events.log(warning, level="warn")
    job.phase("build")
    url = entry(ctx.storage, detail, ctx.options)
    job.events.log(f"dataset.json written: {url}")
    return {"datasetJsonPath": url}


def _counting_map(on_progress: Callable[[int, int], None]) -> Callable[..., Any]:
    """The builtin `map`, reporting (done, total) like `RayMap`."""

    def counting(fn: Callable[[Any], Any], items: Any) -> list[Any]:
        items = list(items)
        results = []
        for item in items:
            results.append(fn(item))
            on_progress(len(results), len(items))
        return results

    return counting


def label(ctx: StageContext, entry: Callable[..., Any]) -> Any:
    return entry(ctx.storage, ctx.slug, ctx.options, events=ctx.events)


def preprocess(ctx: StageContext, entry: Callable[..., Any]) -> Any:
    _need_checkpoints(ctx)
    return entry(ctx.storage, ctx.slug, ctx.options, ctx.checkpoints_dir, "ray", ctx.events)


def train_lm(ctx: StageContext, entry: Callable[..., Any]) -> Any:
    """LM training as a Ray Train job, then the calibration when `calibrate` is set
    (`calibration.after_train.run_lm_on_ray_then_calibrate`). Its rank-0 worker (and the
    calibration) append events to a side file; a tail thread folds them into this job so the SSE
    stream shows the loss as it goes."""
    from hotstep_ray.training import lm_spec

    _need_checkpoints(ctx)
    options: Any = ctx.options
    name = options.adapter_name or ctx.slug
    given = {**options.model_dump(exclude_unset=True), "adapter_name": name}
    recipe = TrainLmOptions(**given)
    codes_key = layout.find_lm_codes(ctx.storage, ctx.slug, options.variant_key)
    side_key = layout.job_side_events(ctx.job.id, "train_events")
    spec = lm_spec.LmTrainSpec(
        options=recipe,
        lm_dir=str(lm_spec.resolve_lm_dir(ctx.checkpoints_dir, recipe.lm_size, recipe.lm_model)),
        codes_key=codes_key,
        artist=name,
        # "" = each song's own tag from lm_codes.jsonl (baked in at preprocessing), as the CLI does
        trigger="",
        trigger_position="prepend",
        events_key=side_key,
    )
    ctx.job.phase("train")
    with FollowJsonl(ctx.storage, side_key, ctx.events):
        result = entry(spec, ctx.storage)
    ctx.job.phase("export")
    return {"runKey": result.run_key, "files": result.files, "log": result.log}


# Per-step loss events at most this often (seconds); each epoch's last step is always sent, so
# even a short run draws a loss curve on the page.
DIT_STEP_EVENT_S = 1.0


def train_dit(ctx: StageContext, entry: Callable[..., Any]) -> Any:
    """DiT training as a Ray Train job, then the calibration when `calibrate` is set
    (`calibration.after_train.train_dit_on_ray_then_calibrate`), as the CLI's `--ray` path runs
    it. Its rank-0 worker writes the events of a stage job of its own; a tail thread folds them
    into this job (that job becomes a child: listed under this one)."""
    from hotstep_ray.core.jobs import Job
    from hotstep_ray.training import dit, dit_data

    _need_checkpoints(ctx)
    options: Any = ctx.options
    given = options.model_dump(exclude_unset=True)
    given.setdefault("adapter_name", ctx.slug)
    given["variant_key"] = dit_data.pick_variant(ctx.storage, ctx.slug, given.get("variant_key"))
    recipe = TrainDitOptions(**given)
    settings = dit.DitSettings(
        checkpoints_dir=ctx.checkpoints_dir,
        artist=recipe.adapter_name,
        step_event_interval_s=DIT_STEP_EVENT_S,
    )
    stage_job = Job(ctx.storage, "train-dit", dataset_id=ctx.job.summary.dataset_id)
    ctx.job.phase("train")
    with FollowJsonl(ctx.storage, layout.job_events(stage_job.id), ctx.events), stage_job:
        result = entry(recipe, ctx.storage, ctx.slug, settings, job_id=stage_job.id)
    ctx.job.phase("export")
    log = result.log
    return {
        "runKey": result.run_key,
        "adapterUrl": ctx.storage.url_of(result.run_key),
        "variantKey": recipe.variant_key,
        "vramGb": result.vram_gb,
        "stopReason": log.get("stop_reason"),
        "epochsRun": log.get("epochs_run"),
        "bestMa5": log.get("best_loss"),
    }


def audition(ctx: StageContext, entry: Callable[..., Any]) -> Any:
    """`studio.audition_job.audition_dataset`, with the job's phases."""
    _need_checkpoints(ctx)
    return entry(
        ctx.storage,
        ctx.slug,
        ctx.options,
        checkpoints_dir=ctx.checkpoints_dir,
        events=ctx.events,
        dataset_id=ctx.job.summary.dataset_id,
        phase=ctx.job.phase,
    )


def dataset_entry(ctx: StageContext, entry: Callable[..., Any]) -> Any:
    """The generic convention (module docstring): pass the keyword arguments it declares."""
    import inspect

    params = inspect.signature(entry).parameters
    kwargs: dict[str, Any] = {}
    if "events" in params:
        kwargs["events"] = ctx.events
    if "checkpoints_dir" in params:
        _need_checkpoints(ctx)
        kwargs["checkpoints_dir"] = ctx.checkpoints_dir
    return entry(ctx.storage, ctx.slug, ctx.options, **kwargs)


def _need_checkpoints(ctx: StageContext) -> None:
    if not ctx.checkpoints_dir:
        raise InputError("this stage needs a checkpoints folder (HOTSTEP_CHECKPOINTS)")
