"""Fan plain-Python work out over Ray; `ray.util.ActorPool` does the scheduling.

`ActorMap`: a pool of at most `size` actors that applies a function to items and yields
`(input index, result)` as each finishes. Actors start only when there is work for them and are
reused by later calls until `shutdown` (or the end of a `with` block); a call's function keeps
its state on each actor for the whole call (a model it built, an HTTP client's spacing). The label stages stream through it
(`labeling.ray_pool`) and calibration runs its grid on it (`calibration.ray_calibrate`).

`RayMap`: the builtin `map` contract, run as Ray tasks. Stages accept `map_fn=map`; passing
`RayMap()` instead spreads the per-item work over the cluster while results still come back in
input order, so the stage's output is identical either way.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Iterable, Iterator
from typing import Any

from hotstep_ray.distributed.runtime import ensure_ray

# A worker process that dies (killed for memory, a crash in native code) is restarted and the
# items it held are run again, up to this many times: what Ray does for a plain task.
RESTARTS = 3


class _Worker:
    """Ray actor body: applies the function of the current call to one item at a time."""

    def __init__(self) -> None:
        self._call: int | None = None
        self._fn: Callable[[Any], Any] | None = None

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def run(self, call: int, fn: Callable[[Any], Any], index: int, item: Any) -> tuple[int, Any]:
        # Every item carries the call's function (a restarted actor needs it again), but the
        # first copy stays for the whole call, so what it holds (an HTTP client's spacing of
        # calls, a model it built) lives as long as the actor serves this call.
        if call != self._call:
            self._call, self._fn = call, fn
        return index, self._fn(item)


class _Items:
    """The input, pulled one item at a time; `take(key)` prefers the next item whose affinity
    key is `key`, which needs the whole input at once (it is read up front then)."""

    def __init__(self, items: Iterable[Any], affinity: Callable[[Any], Hashable] | None) -> None:
        self._source = enumerate(items)
        self._affinity = affinity
        self._ahead: list[tuple[int, Any]] = [] if affinity is None else list(self._source)

    def more(self) -> bool:
        """Whether an item is left (pulling the next one from the input when none is ahead)."""
        if not self._ahead:
            self._ahead.extend(itertools.islice(self._source, 1))
        return bool(self._ahead)

    def take(self, key: Hashable | None) -> tuple[int, Any]:
        if self._affinity is not None and key is not None:
            for position, (_, item) in enumerate(self._ahead):
                if self._affinity(item) == key:
                    return self._ahead.pop(position)
        return self._ahead.pop(0)


class ActorMap:
    """Items over at most `size` Ray actors of `num_cpus` / `num_gpus` each (`spread`: placed on
    as many nodes as possible).

    `as_completed(fn, items)` yields `(index, fn(item))` in the order items finish, `index`
    being the item's position in `items`. It pulls an item from `items` only when an actor is
    free for it (or may still start), so a slow upstream stage streams through. The first item that fails
    re-raises its error from the iterator."""

    def __init__(
        self, size: int, *, num_cpus: float = 1.0, num_gpus: float = 0.0, spread: bool = False
    ) -> None:
        self.size = max(1, size)
        self.num_cpus, self.num_gpus, self.spread = num_cpus, num_gpus, spread
        self._actors: list[Any] = []
        self._calls = itertools.count()

    @property
    def node_ids(self) -> list[str]:
        """The node of each actor started so far (for logs and tests)."""
        import ray

        return list(ray.get([actor.node_id.remote() for actor in self._actors]))

    def _start_actor(self) -> Any:
        import ray

        options: dict[str, Any] = {
            "num_cpus": self.num_cpus,
            "num_gpus": self.num_gpus,
            "max_restarts": RESTARTS,
            "max_task_retries": RESTARTS,
        }
        if self.spread:
            options["scheduling_strategy"] = "SPREAD"
        actor = ray.remote(_Worker).options(**options).remote()
        self._actors.append(actor)
        return actor

    def as_completed(
        self,
        fn: Callable[[Any], Any],
        items: Iterable[Any],
        *,
        affinity: Callable[[Any], Hashable] | None = None,
    ) -> Iterator[tuple[int, Any]]:
        """`(index, fn(item))` for each item, as each finishes. With `affinity`, an actor that
        frees up takes the next item of the same key as the one it last ran when there is one
        (a model keeps its adapter loaded), else the next in order."""
        ray = ensure_ray()
        from ray.util import ActorPool

        call, fn_ref = next(self._calls), ray.put(fn)
        queue = _Items(items, affinity)
        last_key: dict[Any, Hashable] = {}
        pool = ActorPool(self._actors)  # fresh bookkeeping: nothing left from an earlier call

        def submit(actor: Any, _: None) -> Any:
            # ActorPool hands over the actor it picked, so the item is chosen for that actor
            index, item = queue.take(last_key.get(actor))
            if affinity is not None:
                last_key[actor] = affinity(item)
            return actor.run.remote(call, fn_ref, index, item)

        while True:
            while (pool.has_free() or len(self._actors) < self.size) and queue.more():
                if not pool.has_free():
                    pool.push(self._start_actor())
                pool.submit(submit, None)
            if not pool.has_next():
                return
            yield pool.get_next_unordered()

    def shutdown(self) -> None:
        import ray

        for actor in self._actors:
            ray.kill(actor)
        self._actors = []

    def __enter__(self) -> ActorMap:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def _apply(fn: Callable[[Any], Any], index: int, item: Any) -> tuple[int, Any]:
    return index, fn(item)


class RayMap:
    """Callable like `map(fn, items)`; each item becomes one Ray task, the results come back in
    input order. Plain tasks rather than an `ActorMap`: the scans call it on a dozen cheap file
    probes, and tasks run on Ray's already started worker processes, where each new actor
    starts a process of its own (and a task whose process dies is retried by Ray).

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
        from ray.util import ActorPool

        apply, fn_ref = ray.remote(num_cpus=self.num_cpus)(_apply), ray.put(fn)
        items = list(items)
        # ActorPool passes each item one of its members and counts that member busy until the
        # item's ref completes: with slot numbers as its members, it caps the tasks in flight
        # (the items beyond wait in its queue, here in the driver, not as Ray tasks).
        slots = ActorPool(range(max(1, self.max_in_flight)))
        for index, item in enumerate(items):
            slots.submit(lambda _slot, entry: apply.remote(fn_ref, *entry), (index, item))
        results: dict[int, Any] = {}
        while slots.has_next():
            index, result = slots.get_next_unordered()  # re-raises the task's exception here
            results[index] = result
            if self.on_progress is not None:
                self.on_progress(len(results), len(items))
        return iter([results[index] for index in range(len(items))])
