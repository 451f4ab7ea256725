"""The issue's cluster gate: a simulated 2-node Ray cluster whose second node advertises one
(fake) GPU. Encoder actors ask for a GPU, so they can only run on that node; torch finds no CUDA
there and encodes on the CPU. Every sample must be processed exactly once.

It starts its own cluster, so it runs in a subprocess (one Ray per process, and the session Ray
is already up) and costs ~30 s on 2 cores: opt in with HOTSTEP_CLUSTER_TESTS=1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from preprocess_support import make_song_folder, new_dataset

from hotstep_ray.core.storage import Storage

pytestmark = [
    pytest.mark.ray,
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("HOTSTEP_CLUSTER_TESTS") != "1",
        reason="starts a 2-node Ray cluster (~30 s); set HOTSTEP_CLUSTER_TESTS=1",
    ),
]

SCRIPT = textwrap.dedent(
    """
    import json, sys
    import ray
    from ray.cluster_utils import Cluster
    from hotstep_ray.core.storage import Storage
    from hotstep_ray.core.contracts import PreprocessOptions
    from hotstep_ray.preprocess.ray_pipeline import RayPipelineConfig
    from hotstep_ray.preprocess.run import preprocess_dataset

    root, slug, ckpt = sys.argv[1:4]
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=2, num_gpus=1)  # the "GPU" node; no CUDA behind it
    ray.init(address=cluster.address, log_to_driver=False)
    config = RayPipelineConfig(num_gpus_per_actor=1, decode_cpus=0.5, write_cpus=0.25)
    result = preprocess_dataset(
        Storage(root), slug, PreprocessOptions(), ckpt, executor="ray", ray_config=config
    )
    gpus = ray.cluster_resources().get("GPU", 0)
    print("RESULT " + json.dumps({"result": result.to_json_dict(), "gpus": gpus}))
    ray.shutdown()
    cluster.shutdown()
    """
)


def test_two_node_cluster_with_a_fake_gpu_node(tmp_path, tiny_ckpt) -> None:
    source = make_song_folder(tmp_path / "songs")
    storage = Storage(tmp_path / "root")
    slug = new_dataset(storage, source)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "root"), slug, str(tiny_ckpt)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    report = json.loads(lines[-1][len("RESULT ") :])
    result = report["result"]
    assert report["gpus"] == 1
    assert result["processed"] == 3 and result["failed"] == 0
    assert len(set(result["written"])) == len(result["written"]) == 3  # each sample once
    files = sorted(p.name for p in storage.local_path(f"tensors/{slug}").rglob("*.safetensors"))
    assert len(files) == 3
