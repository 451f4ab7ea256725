"""`hotstep-ray mm3 …`: MiniMax-Music3 preprocessing, DiT LoRA training and the tiny test model.

    hotstep-ray mm3 preprocess SLUG --checkpoints DIR [--mode sampled|aligned] [--seed 42]
    hotstep-ray mm3 train-dit SLUG --checkpoints DIR [--steps 200 --lr 1e-4 --rank 32 ...]
                                   [--ray [--ray-address A] [--vram-gb N] [--max-failures 2]]
    hotstep-ray mm3 train-lm SLUG --checkpoints DIR --codes DIR [--steps 800 --lr 8e-5 --rank 16 ...]
                                   (composer-LM LoRA from RVQ codes; PEFT folder out)
    hotstep-ray mm3 tone-check --checkpoints DIR          (trap 14: 440 Hz in = 440 Hz out)
    hotstep-ray mm3 make-tiny DIR                          (a tiny MM3 in the real layout)

The MM3 folder is found at DIR, DIR/mm3 or DIR/mm3/<name>/ (`mm3.checkpoint`); no ACE-Step
weights are needed. Options map 1:1 onto `Mm3PreprocessOptions` / `Mm3TrainOptions` /
`Mm3LmTrainOptions`.
"""

from __future__ import annotations

import os
from pathlib import Path

import typer

from hotstep_ray.cli.common import (
    EXIT_FAILURE,
    console,
    finish_stage,
    handle_errors,
    json_on_stdout,
    print_json,
)
from hotstep_ray.core.events import LogEvent, MetricEvent, ProgressEvent

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


@app.command("preprocess")
@handle_errors
def preprocess(
    slug: str = typer.Argument(..., help="Dataset slug."),
    data: str = DATA,
    checkpoints: str = CHECKPOINTS,
    mode: str = typer.Option("sampled", help="sampled (60 s rollouts) or aligned (from codes)."),
    seed: int = typer.Option(42, help="Rollout seed; segment k uses seed + k."),
    segment_s: float = typer.Option(60.0, help="Rollout segment length, seconds."),
    max_duration_s: float = typer.Option(360.0, help="Cut songs here (<= 360 s, the LM cap)."),
    codes_dir: str = typer.Option("", help="Aligned mode: folder of <stem>.codes files."),
    sample_id: list[str] = typer.Option(None, help="Only these sample ids (repeatable)."),
    overwrite: bool = typer.Option(False, help="Redo songs whose cache is current."),
    lm_dtype: str = typer.Option("bfloat16", help="Composer LM dtype: bfloat16 or float32."),
    device: str = typer.Option("", help="cuda, cuda:1, cpu; default cuda when available."),
    as_json: bool = typer.Option(False, "--json", help="Print the manifest as JSON."),
) -> None:
    """DAV-encode a dataset's songs and build their conditioning (captions from <stem>.mm3.txt).

    Exits 3 when some songs failed (the others are cached), 2 on bad input."""
    from hotstep_ray.core.jobs import Job
    from hotstep_ray.core.storage import Storage
    from hotstep_ray.mm3.preprocess import Mm3PreprocessOptions, run_preprocess

    options = Mm3PreprocessOptions(
        mode=mode,
        seed=seed,
        segment_s=segment_s,
        max_duration_s=max_duration_s,
        codes_dir=codes_dir,
        sample_ids=sample_id or None,
        overwrite=overwrite,
        lm_dtype=lm_dtype,
        device=device,
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


@app.command("train-dit")
@handle_errors
def train_dit(
    slug: str = typer.Argument(..., help="Dataset slug."),
    data: str = DATA,
    checkpoints: str = CHECKPOINTS,
    variant_key: str = typer.Option("mm3-sampled-s42", help="Cache folder from mm3 preprocess."),
    adapter_name: str = typer.Option("", help="Artist folder of the run (default: the slug)."),
    rank: int = typer.Option(32),
    alpha: float = typer.Option(32.0),
    lr: float = typer.Option(1e-4, "--lr", help="Peak learning rate (SimpleTuner uses 5e-5)."),
    steps: int = typer.Option(200),
    warmup_steps: int = typer.Option(-1, help="-1 = max(1, steps / 20)."),
    crop: int = typer.Option(689, help="Crop length in latents (689 = one 8 s DiT window)."),
    crop_mode: str = typer.Option("random", help="random or beginning."),
    batch: int = typer.Option(1),
    grad_accum: int = typer.Option(1),
    seed: int = typer.Option(42),
    logit_mean: float = typer.Option(0.0, help="> 0 biases training toward clean crops."),
    logit_std: float = typer.Option(1.0),
    gradient_checkpointing: bool = typer.Option(False),
    dtype: str = typer.Option("bfloat16", help="Frozen base dtype (LoRA stays float32)."),
    device: str = typer.Option(""),
    delta_every: int = typer.Option(50, help="||dW||/||W|| report every N steps."),
    save_every: int = typer.Option(0, help="Resumable checkpoint every N steps."),
    export_every: int = typer.Option(0, help="Filtered snapshot every N steps (ear ladder)."),
    eval_every: int = typer.Option(0, help="Fixed stratified-sigma eval every N steps."),
    sign_check: bool = typer.Option(False, help="Refuse to train if the sign check fails."),
    trigger: str = typer.Option(""),
    resume: str = typer.Option("", help="Storage key of a checkpoint/ folder to continue."),
    use_ray: bool | None = typer.Option(
        None, "--ray/--no-ray", help="Train on Ray Train (default: when a cluster address is set)."
    ),
    ray_address: str = typer.Option("", help="Ray cluster to join (default $RAY_ADDRESS)."),
    vram_gb: float | None = typer.Option(
        None, help="Ray: GPU memory to request per worker (default: predicted, see mm3/vram.py)."
    ),
    vram_reserve_mb: int = typer.Option(2048, help="Ray: allocator slack added to the request."),
    max_failures: int = typer.Option(2, help="Ray: worker failures to recover from."),
    as_json: bool = typer.Option(False, "--json", help="Print the written paths as JSON."),
) -> None:
    """Train a LoRA on the MM3 DiT; export ComfyUI-format files with the q,k/proj filter."""
    from hotstep_ray.core.jobs import Job
    from hotstep_ray.core.storage import Storage
    from hotstep_ray.mm3.train import Mm3TrainOptions, run_train_dit

    options = Mm3TrainOptions(
        variant_key=variant_key,
        adapter_name=adapter_name,
        rank=rank,
        alpha=alpha,
        learning_rate=lr,
        steps=steps,
        warmup_steps=None if warmup_steps < 0 else warmup_steps,
        crop_latents=crop,
        crop_mode=crop_mode,
        batch=batch,
        grad_accum=grad_accum,
        seed=seed,
        logit_mean=logit_mean,
        logit_std=logit_std,
        gradient_checkpointing=gradient_checkpointing,
        dtype=dtype,
        device=device,
        delta_every=delta_every,
        save_every=save_every,
        export_every=export_every,
        eval_every=eval_every,
        sign_check=sign_check,
        trigger=trigger,
        resume=resume,
        vram_reserve_mb=vram_reserve_mb,
    )
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


@app.command("train-lm")
@handle_errors
def train_lm(
    slug: str = typer.Argument(..., help="Dataset slug (captions: <stem>.mm3.txt by the audio)."),
    data: str = DATA,
    checkpoints: str = CHECKPOINTS,
    codes: str = typer.Option(..., "--codes", help="Folder of <stem>.codes files (mm3-codes)."),
    no_warmup_row: bool = typer.Option(
        False, "--no-warmup-row", help="The codes files have no leading warm-up row."
    ),
    adapter_name: str = typer.Option("", help="Run folder prefix (default: the slug)."),
    sample_id: list[str] = typer.Option(None, help="Only these sample ids (repeatable)."),
    rank: int = typer.Option(16),
    alpha: float = typer.Option(32.0),
    lr: float = typer.Option(8e-5, "--lr", help="Peak learning rate."),
    weight_decay: float = typer.Option(0.01),
    grad_clip: float = typer.Option(1.0, help="Global-norm clip; 0 = off."),
    optimizer: str = typer.Option("adamw", help="adamw or muon."),
    steps: int = typer.Option(800),
    warmup_steps: int = typer.Option(0),
    grad_accum: int = typer.Option(1),
    max_frames: int = typer.Option(1500, help="Frames (25 Hz) per crop; 0 = whole songs."),
    crop_mode: str = typer.Option("random", help="random or beginning."),
    no_eos: bool = typer.Option(False, "--no-eos", help="Never supervise <|audio_end|>."),
    seed: int = typer.Option(42),
    gradient_checkpointing: bool = typer.Option(False),
    dtype: str = typer.Option("bfloat16", help="Frozen base dtype (LoRA stays float32)."),
    device: str = typer.Option(""),
    trigger: str = typer.Option(""),
    as_json: bool = typer.Option(False, "--json", help="Print the written paths as JSON."),
) -> None:
    """Train a LoRA on the MM3 composer LM from RVQ codes; export a PEFT folder."""
    from hotstep_ray.core.storage import Storage
    from hotstep_ray.mm3.lm_train import Mm3LmTrainOptions, run_train_lm

    options = Mm3LmTrainOptions(
        codes_dir=codes,
        codes_warmup_row=not no_warmup_row,
        adapter_name=adapter_name,
        sample_ids=sample_id or None,
        rank=rank,
        alpha=alpha,
        learning_rate=lr,
        weight_decay=weight_decay,
        grad_clip=grad_clip,
        optimizer=optimizer,
        steps=steps,
        warmup_steps=warmup_steps,
        grad_accum=grad_accum,
        max_frames=max_frames,
        crop_mode=crop_mode,
        supervise_eos=not no_eos,
        seed=seed,
        gradient_checkpointing=gradient_checkpointing,
        dtype=dtype,
        device=device,
        trigger=trigger,
    )
    storage = Storage(data)
    paths = run_train_lm(storage, slug, checkpoints, options, sinks=(_sink,))
    if as_json:
        print_json({k: storage.url_of(v) for k, v in paths.items()})
    else:
        console.print(
            f"[green]MM3 composer LoRA:[/] {storage.url_of(paths['run'])}", soft_wrap=True
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
