"""`hotstep-ray train-dit run SLUG ...`: train a LoRA/LoKR adapter for the ACE-Step 1.5 DiT.

Every `TrainDitOptions` field is an option (`--learning-rate 5e-4`, `--target-mlp/--no-target-mlp`,
`--stages train,export`); unset options keep the contract's defaults. `--ray` runs the job on Ray
Train (the cluster at `--ray-address` / $RAY_ADDRESS, or a local one); `--no-ray` trains in this
process. Inside `ray job submit` the default is Ray.

`--calibrate` ends the job by evaluating the run's adapter and milestones x scales (latent Fréchet
against the tensor cache) and baking the winner into `<run>-calibrated/` (`--calibrate-scales`,
`--calibrate-seeds`, `--calibrate-duration` tune it); `--holdout-fraction 0.2` keeps songs out of
training and prints their loss per epoch.

Warm start. `--init-adapter latest` (the default) starts from the newest FINISHED run of this
artist on this DiT with the same adapter type (a killed or paused run's best-so-far export never
counts); with none the run starts fresh. `--init-adapter RUN` names one. An adapter whose shapes
differ from this run's is refused (exit 2); the run prints one line naming what it starts from.

Trigger. The DiT trains on the text conditions encoded at preprocess time, the dataset's tag in
every caption: `--trigger`/`--trigger-position` may only repeat the cache's (a different word is
refused: change the dataset's tag and preprocess again).

Resuming. Checkpoints are written at epoch ends (`--checkpoint-every-s`,
`--checkpoint-every-epochs`). `--resume RUN` continues a run folder from its newest checkpoint
(its own or Ray's), `--resume latest` the latest run of this dataset/artist, `--resume KEY` a
checkpoint folder. A plain rerun never continues on its own (the options may have changed on
purpose): when the latest run was interrupted it says so, and starts a new run.
Under `--ray` rank 0's events are followed from storage, so the epoch lines print here too.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import typer

from hotstep_ray.cli.common import (
    RunByDefault,
    calibration_overrides,
    console,
    err_console,
    fail,
    handle_errors,
    print_eval,
    print_json,
    with_contract_options,
)
from hotstep_ray.core import layout
from hotstep_ray.core.compile_cache import use_compile_cache
from hotstep_ray.core.contracts import TrainDitOptions
from hotstep_ray.core.errors import HotstepError
from hotstep_ray.core.events import FollowJsonl, LogEvent, MetricEvent
from hotstep_ray.core.jobs import Job
from hotstep_ray.core.storage import Storage

if TYPE_CHECKING:
    from hotstep_ray.training.dit_setup import DitSettings

app = typer.Typer(
    help="Train DiT (LoRA/LoKR) adapters from a preprocessed tensor cache "
    "(`train-dit SLUG ...` = `train-dit run SLUG ...`).",
    no_args_is_help=True,
    cls=RunByDefault,
)


@app.callback()
def _group() -> None:
    """Train DiT (LoRA/LoKR) adapters from a preprocessed tensor cache."""


# Options handled by name below rather than generated from the contract.
_EXPLICIT = {"variant_key"}
RAY_WORKERS = 1  # --workers when not given
RAY_MAX_FAILURES = 2  # --max-failures when not given
# Seconds between reads of Ray rank 0's event file (on S3 each read fetches the whole object)
FOLLOW_EVERY_S = 1.0


def _console_sink(event) -> None:
    if isinstance(event, LogEvent):
        style = {"info": "dim", "warn": "yellow", "error": "red"}[event.level]
        # soft_wrap: paths (a warm start's run, a checkpoint) stay whole, so they can be copied
        console.print(f"  [{style}]{event.message}[/]", highlight=False, soft_wrap=True)
    elif isinstance(event, MetricEvent) and event.metric == "epoch":
        extra = event.model_extra or {}
        console.print(
            f"  epoch {event.epoch}/{event.epochs}  loss {event.loss:.4f}  "
            f"ma5 {extra.get('ma5', float('nan')):.4f}  lr {event.lr:.2e}  "
            f"step {event.step}/{event.total_steps}",
            highlight=False,
        )
    elif isinstance(event, MetricEvent) and event.metric == "eval":
        print_eval(event)
    elif isinstance(event, MetricEvent) and event.metric == "milestone":
        console.print(f"  [green]milestone[/] {event.path}", highlight=False)


def _shown_defaults() -> dict[str, str]:
    """The fields whose unset default resolves by adapter type (`effective_<name>`), in words."""
    return {
        name: f"by adapter ({_by_adapter(f'effective_{name}')})"
        for name, field in TrainDitOptions.model_fields.items()
        if field.default is None and hasattr(TrainDitOptions, f"effective_{name}")
    }


def _by_adapter(prop: str) -> str:
    """`lokr X, lora Y`: what an unset field resolves to for each adapter type."""
    values = []
    for kind in ("lokr", "lora"):
        value = getattr(TrainDitOptions(variant_key="help", adapter_type=kind), prop)
        values.append(f"{kind} {value:g}" if isinstance(value, float) else f"{kind} {value}")
    return ", ".join(values)


def build_options(variant: str, values: dict[str, Any]) -> TrainDitOptions:
    """The contract from CLI values (None = unset; lists are comma-separated)."""
    given = {k: v for k, v in values.items() if v is not None}
    if isinstance(given.get("stages"), str):
        given["stages"] = [s.strip() for s in given["stages"].split(",") if s.strip()]
    return TrainDitOptions.model_validate({**given, "variant_key": variant})


def _run(
    slug: str = typer.Argument(..., help="Dataset slug (tensors/<slug>/<variant>/)."),
    data: str = typer.Option("./data", help="Storage root: a folder or s3://bucket/prefix."),
    checkpoints: str | None = typer.Option(
        None, help="Folder of DiT checkpoints (the variant's DiT is looked up there)."
    ),
    variant: str | None = typer.Option(
        None,
        "--variant",
        help="Tensor-cache variant key, e.g. turbo (default: the newest one).",
    ),
    dit_folder: str | None = typer.Option(None, "--dit", help="Explicit DiT folder."),
    artist: str = typer.Option("", help="Adapter folder name (default: adapter name or slug)."),
    trigger: str | None = typer.Option(
        None,
        help="Trigger word: only the tensors' own (the dataset's tag at preprocess), the default.",
    ),
    trigger_position: str | None = typer.Option(
        None, help="prepend | append | replace: only the tensors' own, the default."
    ),
    lora_dropout: float = typer.Option(0.0, help="LoRA input dropout."),
    zero_groups: str = typer.Option("", help="Groups exported as zeros, e.g. q,k."),
    milestone_every_epochs: int = typer.Option(0, help="Also a milestone every N epochs."),
    vram_gb: float | None = typer.Option(
        None, help="GPU memory per worker (Ray request; local: budget). Default: predicted."
    ),
    resume: str | None = typer.Option(
        None,
        help="Continue a run: its folder (key or path: from its newest checkpoint, in that "
        "folder), `latest` (the latest run of this dataset/artist), or a checkpoint folder key "
        "(<run>/checkpoint, ray_results/<run key>/checkpoint_<step>).",
    ),
    run_key: str | None = typer.Option(
        None, help="Run folder key (default: a new one; with --resume RUN, that run's)."
    ),
    max_steps: int | None = typer.Option(
        None, help="Pause after N optimizer steps (resumed ones count), keeping a checkpoint."
    ),
    use_ray: bool | None = typer.Option(
        None, "--ray/--no-ray", help="Train on Ray Train (default: when a cluster address is set)."
    ),
    ray_address: str = typer.Option("", help="Ray cluster to join (default $RAY_ADDRESS)."),
    workers: int | None = typer.Option(
        None, help=f"Ray workers (one GPU each); >1 = data parallel. Default: {RAY_WORKERS}."
    ),
    max_failures: int | None = typer.Option(
        None, help=f"Ray: worker failures to recover from. Default: {RAY_MAX_FAILURES}."
    ),
    calibrate_scales: str = typer.Option("", help="Calibration scales (default 0.5,0.75,1,1.25)."),
    calibrate_seeds: int = typer.Option(0, help="Calibration renders per grid point (0 = 4)."),
    calibrate_duration: float = typer.Option(0.0, help="Seconds per calibration render (0 = 10)."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    **contract: Any,
) -> None:
    """Train a DiT adapter: setup -> train -> export to adapters/dit-<base>/<artist>/<run>/."""
    if use_ray is None:
        use_ray = bool(ray_address or os.environ.get("RAY_ADDRESS"))
    check_placement_options(
        use_ray,
        ray_only={
            "--ray-address": ray_address or None,
            "--workers": workers,
            "--max-failures": max_failures,
        },
    )
    from hotstep_ray.calibration import after_train
    from hotstep_ray.training import dit, dit_data, dit_setup

    storage = Storage(data)
    use_compile_cache(storage)  # compiled blocks reused by later runs and Ray workers
    options = build_options(dit_data.pick_variant(storage, slug, variant), contract)
    if not variant and not as_json:
        console.print(f"  variant {options.variant_key} (the newest tensor cache of {slug})")
    after_train.check_calibrate(options)
    calibration = calibration_overrides(calibrate_scales, calibrate_seeds, calibrate_duration)
    settings = dit.DitSettings(
        dit_folder=dit_folder,
        checkpoints_dir=checkpoints,
        artist=artist,
        trigger=trigger,
        trigger_position=trigger_position,
        lora_dropout=lora_dropout,
        zero_groups=tuple(g.strip() for g in zero_groups.split(",") if g.strip()),
        milestone_every_epochs=milestone_every_epochs,
        vram_budget_gb=vram_gb,
        resume=resume,
        run_key=run_key,
    )
    if settings.resume:
        parent = dit_setup.runs_parent(options, storage, settings, slug)
        resumed = dit_setup.resolve_resume(storage, settings, parent)
        if resumed is not None and _job_alive(storage, resumed.job_id):
            raise fail(
                f"--resume {resume}: {storage.url_of(resumed.run_key)} is still being trained by "
                f"job {resumed.job_id} (`hotstep-ray jobs list`): wait for it, or stop it first"
            )
    elif not settings.run_key:
        _offer_to_continue(storage, options, settings, slug, as_json)
    dit.check_run_folder(options, storage, settings)
    # refused here, before a model loads (on Ray a worker's refusal would only end in a traceback)
    dit_setup.check_trigger_request(storage, settings, slug, options.variant_key)
    _check_warm_start(storage, options, settings, slug)
    with Job(storage, "train-dit", dataset_id=slug, sinks=(_console_sink,)) as job:
        settings.job_id = job.id
        job.phase("loading-models")
        if use_ray:
            from hotstep_ray.distributed.runtime import ensure_ray

            ensure_ray(ray_address or None)
            job.phase("train")
            settings.vram_budget_gb = None  # on Ray the request places the job; fit to free memory
            # rank 0 appends its events here; followed into this job's log and the console
            settings.events_key = layout.job_side_events(job.id, "train_events")
            follow = FollowJsonl(storage, settings.events_key, job.events.emit, FOLLOW_EVERY_S)
            with follow:
                result = after_train.train_dit_on_ray_then_calibrate(
                    options,
                    storage,
                    slug,
                    settings,
                    num_workers=RAY_WORKERS if workers is None else workers,
                    vram_gb=vram_gb,
                    max_failures=RAY_MAX_FAILURES if max_failures is None else max_failures,
                    job_id=job.id,
                    events=job.events,
                    calibration=calibration,
                    max_steps=max_steps,
                )
            summary = {
                "run": storage.url_of(result.run_key),
                "run_key": result.run_key,
                "checkpoint": result.checkpoint_key,
                "vram_gb": result.vram_gb,
            }
            log = result.log
            calibrated = result.calibration
        else:  # in this process: train, then (with --calibrate) calibrate
            run = dit.setup(options, storage, slug, settings, events=job.events)
            job.phase("train")
            outcome = dit.train(run, max_steps=max_steps)
            checkpoint = run.checkpoint_key if storage.list(run.checkpoint_key) else ""
            summary = {
                "run": storage.url_of(outcome.run_key),
                "run_key": outcome.run_key,
                "checkpoint": checkpoint,
            }
            log = outcome.log
            calibrated = None
            if options.calibrate and outcome.stop_reason == "max_steps":
                after_train.dit_calibration_skipped(job.events)
            elif options.calibrate:
                job.phase("calibrate")
                dit_folder = run.dit_folder
                del run  # the trained model; calibration loads the base again
                calibrated = after_train.calibrate_dit_run(
                    options, storage, outcome.run_key, dit_folder, job.events, calibration
                )
    summary.update(
        variant=options.variant_key,
        stop_reason=log.get("stop_reason"),
        epochs_run=log.get("epochs_run"),
        best_ma5=log.get("best_loss"),
        saved_reason=log.get("saved_reason"),
        job=job.id,
        calibration=calibrated,
    )
    if as_json:
        print_json(summary)
        return
    console.print(f"[green]adapter:[/] {summary['run']}", soft_wrap=True)
    console.print(
        f"stopped: {summary['stop_reason']} after {summary['epochs_run']} epochs, "
        f"best ma5 {summary['best_ma5']}, saved ({summary['saved_reason']})"
    )
    if summary["stop_reason"] == "max_steps" and summary["checkpoint"]:
        console.print(f"paused: continue with --resume {summary['run_key']}", soft_wrap=True)
    if calibrated is not None:
        winner = calibrated["winner"]
        if winner is None:
            console.print(f"[yellow]calibration: no winner[/] ({calibrated['url']})")
        else:
            console.print(
                f"[green]calibrated:[/] {calibrated['url']}  ({winner['candidate']} "
                f"x{winner['scale']:g}, score {winner['score']:.4f})",
                soft_wrap=True,
            )


def check_placement_options(
    use_ray: bool, *, ray_only: dict[str, Any], local_only: dict[str, Any] | None = None
) -> None:
    """Refuse options that would do nothing where the run trains: Ray's own (`ray_only`, flag ->
    value, None = not given) on a run in this process, and this process's (`local_only`, e.g.
    `--device`) on a Ray run, whose workers take the devices Ray gives them. Shared by
    train-dit and train-lm."""
    given = (local_only or {}) if use_ray else ray_only
    flags = [flag for flag, value in given.items() if value is not None]
    if not flags:
        return
    if use_ray:
        raise fail(
            f"{', '.join(flags)} only apply to a run in this process (--no-ray); on Ray each "
            "worker trains on the device Ray places it on: leave them out, or add --no-ray"
        )
    raise fail(
        f"{', '.join(flags)} only apply with --ray (Ray Train); this run trains in this "
        "process: add --ray, or leave them out"
    )


def _check_warm_start(
    storage: Storage, options: TrainDitOptions, settings: DitSettings, slug: str
) -> None:
    """`dit_setup.check_warm_start` when the run's folder can be named (no DiT found: the job
    reports that)."""
    from hotstep_ray.training import dit_setup

    try:
        dit_setup.runs_parent(options, storage, settings, slug)
    except (HotstepError, ValueError, OSError):
        return
    dit_setup.check_warm_start(options, storage, settings, slug)


def _job_alive(storage: Storage, job_id: str) -> bool:
    """Whether the job that trains a run still runs (its record through its heartbeat)."""
    from hotstep_ray.studio.records import read_summary

    if not job_id:
        return False
    try:
        return read_summary(storage, job_id).status in ("queued", "running")
    except (HotstepError, ValueError):
        return False


def _offer_to_continue(
    storage: Storage, options: TrainDitOptions, settings: DitSettings, slug: str, as_json: bool
) -> None:
    """One line when the latest run of this dataset/artist can be continued: a plain rerun
    starts a new run, since the options may have changed on purpose."""
    from hotstep_ray.training import dit_setup

    try:
        parent = dit_setup.runs_parent(options, storage, settings, slug)
    except (HotstepError, ValueError, OSError):  # no DiT to name it by: the job reports it
        return
    run = dit_setup.latest_unfinished(storage, parent)
    if run is None or _job_alive(storage, run.job_id):
        return
    article = "an" if run.state == "interrupted" else "a"
    out = err_console if as_json else console  # --json: stdout carries the JSON only
    out.print(
        f"[yellow]{article} {run.state} run {run.run_key} stopped at {run.stopped_at()}: "
        f"continue it with --resume {run.run_key} (or --resume latest); training a new run[/]",
        highlight=False,
        soft_wrap=True,
    )


run = app.command("run")(
    handle_errors(with_contract_options(TrainDitOptions, _EXPLICIT, None, _shown_defaults())(_run))
)
