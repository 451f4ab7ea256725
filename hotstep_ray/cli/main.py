"""`hotstep-ray`: the command line. Each sub-app parses options into the contracts and calls a stage."""

from __future__ import annotations

import typer
from rich.table import Table

from hotstep_ray.cli import (
    adapters_cmd,
    audition_cmd,
    calibrate_cmd,
    dataset_cmd,
    label_cmd,
    mm3_cmd,
    models_cmd,
    preprocess_cmd,
    studio_cmd,
    train_dit_cmd,
    train_lm_cmd,
)
from hotstep_ray.cli.common import console, handle_errors
from hotstep_ray.core.events import LogEvent, ProgressEvent

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


def _console_sink(event) -> None:
    """Human progress on the terminal: phases, logs and the last progress count."""
    if isinstance(event, LogEvent):
        style = {"info": "dim", "warn": "yellow", "error": "red"}[event.level]
        console.print(f"  [{style}]{event.message}[/]", highlight=False)
    elif isinstance(event, ProgressEvent):
        if event.total and event.done == event.total:
            console.print(f"  [dim]{event.phase}: {event.done}/{event.total}[/]")
        elif not event.total and event.phase:
            console.print(f"[bold]▸ {event.phase}[/]")


@app.command()
@handle_errors
def demo(
    data: str = typer.Option("./data", help="Storage root: a folder or s3://bucket/prefix."),
    ray_address: str = typer.Option(
        "", help="Join this Ray cluster (default: start a local one, or use $RAY_ADDRESS)."
    ),
) -> None:
    """Run the main job on the embedded default: the bundled example songs, a local Ray."""
    from hotstep_ray.main_job import run_main_job

    result = run_main_job(data, ray_address or None, sinks=(_console_sink,))
    detail = result.dataset
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
    # soft_wrap: paths stay on one line (copy-pasteable) whatever the terminal width.
    console.print(f"[green]dataset.json:[/] {result.dataset_json_url}", soft_wrap=True)
    console.print(f"[green]songs:[/]        {result.songs_url}", soft_wrap=True)
    console.print(f"[green]job events:[/]   {result.events_url}", soft_wrap=True)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
