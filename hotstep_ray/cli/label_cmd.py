"""`hotstep-ray label …`: label a dataset's songs (BPM/key, lyrics, captions) and list providers.

`run` uses Ray actor pools by default (start a local Ray, join `--ray-address`, or `$RAY_ADDRESS`
inside `ray job submit`); `--no-ray` runs every step in this process.
"""

from __future__ import annotations

import os
from dataclasses import asdict
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from hotstep_ray.cli.common import (
    RunByDefault,
    console,
    err_console,
    finish_stage,
    given,
    handle_errors,
    print_json,
    with_contract_options,
)
from hotstep_ray.core.contracts import CaptionProviderChoice, LabelOptions
from hotstep_ray.core.errors import InputError
from hotstep_ray.core.events import LogEvent, ProgressEvent, SampleEvent
from hotstep_ray.core.storage import Storage

app = typer.Typer(
    help="Label songs: Essentia BPM/key, Genius lyrics, captions "
    "(`label SLUG ...` = `label run SLUG ...`).",
    no_args_is_help=True,
    cls=RunByDefault,
)

CAPTION_PROVIDERS = ("offline", "gemini", "openai")


class _ProgressSink:
    """Events -> a rich progress bar (samples done) with logs and failures printed above it."""

    def __init__(self, progress: Progress, printer: Console) -> None:
        self.progress, self.printer = progress, printer
        self.task = progress.add_task("label", total=None, phase="starting")

    def __call__(self, event) -> None:
        if isinstance(event, ProgressEvent):
            self.progress.update(
                self.task, completed=event.done, total=event.total or None, phase=event.phase
            )
        elif isinstance(event, LogEvent):
            style = {"info": "dim", "warn": "yellow", "error": "red"}[event.level]
            self.printer.print(f"[{style}]{escape(event.message)}[/]", highlight=False)
        elif isinstance(event, SampleEvent) and event.status == "error":
            self.printer.print(f"[red]{event.sample_id}:[/] {escape(event.error)}", highlight=False)


# Fields named by flags of their own, and the ones set from other flags (`--sample-id`, repeatable;
# `caption` from --caption-provider and --caption-model) or not offered here.
_FLAGS = {
    "use_essentia": "--essentia",
    "use_genius": "--genius",
    "use_caption": "--caption",
    "analysis_time_limit_s": "--analysis-time-limit",
}
_NOT_GENERATED = {"sample_ids", "caption", "use_understand", "allow_empty"}


def _options(
    values: dict[str, Any],
    caption_provider: str | None = None,
    caption_model: str = "",
    sample_ids: list[str] | None = None,
) -> LabelOptions:
    """The contract from the command line: only the flags the user gave are set, so "asked
    explicitly" (an error when unavailable) differs from the defaults (skipped with a warning)."""
    if caption_provider is not None and caption_provider not in CAPTION_PROVIDERS:
        raise InputError(f"--caption-provider must be one of {', '.join(CAPTION_PROVIDERS)}")
    if caption_model and caption_provider is None:  # a model name belongs to one provider
        raise InputError("--caption-model needs --caption-provider (the provider it belongs to)")
    options = given(values)
    if sample_ids:
        options["sample_ids"] = sample_ids
    if caption_provider is not None:
        options["caption"] = CaptionProviderChoice(provider=caption_provider, model=caption_model)
    return LabelOptions.model_validate(options)


def _run(
    slug: str = typer.Argument(..., help="Dataset slug (see `hotstep-ray dataset list`)."),
    data: str = typer.Option("./data", help="Storage root: a folder or s3://bucket/prefix."),
    caption_provider: str | None = typer.Option(
        None,
        help="offline | gemini | openai (default: gemini or openai when its key is set, "
        "else offline).",
    ),
    caption_model: str = typer.Option("", help="Model for the caption provider."),
    sample_id: list[str] | None = typer.Option(None, help="Only these samples (repeatable)."),
    use_ray: bool = typer.Option(True, "--ray/--no-ray", help="Fan out over Ray actor pools."),
    ray_address: str = typer.Option(
        "", help="Join this Ray cluster (default: local/$RAY_ADDRESS)."
    ),
    analysis_actors: int = typer.Option(0, min=0, help="Analysis actors (0 = one per CPU)."),
    genius_concurrency: int = typer.Option(1, min=1, help="Parallel Genius calls."),
    caption_concurrency: int = typer.Option(1, min=1, help="Parallel caption calls."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    **values: Any,
) -> None:
    """Label dataset SLUG: analyse, fetch lyrics, caption, and merge into the sidecars.

    Exits 3 when some samples failed (the others are labeled), 2 on bad input."""
    from hotstep_ray.labeling.job import label_dataset

    options = _options(values, caption_provider, caption_model, sample_id)
    storage = Storage(data)
    columns = (
        TextColumn("[bold]label[/] {task.fields[phase]:<9}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=False, disable=as_json) as progress:
        # With --json, stdout carries only the report; the running commentary goes to stderr.
        sink = _ProgressSink(progress, err_console if as_json else progress.console)
        if use_ray:
            from hotstep_ray.labeling.ray_pool import PoolOptions, label_dataset_on_ray

            pool = PoolOptions(analysis_actors, genius_concurrency, caption_concurrency)
            report = label_dataset_on_ray(
                storage, slug, options, pool, events=sink, ray_address=ray_address or None
            )
        else:
            report = label_dataset(storage, slug, options, events=sink)
    if as_json:
        print_json(asdict(report))
    elif report.skipped:
        console.print(f"nothing to do ({report.skipped})")
        return
    else:
        console.print(f"job {report.job_id}: {report.analysed} analysed", highlight=False)
    done = f"{report.labeled} labeled"
    if report.unlabeled:  # finished without a caption and without an error: not a failure
        done += f", {report.unlabeled} without caption"
    finish_stage(done, report.failed, as_json=as_json)


run = app.command("run")(
    handle_errors(with_contract_options(LabelOptions, skip=_NOT_GENERATED, flags=_FLAGS)(_run))
)


@app.command()
@handle_errors
def providers(as_json: bool = typer.Option(False, "--json", help="Print as JSON.")) -> None:
    """Which analyzers and providers are configured here (keys are never printed)."""
    from hotstep_ray.labeling.analysis import essentia_available
    from hotstep_ray.labeling.captions import provider_configured
    from hotstep_ray.labeling.genius import BASE_URL_ENV, DEFAULT_API_BASE, TOKEN_ENV

    rows = [
        {
            "provider": "essentia",
            "step": "bpm/key",
            "configured": essentia_available(),
            "detail": "RhythmExtractor2013 (degara) + KeyExtractor (edma)",
        },
        {
            "provider": "genius",
            "step": "lyrics",
            "configured": bool(os.environ.get(TOKEN_ENV, "").strip()),
            "detail": f"${TOKEN_ENV}; {os.environ.get(BASE_URL_ENV) or DEFAULT_API_BASE}",
        },
        {
            "provider": "offline",
            "step": "caption",
            "configured": True,
            "detail": "composed from the analysis; no network",
        },
        {
            "provider": "gemini",
            "step": "caption",
            "configured": provider_configured("gemini"),
            "detail": "$GEMINI_API_KEY; audio inline as 96 kbps MP3",
        },
        {
            "provider": "openai",
            "step": "caption",
            "configured": provider_configured("openai"),
            "detail": "$OPENAI_API_KEY; OpenAI-compatible chat/completions with input_audio",
        },
    ]
    if as_json:
        print_json(rows)
        return
    table = Table(title="label providers")
    for column in ("provider", "step", "configured", "detail"):
        table.add_column(column, overflow="fold")
    for row in rows:
        mark = "[green]yes[/]" if row["configured"] else "[yellow]no[/]"
        table.add_row(row["provider"], row["step"], mark, escape(str(row["detail"])))
    console.print(table)
