"""`hotstep-ray adapters ...`: the adapter catalogue and the trigger stamper."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.table import Table

from hotstep_ray.cli.common import console, handle_errors, print_json
from hotstep_ray.core import layout
from hotstep_ray.core.errors import HotstepError
from hotstep_ray.core.storage import Storage
from hotstep_ray.training.warm_start import (  # written once, when the run stops
    LM_LOG_FILE,
    lm_stopped,
    read_json_or_none,
)

if TYPE_CHECKING:
    from hotstep_ray.audition.catalogue import AdapterEntry

app = typer.Typer(help="List trained adapters; stamp trigger words into older ones.")

# The LM checkpoint's commit point, spelled here because `training.lm_save` and
# `training.checkpoint` load torch and `adapters list` must not (a test checks it agrees with
# `lm_save.CHECKPOINT_DIR` / `checkpoint.MANIFEST`); removed once the run is exported.
LM_CHECKPOINT_MANIFEST = "checkpoint/checkpoint.json"


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
    a run's status. DiT: finished, paused, training, or interrupted (killed: its adapter is the
    best one exported before that; `train-dit --resume RUN` continues it). LM: finished,
    unfinished (its checkpoint, no adapter yet: `train-lm run --resume RUN` continues it),
    training (the job its checkpoint names is alive), or unexported (trained without the export stage: `--stages
    export --resume RUN` exports it); an LM run without an adapter yet is listed with size 0."""
    from hotstep_ray.audition.catalogue import list_adapters

    storage = Storage(data)
    found = [*list_adapters(storage), *unexported_lm_runs(storage)]
    found.sort(key=lambda e: e.id)
    entries = [e for e in found if not kind or e.kind == kind]
    statuses = [run_status(storage, e) for e in entries]
    if as_json:
        print_json(
            [
                {**e.to_json_dict(), "status": state, "statusDetail": detail}
                for e, (state, detail) in zip(entries, statuses, strict=True)
            ]
        )
        return
    table = Table(title=f"adapters in {data}")
    for column in ("id", "base", "format", "size", "trigger", "trained", "status"):
        table.add_column(column, overflow="fold")
    for e, (state, detail) in zip(entries, statuses, strict=True):
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
        )
    console.print(table)


def run_status(storage: Storage, entry: AdapterEntry) -> tuple[str, str]:
    """(state, text) of a run: a DiT's by its `dit_train_log.json` (finished, paused at a step,
    training while its job is alive, or interrupted at an epoch: killed, the adapter is a
    best-so-far export), an LM's by `lm_run_status`; ("", "") when unknown (a legacy adapter,
    no log)."""
    from hotstep_ray.audition.catalogue import ROOT
    from hotstep_ray.training.dit_log import read_progress

    if entry.legacy:
        return "", ""
    if entry.kind == "lm":
        return lm_run_status(storage, f"{ROOT}/{entry.id}", exported=bool(entry.weights))
    progress = read_progress(storage, f"{ROOT}/{entry.id}")
    if progress is None:
        return "", ""
    if progress.state == "finished":
        return "finished", "finished"
    if progress.state == "paused":
        return "paused", f"paused at step {progress.steps}"
    if _job_alive(storage, progress.job_id):
        return "training", f"training (epoch {progress.epochs_run})"
    return "interrupted", f"interrupted at epoch {progress.epochs_run}"


def _job_alive(storage: Storage, job_id: str) -> bool:
    """Whether the job's record says it runs, read through its heartbeat (a killed one: no)."""
    from hotstep_ray.studio.records import read_summary

    if not job_id:
        return False
    with contextlib.suppress(HotstepError, ValueError):
        return read_summary(storage, job_id).status in ("queued", "running")
    return False


@dataclass(frozen=True)
class LmRunProgress:
    """How far an LM run folder got, by its JSON alone (no torch)."""

    stopped: bool  # `lm_train_log.json` says the run stopped (a stop reason: it is trained)
    epochs_run: int  # from that log, else the checkpoint's
    checkpoint: bool  # `checkpoint/` holds resumable state (committed: its manifest is there)
    # the job that wrote the checkpoint, when its config names it (`job`, as the DiT log does)
    job_id: str
    adapter_type: str  # lora | lokr by the checkpoint's identity ("" unknown)


def read_lm_progress(storage: Storage, run_key: str) -> LmRunProgress | None:
    """The run's progress from its log and checkpoint manifest; None when it has neither."""
    log = read_json_or_none(storage, f"{run_key}/{LM_LOG_FILE}")
    manifest = read_json_or_none(storage, f"{run_key}/{LM_CHECKPOINT_MANIFEST}")
    if log is None and manifest is None:
        return None
    config = (manifest or {}).get("config")
    config = config if isinstance(config, dict) else {}
    identity = config.get("identity")
    # the log's count once the run stopped, else the epoch the checkpoint holds
    epochs = log.get("epochs_run") if log is not None else (manifest or {}).get("epoch")
    try:
        epochs = int(epochs or 0)
    except (TypeError, ValueError):
        epochs = 0
    return LmRunProgress(
        stopped=lm_stopped(log),  # the warm start's rule (`warm_start.trained_run`)
        epochs_run=epochs,
        checkpoint=manifest is not None,
        job_id=str(config.get("job") or ""),
        adapter_type=str(identity.get("kind") or "") if isinstance(identity, dict) else "",
    )


def lm_run_status(storage: Storage, run_key: str, exported: bool) -> tuple[str, str]:
    """(state, text) of an LM run folder (`exported`: it holds adapter weights). The trainer
    writes `lm_train_log.json` once, when the run stops, after the export, and deletes the
    checkpoint after that: stopped with weights is finished (even with a checkpoint a kill left
    behind); a checkpoint without that is unfinished (killed, or training while the job it names
    is alive), or unexported when the run stopped but the export stage did not run; ("", "") for
    a folder with neither log nor checkpoint."""
    progress = read_lm_progress(storage, run_key)
    if progress is None:
        return "", ""
    if progress.stopped and exported:
        return "finished", "finished"
    if not progress.checkpoint:
        return "", ""  # a log without weights or state: nothing this run can continue from
    if progress.stopped:
        return "unexported", f"trained {progress.epochs_run} epochs, not exported"
    if _job_alive(storage, progress.job_id):
        return "training", f"training (epoch {progress.epochs_run})"
    return "unfinished", f"unfinished at epoch {progress.epochs_run}"


def _stamp_time(run: str) -> str:
    try:
        return datetime.strptime("-".join(run.split("-")[:5]), layout.RUN_STAMP_FORMAT).isoformat()
    except ValueError:
        return ""


def unexported_lm_runs(storage: Storage) -> list[AdapterEntry]:
    """LM run folders with resumable state but no adapter yet (an unfinished or unexported run),
    which the catalogue, listing weights, leaves out: as entries without weights or size."""
    from hotstep_ray.audition.catalogue import ROOT, AdapterEntry, resolve_trigger

    def dirs(key: str) -> list[str]:
        names = (k for k in storage.list(key) if not k.rsplit("/", 1)[-1].startswith("."))
        return [k for k in names if storage.is_dir(k)]

    found = []
    for size, folder in layout.LM_SIZE_FOLDERS.items():
        base_key = f"{ROOT}/{folder}"
        if not storage.is_dir(base_key):
            continue
        for artist_key in dirs(base_key):
            for run_key in dirs(artist_key):
                run = run_key.rsplit("/", 1)[-1]
                if not layout.is_run_stamp(run) or layout.has_weights(storage, run_key):
                    continue
                progress = read_lm_progress(storage, run_key)
                if progress is None or not progress.checkpoint:
                    continue
                entry = AdapterEntry(
                    id=run_key.removeprefix(f"{ROOT}/"),
                    kind="lm",
                    base_folder=folder,
                    base=size,
                    artist=artist_key.rsplit("/", 1)[-1],
                    run=run,
                    legacy=False,
                    format=progress.adapter_type or "?",
                    weights="",
                    size_bytes=0,
                    trained_at=_stamp_time(run),
                    trigger=resolve_trigger(storage, run_key),  # the folder's word, as a run's
                )
                found.append(entry)
    return found


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
