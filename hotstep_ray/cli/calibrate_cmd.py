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

from hotstep_ray.audition.schemas import LmSampling
from hotstep_ray.calibration import grid
from hotstep_ray.calibration.ray_calibrate import make_runner
from hotstep_ray.calibration.runs import resolve_run_key, run_kind
from hotstep_ray.cli.common import EXIT_FAILURE, console, handle_errors, print_json
from hotstep_ray.core.contracts import LM_CALIBRATION_MAX_BATCH_DEFAULT
from hotstep_ray.core.events import LogEvent, MetricEvent
from hotstep_ray.core.jobs import Job
from hotstep_ray.core.storage import Storage

app = typer.Typer(help="Calibrate adapters: best milestone x scale, baked.", no_args_is_help=True)
_SAMPLING = LmSampling.model_fields  # the LM sampling defaults the options show


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


@app.command("run")
@handle_errors
def run(
    run_dir: str = typer.Argument(..., help="Run folder: storage key or local path in --data."),
    data: str = typer.Option("./data", help="Storage root: a folder or s3://bucket/prefix."),
    checkpoints: str = typer.Option(..., help="ACE-Step checkpoints folder."),
    scales: str = typer.Option(
        ",".join(f"{scale:g}" for scale in grid.DEFAULT_SCALES),
        help="Adapter scales to try, in (0, 2].",
    ),
    seeds: int = typer.Option(
        grid.DEFAULT_SEEDS, help="Generations per grid point (prompts cycle the songs)."
    ),
    base_seed: int = typer.Option(
        grid.DEFAULT_BASE_SEED, help="Seed of generation 0 (then +1 each)."
    ),
    duration: float = typer.Option(
        0.0,
        help="Seconds per generation; 0 = the kind's default (LM: the LM plans it, within the "
        "length guard; DiT: a fixed render length).",
    ),
    temperature: float = typer.Option(
        _SAMPLING["temperature"].default, help="LM sampling temperature (0 = greedy)."
    ),
    top_p: float = typer.Option(_SAMPLING["top_p"].default, help="LM nucleus sampling."),
    top_k: int = typer.Option(_SAMPLING["top_k"].default, help="LM top-k (0 = off)."),
    cfg_scale: float = typer.Option(
        _SAMPLING["cfg_scale"].default, help="LM classifier-free guidance (<= 1: off)."
    ),
    max_batch: int = typer.Option(
        LM_CALIBRATION_MAX_BATCH_DEFAULT,
        min=1,
        max=64,
        help="LM: generations decoded together (1 = one at a time).",
    ),
    codes: str = typer.Option("", help="Storage key of lm_codes.jsonl (default: from the log)."),
    tensors: str = typer.Option("", help="DiT: tensor cache key (default: from the log)."),
    model: str = typer.Option("", help="LM or DiT folder under --checkpoints (default: run's)."),
    device: str = typer.Option("", help="cuda, cuda:1, cpu (default: cuda when present)."),
    repoint: bool = typer.Option(
        True,
        "--repoint/--no-repoint",
        help="Make the calibrated folder what the artist resolves to.",
    ),
    use_ray: bool = typer.Option(False, "--ray/--no-ray", help="Fan out over Ray actors."),
    actors: int = typer.Option(1, help="Ray actors (each loads the base model once)."),
    gpus_per_actor: float = typer.Option(-1.0, help="Ray: GPUs per actor (-1 = 1 if any)."),
    ray_address: str = typer.Option("", help="Ray cluster to join (default: local)."),
    as_json: bool = typer.Option(False, "--json", help="Print hot_step_eval.json."),
) -> None:
    """Evaluate every milestone x scale of RUN_DIR and bake the winner."""
    # The calibrators import torch: here, so that --help starts without it.
    from hotstep_ray.calibration.dit_calibrate import DitCalibrationConfig, calibrate_dit
    from hotstep_ray.calibration.lm_calibrate import LmCalibrationConfig, calibrate_lm

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
        "codes": codes,
        "device": device or None,
        "runner": runner,
        "repoint": repoint,
    }
    parsed = grid.parse_scales(scales)
    job = Job(storage, "lm-calibrate" if kind == "lm" else "dit-calibrate", sinks=(_print_event,))
    with job:
        job.phase(f"calibrate-{kind}")
        if kind == "lm":
            sampling = LmSampling(
                temperature=temperature, top_p=top_p, top_k=top_k, cfg_scale=cfg_scale
            )
            config = LmCalibrationConfig(
                scales=parsed,
                seeds=seeds,
                base_seed=base_seed,
                duration_s=duration or None,
                sampling=sampling,
                max_batch=max_batch,
            )
            outcome = calibrate_lm(
                storage, run_key, config=config, lm=model or None, events=job.events, **common
            )
        else:
            given = {"duration_s": duration} if duration else {}  # else the config's default
            config_dit = DitCalibrationConfig(
                scales=parsed, seeds=seeds, base_seed=base_seed, **given
            )
            outcome = calibrate_dit(
                storage, run_key, config=config_dit, tensors=tensors, dit=model or None,
                events=job.events, **common,
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
