"""Run calibration work items: here in one worker (`run_local`), or fanned out over Ray actors
(`distributed.map.ActorMap`).

A worker is built by a picklable zero-argument factory (`LmWorkerSpec`, `DitWorkerSpec`, or any
function), once per process: in this process for `run_local`, inside each actor for `run_on_ray`.
The base model loads once per actor and adapters are cached per actor, so an actor pulls the next
item of the candidate it last ran when there is one (adapter affinity), else the next in order.
Results come back in item order either way, so both runners give the same report.

`on_progress(done, total, item, result)` is called in the driver as each item finishes; the
calibrate functions turn it into `progress` and `eval` metric events.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import Any

from hotstep_ray.calibration.grid import WorkerFactory, WorkItem, WorkResult

ProgressFn = Callable[[int, int, WorkItem, WorkResult], None]
Runner = Callable[[Sequence[WorkItem], WorkerFactory, ProgressFn | None], list[WorkResult]]


def run_local(
    items: Sequence[WorkItem], factory: WorkerFactory, on_progress: ProgressFn | None = None
) -> list[WorkResult]:
    """Every item in this process, in order, through one worker."""
    worker = factory()
    results = []
    for done, item in enumerate(items, start=1):
        result = worker(item)
        results.append(result)
        if on_progress is not None:
            on_progress(done, len(items), item, result)
    return results


class _BuiltOnce:
    """The function an actor applies: builds its worker (one base model) on its first item,
    then runs every later item of the run through it (`ActorMap` keeps it for the call)."""

    def __init__(self, factory: WorkerFactory) -> None:
        self.factory = factory
        self._worker: Callable[[WorkItem], WorkResult] | None = None

    def __call__(self, item: WorkItem) -> WorkResult:
        if self._worker is None:
            self._worker = self.factory()
        return self._worker(item)


def run_on_ray(
    items: Sequence[WorkItem],
    factory: WorkerFactory,
    on_progress: ProgressFn | None = None,
    *,
    actors: int = 1,
    num_gpus: float | None = None,
    num_cpus: float = 1.0,
    address: str | None = None,
) -> list[WorkResult]:
    """Items over `actors` Ray actors (each `num_gpus`; None = 1 when the cluster has GPUs,
    else 0), an actor taking the next item of the adapter it last ran when there is one.
    Actors are killed at the end, also on failure; a failing item re-raises here."""
    from hotstep_ray.distributed.map import ActorMap
    from hotstep_ray.distributed.runtime import ensure_ray

    ray = ensure_ray(address)
    if num_gpus is None:
        num_gpus = 1.0 if ray.cluster_resources().get("GPU", 0) > 0 else 0.0
    results: dict[int, WorkResult] = {}
    with ActorMap(min(actors, len(items)), num_cpus=num_cpus, num_gpus=num_gpus) as pool:
        finished = pool.as_completed(_BuiltOnce(factory), items, affinity=attrgetter("key"))
        for position, result in finished:
            results[position] = result
            if on_progress is not None:
                on_progress(len(results), len(items), items[position], result)
    return [results[position] for position in range(len(items))]


def make_runner(use_ray: bool = False, **ray_options: Any) -> Runner:
    """`run_local`, or `run_on_ray` with `ray_options` (actors, num_gpus, num_cpus, address)."""
    if not use_ray:
        return run_local

    def runner(
        items: Sequence[WorkItem], factory: WorkerFactory, on_progress: ProgressFn | None = None
    ) -> list[WorkResult]:
        return run_on_ray(items, factory, on_progress, **ray_options)

    return runner
