"""`ray_map`: the builtin `map` contract, run as Ray tasks.

Stages accept `map_fn=map`; passing `RayMap()` instead spreads the per-item work over the cluster
while results still come back in input order, so the stage's output is identical either way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from hotstep_ray.distributed.runtime import ensure_ray


def _apply(fn: Callable[[Any], Any], item: Any) -> Any:
    return fn(item)


class RayMap:
    """Callable like `map(fn, items)`; each item becomes one Ray task.

    Args:
        num_cpus: CPUs each task reserves (fractions let light I/O tasks share a core).
        max_in_flight: cap on submitted-but-unfinished tasks, so a 5000-file folder does not
            queue 5000 tasks (and their arguments) at once.
        on_progress: called with (finished, total) as each item finishes, for progress events.
    """

    def __init__(
        self,
        num_cpus: float = 0.5,
        max_in_flight: int = 64,
        on_progress: Callable[[int, int], None] | None = None,
    ) -> None:
        self.num_cpus = num_cpus
        self.max_in_flight = max_in_flight
        self.on_progress = on_progress

    def __call__(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> Iterator[Any]:
        ray = ensure_ray()
        remote_apply = ray.remote(num_cpus=self.num_cpus)(_apply)
        fn_ref = ray.put(fn)
        items = list(items)
        results: list[Any] = [None] * len(items)
        pending: dict[Any, int] = {}
        next_index = finished = 0
        while next_index < len(items) or pending:
            while next_index < len(items) and len(pending) < self.max_in_flight:
                pending[remote_apply.remote(fn_ref, items[next_index])] = next_index
                next_index += 1
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                index = pending.pop(ref)
                results[index] = ray.get(ref)  # re-raises the task's exception here
                finished += 1
                if self.on_progress is not None:
                    self.on_progress(finished, len(items))
        return iter(results)
