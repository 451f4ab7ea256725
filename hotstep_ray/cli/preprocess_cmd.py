"""`hotstep-ray preprocess …`: turn a built dataset into the safetensors tensor cache, and listen
to what was cached.

    hotstep-ray preprocess run SLUG --data DIR --checkpoints DIR [--variant turbo] [--ray]
    hotstep-ray preprocess inspect SLUG --decode SAMPLE_ID --out x.wav

`run` records a `preprocess` job (jobs/<id>/job.json + events.jsonl) and works under
`ray job submit -- hotstep-ray preprocess run … --ray` (RAY_ADDRESS is picked up).
"""

from __future__ import annotations

import posixpath
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from hotstep_ray.cli.common import (
    RunByDefault,
    console,
    finish_stage,
    given,
    handle_errors,
    json_on_stdout,
    print_json,
    with_contract_options,
)
from hotstep_ray.core import layout
from hotstep_ray.core.contracts import PreprocessOptions
from hotstep_ray.core.errors import InputError
from hotstep_ray.core.events import LogEvent, ProgressEvent
from hotstep_ray.core.jobs import Job
from hotstep_ray.core.storage import Storage
from hotstep_ray.dataset.store import load_summary

app = typer.Typer(
    help="Encode a dataset into the tensor cache the trainers read; decode a cached target "
    "(`preprocess SLUG ...` = `preprocess run SLUG ...`).",
    no_args_is_help=True,
    cls=RunByDefault,
)


def _console_sink(event) -> None:
    if isinstance(event, LogEvent):
        style = {"info": "dim", "warn": "yellow", "error": "red"}[event.level]
        console.print(f"  [{style}]{escape(event.message)}[/]", highlight=False, soft_wrap=True)
    elif isinstance(event, ProgressEvent) and event.total:
        failed = f", {event.failed} failed" if event.failed else ""
        console.print(f"  [dim]{event.phase}: {event.done}/{event.total}{failed}[/]")


# The fields whose flags are not their names (kept from before the options were generated).
_FLAGS = {
    "dit_model": "--variant",
    "vae_model": "--vae",
    "max_duration_s": "--max-duration",
    "vae_chunk_frames": "--vae-chunk",
    "vae_overlap_frames": "--vae-overlap",
    "codes_recheck_margin": "--codes-margin",
    "gpu_memory_cap_gib": "--gpu-memory-cap",
}


def _run(
    slug: str = typer.Argument(..., help="Dataset slug (see `hotstep-ray dataset list`)."),
    data: str = typer.Option("./data", help="Storage root: a folder or s3://bucket/prefix."),
    checkpoints: Path = typer.Option(..., help="Checkpoints folder (acestep-v15-*, vae, …)."),
    sample_id: list[str] = typer.Option(None, help="Only these samples (repeatable)."),
    batch_size: int = typer.Option(4, min=1, help="Songs per encoder call."),
    use_ray: bool = typer.Option(False, "--ray/--no-ray", help="Run on Ray Data."),
    ray_address: str = typer.Option("", help="Ray cluster to join (default: $RAY_ADDRESS)."),
    min_actors: int = typer.Option(1, min=1, help="Encoder actors to start with (Ray)."),
    max_actors: int = typer.Option(1, min=1, help="Encoder actors to scale up to (Ray)."),
    gpus_per_actor: float = typer.Option(
        -1.0, help="GPUs per encoder actor (Ray; 0.25 packs 4 per GPU; -1 = auto)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    **values: Any,
) -> None:
    """Preprocess dataset SLUG into tensors/SLUG/<variant>/ (cached samples are skipped).

    Exits 3 when some samples failed (the others are cached), 2 on bad input."""
    options = PreprocessOptions.model_validate({**given(values), "sample_ids": sample_id or None})
    from hotstep_ray.preprocess.ray_pipeline import RayPipelineConfig
    from hotstep_ray.preprocess.run import preprocess_dataset

    storage = Storage(data)
    summary = load_summary(storage, slug)
    config = RayPipelineConfig(
        min_actors=min_actors,
        max_actors=max_actors,
        num_gpus_per_actor=None if gpus_per_actor < 0 else gpus_per_actor,
        batch_size=batch_size,
    )
    with (
        json_on_stdout(as_json),
        Job(storage, "preprocess", dataset_id=summary.id, sinks=(_console_sink,)) as job,
    ):
        result = preprocess_dataset(
            storage,
            slug,
            options,
            checkpoints,
            "ray" if use_ray else "local",
            job.events,
            batch_size=batch_size,
            ray_address=ray_address or None,
            ray_config=config,
        )
    if as_json:
        print_json(result.to_json_dict())
    else:
        for sid, error in result.errors.items():
            console.print(f"  [yellow]{sid}[/]: {escape(error)}", highlight=False, soft_wrap=True)
        console.print(f"tensors: {escape(result.tensor_dir)}", highlight=False, soft_wrap=True)
    # `failed` counts the cache's failed entries, carried ones too: the cache is not complete.
    finish_stage(
        f"{result.processed} encoded, {result.cached} cached", result.failed, as_json=as_json
    )


run = app.command("run")(
    handle_errors(with_contract_options(PreprocessOptions, skip={"sample_ids"}, flags=_FLAGS)(_run))
)


@app.command()
@handle_errors
def inspect(
    slug: str = typer.Argument(..., help="Dataset slug."),
    decode: str = typer.Option(..., help="Sample id whose cached target to decode."),
    out: Path = typer.Option(..., help="WAV file to write (48 kHz stereo)."),
    data: str = typer.Option("./data", help="Storage root."),
    variant: str = typer.Option("", help="Variant folder (default: the only one there is)."),
    vae: str = typer.Option("", help="VAE folder (default: the one the cache was made with)."),
) -> None:
    """Decode a cached target_latents back to audio, to listen to what training will see."""
    from hotstep_ray.preprocess.run import inspect_decode

    storage = Storage(data)
    if not variant:
        root = posixpath.dirname(layout.tensor_dir(slug, "x"))  # tensors/<slug>
        found = [key.rsplit("/", 1)[-1] for key in storage.list(root) if storage.is_dir(key)]
        if len(found) != 1:
            raise InputError(f"pass --variant: {root} holds {found or 'no variants'}")
        variant = found[0]
    path = inspect_decode(storage, slug, variant, decode, out, vae_path=vae or None)
    console.print(f"wrote [bold]{escape(str(path))}[/]", highlight=False, soft_wrap=True)
