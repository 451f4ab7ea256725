"""Run locks on the storage root: one `preprocess` run per (dataset, variant), one `label` run per
dataset. Two runs on the same output at once would both do all the work and race on the same
files, so a run takes its lock first and a second one refuses at once, saying who holds it:

    another preprocess run holds band/acestep-v15-turbo since 2026-05-01 10:00:00 (pid 4242 on
    node-a); wait for it or remove /data/locks/preprocess/band/acestep-v15-turbo.lock if it died

The lock is a small JSON record at `locks/<stage>/<dataset>[/<variant>].lock` (a random token,
pid, host, when it was taken, when it was last refreshed). While the run lasts a heartbeat thread
rewrites it every `heartbeat_s`; the run deletes it when it ends, however it ends (unless another
run has taken it over meanwhile: then the record is that run's and is left alone).

A stale lock (its run died without releasing it) is taken over, with a warning, when
- it was taken on this host and its pid is gone, or
- it has not been refreshed for `stale_after_s` (any host: a lost node, a killed Ray actor).

How exclusive it is:
- local roots: the record is created with `O_CREAT | O_EXCL`, so of two runs exactly one creates it.
- object stores (S3 and the like): fsspec offers no create-if-absent that every store honours (S3's
  conditional `If-None-Match` writes are recent and not universal), so the record is written, then
  read back after `settle_s`: of two runs that both found no lock, both read back the later
  writer's record and only that run proceeds. This needs read-after-write consistency (S3 has it)
  and each run's gap between its check and its write to be shorter than `settle_s`: it keeps
  two people's runs apart, it is not a fence for code racing itself.
- taking over a stale lock re-reads it just before deleting it, so a lock some run has just taken
  over is not deleted again; two runs taking over the very same dead lock in the same instant may
  still both proceed (best effort).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import Any

from hotstep_ray.core import layout
from hotstep_ray.core.errors import HotstepError, StorageError
from hotstep_ray.core.storage import Storage

log = logging.getLogger(__name__)

LOCK_ROOT = "locks"
STALE_AFTER_S = 15 * 60.0  # unrefreshed this long (the heartbeat refreshes every minute): dead
HEARTBEAT_S = 60.0
OBJECT_STORE_SETTLE_S = 1.0  # write -> read-back wait on object stores


class LockHeldError(HotstepError):
    """Another live run holds the lock."""


def lock_key(stage: str, *names: str) -> str:
    """`locks/<stage>/<name>/.../<last>.lock`, every part a valid folder name."""
    for name in (stage, *names):
        layout.check_name(name, "lock name")
    return "/".join((LOCK_ROOT, stage, *names)) + ".lock"


@dataclass(frozen=True)
class LockRecord:
    token: str
    pid: int
    host: str
    created_at: float  # epoch seconds
    refreshed_at: float
    what: str = ""

    def to_json(self) -> bytes:
        return json.dumps(self.__dict__, indent=2).encode() + b"\n"

    @classmethod
    def parse(cls, data: bytes) -> LockRecord | None:
        """The record, or None for one that cannot be read (half-written, foreign)."""
        try:
            value = json.loads(data)
            return cls(
                token=str(value["token"]),
                pid=int(value["pid"]),
                host=str(value["host"]),
                created_at=float(value["created_at"]),
                refreshed_at=float(value["refreshed_at"]),
                what=str(value.get("what", "")),
            )
        except (ValueError, KeyError, TypeError):
            return None


def _when(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s).strftime("%Y-%m-%d %H:%M:%S")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    except OSError:
        return True
    return True


class StorageLock:
    """An exclusive run lock at `key` of `storage` (module docstring); a context manager.

    Args:
        stage: the stage named in the refusal (`preprocess`, `label`).
        target: what it locks, as the refusal names it (`band/acestep-v15-turbo`).
        stale_after_s: an unrefreshed lock older than this is taken over.
        heartbeat_s: how often the holder refreshes the record (0 = never).
        settle_s: object stores' write -> read-back wait (None = OBJECT_STORE_SETTLE_S).
        warn: where the takeover warning goes (default: this module's logger).
    """

    def __init__(
        self,
        storage: Storage,
        key: str,
        stage: str,
        target: str,
        *,
        stale_after_s: float = STALE_AFTER_S,
        heartbeat_s: float = HEARTBEAT_S,
        settle_s: float | None = None,
        warn: Callable[[str], None] | None = None,
    ) -> None:
        self.storage = storage
        self.key = key
        self.stage = stage
        self.target = target
        self.stale_after_s = stale_after_s
        self.heartbeat_s = heartbeat_s
        self.settle_s = OBJECT_STORE_SETTLE_S if settle_s is None else settle_s
        self.warn = warn or log.warning
        self.token = uuid.uuid4().hex
        self.held = False
        self._created_at = 0.0
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None

    # -- acquire / release ----------------------------------------------------------------------
    def acquire(self) -> StorageLock:
        """Take the lock; LockHeldError when a live run holds it."""
        if self.held:
            raise HotstepError(f"{self.key} is already held by this lock")
        for _ in range(2):  # a stale lock: taken over once, then one more try
            self._created_at = time.time()
            if self._create():
                self.held = True
                self._start_heartbeat()
                return self
            record, age_s = self._read()
            reason = self._stale(record, age_s)
            if reason is None:
                raise LockHeldError(self._refusal(record, age_s))
            self._take_over(record, reason)
        raise LockHeldError(self._refusal(*self._read()))

    def release(self) -> None:
        """Delete the lock if it is still this run's (never another run's that took it over)."""
        if not self.held:
            return
        self.held = False
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join(timeout=5)
        record, _ = self._read()
        if record is not None and record.token != self.token:
            self.warn(
                f"the {self.stage} lock on {self.target} was taken over by pid {record.pid} on "
                f"{record.host} while this run held it; left in place"
            )
            return
        try:
            self.storage.delete(self.key)
        except (OSError, StorageError) as exc:
            self.warn(f"could not remove the {self.stage} lock {self.where}: {exc}")

    def __enter__(self) -> StorageLock:
        return self.acquire()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    @property
    def where(self) -> str:
        """The lock's path or URL, as a user would remove it."""
        return self.storage.url_of(self.key)

    # -- the record -----------------------------------------------------------------------------
    def _record(self) -> LockRecord:
        return LockRecord(
            token=self.token,
            pid=os.getpid(),
            host=socket.gethostname(),
            created_at=self._created_at,
            refreshed_at=time.time(),
            what=f"{self.stage} {self.target}",
        )

    def _create(self) -> bool:
        """Create the record if there is none; whether this run now holds the lock."""
        data = self._record().to_json()
        if self.storage.is_local:
            path = self.storage.local_path(self.key)
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            return True
        if self.storage.exists(self.key):
            return False
        self.storage.write_bytes(self.key, data)  # no create-if-absent: write, then read back
        time.sleep(self.settle_s)
        record, _ = self._read()
        return record is not None and record.token == self.token

    def _read(self) -> tuple[LockRecord | None, float]:
        """(the stored record or None, seconds since it was last refreshed or written)."""
        try:
            data = self.storage.read_bytes(self.key)
        except StorageError:
            return None, 0.0
        record = LockRecord.parse(data)
        if record is not None:
            return record, max(0.0, time.time() - record.refreshed_at)
        try:  # being written this instant, or foreign: its modification time says how old
            written_s = self.storage.mtime_ns(self.key) / 1e9
        except (OSError, StorageError):
            written_s = 0.0
        return None, (max(0.0, time.time() - written_s) if written_s else 0.0)

    def _stale(self, record: LockRecord | None, age_s: float) -> str | None:
        """Why the lock is stale, or None when its holder may be alive."""
        if age_s > self.stale_after_s:
            return f"not refreshed for {age_s / 60:.0f} min"
        if record is not None and record.host == socket.gethostname():
            if record.pid != os.getpid() and not _pid_alive(record.pid):
                return f"pid {record.pid} is gone"
        return None

    def _take_over(self, record: LockRecord | None, reason: str) -> None:
        holder = f"pid {record.pid} on {record.host}" if record is not None else "unknown holder"
        self.warn(f"taking over the stale {self.stage} lock on {self.target} ({holder}: {reason})")
        current, _ = self._read()
        same = (current is None) if record is None else (current is not None and current == record)
        if same:  # not taken over by someone else meanwhile
            self.storage.delete(self.key)

    def _refusal(self, record: LockRecord | None, age_s: float) -> str:
        if record is None:
            since = _when(time.time() - age_s) if age_s else "just now"
            holder = "holder unknown"
        else:
            since, holder = _when(record.created_at), f"pid {record.pid} on {record.host}"
        return (
            f"another {self.stage} run holds {self.target} since {since} ({holder}); "
            f"wait for it or remove {self.where} if it died"
        )

    # -- heartbeat ------------------------------------------------------------------------------
    def _start_heartbeat(self) -> None:
        self._stop.clear()
        if self.heartbeat_s <= 0:
            return
        self._heartbeat = threading.Thread(
            target=self._beat, name=f"lock-{self.stage}-{self.target}", daemon=True
        )
        self._heartbeat.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            record, _ = self._read()
            if record is None or record.token != self.token:
                self.warn(f"the {self.stage} lock on {self.target} is no longer this run's")
                return
            try:
                self.storage.write_bytes(self.key, self._record().to_json())
            except (OSError, StorageError) as exc:
                log.warning("could not refresh %s: %s", self.where, exc)


def preprocess_lock(storage: Storage, slug: str, variant: str, **kwargs: Any) -> StorageLock:
    """The lock of `preprocess` into `tensors/<slug>/<variant>/`."""
    key = lock_key("preprocess", slug, variant)
    return StorageLock(storage, key, "preprocess", f"{slug}/{variant}", **kwargs)


def label_lock(storage: Storage, slug: str, **kwargs: Any) -> StorageLock:
    """The lock of `label` on dataset `slug` (its sidecars and label records)."""
    return StorageLock(storage, lock_key("label", slug), "label", slug, **kwargs)
