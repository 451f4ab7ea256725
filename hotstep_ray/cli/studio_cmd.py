"""`hotstep-ray studio serve` (the HTTP API) and `hotstep-ray jobs list|show|cancel`.

The lead mounts them: `app.add_typer(studio_cmd.studio_app, name="studio")` and
`app.add_typer(studio_cmd.jobs_app, name="jobs")`.

The token is read from `$HOTSTEP_TOKEN` only (a flag would show up in `ps` and shell history).
"""

from __future__ import annotations

import ipaddress

import typer
from rich.markup import escape
from rich.table import Table

from hotstep_ray.cli.common import console, fail, handle_errors, print_json
from hotstep_ray.core.contracts import TERMINAL_JOB_STATUSES
from hotstep_ray.core.storage import Storage
from hotstep_ray.studio.config import DEFAULT_HOST, DEFAULT_PORT, TOKEN_ENV, StudioConfig

studio_app = typer.Typer(no_args_is_help=True)
jobs_app = typer.Typer(
    help="List, inspect and cancel jobs in a storage root.", no_args_is_help=True
)

DATA_HELP = "Storage root: a folder or s3://bucket/prefix."


@studio_app.callback()
def _studio() -> None:
    """The studio HTTP API (datasets, jobs, live events)."""
    # A callback keeps `studio` a command group even with one command, so `studio serve` reads
    # the same whether this app is run alone or mounted under `hotstep-ray`.


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@studio_app.command("serve")
@handle_errors
def serve(
    data: str = typer.Option("./data", help=DATA_HELP),
    host: str = typer.Option(DEFAULT_HOST, help="Address to bind (loopback by default)."),
    port: int = typer.Option(DEFAULT_PORT, help="Port to listen on."),
    ray_address: str = typer.Option("", help="Ray to run jobs on (default: local/$RAY_ADDRESS)."),
    root: list[str] = typer.Option(
        [], "--root", help="A folder/URL requests may name (song folders); repeatable."
    ),
    checkpoints: str = typer.Option(
        "", help="checkpoints/ folder (default: $HOTSTEP_CHECKPOINTS)."
    ),
    ray_serve: bool = typer.Option(
        False, "--ray-serve", help="Run on Ray Serve instead of an in-process uvicorn."
    ),
) -> None:
    """Serve the studio API until Ctrl-C; jobs run as Ray actors."""
    config = StudioConfig.from_env(
        data,
        roots=tuple(root) or None,
        ray_address=ray_address or None,
        checkpoints=checkpoints or None,
    )
    if not _is_loopback(host) and not config.token:
        raise fail(f"refusing to bind {host} without ${TOKEN_ENV}: anyone could reach the API")
    from hotstep_ray.distributed.runtime import ensure_ray

    ensure_ray(config.ray_address or None)
    url = f"http://{host}:{port}/api/training"
    console.print(f"[green]studio[/] {escape(url)}  storage {escape(config.data)}", soft_wrap=True)
    if ray_serve:
        _run_on_serve(config, host, port)
        return
    import uvicorn

    from hotstep_ray.studio.app import create_app

    uvicorn.run(create_app(config), host=host, port=port, log_level="warning")


def _run_on_serve(config: StudioConfig, host: str, port: int) -> None:
    import time

    from ray import serve

    from hotstep_ray.studio.serve import StudioDeployment

    serve.start(http_options={"host": host, "port": port})
    serve.run(
        StudioDeployment.bind(
            config.data,
            roots=list(config.roots),
            ray_address=config.ray_address,
            checkpoints=config.checkpoints,
            # Explicitly: a replica on a running cluster does not see this shell's environment.
            token=config.token,
        ),
        name="studio",
        route_prefix="/",
    )
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        serve.shutdown()


@jobs_app.command("list")
@handle_errors
def list_jobs(
    data: str = typer.Option("./data", help=DATA_HELP),
    dataset: str = typer.Option("", help="Only jobs of this dataset id."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Every job under the storage root, newest first (studio, CLI and `ray job submit` runs).
    A job whose process is gone without ending its record (killed) shows as `lost`."""
    from hotstep_ray.core.jobs import LOST
    from hotstep_ray.studio.records import list_stored

    jobs = [j for j in list_stored(Storage(data)) if not dataset or j.dataset_id == dataset]
    jobs.sort(key=lambda j: (j.created_at, j.id), reverse=True)
    if as_json:
        print_json([j.to_json_dict() for j in jobs])
        return
    table = Table(title=f"jobs in {data}")
    for column in ("id", "kind", "status", "phase", "progress", "dataset", "error"):
        table.add_column(column, overflow="fold")
    for job in jobs:
        style = {"done": "green", "failed": "red", "cancelled": "yellow"}.get(job.status, "cyan")
        lost = job.status == "failed" and job.error.startswith(f"{LOST}:")
        table.add_row(
            job.id,
            job.kind,
            f"[{style}]{LOST if lost else job.status}[/]",
            job.phase,
            f"{job.done}/{job.total}" if job.total else "",
            job.dataset_id,
            escape(job.error),
        )
    console.print(table)


@jobs_app.command("show")
@handle_errors
def show_job(
    job_id: str = typer.Argument(..., help="Job id."),
    data: str = typer.Option("./data", help=DATA_HELP),
    events: bool = typer.Option(False, "--events", help="Also print every event (JSONL)."),
) -> None:
    """A job's summary as JSON, and optionally its event log."""
    from hotstep_ray.core import layout
    from hotstep_ray.studio.records import read_summary

    storage = Storage(data)
    print_json(read_summary(storage, job_id).to_json_dict())
    if events and storage.exists(layout.job_events(job_id)):
        typer.echo(storage.read_text(layout.job_events(job_id)), nl=False)


@jobs_app.command("cancel")
@handle_errors
def cancel_job(
    job_id: str = typer.Argument(..., help="Job id."),
    data: str = typer.Option("./data", help=DATA_HELP),
    ray_address: str = typer.Option(
        "auto", help="Ray the job runs on (its runner actor is killed there)."
    ),
) -> None:
    """Cancel a studio job: kill its runner actor and record it as cancelled."""
    from hotstep_ray.distributed.runtime import ensure_ray
    from hotstep_ray.studio.jobs import cancel_stored_job
    from hotstep_ray.studio.records import read_summary

    storage = Storage(data)
    summary = read_summary(storage, job_id)
    if summary.status in TERMINAL_JOB_STATUSES:
        console.print(f"job {job_id} already {summary.status}")
        return
    ended = cancel_stored_job(storage, lambda: ensure_ray(ray_address or None), job_id)
    console.print(f"[yellow]job {job_id} {ended.status}[/]")
