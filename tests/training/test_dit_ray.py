"""DiT training on Ray Train, on a simulated 2-node cluster (CPU workers, gloo, fake VRAM_GB).

head node: 2 CPUs, VRAM_GB 24; second node: 2 CPUs, VRAM_GB 48. The killed-worker run keeps its
storage root on S3 (`rclone serve s3`, tests/cluster/cluster_support.py), opened with explicit
keys and endpoint: Ray's checkpoints then go through the root's own filesystem
(`distributed.ray_results`); rclone stores a pyarrow folder marker "a/" as a file "a", so the run
fails if Ray writes with an S3 client of its own."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from test_dit_support import (
    SLUG,
    fast_options,
    read_log,
    single_thread_fixture,  # noqa: F401  (fixtures)
    tiny_dit_dir_fixture,  # noqa: F401
    write_cache,
)
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parents[1] / "cluster"))  # the S3 server fixture
from cluster_support import ACCESS_KEY, SECRET_KEY, s3_server  # noqa: E402, F401  (fixture)

from hotstep_ray.cli.train_dit_cmd import app  # noqa: E402
from hotstep_ray.core.contracts import TrainDitOptions  # noqa: E402
from hotstep_ray.core.errors import InputError  # noqa: E402
from hotstep_ray.core.storage import Storage  # noqa: E402
from hotstep_ray.distributed.ray_results import results_location  # noqa: E402
from hotstep_ray.training import dit  # noqa: E402
from hotstep_ray.training.ray_dit import train_dit_on_ray  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.ray]


@pytest.fixture(scope="module")
def cluster():
    """Its own 2-node cluster; a session Ray instance started earlier is stopped for the module
    and started again afterwards."""
    import ray
    from ray.cluster_utils import Cluster

    from hotstep_ray.distributed.runtime import ensure_ray

    had_session = ray.is_initialized()
    if had_session:
        ray.shutdown()
    nodes = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 2, "resources": {"VRAM_GB": 24}}
    )
    big = nodes.add_node(num_cpus=2, resources={"VRAM_GB": 48})
    ray.init(address=nodes.address, logging_level="WARNING", log_to_driver=False)
    yield big.node_id
    ray.shutdown()
    nodes.shutdown()
    if had_session:
        ensure_ray(num_cpus=2)


@pytest.fixture
def storage(tmp_path) -> Storage:
    store = Storage(tmp_path / "data")
    write_cache(store)
    return store


def settings(tiny_dit_dir) -> dit.DitSettings:
    return dit.DitSettings(
        checkpoints_dir=str(tiny_dit_dir), export_interval_s=0, checkpoint_interval_s=0
    )


def _workers(storage: Storage, run_key: str) -> list[dict]:
    files = storage.list(f"{run_key}/workers")
    return [json.loads(storage.read_text(key)) for key in files]


def _cli_flags(options: TrainDitOptions) -> list[str]:
    """`train-dit` flags for every field of `options` that differs from the contract's default."""
    flags = []
    for name, value in options.model_dump().items():
        field = TrainDitOptions.model_fields[name]
        if name == "variant_key" or value == field.get_default(call_default_factory=True):
            continue
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else f"--no-{flag[2:]}")
        else:
            flags += [flag, ",".join(value) if isinstance(value, list) else str(value)]
    return flags


def test_a_paused_ray_run_continues_from_its_checkpoint_as_if_uninterrupted(
    cluster, storage, tiny_dit_dir, single_thread
) -> None:
    """`train-dit --ray --max-steps` pauses a Ray run mid-epoch with a checkpoint under the root,
    printing rank 0's epoch lines as they come; `--resume RUN` continues the run folder from that
    checkpoint (named by its step) and ends where one uninterrupted run ends."""
    options = fast_options(epochs=2, batch=1, grad_accum=1)  # 3 songs: 3 steps an epoch
    args = [SLUG, "--data", storage.url, "--checkpoints", str(tiny_dit_dir), "--ray"]
    args += ["--max-failures", "0", "--checkpoint-every-s", "0", *_cli_flags(options)]
    paused = CliRunner().invoke(app, [*args, "--max-steps", "4"])
    assert paused.exit_code == 0, paused.output
    assert any(line.startswith("  epoch 1/2  loss") for line in paused.output.splitlines())
    line = next(x for x in paused.output.splitlines() if x.startswith("paused: continue with"))
    run_key = line.split("--resume ", 1)[1].strip()
    assert read_log(storage, run_key)["stop_reason"] == "max_steps"
    ray_run = f"ray_results/{run_key.replace('/', '_')}"
    found = [k for k in storage.list(ray_run) if storage.exists(f"{k}/checkpoint.json")]
    named = sorted(key.rsplit("/", 1)[-1] for key in found)
    assert named == ["checkpoint_000003", "checkpoint_000004"]  # epoch 1's end, the pause
    resumed = CliRunner().invoke(app, [*args, "--resume", run_key, "--json"])
    assert resumed.exit_code == 0, resumed.output
    said = " ".join(resumed.output.split())  # rank 0's line, printed by the driver
    assert "resumed from " in said and "/checkpoint_000004 at step 4 (epoch 2)" in said
    summary = json.loads(resumed.output[resumed.output.index("{\n") :])
    assert summary["run_key"] == run_key and summary["stop_reason"] == "epochs"
    log = read_log(storage, run_key)
    assert log["resumes"] == [{"step": 4, "epoch": 2}] and log["steps"] == 6
    # the same run in this process, never paused (Ray's CPU workers run one thread, as here)
    full = dit.train(dit.setup(options, storage, SLUG, settings(tiny_dit_dir)))
    # the same kernels on this host and exact float32 checkpoint state: equal up to slack for a
    # worker whose allocations align differently (MKL may then round otherwise); rel 1e-6 ~ 8 ulp
    assert [e["loss"] for e in log["epochs"]] == pytest.approx(
        [e["loss"] for e in full.log["epochs"]], rel=1e-6
    )


def test_a_40gb_job_lands_only_on_the_node_that_has_it(cluster, storage, tiny_dit_dir) -> None:
    result = train_dit_on_ray(
        fast_options(epochs=2), storage, SLUG, settings(tiny_dit_dir), vram_gb=40, max_failures=0
    )
    (worker,) = _workers(storage, result.run_key)
    assert worker["node_id"] == cluster
    assert result.metrics["node_id"] == cluster and result.vram_gb == 40
    assert result.log["stop_reason"] == "epochs" and result.log["epochs_run"] == 2
    with pytest.raises(InputError, match="largest node offers 48"):
        train_dit_on_ray(fast_options(), storage, SLUG, settings(tiny_dit_dir), vram_gb=80)


def test_a_killed_worker_resumes_from_the_last_checkpoint_on_s3(
    cluster,
    s3_server,  # noqa: F811  (the imported fixture)
    tiny_dit_dir,
) -> None:
    storage = Storage(
        s3_server.root("ray-train"),
        key=ACCESS_KEY,
        secret=SECRET_KEY,
        client_kwargs={"endpoint_url": s3_server.endpoint},
    )
    write_cache(storage)
    options = fast_options(epochs=3, batch=1, grad_accum=1)  # 2 workers: 2 steps per epoch each
    run_settings = settings(tiny_dit_dir)
    run_settings.checkpoint_every_steps = 2
    result = train_dit_on_ray(
        options,
        storage,
        SLUG,
        run_settings,
        num_workers=2,
        vram_gb=8,
        max_failures=1,
        fail_at_step=4,  # rank 0 dies once the step-4 (end of epoch 2) checkpoint is registered
        job_id="killed-worker",  # rank 0's events
    )
    workers = sorted(_workers(storage, result.run_key), key=lambda w: w["rank"])
    assert [w["rank"] for w in workers] == [0, 1]
    assert all(not w["first_attempt"] for w in workers), workers  # both ran on the restart
    assert all(w["resumed_from"] == [{"step": 4, "epoch": 3}] for w in workers), workers
    assert all(w["steps"] == 6 for w in workers)
    # data parallel: both ranks hold the same adapter after every averaged step
    assert workers[0]["adapter_sha256"] == workers[1]["adapter_sha256"]
    assert result.log["resumes"] == [{"step": 4, "epoch": 3}]
    assert result.log["epochs_run"] == 3
    # Ray's own state sits under the root, in the bucket folder rclone serves
    path = results_location(storage)["storage_path"]
    assert path == f"{s3_server.bucket}/ray-train/ray_results"
    assert result.checkpoint_path and result.checkpoint_path.startswith(path + "/")
    run_dir = s3_server.on_disk(storage.url_of(f"ray_results/{result.run_name}"))
    reported = sorted(p.parent.name for p in run_dir.glob("checkpoint_*/checkpoint.json"))
    # named by step: each epoch's end (2 steps an epoch), before and after the kill
    assert reported == ["checkpoint_000002", "checkpoint_000004", "checkpoint_000006"], reported
    events = " ".join(storage.read_text("jobs/killed-worker/events.jsonl").split())
    assert "checkpoint_000004 (the workers were restarted) at step 4 (epoch 3)" in events
