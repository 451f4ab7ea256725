"""`hotstep-ray calibrate run RUN_DIR`: pick an adapter run's best milestone and scale.

RUN_DIR is the run folder (a storage key under --data such as
`adapters/lm-4b/band/2026-05-01_10-00-00`, or a local path inside --data); LM or DiT is told by
its place (`adapters/lm-*`, `adapters/dit-*`) or its training log. Every candidate (the run's
adapter and its milestones) x every scale is evaluated against the dataset the run was trained on,
and the winner is baked into `<RUN_DIR>-calibrated/` with `hot_step_eval.json`. `--ray` fans the
grid out over Ray actors (`--actors`, each `--gpus-per-actor`); `--no-ray` runs it here.
"""

from __future__ import annotations

from typing import Any

import typer

from hotstep_ray.calibration.options import CalibrateOptions
from hotstep_ray.calibration.ray_calibrate import make_runner
from hotstep_ray.calibration.runs import resolve_run_key, run_kind
from hotstep_ray.cli.common import (
    EXIT_FAILURE,
    console,
    given,
    handle_errors,
    print_json,
    with_contract_options,
)
from hotstep_ray.core.events import LogEvent, MetricEvent
from hotstep_ray.core.jobs import Job
from hotstep_ray.core.storage import Storage

app = typer.Typer(help="Calibrate adapters: best milestone x scale, baked.", no_args_is_help=True)


@app.callback()
def _group() -> None:
    """Calibrate LM / DiT adapter runs: `calibrate run RUN_DIR …`."""


def _print_event(event: Any) -> None:
    if isinstance(event, LogEvent):
        style = {"info": "dim", "warn": "yellow", "error": "red"}[event.level]
        console.print(f"  [{style}]{event.message}[/]", highlight=False, soft_wrap=True)
    elif isinstance(event, MetricEvent) and event.metric == "eval":
        extra = event.model_extra or {}
        mark = "  <- winner" if extra.get("winner") else ""
        ok = "" if extra.get("eligible") else "  (guard)"
        console.print(
            f"  {extra.get('candidate')} x{extra.get('scale', 0):g}  "
            f"score {extra.get('score', float('nan')):.4f}{ok}{mark}",
            highlight=False,
        )


@with_contract_options(CalibrateOptions, flags={"duration_s": "--duration"})
def _run(
    run_dir: str = typer.Argument(..., help="Run folder: storage key or local path in --data."),
    data: str = typer.Option("./data", help="Storage root: a folder or s3://bucket/prefix."),
    checkpoints: str = typer.Option(..., help="ACE-Step checkpoints folder."),
    use_ray: bool = typer.Option(False, "--ray/--no-ray", help="Fan out over Ray actors."),
    actors: int = typer.Option(1, help="Ray actors (each loads the base model once)."),
    gpus_per_actor: float = typer.Option(-1.0, help="Ray: GPUs per actor (-1 = 1 if any)."),
    ray_address: str = typer.Option("", help="Ray cluster to join (default: local)."),
    as_json: bool = typer.Option(False, "--json", help="Print hot_step_eval.json."),
    **values: Any,
) -> None:
    """Evaluate every milestone x scale of RUN_DIR and bake the winner."""
    # The calibrators import torch: here, so that --help starts without it.
    from hotstep_ray.calibration.dit_calibrate import DitCalibrationConfig, calibrate_dit
    from hotstep_ray.calibration.lm_calibrate import LmCalibrationConfig, calibrate_lm

    options = CalibrateOptions.model_validate(given(values))
    storage = Storage(data)
    run_key = resolve_run_key(storage, run_dir)
    kind = run_kind(storage, run_key)
    runner = make_runner(
        use_ray,
        actors=actors,
        num_gpus=None if gpus_per_actor < 0 else gpus_per_actor,
        address=ray_address or None,
    )
    common: dict[str, Any] = {
        "checkpoints": checkpoints,
        "codes": options.codes,
        "device": options.device or None,
        "runner": runner,
        "repoint": options.repoint,
    }
    job = Job(storage, "lm-calibrate" if kind == "lm" else "dit-calibrate", sinks=(_print_event,))
    with job:
        job.phase(f"calibrate-{kind}")
        if kind == "lm":
            config = LmCalibrationConfig(
                **options.grid_fields(), sampling=options.sampling(), max_batch=options.max_batch
            )
            outcome = calibrate_lm(
                storage, run_key, config=config, lm=options.model or None, events=job.events,
                **common,
            )  # fmt: skip
        else:
            config_dit = DitCalibrationConfig(**options.grid_fields())  # else its render length
            outcome = calibrate_dit(
                storage, run_key, config=config_dit, tensors=options.tensors,
                dit=options.model or None, events=job.events, **common,
            )  # fmt: skip
    if as_json:
        print_json(outcome.document)
    elif outcome.winner is None:
        console.print(
            f"[yellow]no candidate passed the guards[/]; report: "
            f"{storage.url_of(outcome.folder.eval_key)}",
            soft_wrap=True,
        )
    if outcome.winner is None:
        # Not EXIT_PARTIAL: a grid point that fails raises, so nothing here fails one by one;
        # the run finished and there is nothing to bake. The same code with --json or without.
        raise typer.Exit(EXIT_FAILURE)
    if as_json:
        return
    winner = outcome.winner
    console.print(
        f"[green]calibrated:[/] {storage.url_of(outcome.folder.weights_key)}  "
        f"({winner['candidate']} x{winner['scale']:g}, score {winner['score']:.4f})",
        soft_wrap=True,
    )


run = app.command("run")(handle_errors(_run))
