"""RayMap keeps `map`'s contract (order, errors) while running items as Ray tasks; ActorMap
runs them on a pool of actors it keeps, with affinity, and restarts an actor whose process dies."""

from __future__ import annotations

import os
import sys

import pytest
from ray import cloudpickle

from hotstep_ray.distributed.map import ActorMap, RayMap

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


class _Counter:
    """Counts the items it ran: on an actor, how many this actor ran so far in the call."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, item: object) -> tuple[int, int]:
        self.count += 1
        return self.count, os.getpid()


def test_actor_map_keeps_its_actors_and_each_calls_function_state(ray_session):
    with ActorMap(2, num_cpus=0) as pool:
        first = dict(pool.as_completed(_Counter(), range(6)))
        assert sorted(first) == list(range(6))
        pids = {pid for _, pid in first.values()}
        assert os.getpid() not in pids and len(pids) <= 2 and len(pool.node_ids) == 2
        for pid in pids:  # one function per actor for the whole call: its count goes on
            counts = sorted(count for count, seen in first.values() if seen == pid)
            assert counts == list(range(1, len(counts) + 1))
        second = dict(pool.as_completed(_Counter(), range(3)))
        assert {pid for _, pid in second.values()} <= pids  # the same actors, reused
        assert min(count for count, _ in second.values()) == 1  # ... with the new call's function


def test_an_actor_takes_the_next_item_of_the_key_it_last_ran(ray_session):
    items = [("a", 0), ("b", 1), ("a", 2), ("b", 3)]
    with ActorMap(1, num_cpus=0) as pool:
        order = dict(pool.as_completed(_Counter(), items, affinity=lambda item: item[0]))
    # one actor: both "a" items run before the "b" ones, whatever the input order
    assert {index: count for index, (count, _) in order.items()} == {0: 1, 2: 2, 1: 3, 3: 4}


def test_a_failing_item_raises_from_the_pool(ray_session):
    with ActorMap(2, num_cpus=0) as pool, pytest.raises(Exception, match="bad item 3"):
        list(pool.as_completed(_fail_on_three, range(5)))


def _exit_once(marker: str):
    def run(x: int) -> int:
        if x == 2 and not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(1)  # the actor's process dies mid-item, as when killed for memory
        return x * 10

    return run


def test_an_actor_whose_process_dies_restarts_and_runs_its_item_again(ray_session, tmp_path):
    marker = str(tmp_path / "died")
    with ActorMap(1, num_cpus=0) as pool:
        results = dict(pool.as_completed(_exit_once(marker), range(4)))
    assert os.path.exists(marker)  # it did die
    assert results == {0: 0, 1: 10, 2: 20, 3: 30}
