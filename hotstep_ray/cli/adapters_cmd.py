"""`hotstep-ray adapters ...`: the adapter catalogue and the trigger stamper."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.table import Table

from hotstep_ray.cli.common import console, handle_errors, print_json
from hotstep_ray.core.errors import HotstepError
from hotstep_ray.core.storage import Storage

if TYPE_CHECKING:
    from hotstep_ray.audition.catalogue import AdapterEntry

app = typer.Typer(help="List trained adapters; stamp trigger words into older ones.")


@app.command("list")
@handle_errors
def list_cmd(
    data: str = typer.Option(
        "./data", "--data", help="Storage root: a folder or s3://bucket/prefix."
    ),
    kind: str = typer.Option("", help="Only `lm` or `dit` adapters."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Every adapter under <data>/adapters: base, run, format, size, trigger, trained time, and
    a DiT run's status: finished, paused, training, or interrupted (killed: its adapter is the
    best one exported before that; `train-dit --resume RUN` continues it)."""
    from hotstep_ray.audition.catalogue import list_adapters

    storage = Storage(data)
    entries = [e for e in list_adapters(storage) if not kind or e.kind == kind]
    statuses = [run_status(storage, e) for e in entries]
    if as_json:
        print_json(
            [
                {**e.to_json_dict(), "status": state, "status_detail": detail}
                for e, (state, detail) in zip(entries, statuses, strict=True)
            ]
        )
        return
    table = Table(title=f"adapters in {data}")
    for column in ("id", "base", "format", "size", "trigger", "trained", "status"):
        table.add_column(column, overflow="fold")
    for e, (state, detail) in zip(entries, statuses, strict=True):
        trigger = f"{e.trigger.word} ({e.trigger.placement}, {e.trigger.source})"
        style = {"interrupted": "yellow", "paused": "yellow", "training": "cyan"}.get(state, "")
        table.add_row(
            e.id,
            e.base or "?",
            e.format,
            f"{e.size_bytes / 1e6:.1f} MB",
            trigger if e.trigger.word else "-",
            e.trained_at,
            f"[{style}]{detail}[/]" if style else detail or "-",
        )
    console.print(table)


def run_status(storage: Storage, entry: AdapterEntry) -> tuple[str, str]:
    """(state, text) of a DiT run's adapter by its `dit_train_log.json`: finished, paused (at a
    step), training (its job is alive) or interrupted (at an epoch: killed, the adapter is a
    best-so-far export); ("", "") when unknown (an LM or legacy adapter, no log)."""
    from hotstep_ray.audition.catalogue import ROOT
    from hotstep_ray.studio.records import read_summary
    from hotstep_ray.training.dit_log import read_progress

    if entry.kind != "dit" or entry.legacy:
        return "", ""
    progress = read_progress(storage, f"{ROOT}/{entry.id}")
    if progress is None:
        return "", ""
    if progress.state == "finished":
        return "finished", "finished"
    if progress.state == "paused":
        return "paused", f"paused at step {progress.steps}"
    alive = False
    if progress.job_id:
        with contextlib.suppress(HotstepError, ValueError):
            alive = read_summary(storage, progress.job_id).status in ("queued", "running")
    if alive:
        return "training", f"training (epoch {progress.epochs_run})"
    return "interrupted", f"interrupted at epoch {progress.epochs_run}"


@app.command("stamp-triggers")
@handle_errors
def stamp_cmd(
    path: Path = typer.Argument(..., help="An adapter folder, a tree of them, or a .safetensors."),
    trigger: str = typer.Option("", help="The trigger word (default: each adapter's folder name)."),
    position: str = typer.Option("prepend", help="prepend or append."),
    write: bool = typer.Option(False, "--write", help="Write (default: dry run, nothing written)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Write the trigger metadata into adapter files; tensor bytes unchanged, `.bak` kept."""
    from hotstep_ray.audition.catalogue import stamp_triggers

    path = path.expanduser().resolve()
    if path.is_file():
        storage, key = Storage(path.parent), path.name
    else:
        storage, key = Storage(path), ""
    results = stamp_triggers(storage, key, trigger or None, position, write)
    if as_json:
        print_json([r.to_json_dict() for r in results])
        return
    table = Table(title="trigger stamp" + ("" if write else " (dry run: add --write)"))
    for column in ("file", "trigger", "source", "before", "action"):
        table.add_column(column, overflow="fold")
    for r in results:
        before = r.current.get("hot_step_trigger") or r.current.get("modelspec.trigger_phrase")
        action = "written" if r.written else ("would write" if r.changed else "unchanged")
        table.add_row(r.key, r.trigger or "-", r.source, before or "-", action)
    console.print(table)
