"""`hotstep-ray mm3 …`: MiniMax-Music3 preprocessing, DiT LoRA training and the tiny test model.

    hotstep-ray mm3 preprocess SLUG --checkpoints DIR [--mode sampled|aligned] [--seed 42]
    hotstep-ray mm3 train-dit SLUG --checkpoints DIR [--steps 200 --lr 1e-4 --rank 32 ...]
                                   [--ray [--ray-address A] [--vram-gb N] [--max-failures 2]]
    hotstep-ray mm3 train-lm SLUG --checkpoints DIR --codes DIR [--steps 800 --lr 8e-5 --rank 16 ...]
                                   (composer-LM LoRA from RVQ codes; PEFT folder out)
    hotstep-ray mm3 tone-check --checkpoints DIR          (trap 14: 440 Hz in = 440 Hz out)
    hotstep-ray mm3 make-tiny DIR                          (a tiny MM3 in the real layout)

The MM3 folder is found at DIR, DIR/mm3 or DIR/mm3/<name>/ (`mm3.checkpoint`); no ACE-Step
weights are needed. Each command's options are generated from its contract (`mm3/options.py`:
`Mm3PreprocessOptions`, `Mm3TrainOptions`, `Mm3LmTrainOptions`; `--lr` and `--crop` name
`learning_rate` and `crop_latents`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import typer

from hotstep_ray.cli.common import (
    EXIT_FAILURE,
    console,
    finish_stage,
    given,
    handle_errors,
    json_on_stdout,
    print_json,
    with_contract_options,
)
from hotstep_ray.core.events import LogEvent, MetricEvent, ProgressEvent
from hotstep_ray.mm3.options import Mm3LmTrainOptions, Mm3PreprocessOptions, Mm3TrainOptions

app = typer.Typer(
    help="MiniMax-Music3: preprocess a dataset into the MM3 cache, train a DiT LoRA.",
    no_args_is_help=True,
)
DATA = typer.Option("./data", help="Storage root: a folder or s3://bucket/prefix.")
CHECKPOINTS = typer.Option(..., "--checkpoints", help="Folder holding mm3/ (or the MM3 folder).")


def _sink(event) -> None:
    if isinstance(event, LogEvent):
        style = {"info": "dim", "warn": "yellow", "error": "red"}[event.level]
        console.print(f"  [{style}]{event.message}[/]", highlight=False)
    elif isinstance(event, ProgressEvent) and event.total and event.done == event.total:
        console.print(f"  [dim]{event.phase}: {event.done}/{event.total}[/]")
    elif isinstance(event, MetricEvent) and event.metric == "step" and event.step:
        if event.step == 1 or event.step % 10 == 0 or event.step == event.total_steps:
            console.print(
                f"  step {event.step}/{event.total_steps} loss {event.loss:.4f} "
                f"lr {event.lr:.2e} |g| {event.grad_norm:.3f} {event.step_ms:.0f} ms",
                highlight=False,
            )


def _preprocess(
    slug: str = typer.Argument(..., help="Dataset slug."),
    data: str = DATA,
    checkpoints: str = CHECKPOINTS,
    sample_id: list[str] = typer.Option(None, help="Only these sample ids (repeatable)."),
    as_json: bool = typer.Option(False, "--json", help="Print the manifest as JSON."),
    **values: Any,
) -> None:
    """DAV-encode a dataset's songs and build their conditioning (captions from <stem>.mm3.txt).

    Exits 3 when some songs failed (the others are cached), 2 on bad input."""
    from hotstep_ray.core.jobs import Job
    from hotstep_ray.core.storage import Storage
    from hotstep_ray.mm3.preprocess import run_preprocess

    options = Mm3PreprocessOptions.model_validate(
        {**given(values), "sample_ids": sample_id or None}
    )
    storage = Storage(data)
    # With --json, stdout carries the manifest alone (as `preprocess run` does).
    with (
        json_on_stdout(as_json),
        Job(storage, "preprocess", dataset_id=slug, sinks=(_sink,)) as job,
    ):
        manifest = run_preprocess(storage, slug, checkpoints, options, job.events)
    if as_json:
        print_json(manifest)
    else:
        console.print(f"MM3 cache {options.resolved_variant_key}", highlight=False)
    finish_stage(f"{manifest['n_ok']} ok", manifest["n_failed"], as_json=as_json)


def _train_dit(
    slug: str = typer.Argument(..., help="Dataset slug."),
    data: str = DATA,
    checkpoints: str = CHECKPOINTS,
    use_ray: bool | None = typer.Option(
        None, "--ray/--no-ray", help="Train on Ray Train (default: when a cluster address is set)."
    ),
    ray_address: str = typer.Option("", help="Ray cluster to join (default $RAY_ADDRESS)."),
    vram_gb: float | None = typer.Option(
        None, help="Ray: GPU memory to request per worker (default: predicted, see mm3/vram.py)."
    ),
    max_failures: int = typer.Option(2, help="Ray: worker failures to recover from."),
    as_json: bool = typer.Option(False, "--json", help="Print the written paths as JSON."),
    **values: Any,
) -> None:
    """Train a LoRA on the MM3 DiT; export ComfyUI-format files with the q,k/proj filter."""
    from hotstep_ray.core.jobs import Job
    from hotstep_ray.core.storage import Storage
    from hotstep_ray.mm3.train import run_train_dit

    options = Mm3TrainOptions.model_validate(given(values))
    resume = options.resume
    storage = Storage(data)
    if use_ray is None:
        use_ray = bool(ray_address or os.environ.get("RAY_ADDRESS"))
    if use_ray:
        from hotstep_ray.distributed.runtime import ensure_ray
        from hotstep_ray.mm3.ray_train import train_mm3_on_ray

        if resume:
            raise typer.BadParameter("--resume is for local runs; Ray resumes by itself")
        ensure_ray(ray_address or None)
        with Job(storage, "train-dit", dataset_id=slug, sinks=(_sink,)) as job:
            job.phase("train")
            result = train_mm3_on_ray(
                options,
                storage,
                slug,
                checkpoints,
                vram_gb=vram_gb,
                max_failures=max_failures,
                job_id=job.id,
            )
            job.events.log(f"Ray run {result.run_name}: {result.vram_gb:g} GB per worker")
        paths = result.paths
    else:
        paths = run_train_dit(storage, slug, checkpoints, options, sinks=(_sink,))
    if as_json:
        print_json({k: storage.url_of(v) for k, v in paths.items()})
    else:
        console.print(f"[green]MM3 LoRA:[/] {storage.url_of(paths['lora'])}", soft_wrap=True)


def _train_lm(
    slug: str = typer.Argument(..., help="Dataset slug (captions: <stem>.mm3.txt by the audio)."),
    data: str = DATA,
    checkpoints: str = CHECKPOINTS,
    codes: str = typer.Option(..., "--codes", help="Folder of <stem>.codes files (mm3-codes)."),
    no_warmup_row: bool = typer.Option(
        False, "--no-warmup-row", help="The codes files have no leading warm-up row."
    ),
    no_eos: bool = typer.Option(False, "--no-eos", help="Never supervise <|audio_end|>."),
    sample_id: list[str] = typer.Option(None, help="Only these sample ids (repeatable)."),
    as_json: bool = typer.Option(False, "--json", help="Print the written paths as JSON."),
    **values: Any,
) -> None:
    """Train a LoRA on the MM3 composer LM from RVQ codes; export a PEFT folder."""
    from hotstep_ray.core.storage import Storage
    from hotstep_ray.mm3.lm_train import run_train_lm

    options = Mm3LmTrainOptions.model_validate(
        {
            **given(values),
            "codes_dir": codes,
            "codes_warmup_row": not no_warmup_row,
            "supervise_eos": not no_eos,
            "sample_ids": sample_id or None,
        }
    )
    storage = Storage(data)
    paths = run_train_lm(storage, slug, checkpoints, options, sinks=(_sink,))
    if as_json:
        print_json({k: storage.url_of(v) for k, v in paths.items()})
    else:
        console.print(
            f"[green]MM3 composer LoRA:[/] {storage.url_of(paths['run'])}", soft_wrap=True
        )


preprocess = app.command("preprocess")(
    handle_errors(with_contract_options(Mm3PreprocessOptions, skip={"sample_ids"})(_preprocess))
)
train_dit = app.command("train-dit")(
    handle_errors(
        with_contract_options(
            Mm3TrainOptions, flags={"learning_rate": "--lr", "crop_latents": "--crop"}
        )(_train_dit)
    )
)
train_lm = app.command("train-lm")(
    handle_errors(
        with_contract_options(
            Mm3LmTrainOptions,
            skip={"codes_dir", "codes_warmup_row", "supervise_eos", "sample_ids"},
            flags={"learning_rate": "--lr"},
        )(_train_lm)
    )
)


@app.command("tone-check")
@handle_errors
def tone_check(
    checkpoints: str = CHECKPOINTS,
    frequency_hz: float = typer.Option(440.0),
    device: str = typer.Option(""),
) -> None:
    """Encode a sine with the DAV encoder, decode it with the vocoder, print the pitch back."""
    from hotstep_ray.mm3 import checkpoint as ckpt
    from hotstep_ray.mm3.preprocess import resolve_device
    from hotstep_ray.mm3.preprocess import tone_check as run_tone_check

    paths = ckpt.Mm3Paths.find(checkpoints)
    where = str(resolve_device(device))
    result = run_tone_check(
        ckpt.load_dav(paths, where), ckpt.load_vocoder(paths, where), frequency_hz
    )
    ok = abs(result["ratio"] - 1.0) < 0.01
    colour = "green" if ok else "red"
    console.print(f"[{colour}]{frequency_hz:g} Hz in -> {result['frequency_hz']:.1f} Hz out[/]")
    if not ok:
        raise typer.Exit(EXIT_FAILURE)


@app.command("make-tiny")
@handle_errors
def make_tiny(
    folder: Path = typer.Argument(..., help="Where to write it (e.g. checkpoints/mm3/tiny)."),
    seed: int = typer.Option(0),
) -> None:
    """Write a tiny, seeded MM3 checkpoint in the real folder layout (tests, dry runs)."""
    from hotstep_ray.mm3.tiny import write_tiny_mm3

    console.print(f"[green]tiny MM3:[/] {write_tiny_mm3(folder, seed)}", soft_wrap=True)
