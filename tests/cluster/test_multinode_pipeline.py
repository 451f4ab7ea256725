"""A simulated multi-node cluster (`ray.cluster_utils.Cluster`, one machine) with the node types of
`cluster/`: a head without GPU or VRAM (it doubles as the CPU node that labels), and two "GPU"
nodes that declare 24 and 48 `VRAM_GB` (no real GPU behind them: the work runs on their CPUs). label → preprocess → train runs
across it, and the DiT job is placed by its VRAM need.

Every node reads the tiny checkpoint tree and the storage root from local paths, which is fine on
one machine; a real cluster shares them through S3 or a shared mount (docs/CLUSTER.md)."""

from __future__ import annotations

import json
import sys

import pytest
from cluster_support import SONGS, TAG, write_songs
from ray import cloudpickle

from hotstep_ray.core.contracts import CreateDatasetInput
from hotstep_ray.core.errors import InputError
from hotstep_ray.core.storage import Storage
from hotstep_ray.dataset.store import build_dataset, create_dataset, read_labels
from hotstep_ray.labeling.job import label_dataset
from hotstep_ray.labeling.ray_pool import LabelPools, PoolOptions
from hotstep_ray.main_job import OFFLINE_LABELS, _with, tiny_recipe
from hotstep_ray.preprocess.ray_pipeline import RayPipelineConfig
from hotstep_ray.preprocess.run import preprocess_dataset
from hotstep_ray.training import dit
from hotstep_ray.training.ray_dit import train_dit_on_ray

pytestmark = [pytest.mark.ray, pytest.mark.slow]
cloudpickle.register_pickle_by_value(sys.modules[__name__])
VARIANT = "acestep-v15-turbo"


@pytest.fixture(scope="module")
def nodes():
    """head (1 CPU, no GPU, no VRAM_GB), gpu24 and gpu48 (1 CPU each, VRAM_GB 24 / 48): node ids
    by name (each node costs a raylet and workers, so three, not one per launcher node type). The session Ray (if any) is stopped meanwhile and started again afterwards."""
    import ray
    from ray.cluster_utils import Cluster

    from hotstep_ray.distributed.runtime import ensure_ray

    had_session = ray.is_initialized()
    if had_session:
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 0})
    ids = {"head": cluster.head_node.node_id}
    for gb in (24, 48):
        ids[f"gpu{gb}"] = cluster.add_node(num_cpus=1, resources={"VRAM_GB": gb}).node_id
    ray.init(address=cluster.address, logging_level="WARNING", log_to_driver=False)
    yield ids
    ray.shutdown()
    cluster.shutdown()
    if had_session:
        ensure_ray(num_cpus=2)


def test_label_preprocess_train_across_nodes(nodes, tiny_tree, tmp_path):
    import ray

    offered = sorted(n["Resources"].get("VRAM_GB", 0) for n in ray.nodes() if n["Alive"])
    assert offered == [0, 24, 48]
    storage = Storage(tmp_path / "data")
    write_songs(Storage(tmp_path / "songs"))
    inp = CreateDatasetInput(source_dir=str(tmp_path / "songs"), custom_tag=TAG)
    slug = create_dataset(storage, inp).slug

    # label: Essentia analysis actors, one CPU each, spread over the nodes
    with LabelPools(PoolOptions(analysis_actors=2)) as pools:
        report = label_dataset(storage, slug, OFFLINE_LABELS, executors=pools.executors)
        label_nodes = set(pools.analysis.node_ids)
    assert (report.labeled, report.failed) == (len(SONGS), 0)
    assert len(label_nodes) == 2 and label_nodes <= set(nodes.values())
    assert all(record["essentia"]["key"] for record in read_labels(storage, slug).values())
    build_dataset(storage, slug)

    # preprocess: Ray Data over the cluster (CPU encoder actors: the "GPU" nodes have no CUDA)
    recipe = tiny_recipe(epochs=2)
    config = RayPipelineConfig(
        num_gpus_per_actor=0, num_cpus_per_actor=0.5, decode_cpus=0.25, write_cpus=0.25
    )
    options = _with(recipe.preprocess, max_duration_s=1.0)
    pre = preprocess_dataset(storage, slug, options, tiny_tree, "ray", ray_config=config)
    assert (pre.processed, pre.failed) == (len(SONGS), 0)
    tensors = storage.local_path(f"tensors/{slug}/{VARIANT}")
    assert len(list(tensors.glob("*.safetensors"))) == len(SONGS)

    # train: a job that needs 40 GB per worker lands on the 48 GB node, nowhere else
    train = _with(recipe.dit, crop_frames=24, variant_key=VARIANT, adapter_name=slug)
    settings = dit.DitSettings(checkpoints_dir=str(tiny_tree), device="cpu")
    result = train_dit_on_ray(train, storage, slug, settings, use_gpu=False, vram_gb=40)
    assert result.metrics["node_id"] == nodes["gpu48"]
    (worker,) = [
        json.loads(storage.read_text(key)) for key in storage.list(f"{result.run_key}/workers")
    ]
    assert worker["node_id"] == nodes["gpu48"] and worker["steps"] > 0
    assert result.log["epochs_run"] == 2
    assert storage.exists(f"{result.run_key}/lokr_weights.safetensors")

    # a need no node can meet is refused at once, naming the numbers
    with pytest.raises(InputError, match=r"needs 80 GB .* largest node offers 48 VRAM_GB"):
        train_dit_on_ray(train, storage, slug, settings, use_gpu=False, vram_gb=80)
