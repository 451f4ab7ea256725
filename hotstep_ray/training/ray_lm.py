"""LM adapter training as a Ray Train job: the same setup -> train -> save in every worker.

Driver: size the job from the memory plan (`lm_setup.memory_plan`: every layer checkpointed, the
largest micro-batch), pick the run folder, start a `TorchTrainer` whose workers ask for the GPU
memory the plan needs (`distributed.gpu_share`: a share of one card for a one-worker job, whole
GPUs for several; CPU workers when there is no GPU), `FailureConfig(max_failures)`.
Worker: `setup_lm` on its device (DDP over the loss module when there are several workers; each
rank takes every world-th micro-batch group), resume from `ray.train.get_checkpoint()` when Ray
restarted it (else, with `resume`, from the run folder's `<run>/checkpoint/`), report a
checkpoint with `ray.train.report` at the options' cadence (`contracts.CheckpointCadence`); rank 0 exports the adapter and writes `lm_train_log.json` into
the run folder of the storage root, and appends the run's events to `spec.events_key` when given.
Stages: `extract` runs in the driver before the job is sized; without `train` nothing needs a
worker, so the stages run in the driver (`lm.run_lm_training`); `train` without `export` leaves
the final state in `<run>/checkpoint/` for a later export. `calibrate` is composed above:
`calibration.after_train.run_lm_on_ray_then_calibrate` runs this job, then calibrates the run on
Ray actors (one per worker).
"""

from __future__ import annotations

import contextlib
import math
import tempfile
import time
from typing import Any

import torch

from hotstep_ray.core.errors import InputError
from hotstep_ray.core.events import EventLog, jsonl_sink
from hotstep_ray.core.storage import Storage
from hotstep_ray.distributed.gpu_share import GB, gpu_worker_resources
from hotstep_ray.distributed.ray_results import checkpoint_folder, results_location
from hotstep_ray.distributed.runtime import worker_up_line
from hotstep_ray.training import lm, lm_save, lm_setup, lm_spec, lm_start
from hotstep_ray.training.lm_vram import GIB


def worker_need_gb(estimate_bytes: int, reserve_gib: float) -> float:
    """Decimal GB (the `VRAM_GB` resource's unit) one worker's memory plan needs, reserve included."""
    return float(math.ceil((estimate_bytes + reserve_gib * GIB) / GB))


def _rank0_says(setup: lm_setup.LmSetup, flag: bool) -> bool:
    """Rank 0's `flag`, on every rank."""
    if setup.world == 1:
        return flag
    import torch.distributed as dist

    value = torch.tensor([float(flag)], device=setup.device)
    dist.broadcast(value, src=0)
    return bool(value.item())


def _train_loop(config: dict[str, Any]) -> None:
    """Runs in each Ray Train worker."""
    import ray.train
    import ray.train.torch

    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    spec = lm_spec.LmTrainSpec.from_config(config["spec"])
    storage = Storage(config["storage_url"], **config.get("storage_options", {}))
    events = None
    if spec.events_key and rank == 0:
        events = EventLog(jsonl_sink(storage, spec.events_key))
        if config.get("submitted_at") and ray.train.get_checkpoint() is None:
            events.log(worker_up_line(config["submitted_at"]))
    device = ray.train.torch.get_device() if config["use_gpu"] else torch.device("cpu")
    # the driver logged the warm start already (`run_lm_on_ray`)
    setup = lm_setup.setup_lm(
        spec, storage, rank=rank, world=world, device=device, events=events, log_start=False
    )
    state = None
    restored = ray.train.get_checkpoint()
    if restored is not None:
        with checkpoint_folder(restored) as folder:
            state = lm_save.load_state(setup, Storage(folder), "")
        setup.log(f"resumed after a failure at epoch {state.epoch} (step {state.step})", "warn")
    elif config.get("resume"):  # the job's first attempt continues the run folder's checkpoint
        state = lm_save.load_state(setup, storage, lm_save.checkpoint_key(spec.run_key))
        setup.log(f"resumed {spec.run_key} at epoch {state.epoch} (step {state.step})")
    # Fault injection for tests: fail once, after this epoch's report.
    marker = f"{spec.run_key}/.injected-failure"
    fail_after = int(config.get("fail_after_epoch", 0))
    if restored is not None or storage.exists(marker):
        fail_after = 0
    due = lm.checkpoint_cadence(spec.options)

    def report(setup: lm_setup.LmSetup, state: lm_save.LmTrainState) -> None:
        # Only checkpoints are reported: each report waits for the controller's next poll of its
        # workers (`RAY_TRAIN_HEALTH_CHECK_INTERVAL_S`), and the epoch's metrics are in the run's
        # events already. Every rank reports together (a collective), so rank 0's clock decides.
        if not _rank0_says(setup, due(state)):
            return
        row = state.history[-1]
        metrics = {"epoch": state.epoch, "step": state.step, "loss": row["loss"]}
        if rank == 0:
            with tempfile.TemporaryDirectory() as folder:
                lm_save.save_state(setup, state, Storage(folder), "")
                checkpoint = ray.train.Checkpoint.from_directory(folder)
                ray.train.report(metrics, checkpoint=checkpoint)
        else:
            ray.train.report(metrics)
        if fail_after and state.epoch == fail_after and rank == 0:
            # Wait until Ray has registered the checkpoint just reported, then die.
            with contextlib.suppress(Exception):
                ray.train.get_all_reported_checkpoints(timeout_s=60)
            storage.write_text(marker, f"epoch {state.epoch}\n")
            raise RuntimeError(f"injected failure after epoch {state.epoch}")

    state = lm.train_lm(setup, state, on_epoch=report)
    if rank == 0:
        lm_save.save_lm(setup, state)
        if "export" not in setup.options.stages:  # what a later export stage reads
            lm_save.save_state(setup, state, storage, lm_save.checkpoint_key(setup.run_key))
        else:  # exported: a resumed run's checkpoint is spent, as in `lm.run_lm_training`
            storage.delete(lm_save.checkpoint_key(setup.run_key), recursive=True)
        storage.delete(marker)


def run_lm_on_ray(
    spec: lm_spec.LmTrainSpec,
    storage: Storage,
    *,
    num_workers: int = 1,
    use_gpu: bool | None = None,
    max_failures: int = 2,
    ray_address: str | None = None,
    fail_after_epoch: int = 0,
    events: EventLog | None = None,
    resume: bool = False,
) -> lm_save.LmRunResult:
    """Train on Ray and return what rank 0 wrote (run folder, files, the training log).
    `use_gpu=None` uses GPUs when the cluster has any; `events` (driver side: extract) defaults to
    appending to `spec.events_key`. `resume` continues the checkpoint in `spec.run_key` with the
    options it was trained with."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from hotstep_ray.core import layout
    from hotstep_ray.distributed.runtime import ensure_ray

    if spec.options.calibrate:  # composed above the trainer (module docstring)
        raise InputError(
            "this trainer does not calibrate: "
            "calibration.after_train.run_lm_on_ray_then_calibrate trains, then calibrates"
        )
    if events is None and spec.events_key:
        events = EventLog(jsonl_sink(storage, spec.events_key))
    ray = ensure_ray(ray_address)
    stages = spec.options.stages
    if "extract" in stages:
        extracted = lm.run_extract(spec, storage, events)
        stages = [s for s in stages if s != "extract"]
        if not stages:
            return lm.extract_only_result(extracted)
        spec = spec.model_copy(
            update={"options": spec.options.model_copy(update={"stages": stages})}
        )
    if "train" not in stages:  # export only: no worker needed
        return lm.run_lm_training(spec, storage, events=events, resume=resume)
    if resume:
        if not spec.run_key:
            raise InputError("resume needs the run folder (run_key) of the interrupted run")
        spec = lm.options_from_checkpoint(spec, storage, events)
    else:  # the warm start, refused here rather than in a worker; its identity sizes the plan
        dims = lm_spec.read_dims(spec.lm_dir)
        start = lm_start.resolve_start(
            spec, storage, dims, lm_spec.lm_size_of(dims, spec.options.lm_size)
        )
        spec = spec.model_copy(update={"options": start.options})
        if events is not None:
            events.log(start.line)
    if use_gpu is None:
        use_gpu = ray.cluster_resources().get("GPU", 0) > 0
    estimate = lm_setup.memory_plan(spec, storage)
    if not spec.run_key:
        size = lm_spec.lm_size_of(lm_spec.read_dims(spec.lm_dir), spec.options.lm_size)
        run_key = layout.new_run_dir(storage, layout.lm_adapter_base(size), spec.artist)
        spec = spec.model_copy(update={"run_key": run_key})
    if use_gpu:
        need_gb = worker_need_gb(estimate.total, spec.engine.vram_reserve_gib)
        resources = gpu_worker_resources(need_gb, num_workers, ray.nodes())
    else:
        resources = {"CPU": 1}
    name = layout.ray_run_name(spec.run_key)
    trainer = TorchTrainer(
        _train_loop,
        train_loop_config={
            "spec": spec.to_config(),
            "storage_url": storage.url,
            "storage_options": storage.storage_options,
            "use_gpu": use_gpu,
            "fail_after_epoch": fail_after_epoch,
            "resume": resume,
            "submitted_at": time.time(),  # the worker says how long it took to come up
        },
        scaling_config=ScalingConfig(
            num_workers=num_workers, use_gpu=use_gpu, resources_per_worker=resources
        ),
        run_config=RunConfig(
            name=name,
            **results_location(storage),
            failure_config=FailureConfig(max_failures=max_failures),
            checkpoint_config=CheckpointConfig(num_to_keep=2),
        ),
    )
    result = trainer.fit()
    if result.error is not None:
        raise result.error
    log = storage.read_json(f"{spec.run_key}/{lm_save.LOG_FILE}")
    files = [k for k in storage.list(spec.run_key) if not storage.is_dir(k)]
    return lm_save.LmRunResult(spec.run_key, files, log, finished=True)
