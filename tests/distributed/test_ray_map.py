"""RayMap keeps `map`'s contract (order, errors) while running items as Ray tasks."""

from __future__ import annotations

import os
import sys

import pytest
from ray import cloudpickle

from hotstep_ray.distributed.map import RayMap

pytestmark = pytest.mark.ray
# Ray workers cannot import test modules by name; ship this module's functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _square_with_pid(x: int) -> tuple[int, int]:
    return x * x, os.getpid()


def _fail_on_three(x: int) -> int:
    if x == 3:
        raise ValueError("bad item 3")
    return x


def test_results_come_back_in_input_order_from_worker_processes(ray_session):
    seen = []
    ray_map = RayMap(max_in_flight=3, on_progress=lambda done, total: seen.append((done, total)))
    results = list(ray_map(_square_with_pid, range(10)))
    assert [r[0] for r in results] == [x * x for x in range(10)]
    assert os.getpid() not in {r[1] for r in results}  # the work really left the driver
    assert seen == [(n, 10) for n in range(1, 11)]


def test_a_failing_item_raises_its_error_in_the_driver(ray_session):
    with pytest.raises(Exception, match="bad item 3"):
        list(RayMap()(_fail_on_three, range(5)))
