"""The objects every route shares: settings, the storage root, the path guard, the job manager."""

from __future__ import annotations

from dataclasses import dataclass

from hotstep_ray.core.storage import Storage
from hotstep_ray.studio.config import StudioConfig
from hotstep_ray.studio.jobs import JobManager
from hotstep_ray.studio.security import PathGuard


def checkpoints_dir(config: StudioConfig, storage: Storage) -> str:
    """The configured checkpoints folder, else `<storage>/checkpoints` for a local root."""
    if config.checkpoints:
        return config.checkpoints
    return str(storage.local_path("checkpoints")) if storage.is_local else ""


@dataclass
class Studio:
    config: StudioConfig
    storage: Storage
    guard: PathGuard
    jobs: JobManager

    @property
    def checkpoints_dir(self) -> str:
        return self.jobs.checkpoints_dir

    @classmethod
    def from_config(cls, config: StudioConfig) -> Studio:
        storage = Storage(config.data, **config.storage_options)
        if storage.is_local:
            storage.makedirs("")
        # The storage root is always allowed; song folders live in the configured roots.
        guard = PathGuard((storage.url, *config.roots))
        jobs = JobManager(storage, config.ray_address, checkpoints_dir(config, storage))
        return cls(config, storage, guard, jobs)
