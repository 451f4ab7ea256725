"""The Ray Data pipeline: list -> decode/resample (CPU tasks) -> encode (actor pool, one
`Encoder` per actor, `num_gpus` each when the cluster has GPUs) -> write (CPU tasks).

Rows carry plain data only: the sample's job as JSON, decoded audio as float32 bytes, outputs
as file bytes. The actor pool autoscales between `min_actors` and `max_actors`, so a big batch
job can grow the cluster (Ray's autoscaler adds GPU nodes for pending actors). A fractional
`num_gpus_per_actor` (0.25) packs several actors on one GPU; each needs < 8 GiB at the default
VAE window batch. The driver only plans, streams results for progress events and writes the
three variant files, exactly as the plain path does (`run.finalize`). Each write task's file is
its song's own record (the safetensors header, see `plan.make_plan`), so a driver killed midway
keeps every song whose row was written, as the plain path does.

Checkpoint folders are read by the actors from local paths: on a multi-node cluster they must
exist at the same path on every GPU node (shared filesystem or a pre-synced folder).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from hotstep_ray.core.contracts import PreprocessOptions
from hotstep_ray.core.events import EventLog
from hotstep_ray.core.storage import Storage
from hotstep_ray.distributed.runtime import ensure_ray
from hotstep_ray.preprocess.cache import SampleOutputs, write_outputs
from hotstep_ray.preprocess.items import VAE_BATCH_FRAMES, EncoderSettings, allocator_env
from hotstep_ray.preprocess.model_paths import ModelPaths
from hotstep_ray.preprocess.plan import RunPlan
from hotstep_ray.preprocess.sample_job import SampleJob
from hotstep_ray.preprocess.stages import (
    Decoded,
    decode_job,
    encode_decoded,
    encoder_settings,
    plan_info,
)


@dataclass
class RayPipelineConfig:
    min_actors: int = 1
    max_actors: int = 1  # autoscaling ceiling of the encoder pool
    num_gpus_per_actor: float | None = None  # None: 1 when the cluster has GPUs, else 0
    num_cpus_per_actor: float = 1.0
    batch_size: int = 4  # samples per encoder call
    vae_batch_frames: int = VAE_BATCH_FRAMES  # latent frames per VAE forward inside one call
    decode_cpus: float = 1.0  # per decode task (resampling is CPU-bound)
    write_cpus: float = 0.25


# -- stage functions (module level: Ray pickles them by reference) -----------------------------
def _decode_row(row: dict[str, Any], opts_json: str) -> dict[str, Any]:
    job = SampleJob.from_json(row["job"])
    decoded = decode_job(job, PreprocessOptions.model_validate_json(opts_json))
    audio = decoded.audio
    return {
        "job": row["job"],
        "audio": b"" if audio is None else np.ascontiguousarray(audio).tobytes(),
        "facts": json.dumps(decoded.facts),
        "error": decoded.error,
    }


class _EncodeActor:
    """One `Encoder` per actor; the GPU (if any) is the one Ray assigned."""

    def __init__(self, paths: dict[str, str], settings: dict[str, Any], info: dict[str, Any]):
        import torch

        from hotstep_ray.preprocess.encode import Encoder  # model libraries: actors only

        device = "cuda" if torch.cuda.is_available() else "cpu"
        if device == "cuda":  # this process only encodes; VAE windows repeat one shape
            torch.backends.cudnn.benchmark = True
        self.encoder = Encoder.load(ModelPaths(**paths), EncoderSettings(**settings), device)
        self.info = info

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, list[Any]]:
        decoded = []
        for job_json, audio, facts, error in zip(
            batch["job"], batch["audio"], batch["facts"], batch["error"], strict=True
        ):
            samples = (
                np.frombuffer(audio, dtype=np.float32).reshape(2, -1).copy() if audio else None
            )
            decoded.append(
                Decoded(SampleJob.from_json(job_json), samples, json.loads(facts), error)
            )
        outputs = encode_decoded(self.encoder, decoded, self.info)
        columns: dict[str, list[Any]] = {
            name: [] for name in ("job", "entry", "codes_line", "files", "blob")
        }
        for item, out in zip(decoded, outputs, strict=True):
            columns["job"].append(item.job.to_json())
            columns["entry"].append(json.dumps(out.entry))
            columns["codes_line"].append(out.codes_line)
            # All of a sample's files as one binary blob + a JSON list of (name, size).
            files = out.files or {}
            columns["files"].append(json.dumps([[n, len(b)] for n, b in files.items()]))
            columns["blob"].append(b"".join(files.values()))
        return columns


def _write_row(row: dict[str, Any], root: str, storage_options: dict, tensor_dir: str):
    storage = Storage(root, **storage_options)
    blob, files, offset = row["blob"], {}, 0
    for name, size in json.loads(row["files"]):
        files[name] = bytes(blob[offset : offset + size])
        offset += size
    job = SampleJob.from_json(row["job"])
    out = SampleOutputs(json.loads(row["entry"]), row["codes_line"], files)
    write_outputs(storage, tensor_dir, job, out)
    return {"sample_id": job.sample_id, "entry": row["entry"], "codes_line": row["codes_line"]}


def encoder_remote_args(gpus: float) -> dict[str, Any]:
    """Extra actor options of a GPU encoder: the allocator configuration it must start with
    (`allocator_env`), as Ray merges an actor's env_vars into the job's."""
    env = allocator_env() if gpus > 0 else {}
    return {"runtime_env": {"env_vars": env}} if env else {}


def run_ray(
    storage: Storage,
    plan: RunPlan,
    config: RayPipelineConfig,
    events: EventLog | None = None,
    address: str | None = None,
) -> dict[str, SampleOutputs]:
    """Run `plan.jobs` through Ray Data; returns each sample's outputs (files already written)."""
    ensure_ray(address)
    import ray
    import ray.data

    gpus = config.num_gpus_per_actor
    if gpus is None:
        gpus = 1.0 if ray.cluster_resources().get("GPU", 0) > 0 else 0.0
    context = ray.data.DataContext.get_current()
    context.execution_options.preserve_order = True  # same batches as the plain path
    context.enable_progress_bars = False  # progress goes to our event stream instead
    rows = [{"job": job.to_json()} for job in plan.jobs]
    dataset = ray.data.from_items(rows, override_num_blocks=max(1, len(rows)))
    dataset = dataset.map(
        _decode_row,
        fn_kwargs={"opts_json": plan.options.model_dump_json()},
        num_cpus=config.decode_cpus,
    )
    settings = asdict(encoder_settings(plan.options, config.vae_batch_frames))
    dataset = dataset.map_batches(
        _EncodeActor,
        fn_constructor_kwargs={
            "paths": plan.paths.to_dict(),
            "settings": settings,
            "info": plan_info(plan),
        },
        batch_size=config.batch_size,
        batch_format="numpy",
        compute=ray.data.ActorPoolStrategy(
            min_size=config.min_actors, max_size=max(config.min_actors, config.max_actors)
        ),
        num_gpus=gpus,
        num_cpus=config.num_cpus_per_actor,
        **encoder_remote_args(gpus),
    )
    dataset = dataset.map(
        _write_row,
        fn_kwargs={
            "root": storage.url,
            "storage_options": storage.storage_options,
            "tensor_dir": plan.tensor_dir,
        },
        num_cpus=config.write_cpus,
    )
    outputs: dict[str, SampleOutputs] = {}
    failed = 0
    for row in dataset.iter_rows():
        out = SampleOutputs(json.loads(row["entry"]), row["codes_line"])
        outputs[row["sample_id"]] = out
        if events:
            failed += 0 if out.entry["ok"] else 1
            events.progress(len(outputs), len(rows), "preprocess", failed, row["sample_id"])
            if not out.entry["ok"]:
                events.log(f"{out.entry['rel_path']}: {out.entry['error']}", "warn")
    return outputs
