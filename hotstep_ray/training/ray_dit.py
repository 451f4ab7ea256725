"""DiT adapter training as a Ray Train job: the recipe of `dit.py` in each `TorchTrainer` worker.

Placement. The driver predicts the least GPU memory the job can run in (`dit_vram`, with the
user's fixed choices) and asks every worker for `{"GPU": share, "VRAM_GB": n}`
(`distributed.gpu_share`: a one-worker job takes the share of a card its memory needs, so it can
train beside another; several workers take whole GPUs), so Ray only places it on a node that
declared enough: start each GPU node with
`ray start --num-gpus G --resources '{"VRAM_GB": <GB per GPU x G>}'` (keep one GPU size per node,
the usual cloud case: a node mixing sizes pools them). A request no node can meet fails at once
with the numbers instead of pending forever; a cluster that declares no `VRAM_GB` at all gets a
warning and plain GPU placement. On the worker the auto-fit then sizes crop/checkpointing/batch to
the memory really free (and refuses clearly if it is still too small).

Workers. One process per GPU; gradients are averaged across workers after every optimizer window
(one flat all-reduce: NCCL on GPUs, gloo on CPUs); rank 0 exports, logs and writes events into the
job's `events.jsonl` (or `settings.events_key`: the CLI follows that file to print them); each rank
takes its share of every epoch's micro-batches.

Fault tolerance. Checkpoints (`training/checkpoint.py` files) go through `ray.train.report` into
`<storage root>/ray_results/<run key>/checkpoint_<step, 6 digits>/` (local or s3://); with
`FailureConfig(max_failures)` a killed worker's group is restarted and continues from the newest
reported checkpoint (rank 0 logs "resumed from ..."), drawing the very same crops/timesteps/noise
it would have (the data streams are seeded per step).

Calibration is composed above: `calibration.after_train.train_dit_on_ray_then_calibrate` runs
this job, then evaluates the run's adapter and milestones x scales on Ray actors (one per worker)
and bakes `<run>-calibrated/`; this function refuses `options.calibrate`.

Tests run all of this on CPUs: `use_gpu=False, resources_per_worker={"CPU": 1, "VRAM_GB": n}`.
"""

from __future__ import annotations

import hashlib
import json
import math
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from hotstep_ray.core import layout
from hotstep_ray.core.contracts import TrainDitOptions
from hotstep_ray.core.errors import InputError, StorageError
from hotstep_ray.core.events import EventLog, jsonl_sink
from hotstep_ray.core.storage import Storage
from hotstep_ray.distributed.gpu_share import VRAM_RESOURCE, gpu_worker_resources
from hotstep_ray.distributed.ray_results import checkpoint_folder, results_location
from hotstep_ray.distributed.runtime import die_after_checkpoint, worker_up_line
from hotstep_ray.training import adapters, dit, dit_data, dit_setup, dit_state, dit_vram

WORKERS_DIR = "workers"


def read_dit_config(folder: Path) -> dict[str, Any]:
    """The DiT's shape config without loading weights (official or diffusers layout)."""
    for path in (folder / "config.json", folder / "transformer" / "config.json"):
        if path.is_file():
            return json.loads(path.read_text())
    raise InputError(f"{folder}: no config.json or transformer/config.json")


def vram_request_gb(
    options: TrainDitOptions, settings: dit.DitSettings, storage: Storage, dataset: str
) -> tuple[float, Path]:
    """GB each worker must find on its GPU: the least the job can run in, plus the reserve."""
    cache_key = layout.tensor_dir(dataset, options.variant_key)
    shapes = dit_data.scan_cache(storage, cache_key)
    meta_key = f"{cache_key}/{dit_data.META_FILE}"
    meta = storage.read_json(meta_key) if storage.exists(meta_key) else {}
    folder = dit.resolve_dit_folder(
        meta, options.variant_key, settings.dit_folder, settings.checkpoints_dir
    )
    dims = dit_vram.DitDims.from_config(read_dit_config(folder))
    spec = dit.adapter_spec(options, settings, dims)
    need = dit_vram.min_required_bytes(
        dims,
        spec,
        options,
        longest_song=shapes.longest,
        condition_len=shapes.condition_len,
    )
    return math.ceil((need + options.vram_reserve_mb * 1e6) / dit_vram.GB), folder


def check_placement(ray_module: Any, vram_gb: float) -> bool:
    """True when the cluster declares `VRAM_GB` (then the request is used); raises when no alive
    node offers `vram_gb`; False (plain GPU placement) when no node declares the resource."""
    offered = [
        node["Resources"].get(VRAM_RESOURCE, 0.0)
        for node in ray_module.nodes()
        if node.get("Alive")
    ]
    if not any(offered):
        return False
    if max(offered) < vram_gb:
        raise InputError(
            f"this DiT job needs {vram_gb:g} GB of GPU memory per worker but the largest node "
            f"offers {max(offered):g} {VRAM_RESOURCE}; train fewer layers (--layers), lower "
            "--crop-min-frames, or add a larger GPU"
        )
    return True


@dataclass
class RayDitResult:
    run_key: str
    run_name: str
    vram_gb: float
    metrics: dict[str, Any]
    checkpoint_path: str | None
    log: dict[str, Any]
    # Ray's last checkpoint as a key under the storage root (`ray_results/<run>/checkpoint_N`):
    # what `settings.resume` / `train-dit --resume` continue from; "" when none was reported
    checkpoint_key: str = ""
    dit_folder: str = ""  # the base DiT folder the run trained on
    # the calibration summary, filled in by `calibration.after_train` when `calibrate` ran
    calibration: dict[str, Any] | None = None


def train_dit_on_ray(
    options: TrainDitOptions,
    storage: Storage,
    dataset: str,
    settings: dit.DitSettings | None = None,
    *,
    num_workers: int = 1,
    use_gpu: bool | None = None,
    vram_gb: float | None = None,
    max_failures: int = 2,
    job_id: str | None = None,
    fail_at_step: int | None = None,
    max_steps: int | None = None,
) -> RayDitResult:
    """Run DiT training as a Ray Train job on the connected cluster (call `ensure_ray` first).

    `vram_gb` overrides the predicted per-worker request; `fail_at_step` (tests, drills) makes
    rank 0 exit hard once the first checkpoint at or after that step is registered (first
    attempt only); rank 0 writes its events into the job's events.jsonl when `job_id` is given.
    `max_steps` pauses the run after that many optimizer steps (resumed ones count) with a
    checkpoint; `settings.resume` (a checkpoint folder key: a local run's `<run>/checkpoint` or a
    Ray run's `checkpoint_key`) starts the job from it, while a worker Ray restarts continues from
    Ray's own newer checkpoint."""
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    if options.calibrate:  # composed above the trainer (module docstring)
        raise InputError(
            "this trainer does not calibrate: "
            "calibration.after_train.train_dit_on_ray_then_calibrate trains, then calibrates"
        )
    settings = settings or dit.DitSettings()
    dit.check_run_folder(options, storage, settings)
    # refused here, before any worker starts (a worker's refusal would end in a Ray traceback)
    dit_setup.check_trigger_request(storage, settings, dataset, options.variant_key)
    dit_setup.check_warm_start(options, storage, settings, dataset)
    predicted, folder = vram_request_gb(options, settings, storage, dataset)
    vram_gb = predicted if vram_gb is None else vram_gb
    declared = check_placement(ray, vram_gb)
    if use_gpu is None:
        use_gpu = bool(ray.cluster_resources().get("GPU", 0))
    if use_gpu:  # a share of one card for a one-worker job (`distributed.gpu_share`)
        resources = gpu_worker_resources(vram_gb, num_workers, ray.nodes()) if declared else {}
    else:
        resources = {"CPU": 1, VRAM_RESOURCE: vram_gb} if declared else {"CPU": 1}
    # One run folder for every worker and every restart.
    artist = layout.check_name(settings.artist or options.adapter_name or dataset, "artist")
    run_key = settings.run_key or layout.new_run_dir(
        storage, layout.dit_adapter_base(folder.name), artist
    )
    run_name = layout.ray_run_name(run_key)
    worker_settings = {**asdict(settings), "run_key": run_key, "dit_folder": str(folder)}
    worker_settings["job_id"] = settings.job_id or job_id or ""  # recorded in the run's log
    worker_settings["zero_groups"] = list(settings.zero_groups)
    trainer = TorchTrainer(
        _worker,
        train_loop_config={
            "options": options.model_dump(mode="json"),
            "settings": worker_settings,
            "storage_url": storage.url,
            "storage_options": storage.storage_options,
            "dataset": dataset,
            "job_id": job_id,
            "fail_at_step": fail_at_step,
            "max_steps": max_steps,
            "submitted_at": time.time(),  # the worker says how long it took to come up
        },
        torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo"),
        scaling_config=ScalingConfig(
            num_workers=num_workers, use_gpu=use_gpu, resources_per_worker=resources
        ),
        run_config=RunConfig(
            name=run_name,
            **results_location(storage),
            failure_config=FailureConfig(max_failures=max_failures),
        ),
    )
    result = trainer.fit()
    log_key = f"{run_key}/{dit.LOG_FILE}"
    return RayDitResult(
        run_key=run_key,
        run_name=run_name,
        vram_gb=vram_gb,
        metrics=dict(result.metrics or {}),
        checkpoint_path=None if result.checkpoint is None else result.checkpoint.path,
        log=storage.read_json(log_key) if storage.exists(log_key) else {},
        checkpoint_key=_checkpoint_key(storage, result.checkpoint),
        dit_folder=str(folder),
    )


def _checkpoint_key(storage: Storage, checkpoint: Any) -> str:
    """Ray's checkpoint folder as a key under the root ("" when there is none, or Ray put it
    where the root cannot see: then only Ray's own restarts can use it)."""
    if checkpoint is None:
        return ""
    try:
        return storage.key_of(checkpoint.path)
    except StorageError:
        return ""


# =============================================================================== worker


def _adapter_digest(run: dit.DitRun) -> str:
    digest = hashlib.sha256()
    for key, value in sorted(adapters.adapter_state_dict(run.transformer).items()):
        digest.update(key.encode())
        digest.update(value.float().cpu().numpy().tobytes())
    return digest.hexdigest()


def _report_hook(fail_at_step: int | None):
    """`DitRun.checkpoint_hook` under Ray: every rank reports (a collective), rank 0 with the
    checkpoint folder."""
    import ray
    from ray.train import Checkpoint

    def report(run: dit.DitRun) -> None:
        metrics = {
            "step": run.state.step,
            "epoch": run.state.epoch,
            "loss": run.state.history[-1]["loss"] if run.state.history else None,
            "node_id": ray.get_runtime_context().get_node_id(),
            "run_key": run.run_key,
        }
        if run.is_main:
            with tempfile.TemporaryDirectory() as folder:
                dit.write_checkpoint(run, Storage(folder), "")
                ray.train.report(
                    metrics,
                    checkpoint=Checkpoint.from_directory(folder),
                    # named by progress, not Ray's timestamp: `checkpoint_000042` = 42 steps
                    checkpoint_dir_name=dit_state.ray_checkpoint_name(run.state.step),
                )
        else:
            ray.train.report(metrics)
        if run.is_main:
            die_after_checkpoint(fail_at_step, run.state.step)

    return report


def _worker(config: dict[str, Any]) -> None:
    import ray
    import ray.train
    import ray.train.torch

    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    device = ray.train.torch.get_device() if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    storage = Storage(config["storage_url"], **config["storage_options"])
    values = {**config["settings"], "rank": rank, "world_size": world, "device": str(device)}
    values["zero_groups"] = tuple(values["zero_groups"])
    checkpoint = ray.train.get_checkpoint()
    first_attempt = checkpoint is None
    asked = values["resume"]  # the checkpoint the job was asked to begin from (None: none)
    if not first_attempt:  # a restart: Ray's checkpoint is newer than the one the job began from
        values["resume"] = None
    settings = dit.DitSettings(**values)
    events = None
    events_key = settings.events_key or (
        layout.job_events(config["job_id"]) if config.get("job_id") else ""
    )
    if rank == 0 and events_key:
        events = EventLog(jsonl_sink(storage, events_key))
    if events is not None and first_attempt and config.get("submitted_at"):
        events.log(worker_up_line(config["submitted_at"]))
    options = TrainDitOptions.model_validate(config["options"])
    run = dit.setup(options, storage, config["dataset"], settings, events)
    if checkpoint is not None:
        shown = _checkpoint_key(storage, checkpoint) or checkpoint.path
        if shown != asked:  # not the one asked for: Ray restarted the workers after a failure
            shown = f"Ray's checkpoint {shown} (the workers were restarted)"
        with checkpoint_folder(checkpoint) as folder:
            dit.restore(run, Storage(folder), "", shown=shown)
    run.checkpoint_hook = _report_hook(config.get("fail_at_step") if first_attempt else None)
    result = dit.train(run, max_steps=config.get("max_steps"))
    storage.write_json(
        f"{run.run_key}/{WORKERS_DIR}/rank-{rank}.json",
        {
            "rank": rank,
            "world_size": world,
            "node_id": ray.get_runtime_context().get_node_id(),
            "device": str(device),
            "first_attempt": first_attempt,
            "resumed_from": run.state.resumes,
            "steps": result.steps,
            "stop_reason": result.stop_reason,
            "adapter_sha256": _adapter_digest(run),
        },
    )
