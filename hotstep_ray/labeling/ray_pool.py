"""Ray actor pools for the label job: one pool per stage, each a drop-in `map`.

- analysis: CPU-bound, one actor per CPU of the cluster (or `PoolOptions.analysis_actors`), one
  CPU each, spread over the nodes;
- genius and caption: network-bound, `*_concurrency` actors each (the per-provider cap), zero CPU
  reserved so they never starve the analysis; each actor spaces its calls by the provider's
  interval × the pool size, which keeps the pool's total call rate at the provider's limit.

A pool takes its input lazily and yields results as they complete (not in input order: the job
persists by sample id), so the three stages overlap and every sample is written the moment it is
done. `label_dataset_on_ray` is `job.label_dataset` with these pools as its executors.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import ray

from hotstep_ray.core.contracts import LabelOptions
from hotstep_ray.core.events import EventSink
from hotstep_ray.core.storage import Storage
from hotstep_ray.distributed.map import ActorMap
from hotstep_ray.distributed.runtime import ensure_ray
from hotstep_ray.labeling.job import (
    LabelExecutors,
    LabelReport,
    dataset_label_lock,
    label_dataset_locked,
)
from hotstep_ray.labeling.providers import Providers


def _env_int(name: str, default: int) -> int:
    try:
        return max(0, int(os.environ.get(name, default)))
    except ValueError:
        return default


@dataclass(frozen=True)
class PoolOptions:
    """Pool sizes. Defaults follow the seed's limiter (Genius 1, captions 1) and can be set
    from the environment (`LABEL_ESSENTIA_CONCURRENCY`, `LABEL_GENIUS_CONCURRENCY`,
    `LABEL_CAPTION_CONCURRENCY`), like the seed's hot-reloaded settings."""

    analysis_actors: int = 0  # 0 = one per CPU in the cluster
    genius_concurrency: int = 1
    caption_concurrency: int = 1

    @classmethod
    def from_env(cls) -> PoolOptions:
        return cls(
            _env_int("LABEL_ESSENTIA_CONCURRENCY", 0),
            max(1, _env_int("LABEL_GENIUS_CONCURRENCY", 1)),
            max(1, _env_int("LABEL_CAPTION_CONCURRENCY", 1)),
        )


class ActorPoolMap(ActorMap):
    """`map(fn, items)` over a pool of at most `size` actors (`distributed.map.ActorMap`),
    results in the order they finish. Actors start only when there is work for them (three songs
    never start sixteen analysis actors) and are reused by later calls until `shutdown`."""

    def __init__(self, name: str, size: int, num_cpus: float = 1.0, spread: bool = False) -> None:
        super().__init__(size, num_cpus=num_cpus, spread=spread)
        self.name = name

    def __call__(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> Iterator[Any]:
        # Scaled for the full pool, so the call rate holds however many actors start.
        scale = getattr(fn, "for_concurrency", None)
        results = self.as_completed(scale(self.size) if scale else fn, items)
        return (result for _, result in results)


class LabelPools:
    """The three pools of one label job; a context manager that kills its actors on exit."""

    def __init__(self, pool: PoolOptions | None = None) -> None:
        pool = pool or PoolOptions.from_env()
        ensure_ray()
        cpus = int(ray.cluster_resources().get("CPU", 1)) or 1
        self.analysis = ActorPoolMap(
            "analysis", pool.analysis_actors or cpus, num_cpus=1.0, spread=True
        )
        self.genius = ActorPoolMap("genius", pool.genius_concurrency, num_cpus=0)
        self.caption = ActorPoolMap("caption", pool.caption_concurrency, num_cpus=0)

    @property
    def executors(self) -> LabelExecutors:
        return LabelExecutors(self.analysis, self.genius, self.caption)

    def __enter__(self) -> LabelPools:
        return self

    def __exit__(self, *exc: object) -> None:
        for pool in (self.analysis, self.genius, self.caption):
            pool.shutdown()


def label_dataset_on_ray(
    storage: Storage,
    slug: str,
    options: LabelOptions | None = None,
    pool: PoolOptions | None = None,
    providers: Providers | None = None,
    events: EventSink | None = None,
    env: Mapping[str, str] | None = None,
    ray_address: str | None = None,
) -> LabelReport:
    """`label_dataset` with one actor pool per stage on the Ray cluster at `ray_address`
    (default: the running one, `$RAY_ADDRESS`, or a new local one). The dataset's label lock is
    taken before any pool starts: a second run refuses without starting actors."""
    ensure_ray(ray_address)
    with dataset_label_lock(storage, slug, events), LabelPools(pool) as pools:
        return label_dataset_locked(
            storage,
            slug,
            options,
            providers=providers,
            events=events,
            executors=pools.executors,
            env=env,
        )
