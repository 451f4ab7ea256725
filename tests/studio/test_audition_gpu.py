"""The studio's audition job renders in its runner actor, so on a cluster with GPUs the runner
asks for the GPU share the audition Serve replicas of the same engines take (Ray hides every GPU
from an actor that asks for none); on a CPU cluster, or with `device: cpu`, it asks for none.

CPU-only: the cluster is a resources dict, and `JobManager` starts its runner on a fake Ray that
records the actor options it is given.
"""

from __future__ import annotations

from typing import Any

import pytest

from hotstep_ray.core.contracts import (
    AUDITION_DECODER_GPUS,
    AUDITION_DIT_GPUS,
    AUDITION_LM_GPUS,
    BuildOptions,
    DatasetSummary,
)
from hotstep_ray.core.storage import Storage
from hotstep_ray.studio import jobs as studio_jobs
from hotstep_ray.studio import stages
from hotstep_ray.studio.audition_job import AuditionJobOptions, runner_actor_options

GPU_CLUSTER = {"CPU": 16.0, "GPU": 2.0, "memory": 1e11}
CPU_CLUSTER = {"CPU": 16.0, "memory": 1e11}


def test_the_audition_runner_asks_for_the_replicas_gpu_share_where_there_are_gpus():
    dit, lm = AuditionJobOptions(), AuditionJobOptions(engine="lm")
    assert runner_actor_options(dit, GPU_CLUSTER) == {"num_gpus": AUDITION_DIT_GPUS}
    assert runner_actor_options(lm, GPU_CLUSTER) == {
        "num_gpus": AUDITION_LM_GPUS + AUDITION_DECODER_GPUS
    }
    assert runner_actor_options(dit, CPU_CLUSTER) == {}
    assert runner_actor_options(dit, {**GPU_CLUSTER, "GPU": 0.0}) == {}
    assert runner_actor_options(AuditionJobOptions(device="cpu"), GPU_CLUSTER) == {}
    # the Serve app's replicas take the same shares (one definition, core.contracts)
    assert (AUDITION_DIT_GPUS, AUDITION_LM_GPUS, AUDITION_DECODER_GPUS) == (0.5, 0.5, 0.25)


def test_only_the_audition_stage_has_a_gpu_hook():
    options = AuditionJobOptions()
    assert stages.runner_actor_options("audition", options, GPU_CLUSTER) == {"num_gpus": 0.5}
    assert stages.runner_actor_options("audition", options, CPU_CLUSTER) == {}
    assert stages.runner_actor_options("build", BuildOptions(), GPU_CLUSTER) == {}


class _FakeRay:
    """Just what `JobManager._start` calls: cluster resources and `remote(cls).options(...)`."""

    def __init__(self, resources: dict[str, float]) -> None:
        self.resources = resources
        self.actor_options: dict[str, Any] | None = None

    def cluster_resources(self) -> dict[str, float]:
        return self.resources

    def remote(self, cls: type) -> _FakeRay:
        return self

    def options(self, **options: Any) -> _FakeRay:
        self.actor_options = options
        return self

    def kill(self, *args: Any, **kwargs: Any) -> None:
        pass

    class _Run:
        @staticmethod
        def remote() -> str:
            return "run-ref"

    run = _Run()


@pytest.mark.parametrize(
    ("resources", "gpus"), [(GPU_CLUSTER, AUDITION_DIT_GPUS), (CPU_CLUSTER, None)]
)
def test_the_job_manager_starts_the_audition_runner_with_that_share(
    tmp_path, monkeypatch, resources, gpus
):
    monkeypatch.setattr(studio_jobs, "_RUNNER_CLASS", None)
    monkeypatch.setattr(studio_jobs.JobManager, "_pump", lambda self, active: None)
    manager = studio_jobs.JobManager(Storage(tmp_path))
    fake = _FakeRay(resources)
    manager._ray = fake
    dataset = DatasetSummary(id="d1", slug="band", name="Band", source_dir=str(tmp_path))
    manager.submit("audition", dataset, AuditionJobOptions())
    assert fake.actor_options is not None
    assert fake.actor_options.get("num_gpus") == gpus
    assert fake.actor_options["num_cpus"] == 0 and fake.actor_options["max_restarts"] == 0
