"""GPU lease: a training job releases the audition replicas and restores them when done.

The seed's engine stop/restart with an epoch guard, for overlapping jobs:
- `acquire` marks the engine suspended FIRST, bumps the epoch (which cancels any restore that
  is pending or in flight) and stops the engine if it runs;
- `release` drops the job; only the LAST holder schedules a restore, tagged with the epoch it
  saw. The restore runs under the operation lock and re-checks: if another job acquired since
  (epoch moved, holders non-empty) it does nothing. So two overlapping jobs never restore early
  (while one still trains) and never twice.
- `stop_engine=False`: the job shares the GPU (enough VRAM) and touches nothing.

`stop` / `start` are callables: in Serve they replace the audition app by a tiny "suspended" app
answering 503 and deploy it back (`serve_app_callbacks`); tests pass plain functions.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass


@dataclass
class LeaseToken:
    job_id: str
    stopped_engine: bool  # False for stop_engine=False leases


class EngineLifecycle:
    """Epoch-guarded stop/restore of the audition engine around GPU jobs. Thread-safe."""

    def __init__(self, stop: Callable[[], None], start: Callable[[], None]) -> None:
        self._stop, self._start = stop, start
        self._state = threading.Lock()  # guards the fields below; never held across stop/start
        self._ops = threading.Lock()  # serialises stop/start calls
        self.holders: set[str] = set()
        self.epoch = 0
        self.suspended = False
        self.running = True
        self.stops = 0
        self.restores = 0

    def acquire(self, job_id: str, stop_engine: bool = True) -> LeaseToken:
        """Take the GPU for `job_id`; with `stop_engine`, the engine is stopped before return."""
        if not stop_engine:
            return LeaseToken(job_id, stopped_engine=False)
        with self._state:
            if job_id in self.holders:
                raise ValueError(f"job {job_id!r} already holds the GPU lease")
            self.holders.add(job_id)
            self.suspended = True
            self.epoch += 1  # cancels a restore scheduled by an earlier release
        with self._ops:
            with self._state:
                need_stop = self.running and bool(self.holders)
            if need_stop:
                self._stop()
                with self._state:
                    self.running = False
                    self.stops += 1
        return LeaseToken(job_id, stopped_engine=True)

    def release(self, token: LeaseToken) -> bool:
        """Give the lease back; the last holder restores the engine. True if it restored."""
        if not token.stopped_engine:
            return False
        with self._state:
            self.holders.discard(token.job_id)
            if self.holders:
                return False  # another job still trains: restoring now would be early
            self.epoch += 1
            epoch = self.epoch
        return self._restore(epoch)

    def _restore(self, epoch: int) -> bool:
        with self._ops:
            with self._state:
                if self.holders or self.epoch != epoch or self.running:
                    return False  # superseded by a newer acquire, or already up
            self._start()
            with self._state:
                self.running = True
                self.suspended = bool(self.holders)
                self.restores += 1
        return True

    @contextlib.contextmanager
    def lease(self, job_id: str, stop_engine: bool = True) -> Iterator[LeaseToken]:
        """`with lifecycle.lease(job_id): train()` — restores in `finally`."""
        token = self.acquire(job_id, stop_engine)
        try:
            yield token
        finally:
            self.release(token)


def serve_app_callbacks(
    app_name: str,
    route_prefix: str,
    build_app: Callable[[], object],
    build_suspended: Callable[[], object],
) -> tuple[Callable[[], None], Callable[[], None]]:
    """(stop, start) for a Serve application: stop swaps in the suspended app (its replicas
    free the GPU; HTTP answers 503), start deploys the real one back."""

    def stop() -> None:
        from ray import serve

        serve.run(build_suspended(), name=app_name, route_prefix=route_prefix)

    def start() -> None:
        from ray import serve

        serve.run(build_app(), name=app_name, route_prefix=route_prefix)

    return stop, start
