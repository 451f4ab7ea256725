"""Run calibration work items: here in one worker (`run_local`), or fanned out over Ray actors.

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


class CalibrationActor:
    """Ray actor body: one worker (one base model) for the actor's life."""

    def __init__(self, factory: WorkerFactory) -> None:
        self._worker = factory()

    def run(self, item: WorkItem) -> WorkResult:
        return self._worker(item)


def _next_item(remaining: list[WorkItem], last_key: str | None) -> WorkItem:
    for item in remaining:
        if last_key is not None and item.key == last_key:
            remaining.remove(item)
            return item
    return remaining.pop(0)


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
    else 0). Actors are killed at the end, also on failure; a failing item re-raises here."""
    from hotstep_ray.distributed.runtime import ensure_ray

    ray = ensure_ray(address)
    if num_gpus is None:
        num_gpus = 1.0 if ray.cluster_resources().get("GPU", 0) > 0 else 0.0
    actor_class = ray.remote(num_cpus=num_cpus, num_gpus=num_gpus)(CalibrationActor)
    count = max(1, min(actors, len(items)))
    pool = [actor_class.remote(factory) for _ in range(count)]
    remaining = list(items)
    results: dict[int, WorkResult] = {}
    pending: dict[Any, tuple[WorkItem, Any]] = {}
    last_key: dict[int, str | None] = {id(actor): None for actor in pool}
    idle = list(pool)
    try:
        while remaining or pending:
            while idle and remaining:
                actor = idle.pop(0)
                item = _next_item(remaining, last_key[id(actor)])
                last_key[id(actor)] = item.key
                pending[actor.run.remote(item)] = (item, actor)
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                item, actor = pending.pop(ref)
                result = ray.get(ref)  # re-raises the actor's exception
                results[item.index] = result
                idle.append(actor)
                if on_progress is not None:
                    on_progress(len(results), len(items), item, result)
    finally:
        for actor in pool:
            ray.kill(actor)
    return [results[item.index] for item in items]


def make_runner(use_ray: bool = False, **ray_options: Any) -> Runner:
    """`run_local`, or `run_on_ray` with `ray_options` (actors, num_gpus, num_cpus, address)."""
    if not use_ray:
        return run_local

    def runner(
        items: Sequence[WorkItem], factory: WorkerFactory, on_progress: ProgressFn | None = None
    ) -> list[WorkResult]:
        return run_on_ray(items, factory, on_progress, **ray_options)

    return runner
