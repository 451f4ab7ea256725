"""`hotstep-ray`: the command line. Each sub-app parses options into the contracts and calls a stage."""

from __future__ import annotations

from typing import Any

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
from hotstep_ray.cli.common import (
    console,
    given,
    handle_errors,
    json_on_stdout,
    print_json,
    with_contract_options,
)
from hotstep_ray.core.contracts import MakeOptions
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

    source = (event.model_extra or {}).get("source")
    who = f"{source}: " if source else ""  # stages running side by side (the two trainers)
    if isinstance(event, LogEvent):
        style = {"info": "dim", "warn": "yellow", "error": "red"}[event.level]
        line = escape(who + event.message)
        console.print(f"  [{style}]{line}[/]", highlight=False, soft_wrap=True)
    elif isinstance(event, ProgressEvent):
        if (event.model_extra or {}).get("stage") in STAGES:  # sub-jobs' own phases stay quiet
            console.print(f"[bold]▸ {event.phase}[/]")
        elif event.total and event.done == event.total:
            console.print(f"  [dim]{event.phase}: {event.done}/{event.total}[/]")
    elif isinstance(event, MetricEvent) and event.metric == "epoch" and event.loss is not None:
        console.print(
            f"  [dim]{escape(who)}epoch {event.epoch}/{event.epochs}  loss {event.loss:.4f}[/]",
            highlight=False,
        )


_JSON = typer.Option(False, "--json", help="Print the result as JSON (progress goes to stderr).")


def _make(
    songs: str = typer.Argument(
        ...,
        help="Folder of your songs (.wav .mp3 .flac ...; local or s3://), searched recursively.",
    ),
    as_json: bool = _JSON,
    **contract: Any,
) -> None:
    """Your songs → dataset → labels → tensors → DiT + LM adapters → same-seed A/B, on Ray.

    Sidecars (`song.txt`, Side-Step's format) are read and only what they lack is labeled. Without
    --checkpoints it trains the tiny CPU checkpoint on 2 s cuts (a try-out of the flow); point
    --checkpoints at the ACE-Step 1.5 folder for real adapters. A rerun reuses what did not change
    (dataset, labels, tensors, finished adapter runs) and continues an interrupted training run
    from its last checkpoint."""
    _run_main_job(as_json, MakeOptions.model_validate({**given(contract), "songs": songs}))


def _demo(as_json: bool = _JSON, **contract: Any) -> None:
    """`make` on the bundled example songs: the whole product, nothing to bring.

    Runs on a local Ray with the tiny CPU checkpoint unless --checkpoints points at real weights.
    Reruns reuse what did not change and continue an interrupted training run."""
    _run_main_job(as_json, MakeOptions.model_validate(given(contract)))


make = app.command("make")(handle_errors(with_contract_options(MakeOptions, skip={"songs"})(_make)))
demo = app.command("demo")(
    handle_errors(with_contract_options(MakeOptions, skip={"songs", "name", "tag"})(_demo))
)


def _run_main_job(as_json: bool, options: MakeOptions) -> None:
    from hotstep_ray.main_job import run_main_job

    with json_on_stdout(as_json):
        result = run_main_job(options, sinks=(_console_sink,))
        _print_dataset(result.dataset)
        _print_stages(result)
        _print_artifacts(result)
        if result.tiny and options.songs:
            console.print(
                "[yellow]trained the tiny CPU checkpoint on 2 s cuts: a try-out of the flow. "
                "For real adapters: --checkpoints /path/to/ACE-Step-1.5[/]"
            )
    if as_json:
        print_json(result.to_json_dict())


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
    """The run's timeline: each stage's wall time, for the trainers its split into set-up (worker
    start, loading), epochs (the first one holds any compile) and finish (final export), and how
    busy the GPU was (where there is one)."""
    startup = "" if result.startup_s is None else f", {result.startup_s:.1f} s start-up before it"
    table = Table(title=f"main job {result.job_id}: {result.seconds:.0f} s{startup}")
    gpu = any(stage.gpu_busy is not None for stage in result.stages)
    table.add_column("stage")
    table.add_column("time", justify="right")
    table.add_column("set-up + epochs (first) + finish", justify="right")
    if gpu:
        table.add_column("GPU busy", justify="right")
    table.add_column("what happened", overflow="fold")
    table.add_column("loss (first → last epoch)", justify="right")
    for stage in result.stages:
        loop = ""
        if stage.loop_s is not None:
            loop = f"{stage.loop_s:.1f} s ({stage.first_epoch_s:.1f} s)"
        if stage.setup_s is not None and stage.finish_s is not None:
            loop = f"{stage.setup_s:.1f} + {loop} + {stage.finish_s:.1f} s"
        busy = [] if not gpu else ["" if stage.gpu_busy is None else f"{stage.gpu_busy:.0%}"]
        cells = [stage.name, f"{stage.seconds:.1f} s", loop, *busy, escape(stage.summary)]
        table.add_row(*cells, stage.loss)
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
