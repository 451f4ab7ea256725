"""`hotstep-ray`: the command line. Each sub-app parses options into the contracts and calls a stage."""

from __future__ import annotations

import typer
from rich.markup import escape
from rich.table import Table

from hotstep_ray.cli import (
    adapters_cmd,
    audition_cmd,
    bench_cmd,
    calibrate_cmd,
    dataset_cmd,
    doctor_cmd,
    label_cmd,
    mm3_cmd,
    models_cmd,
    preprocess_cmd,
    studio_cmd,
    train_dit_cmd,
    train_lm_cmd,
)
from hotstep_ray.cli.common import console, handle_errors
from hotstep_ray.core.events import LogEvent, MetricEvent, ProgressEvent

app = typer.Typer(
    name="hotstep-ray",
    help="Turn a folder of songs into ACE-Step 1.5 adapters, on Ray.",
    no_args_is_help=True,
    add_completion=False,
)
app.add_typer(dataset_cmd.app, name="dataset")
app.add_typer(models_cmd.app, name="models")
app.add_typer(label_cmd.app, name="label")
app.add_typer(preprocess_cmd.app, name="preprocess")
app.add_typer(train_dit_cmd.app, name="train-dit")
app.add_typer(train_lm_cmd.app, name="train-lm")
app.add_typer(calibrate_cmd.app, name="calibrate")
app.add_typer(audition_cmd.app, name="audition")
app.add_typer(adapters_cmd.app, name="adapters")
app.add_typer(mm3_cmd.app, name="mm3")
app.add_typer(studio_cmd.studio_app, name="studio")
app.add_typer(studio_cmd.jobs_app, name="jobs")
app.add_typer(bench_cmd.app, name="bench")
app.command("doctor")(doctor_cmd.doctor)


def _console_sink(event) -> None:
    """Human progress on the terminal: stage headers, logs, finished counts and epoch losses."""
    from hotstep_ray.main_job import STAGES

    if isinstance(event, LogEvent):
        style = {"info": "dim", "warn": "yellow", "error": "red"}[event.level]
        console.print(f"  [{style}]{escape(event.message)}[/]", highlight=False, soft_wrap=True)
    elif isinstance(event, ProgressEvent):
        if (event.model_extra or {}).get("stage") in STAGES:  # sub-jobs' own phases stay quiet
            console.print(f"[bold]▸ {event.phase}[/]")
        elif event.total and event.done == event.total:
            console.print(f"  [dim]{event.phase}: {event.done}/{event.total}[/]")
    elif isinstance(event, MetricEvent) and event.metric == "epoch" and event.loss is not None:
        console.print(
            f"  [dim]epoch {event.epoch}/{event.epochs}  loss {event.loss:.4f}[/]", highlight=False
        )


@app.command()
@handle_errors
def demo(
    data: str = typer.Option("./data", help="Storage root: a folder or s3://bucket/prefix."),
    ray_address: str = typer.Option(
        "", help="Join this Ray cluster (default: start a local one, or use $RAY_ADDRESS)."
    ),
    checkpoints: str = typer.Option(
        "", help="Real ACE-Step 1.5 weights (default: a tiny CPU checkpoint, written once)."
    ),
    epochs: int | None = typer.Option(
        None, min=1, help="Epochs of both trainers (default: 8 DiT / 4 LM tiny; contract's real)."
    ),
    ray_train: bool = typer.Option(
        True, "--ray-train/--no-ray-train", help="Train on Ray Train (1 worker) or in-process."
    ),
    skip_train: bool = typer.Option(False, "--skip-train", help="Stop after preprocessing."),
    skip_audition: bool = typer.Option(
        False, "--skip-audition", help="Train, but start no audition app."
    ),
) -> None:
    """The main job: example songs → dataset → tensors → DiT + LM adapters → A/B, on Ray.

    Runs on a local Ray with the tiny CPU checkpoint unless --checkpoints points at real weights.
    Reruns reuse the dataset, the labels and the tensor cache, and train new adapter runs."""
    from hotstep_ray.main_job import MainJobConfig, run_main_job

    config = MainJobConfig(
        data=data,
        ray_address=ray_address or None,
        checkpoints=checkpoints or None,
        epochs=epochs,
        ray_train=ray_train,
        train=not skip_train,
        audition=not skip_audition,
    )
    result = run_main_job(config, sinks=(_console_sink,))
    _print_dataset(result.dataset)
    _print_stages(result)
    _print_artifacts(result)


def _print_dataset(detail) -> None:
    table = Table(title=f"dataset {detail.slug!r}", show_lines=False)
    for column in ("file", "caption", "bpm", "key", "sources"):
        table.add_column(column, overflow="fold")
    for sample in detail.samples:
        table.add_row(
            sample.rel_path,
            sample.caption[:60],
            str(sample.bpm or ""),
            sample.key,
            ",".join(sorted(set(sample.sources.values()))),
        )
    console.print(table)


def _print_stages(result) -> None:
    table = Table(title=f"main job {result.job_id}: {result.seconds:.0f} s")
    table.add_column("stage")
    table.add_column("time", justify="right")
    table.add_column("what happened", overflow="fold")
    table.add_column("loss (first → last epoch)", justify="right")
    for stage in result.stages:
        table.add_row(stage.name, f"{stage.seconds:.1f} s", escape(stage.summary), stage.loss)
    console.print(table)
    ab = result.ab
    if ab is not None and not ab.base_reproducible:
        console.print(
            "[red]A/B: the base side differs from an adapterless run with the same seed[/]"
        )
    if ab is not None and not ab.adapter_differs:
        console.print(
            "[yellow]A/B: the new LM adapter drew the same codes as the base (too little "
            "training to move the sampling?)[/]"
        )


def _print_artifacts(result) -> None:
    """Where everything is; soft_wrap keeps each path on one line (copy-pasteable)."""
    rows = [
        ("songs", result.songs_url),
        ("dataset.json", result.dataset_json_url),
        ("checkpoints", result.checkpoints),
        ("tensor cache", result.preprocess.tensor_dir if result.preprocess else ""),
        ("DiT adapter", result.dit.url if result.dit else ""),
        ("LM adapter", result.lm.url if result.lm else ""),
        ("A/B preview", result.ab.preview_url if result.ab else ""),
        ("loss plot", result.plot_url),
        ("job events", result.events_url),
        ("job result", result.result_url),
    ]
    width = max(len(name) for name, _ in rows) + 1
    for name, where in rows:
        if where:
            console.print(f"[green]{name + ':':<{width}}[/] {escape(where)}", soft_wrap=True)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
