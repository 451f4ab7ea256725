"""Entry points: `preprocess_dataset` (plain, single process, or Ray) and `inspect_decode`.

The plain path encodes samples (shortest first) in batches of `batch_size`, decoding the next
batch on threads meanwhile, writes each sample's files as soon as they exist, and finally writes
the variant files. Models load only when there is something to encode, so a fully cached rerun
costs a dataset.json read, a listing and one header read per song (no tensor bytes).

Every song's files land as soon as it is encoded, and each safetensors header records what the
file was made from, so a run killed midway (SIGKILL, Ctrl-C, a lost node) keeps what it wrote: the
next run's plan counts those files as cached by their headers, and re-encodes any cached file
whose header holds other settings than this run's (`plan.make_plan`).

A run holds the (dataset, variant) lock (`core.locks.preprocess_lock`) from before it plans until
it ends: a second run on the same variant refuses at once instead of encoding every song again
and racing the first on the same files, whatever its settings or `sample_ids` (the variant key,
which alone names the folder, is the DiT folder's name or `output_dir`).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from hotstep_ray.audio.io import encode_audio
from hotstep_ray.core import layout
from hotstep_ray.core.contracts import SAMPLE_RATE_HZ, PreprocessOptions
from hotstep_ray.core.errors import InputError
from hotstep_ray.core.events import EventLog
from hotstep_ray.core.locks import preprocess_lock
from hotstep_ray.core.storage import Storage
from hotstep_ray.preprocess.cache import SampleOutputs, read_sample, write_outputs
from hotstep_ray.preprocess.finalize import PreprocessResult, finalize
from hotstep_ray.preprocess.items import VAE_BATCH_FRAMES
from hotstep_ray.preprocess.model_paths import resolve_models
from hotstep_ray.preprocess.plan import META_FILE, RunPlan, make_plan
from hotstep_ray.preprocess.stages import decode_job, encode_decoded, encoder_settings, plan_info

if TYPE_CHECKING:
    from hotstep_ray.preprocess.ray_pipeline import RayPipelineConfig

Executor = Literal["local", "ray"]


def preprocess_dataset(
    storage: Storage,
    slug: str,
    options: PreprocessOptions,
    checkpoints_dir: str | Path,
    executor: Executor = "local",
    events: EventLog | None = None,
    *,
    batch_size: int = 4,
    vae_batch_frames: int = VAE_BATCH_FRAMES,
    device: str | None = None,
    ray_address: str | None = None,
    ray_config: RayPipelineConfig | None = None,
) -> PreprocessResult:
    """Preprocess dataset `slug` into `tensors/<slug>/<variant_key>/` and return what happened.

    `options`: the contract's `PreprocessOptions` (incl. `sidestep_pt` and
    `seed`). `executor="ray"` runs the Ray Data pipeline (`ray_config`: a
    `RayPipelineConfig`); `device` forces the plain path's device ("cpu", "cuda:1").
    """
    if executor not in ("local", "ray"):
        raise InputError(f"unknown executor {executor!r}; use 'local' or 'ray'")
    variant = resolve_models(checkpoints_dir, options).variant_key
    warn = (lambda message: events.log(message, "warn")) if events else None
    with preprocess_lock(storage, slug, variant, warn=warn):
        return _preprocess_locked(
            storage,
            slug,
            options,
            checkpoints_dir,
            executor,
            events,
            batch_size=batch_size,
            vae_batch_frames=vae_batch_frames,
            device=device,
            ray_address=ray_address,
            ray_config=ray_config,
        )


def _preprocess_locked(
    storage: Storage,
    slug: str,
    options: PreprocessOptions,
    checkpoints_dir: str | Path,
    executor: Executor,
    events: EventLog | None,
    *,
    batch_size: int,
    vae_batch_frames: int,
    device: str | None,
    ray_address: str | None,
    ray_config: RayPipelineConfig | None,
) -> PreprocessResult:
    """`preprocess_dataset` once its lock is held."""
    plan = make_plan(storage, slug, options, str(checkpoints_dir), events)
    if events:
        _log_plan(plan, events)
    outputs: dict[str, SampleOutputs] = {}
    if plan.jobs:
        if executor == "ray":
            from hotstep_ray.preprocess.ray_pipeline import RayPipelineConfig, run_ray

            config = ray_config or RayPipelineConfig(batch_size=batch_size)
            outputs = run_ray(storage, plan, config, events, ray_address)
        else:
            outputs = run_local(storage, plan, events, batch_size, vae_batch_frames, device)
    return finalize(storage, plan, outputs, events)


def _log_plan(plan: RunPlan, events: EventLog) -> None:
    reasons: dict[str, int] = {}
    for job in plan.jobs:
        reasons[job.reason] = reasons.get(job.reason, 0) + 1
    detail = ", ".join(f"{n} {why}" for why, n in sorted(reasons.items())) or "nothing"
    recovered = f" ({len(plan.recovered)} left by an interrupted run)" if plan.recovered else ""
    events.log(
        f"variant {plan.paths.variant_key}: {len(plan.jobs)} to encode ({detail}), "
        f"{len(plan.carried)} cached{recovered}"
    )
    if plan.stale:
        were = "was" if len(plan.stale) == 1 else "were"
        events.log(f"{_files(plan.stale)} {were} made with other settings: re-encoding", "warn")
    if plan.dropped:
        events.log(
            f"dropped {_files(plan.dropped)} outside this run's samples: their headers disagree "
            "with their entries (a run over those samples encodes them)",
            "warn",
        )


def _files(ids: list[str]) -> str:
    return f"{len(ids)} cached file" + ("" if len(ids) == 1 else "s")


def run_local(
    storage: Storage,
    plan: RunPlan,
    events: EventLog | None = None,
    batch_size: int = 4,
    vae_batch_frames: int = VAE_BATCH_FRAMES,
    device: str | None = None,
    decode_workers: int = 4,
) -> dict[str, SampleOutputs]:
    """Encode `plan.jobs` in this process (jobs are already sorted shortest first). The next
    batch decodes on worker threads while the current one encodes (libsndfile and torch's
    resampling convolution release the GIL), so a GPU does not wait on the CPU between batches."""
    import torch

    from hotstep_ray.preprocess.encode import Encoder
    from hotstep_ray.preprocess.items import allocator_env

    if not torch.cuda.is_initialized():  # torch reads it when CUDA starts in this process
        os.environ.update(allocator_env())
    opts = plan.options
    encoder = Encoder.load(plan.paths, encoder_settings(opts, vae_batch_frames), device)
    info = plan_info(plan)
    outputs: dict[str, SampleOutputs] = {}
    total = len(plan.jobs)
    batches = [plan.jobs[i : i + batch_size] for i in range(0, total, batch_size)]
    with ThreadPoolExecutor(max_workers=max(1, decode_workers)) as pool:
        pending = [pool.submit(decode_job, job, opts) for job in batches[0]]
        for index in range(len(batches)):
            decoded = [future.result() for future in pending]
            if index + 1 < len(batches):
                pending = [pool.submit(decode_job, job, opts) for job in batches[index + 1]]
            for item, result in zip(decoded, encode_decoded(encoder, decoded, info), strict=True):
                write_outputs(storage, plan.tensor_dir, item.job, result)
                outputs[item.job.sample_id] = result
                if events:
                    failed = sum(1 for out in outputs.values() if not out.entry["ok"])
                    events.progress(len(outputs), total, "preprocess", failed, item.job.sample_id)
                    if not result.entry["ok"]:
                        events.log(f"{item.job.rel_path}: {result.entry['error']}", "warn")
    return outputs


def inspect_decode(
    storage: Storage,
    slug: str,
    variant_key: str,
    sample_id: str,
    out_wav: str | Path,
    *,
    vae_path: str | Path | None = None,
    device: str | None = None,
) -> Path:
    """Decode a cached `target_latents` through the VAE to a 48 kHz stereo WAV at `out_wav`, so
    a person can listen to what the trainer will learn (the seed's trap 14: a wrong channel
    layout or rate shows up as slow, low or garbled audio, which no metadata check catches).
    The VAE is the one recorded in preprocess_meta.json unless `vae_path` is given."""
    tensor_dir = layout.tensor_dir(slug, variant_key)
    meta_key = f"{tensor_dir}/{META_FILE}"
    if not storage.exists(meta_key):
        raise InputError(f"no preprocessed variant {variant_key!r} for {slug!r} ({meta_key})")
    meta = storage.read_json(meta_key)
    entry = next((e for e in meta["samples"] if e["sample_id"] == sample_id), None)
    if entry is None:
        known = ", ".join(e["sample_id"] for e in meta["samples"][:10])
        raise InputError(f"no sample {sample_id!r} in {tensor_dir} (have: {known})")
    if not entry.get("ok"):
        raise InputError(f"sample {sample_id} failed to preprocess: {entry.get('error')}")
    from hotstep_ray.models.text_models import load_vae
    from hotstep_ray.preprocess.vae_tiles import decode_latents

    tensors, _ = read_sample(storage, f"{tensor_dir}/{entry['file']}")
    vae = load_vae(vae_path or meta["models"]["vae"], device=device)
    audio = decode_latents(vae, tensors["target_latents"].float())  # [2, T * 1920] at 48 kHz
    peak = float(audio.abs().max()) if audio.numel() else 0.0
    if peak > 1.0:  # the reference app normalises only when the decode clips
        audio = audio / peak
    out = Path(out_wav).expanduser()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(encode_audio(audio.numpy(), SAMPLE_RATE_HZ, "WAV"))
    return out
