"""GPU memory as a Ray resource and a training worker's share of a card (`distributed.gpu_share`)."""

from __future__ import annotations

import pytest

from hotstep_ray.distributed.gpu_share import (
    VRAM_RESOURCE,
    card_gb,
    gpu_worker_resources,
    local_card_mib,
    local_ray_resources,
)


def _node(gpus: float, vram: float, alive: bool = True) -> dict:
    return {"Alive": alive, "Resources": {"CPU": 8, "GPU": gpus, VRAM_RESOURCE: vram}}


def test_a_node_declares_its_smallest_card_in_decimal_gb_times_its_cards() -> None:
    # nvidia-smi MiB -> GB rounded down: an H200's 143771 MiB is 150.75 GB; an A10G's 23028 is 24.1
    assert card_gb([143771]) == 150
    assert card_gb([143771, 23028]) == 2 * 24  # never more than the smaller card per worker
    assert card_gb([]) == 0


def test_a_one_worker_job_asks_for_the_share_of_a_card_its_memory_takes() -> None:
    nodes = [_node(1, 150)]
    assert gpu_worker_resources(30, 1, nodes) == {"GPU": 0.2, VRAM_RESOURCE: 30}
    assert gpu_worker_resources(31, 1, nodes) == {"GPU": 0.21, VRAM_RESOURCE: 31}  # rounded up
    # two such jobs fit one card side by side: the shares sum below one GPU
    assert 2 * gpu_worker_resources(40, 1, nodes)["GPU"] <= 1
    assert gpu_worker_resources(400, 1, nodes)["GPU"] == 1.0  # never more than a card


def test_the_share_is_taken_of_the_smallest_declared_card() -> None:
    nodes = [_node(8, 8 * 150), _node(1, 24), _node(1, 48, alive=False), _node(0, 0)]
    assert gpu_worker_resources(12, 1, nodes)["GPU"] == 0.5  # of the 24 GB card


def test_data_parallel_workers_and_undeclared_clusters_ask_for_whole_gpus() -> None:
    assert gpu_worker_resources(30, 2, [_node(2, 300)]) == {"GPU": 1.0, VRAM_RESOURCE: 30}
    assert gpu_worker_resources(30, 1, [_node(1, 0)]) == {"GPU": 1}


@pytest.fixture
def fake_smi(tmp_path):
    script = tmp_path / "nvidia-smi"
    script.write_text("#!/bin/sh\nprintf '0, 143771\\n1, 143771\\n'\n")
    script.chmod(0o755)
    return str(script)


def test_a_local_ray_on_a_gpu_machine_declares_its_memory(fake_smi, monkeypatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert local_card_mib(fake_smi) == [143771, 143771]
    assert local_ray_resources(fake_smi) == {VRAM_RESOURCE: 300.0}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert local_ray_resources(fake_smi) == {VRAM_RESOURCE: 150.0}


def test_a_machine_without_gpus_declares_nothing(tmp_path, monkeypatch) -> None:
    failing = tmp_path / "nvidia-smi"
    failing.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    failing.chmod(0o755)
    assert local_ray_resources(str(failing)) == {}
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert local_ray_resources() == {}
