"""A placement group whose creating actor was killed is freed (`distributed.runtime`)."""

from __future__ import annotations

import time

import pytest

from hotstep_ray.distributed.runtime import remove_orphaned_placement_groups


@pytest.mark.ray
def test_a_group_left_by_a_killed_actor_is_removed_and_its_cpu_returns(ray_session) -> None:
    import ray
    from ray.util import placement_group_table

    @ray.remote(num_cpus=0)
    class Creator:  # stands in for the Ray Train controller a killed job runner owned
        def make(self) -> str:
            group = ray.util.placement_group([{"CPU": 1}])
            ray.get(group.ready(), timeout=60)
            return group.id.hex()

    def free_cpus() -> float:
        return ray.available_resources().get("CPU", 0.0)

    before = free_cpus()
    creator = Creator.remote()
    group_id = ray.get(creator.make.remote())
    mine = remove_orphaned_placement_groups()  # the creator lives: its group is in use
    assert group_id not in mine
    ray.kill(creator, no_restart=True)
    deadline = time.monotonic() + 30
    while group_id not in mine and time.monotonic() < deadline:  # the GCS marks the death
        time.sleep(0.2)
        mine += remove_orphaned_placement_groups()
    assert group_id in mine
    assert placement_group_table()[group_id]["state"] == "REMOVED"
    deadline = time.monotonic() + 30
    while free_cpus() < before and time.monotonic() < deadline:  # the bundle's CPU comes back
        time.sleep(0.2)
    assert free_cpus() >= before
