"""Labeling across nodes: on a 2-node cluster the analysis actors spread over both nodes."""

from __future__ import annotations

import sys

import pytest
from ray import cloudpickle

from hotstep_ray.core.contracts import LabelOptions
from hotstep_ray.dataset.store import read_labels
from hotstep_ray.labeling.analysis import EssentiaAnalyzer
from hotstep_ray.labeling.captions import OfflineCaptioner
from hotstep_ray.labeling.job import label_dataset
from hotstep_ray.labeling.providers import Providers
from hotstep_ray.labeling.ray_pool import LabelPools, PoolOptions

pytestmark = [pytest.mark.ray, pytest.mark.slow]
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def two_nodes():
    """A head and one more node, one CPU each; the session Ray (if any) is stopped meanwhile."""
    import ray
    from ray.cluster_utils import Cluster

    from hotstep_ray.distributed.runtime import ensure_ray

    had_session = ray.is_initialized()
    if had_session:
        ray.shutdown()
    nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    worker = nodes.add_node(num_cpus=1)
    ray.init(address=nodes.address, logging_level="WARNING", log_to_driver=False)
    yield {nodes.head_node.node_id, worker.node_id}
    ray.shutdown()
    nodes.shutdown()
    if had_session:
        ensure_ray(num_cpus=2)


def test_analysis_actors_run_on_both_nodes(two_nodes, tmp_path, dataset_factory):
    data = dataset_factory(tmp_path)
    providers = Providers(EssentiaAnalyzer(), None, OfflineCaptioner())
    with LabelPools(PoolOptions(analysis_actors=2)) as pools:
        report = label_dataset(
            data.storage,
            data.slug,
            LabelOptions(scope="all"),
            providers=providers,
            executors=pools.executors,
        )
        used = set(pools.analysis.node_ids)
    # one actor per node (each reserves a whole CPU, and SPREAD places them apart)
    assert used == two_nodes
    assert (report.labeled, report.failed, report.analysed) == (4, 0, 4)
    labels = read_labels(data.storage, data.slug)
    # every song's analysis landed in the label store, whichever node ran it (3 s clips are too
    # short for tempo accuracy; tests/labeling/test_label_analysis.py checks that on 20 s songs)
    assert all(
        isinstance(r["essentia"]["bpm"], int) and r["essentia"]["key"] for r in labels.values()
    )
