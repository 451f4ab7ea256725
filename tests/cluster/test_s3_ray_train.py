"""Ray Train with the storage root on S3 (`rclone serve s3`, see cluster_support): the run's
checkpoints go through `ray.train.report` into `s3://.../ray_results/`, and a worker killed
mid-run resumes from the one it reported there.

The root is opened with explicit keys and endpoint, so nothing reaches Ray's pyarrow side
through the environment: Ray writes through the root's own filesystem
(`distributed.ray_results`). rclone also stores a pyarrow folder marker "a/" as a file "a", so
this test fails if Ray writes with its own S3 filesystem."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from cluster_support import ACCESS_KEY, SECRET_KEY

sys.path.insert(0, str(Path(__file__).parents[1] / "training"))  # the DiT tests' cache helpers
from test_dit_support import SLUG, fast_options, write_cache  # noqa: E402

from hotstep_ray.core.storage import Storage  # noqa: E402
from hotstep_ray.distributed.ray_results import results_location  # noqa: E402
from hotstep_ray.models.tiny_dit import write_tiny_dit  # noqa: E402
from hotstep_ray.training import dit  # noqa: E402
from hotstep_ray.training.ray_dit import train_dit_on_ray  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.ray]


def test_dit_checkpoints_on_s3_and_a_killed_worker_resumes(
    s3_server, ray_session, tmp_path
) -> None:
    storage = Storage(
        s3_server.root("ray-train"),
        key=ACCESS_KEY,
        secret=SECRET_KEY,
        client_kwargs={"endpoint_url": s3_server.endpoint},
    )
    write_cache(storage)
    write_tiny_dit(tmp_path / "checkpoints" / "turbo", "turbo", seed=0)
    settings = dit.DitSettings(
        checkpoints_dir=str(tmp_path / "checkpoints"),
        export_interval_s=0,
        checkpoint_interval_s=0,
        checkpoint_every_steps=2,
    )
    result = train_dit_on_ray(
        fast_options(epochs=3, batch=1, grad_accum=1),  # 3 songs: 3 steps per epoch
        storage,
        SLUG,
        settings,
        vram_gb=1,
        max_failures=1,
        fail_at_step=4,  # dies once the step-4 checkpoint is registered, first attempt only
    )
    assert result.log["stop_reason"] == "epochs" and result.log["epochs_run"] == 3
    assert result.log["resumes"] and result.log["resumes"][0]["step"] == 4
    # Ray's own state sits under the root, in the bucket folder rclone serves
    path, _ = results_location(storage)
    assert path == f"{s3_server.bucket}/ray-train/ray_results"
    assert result.checkpoint_path and result.checkpoint_path.startswith(path + "/")
    run_dir = s3_server.on_disk(storage.url_of(f"ray_results/{result.run_name}"))
    reported = sorted(p.parent.name for p in run_dir.glob("checkpoint_*/checkpoint.json"))
    assert len(reported) >= 2, reported  # before and after the kill
    (worker,) = [
        json.loads(storage.read_text(k)) for k in storage.list(f"{result.run_key}/workers")
    ]
    assert not worker["first_attempt"] and worker["resumed_from"] == [{"step": 4, "epoch": 2}]
    assert storage.exists(f"{result.run_key}/{dit.LOG_FILE}")
