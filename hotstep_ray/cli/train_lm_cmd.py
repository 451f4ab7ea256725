"""`hotstep-ray train-lm run SLUG`: train a 5 Hz LM adapter from a dataset's `lm_codes.jsonl`.

Every `TrainLmOptions` field is an option, generated from the contract (`--size` and `--lr` name
`lm_size` and `learning_rate`); only the options given on the command line reach it, the rest take
the LM recipe's defaults (`core.contracts.TrainLmOptions`). Warm start: `--init-adapter latest` (the default) is
the newest FINISHED run of this artist on this LM size (a run still training, killed or only
checkpointed never counts) of the `--adapter-type` given, or of any type when none is given; the
adapter type, rank and alpha not given here are taken from that run, and a contradicting one is
refused (exit 2), as is a named `--init-adapter RUN` that does not fit. With no such run the job
starts fresh; either way it prints one line naming what it starts from (the DiT trainer's rule).
`--ray` runs the job on Ray Train (GPU workers sized from the memory plan, resume after a worker
failure); `--no-ray` trains in this process. Ray's options (`--workers`, `--max-failures`,
`--ray-address`) are refused without `--ray`, and `--device` with it.

`--resume RUN` continues the run's checkpoint exactly as it was started: its options and trigger
are the checkpoint's (a resumed run equals an uninterrupted one), so any other value given now
is ignored with one line each (`--epochs 10 ignored: the run continues with its own 40`); only
the stages and the calibration choices are this request's.

`--trigger WORD` replaces every song's tag in the caption rendered at train time, so the adapter
learns it (and its metadata names it); without it each song keeps its preprocessed tag.

`--stages extract,train,export` (the default) picks what runs: `extract` refreshes lm_codes.jsonl
from the tensor cache, `train` without `export` keeps the run's checkpoint, and `--stages export
--resume RUN` exports it later. `--holdout-fraction 0.2` keeps songs out of training and prints
their loss per epoch; `--calibrate` ends the job by picking the best milestone x scale and baking
it into `<run>-calibrated/` (`--no-calibrate-repoint`: the artist keeps resolving to the run).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from hotstep_ray.cli.common import (
    RunByDefault,
    calibration_overrides,
    console,
    given,
    handle_errors,
    print_eval,
    print_json,
    with_contract_options,
)
from hotstep_ray.cli.train_dit_cmd import RAY_MAX_FAILURES, RAY_WORKERS, check_placement_options
from hotstep_ray.core import layout
from hotstep_ray.core.compile_cache import use_compile_cache
from hotstep_ray.core.contracts import (
    LM_ACTIVATION_BUDGET_DEFAULT,
    LM_COMPILE_DEFAULT,
    TrainLmOptions,
)
from hotstep_ray.core.events import LogEvent, MetricEvent
from hotstep_ray.core.jobs import Job
from hotstep_ray.core.storage import Storage

app = typer.Typer(
    help="Train 5 Hz LM (planner) adapters (`train-lm SLUG ...` = `train-lm run SLUG ...`).",
    no_args_is_help=True,
    cls=RunByDefault,
)


@app.callback()
def _group() -> None:
    """Train 5 Hz LM (planner) adapters: `train-lm run SLUG …`."""


def lm_folder(checkpoints: str, options: TrainLmOptions) -> tuple[Path, TrainLmOptions]:
    """The LM folder of `options` and the options with its size: a named folder (`lm_model`)
    says its size in its config.json, which wins over the contract's default size; a size given
    explicitly that disagrees with the folder is an InputError (before anything loads); with
    neither, the default size's official folder, else the largest LM present."""
    from hotstep_ray.training import lm_spec

    explicit = "lm_size" in options.model_fields_set
    if not options.lm_model and not explicit:  # the default size, or the largest present
        options = options.model_copy(
            update={"lm_size": lm_spec.present_lm_size(checkpoints, options.lm_size)}
        )
    folder = lm_spec.resolve_lm_dir(checkpoints, options.lm_size, options.lm_model)
    if not options.lm_model:  # the official folder of the requested size: setup checks it
        return folder, options
    size = lm_spec.lm_size_of(lm_spec.read_dims(folder), options.lm_size, explicit=explicit)
    return folder, options.model_copy(update={"lm_size": size})


def _print_event(event: Any) -> None:
    if isinstance(event, LogEvent):
        style = {"info": "dim", "warn": "yellow", "error": "red"}[event.level]
        console.print(f"  [{style}]{event.message}[/]", highlight=False, soft_wrap=True)
    elif isinstance(event, MetricEvent) and event.metric == "eval":
        print_eval(event)
    elif isinstance(event, MetricEvent) and event.metric == "epoch":
        extra = event.model_extra or {}
        mark = " *" if extra.get("best") else ""
        console.print(
            f"  epoch {event.epoch}/{event.epochs}  loss {event.loss:.4f}  "
            f"lr {event.lr:.2e}  grad {event.grad_norm:.3f}{mark}",
            highlight=False,
        )


# Options named here rather than generated from the contract: their flags are `--size`, `--lr`,
# `--variant` and `--artist` (the adapter name).
_EXPLICIT = {"lm_size", "learning_rate", "variant_key", "adapter_name"}


def _run(
    slug: str = typer.Argument(..., help="Dataset slug (its preprocessed codes are the data)."),
    data: str = typer.Option("./data", help="Storage root: a folder or s3://bucket/prefix."),
    checkpoints: str = typer.Option(..., help="ACE-Step checkpoints folder."),
    size: str | None = typer.Option(
        None,
        help="LM size: 0.6B, 1.7B or 4B (default: the --lm-model folder's, read from its "
        f"config.json; without --lm-model {TrainLmOptions.model_fields['lm_size'].default}).",
    ),
    lr: float | None = typer.Option(
        None,
        help="Peak learning rate. "
        f"Default: {TrainLmOptions.model_fields['learning_rate'].default}.",
    ),
    variant: str = typer.Option("", help="Preprocessed variant (default: newest)."),
    codes: str = typer.Option("", help="Storage key of lm_codes.jsonl (overrides the lookup)."),
    artist: str = typer.Option("", help="Adapter name (default: the slug)."),
    trigger: str | None = typer.Option(
        None, help="Trigger word rendered into every song's caption (default: each row's tag)."
    ),
    trigger_position: str | None = typer.Option(None, help="prepend, append or replace."),
    calibrate_scales: str = typer.Option("", help="Calibration scales (default 0.5,0.75,1,1.25)."),
    calibrate_seeds: int = typer.Option(0, help="Generations per grid point (0 = default 4)."),
    calibrate_duration: float = typer.Option(
        0.0, help="Seconds per calibration generation (0 = the LM plans it)."
    ),
    batching: str = typer.Option("single", help="single, bucket or pack."),
    pack_tokens: int = typer.Option(0, help="Row capacity when packing (0 = auto)."),
    checkpointing: str = typer.Option("auto", help="auto, none, full or a layer count."),
    attention: str = typer.Option("sdpa", help="sdpa or varlen."),
    compile_mode: str = typer.Option(
        LM_COMPILE_DEFAULT,
        "--compile",
        help="torch.compile each decoder layer: off, default, reduce-overhead (CUDA graphs), or "
        "auto (reduce-overhead on one GPU; default when layers are checkpointed or on several "
        "GPUs; off on the CPU). CUDA only; each new row width compiles once.",
    ),
    activation_budget: float = typer.Option(
        LM_ACTIVATION_BUDGET_DEFAULT,
        help="Share of the compiled layers' activations kept for the backward (the rest is "
        "recomputed): less memory for a little time.",
    ),
    pad_multiple: int = typer.Option(
        0,
        help="Round row widths up to this many tokens (0 = when compiled, 64-512 chosen to "
        "balance compiles against padding; else 1).",
    ),
    device: str = typer.Option(
        "", help="In this process (--no-ray): cuda, cuda:1, cpu (default: cuda when present)."
    ),
    resume: str = typer.Option(
        "", help="Continue the checkpoint of this run folder, with its own options."
    ),
    use_ray: bool = typer.Option(False, "--ray/--no-ray", help="Run as a Ray Train job."),
    workers: int | None = typer.Option(
        None, help=f"Ray workers (one GPU each). Default: {RAY_WORKERS}."
    ),
    max_failures: int | None = typer.Option(
        None, help=f"Ray: restarts after a worker failure. Default: {RAY_MAX_FAILURES}."
    ),
    ray_address: str = typer.Option("", help="Ray cluster to join (default: local)."),
    as_json: bool = typer.Option(False, "--json", help="Print the training log as JSON."),
    **values: Any,
) -> None:
    """Train a LoRA/LoKR adapter on the 5 Hz LM from SLUG's preprocessed codes."""
    from hotstep_ray.calibration import after_train
    from hotstep_ray.training import lm_spec

    check_placement_options(
        use_ray,
        ray_only={
            "--ray-address": ray_address or None,
            "--workers": workers,
            "--max-failures": max_failures,
        },
        local_only={"--device": device or None},
    )
    storage = Storage(data)
    use_compile_cache(storage)  # compiled blocks reused by later runs and Ray workers
    options_given = given(values)
    if isinstance(options_given.get("stages"), str):
        options_given["stages"] = [
            stage.strip() for stage in options_given["stages"].split(",") if stage.strip()
        ]
    # only when given: what a resume names as ignored is what the user typed
    explicit = {"lm_size": size, "learning_rate": lr, "variant_key": variant or None}
    options_given.update(given(explicit))
    name = artist or slug
    options = TrainLmOptions(adapter_name=name, **options_given)
    lm_dir, options = lm_folder(checkpoints, options)
    calibration = calibration_overrides(calibrate_scales, calibrate_seeds, calibrate_duration)
    codes_key = codes or layout.find_lm_codes(storage, slug, variant)
    engine = lm_spec.LmEngine(
        device=device,
        batching=batching,
        pack_tokens=pack_tokens,
        checkpointing=checkpointing,
        attention=attention,
        pad_multiple=pad_multiple,
        compile=compile_mode,
        activation_budget=activation_budget,
    )
    job = Job(storage, "train-lm", dataset_id=slug, sinks=(_print_event,))
    tagging = {"trigger": trigger, "trigger_position": trigger_position}
    spec = lm_spec.LmTrainSpec(
        options=options,
        lm_dir=str(lm_dir),
        codes_key=codes_key,
        artist=name,
        engine=engine,
        run_key=resume,
        events_key=layout.job_events(job.id) if use_ray else "",
        job_id=job.id,
        # only when given (a resume keeps the checkpoint's and names a given one as ignored)
        **{k: v for k, v in tagging.items() if v is not None},
    )
    with job:
        job.phase("train")
        if use_ray:
            result = after_train.run_lm_on_ray_then_calibrate(
                spec,
                storage,
                num_workers=RAY_WORKERS if workers is None else workers,
                max_failures=RAY_MAX_FAILURES if max_failures is None else max_failures,
                ray_address=ray_address or None,
                events=job.events,
                resume=bool(resume),
                calibration=calibration,
            )
        else:
            result = after_train.run_lm_then_calibrate(
                spec, storage, events=job.events, resume=bool(resume), calibration=calibration
            )
        job.phase("export")
    if as_json:
        print_json({**result.log, "calibration": result.calibration})
        return
    log = result.log
    if not result.run_key:  # extract only
        console.print(f"[green]codes:[/] {storage.url_of(result.files[0])}", soft_wrap=True)
        return
    if "saved_epoch" not in log or not log.get("saved_epoch"):
        console.print(f"[yellow]no adapter kept[/] in {storage.url_of(result.run_key)}")
        return
    console.print(
        f"[green]adapter:[/] {storage.url_of(result.run_key)}  "
        f"({log['saved_reason']} epoch {log['saved_epoch']}, loss {log['saved_loss']:.4f}; "
        f"{log['epochs_run']} epochs, stop: {log['stop_reason']})",
        soft_wrap=True,
    )
    if result.calibration is not None:
        _print_calibration(result.calibration)


def _print_calibration(summary: dict[str, Any]) -> None:
    winner = summary.get("winner")
    if winner is None:
        console.print(f"[yellow]calibration: no candidate passed the guards[/] ({summary['url']})")
        return
    console.print(
        f"[green]calibrated:[/] {summary['url']}  ({winner['candidate']} x{winner['scale']:g}, "
        f"score {winner['score']:.4f})",
        soft_wrap=True,
    )


run = app.command("run")(handle_errors(with_contract_options(TrainLmOptions, skip=_EXPLICIT)(_run)))
