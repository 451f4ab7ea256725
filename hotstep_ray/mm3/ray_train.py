"""MM3 DiT LoRA training as a Ray Train job: the recipe of `train.py` in one `TorchTrainer` worker.

Placement (as `training.ray_dit`, whose helpers this imports): the driver predicts the GPU memory
the run needs (`vram.py`: frozen DiT + LoRA/AdamW + activations, anchored on the H200 bench) and
asks the worker for `{"GPU": 1, "VRAM_GB": n}`, so Ray places it only on a node started with
`ray start --resources '{"VRAM_GB": <GB per GPU x GPUs>}'`. A request no node can meet fails at
once with the numbers (`check_placement`); a cluster that declares no `VRAM_GB` gets plain GPU
placement.

One worker: the full DiT trains at 689 latents in ~8 GiB, so one GPU is the job; the recipe's
draws are indexed by step, not by rank, so data parallelism is not wired (a second worker would
repeat the first one's crops).

Fault tolerance: every `save_every` steps (default steps / 10 here) the worker writes the
resumable checkpoint (`training.checkpoint` files) into a temporary folder and hands it to
`ray.train.report`, which keeps it under `<storage root>/ray_results/<run name>/`. With
`FailureConfig(max_failures)` a lost worker is restarted, restores the newest reported checkpoint
and continues; the crops, times and noise of every later step are those an uninterrupted run
draws (`flow.generator` is seeded per step), so the adapter ends the same. The run folder
`adapters/mm3-dit/<artist>/<run>/` is fixed by the driver, so every attempt writes into it.

Tests run it on CPUs: `use_gpu=False` asks for `{"CPU": 1, "VRAM_GB": n}`.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hotstep_ray.core import layout
from hotstep_ray.core.events import EventLog, jsonl_sink
from hotstep_ray.core.storage import Storage
from hotstep_ray.distributed.ray_results import checkpoint_folder, results_location
from hotstep_ray.distributed.runtime import die_after_checkpoint
from hotstep_ray.mm3 import checkpoint as ckpt
from hotstep_ray.mm3 import train, vram
from hotstep_ray.training.ray_dit import VRAM_RESOURCE, WORKERS_DIR, check_placement

DEFAULT_CHECKPOINTS = 10  # reported checkpoints per run when `save_every` is 0


def read_transformer_config(checkpoints: str | Path) -> dict[str, Any]:
    """The MM3 DiT's config.json (shape only, no weights) from the MM3 folder under
    `checkpoints`."""
    paths = ckpt.Mm3Paths.find(checkpoints)
    paths.require("train-dit")
    return json.loads((paths.root / "transformer" / "config.json").read_text())


def predicted_vram_gb(options: train.Mm3TrainOptions, checkpoints: str | Path) -> int:
    return vram.request_gb(read_transformer_config(checkpoints), options)


@dataclass
class RayMm3Result:
    run_key: str  # adapters/mm3-dit/<artist>/<run>
    run_name: str  # the Ray Train run under ray_results/
    vram_gb: float
    metrics: dict[str, Any]  # the last `ray.train.report`
    checkpoint_path: str | None
    paths: dict[str, str]  # what `train.save` wrote (storage keys)


def train_mm3_on_ray(
    options: train.Mm3TrainOptions,
    storage: Storage,
    slug: str,
    checkpoints: str,
    *,
    use_gpu: bool | None = None,
    vram_gb: float | None = None,
    max_failures: int = 2,
    job_id: str | None = None,
    fail_at_step: int | None = None,
) -> RayMm3Result:
    """Run `mm3 train-dit` as a Ray Train job on the connected cluster (call `ensure_ray` first).

    `vram_gb` overrides the predicted request; `fail_at_step` (tests, drills) makes the worker exit
    hard once the first checkpoint at or after that step is registered (first attempt only)."""
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    if vram_gb is None:
        vram_gb = predicted_vram_gb(options, checkpoints)
    declared = check_placement(ray, vram_gb)
    if use_gpu is None:
        use_gpu = bool(ray.cluster_resources().get("GPU", 0))
    resources: dict[str, float] = {} if use_gpu else {"CPU": 1}
    if declared:
        resources[VRAM_RESOURCE] = vram_gb
    if not options.save_every:
        options = options.model_copy(
            update={"save_every": max(1, options.steps // DEFAULT_CHECKPOINTS)}
        )
    artist = layout.check_name(options.adapter_name or slug, "adapter name")
    run_key = layout.new_run_dir(storage, train.ADAPTER_BASE, artist)
    run_name = layout.ray_run_name(run_key)
    trainer = TorchTrainer(
        _worker,
        train_loop_config={
            "options": options.model_dump(mode="json"),
            "storage_url": storage.url,
            "storage_options": storage.storage_options,
            "slug": slug,
            "checkpoints": str(checkpoints),
            "run_key": run_key,
            "job_id": job_id,
            "fail_at_step": fail_at_step,
        },
        torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo"),
        scaling_config=ScalingConfig(
            num_workers=1, use_gpu=use_gpu, resources_per_worker=resources
        ),
        run_config=RunConfig(
            name=run_name,
            **results_location(storage),
            failure_config=FailureConfig(max_failures=max_failures),
        ),
    )
    result = trainer.fit()
    metrics = dict(result.metrics or {})
    return RayMm3Result(
        run_key=run_key,
        run_name=run_name,
        vram_gb=vram_gb,
        metrics=metrics,
        checkpoint_path=None if result.checkpoint is None else result.checkpoint.path,
        paths=dict(metrics.get("paths") or {}),
    )


# =============================================================================== worker


def _report(run: train.Mm3Run, step: int, extra: dict[str, Any] | None = None) -> None:
    """Write the resumable checkpoint to a temporary folder and report it with the metrics."""
    import ray
    from ray.train import Checkpoint

    metrics = {
        "step": step,
        "loss": run.losses[-1] if run.losses else None,
        "node_id": ray.get_runtime_context().get_node_id(),
        "run_key": run.out_dir,
        **(extra or {}),
    }
    with tempfile.TemporaryDirectory() as folder:
        train.save_state(run, step, Storage(folder), "")
        ray.train.report(metrics, checkpoint=Checkpoint.from_directory(folder))


def _report_hook(fail_at_step: int | None):
    def hook(run: train.Mm3Run, step: int) -> None:
        _report(run, step)
        die_after_checkpoint(fail_at_step, step)

    return hook


def _worker(config: dict[str, Any]) -> None:
    import ray
    import ray.train
    import ray.train.torch
    import torch

    device = ray.train.torch.get_device() if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    storage = Storage(config["storage_url"], **config["storage_options"])
    options = train.Mm3TrainOptions.model_validate(config["options"])
    options = options.model_copy(update={"device": str(device), "resume": ""})
    events = None
    if config.get("job_id"):
        events = EventLog(jsonl_sink(storage, layout.job_events(config["job_id"])))
    run = train.setup(
        storage, config["slug"], config["checkpoints"], options, events, out_dir=config["run_key"]
    )
    checkpoint = ray.train.get_checkpoint()
    first_attempt = checkpoint is None
    if checkpoint is not None:
        with checkpoint_folder(checkpoint) as folder:
            train.restore(run, Storage(folder), "")
    run.checkpoint_hook = _report_hook(config.get("fail_at_step") if first_attempt else None)
    gate = train.train(run)
    paths = train.save(run, gate)
    storage.write_json(
        f"{run.out_dir}/{WORKERS_DIR}/rank-0.json",
        {
            "node_id": ray.get_runtime_context().get_node_id(),
            "device": str(device),
            "first_attempt": first_attempt,
            "resumed_from": run.resumes,
            "steps": options.steps,
        },
    )
    _report(run, options.steps, {"paths": paths, "delta_median": gate.median})
