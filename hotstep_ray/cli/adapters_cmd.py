"""`hotstep-ray adapters ...`: the adapter catalogue, deleting one, and the trigger stamper."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from hotstep_ray.cli.common import console, handle_errors, print_json
from hotstep_ray.core.storage import Storage
from hotstep_ray.studio import adapter_runs
from hotstep_ray.studio.errors import NotFoundError

app = typer.Typer(help="List or delete trained adapters; stamp trigger words into older ones.")
DATA_HELP = "Storage root: a folder or s3://bucket/prefix."


@app.command("list")
@handle_errors
def list_cmd(
    data: str = typer.Option("./data", "--data", help=DATA_HELP),
    kind: str = typer.Option("", help="Only `lm` or `dit` adapters."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Every adapter under <data>/adapters: base, run, format, size, trigger, trained time, and
    a run's status. DiT: finished, paused, training, or interrupted (killed: its adapter is the
    best one exported before that; `train-dit --resume RUN` continues it). LM: finished,
    unfinished (its checkpoint, no adapter yet: `train-lm run --resume RUN` continues it),
    training (the job its checkpoint names is alive), or unexported (trained without the export
    stage: `--stages export --resume RUN` exports it); an LM run without an adapter yet is listed
    with size 0. Then the DiT adapter's ΔW/W (the largest projection group's median, flagged past
    5 %) and the run's calibration, where its files say."""
    storage = Storage(data)
    rows = adapter_runs.with_status(storage, kind)
    if as_json:
        print_json(adapter_runs.to_json(storage, rows))
        return
    table = Table(title=f"adapters in {data}")
    for column in (
        "id",
        "base",
        "format",
        "size",
        "trigger",
        "trained",
        "status",
        "ΔW/W",
        "calibration",
    ):
        table.add_column(column, overflow="fold")
    for e, state, detail in rows:
        checks = adapter_runs.checks(storage, e)
        trigger = f"{e.trigger.word} ({e.trigger.placement}, {e.trigger.source})"
        style = {
            "interrupted": "yellow",
            "paused": "yellow",
            "unfinished": "yellow",
            "unexported": "yellow",
            "training": "cyan",
        }.get(state, "")
        table.add_row(
            e.id,
            e.base or "?",
            e.format,
            f"{e.size_bytes / 1e6:.1f} MB" if e.weights else "-",
            trigger if e.trigger.word else "-",
            e.trained_at,
            f"[{style}]{detail}[/]" if style else detail or "-",
            f"[yellow]{checks.delta}[/]" if checks.flagged else checks.delta or "-",
            checks.calibration or "-",
        )
    console.print(table)


@app.command("delete")
@handle_errors
def delete_cmd(
    run: str = typer.Argument(..., help="The adapter's id, as `adapters list` shows it."),
    data: str = typer.Option("./data", "--data", help=DATA_HELP),
    yes: bool = typer.Option(False, "--yes", "-y", help="Delete without asking."),
) -> None:
    """Delete an adapter: its run folder and, for a run trained with --ray, the folder Ray Train
    kept for it under ray_results/ (what the studio's Delete button does). Refused while the run
    still trains: cancel its job first."""
    storage = Storage(data)
    try:
        entry, state, _ = adapter_runs.find(storage, run.strip("/").removeprefix("adapters/"))
    except NotFoundError as exc:
        raise NotFoundError(f"{exc} in {data} (`hotstep-ray adapters list` shows the ids)") from exc
    if not yes:
        typer.confirm(f"Delete {storage.url_of(adapter_runs.folder_key(entry))}?", abort=True)
    for key in adapter_runs.delete(storage, entry, state):
        console.print(f"deleted {storage.url_of(key)}", highlight=False, soft_wrap=True)


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
