"""Run locks: a second acquisition refuses with who holds it and how to clear it, a stale lock
(dead pid on this host, or not refreshed for too long) is taken over with a warning, the lock is
released however the run ends, and a holder's heartbeat keeps it fresh. Local roots and an object
store (fsspec's memory filesystem: the write + read-back path)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid

import pytest

from hotstep_ray.core.errors import HotstepError
from hotstep_ray.core.locks import (
    LockHeldError,
    LockRecord,
    StorageLock,
    label_lock,
    lock_key,
    preprocess_lock,
)
from hotstep_ray.core.storage import Storage

KEY = "locks/preprocess/band/turbo.lock"


@pytest.fixture(params=["local", "object-store"])
def storage(request, tmp_path) -> Storage:
    if request.param == "local":
        return Storage(tmp_path)
    return Storage(f"memory://locks-{uuid.uuid4().hex}")


def _lock(storage: Storage, **kwargs) -> StorageLock:
    kwargs.setdefault("settle_s", 0.01)
    kwargs.setdefault("heartbeat_s", 0)
    return preprocess_lock(storage, "band", "turbo", **kwargs)


def _dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], check=True,
                          capture_output=True, text=True)  # fmt: skip
    return int(done.stdout)


def _plant(storage: Storage, pid: int, host: str, age_s: float) -> None:
    then = time.time() - age_s
    record = LockRecord("old", pid, host, then, then, "preprocess band/turbo")
    storage.write_bytes(KEY, record.to_json())


def test_a_second_acquisition_refuses_naming_the_holder_and_the_key(storage):
    first = _lock(storage).acquire()
    assert storage.exists(KEY) and lock_key("preprocess", "band", "turbo") == KEY
    with pytest.raises(LockHeldError) as refused:
        _lock(storage).acquire()
    message = str(refused.value)
    assert message.startswith("another preprocess run holds band/turbo since ")
    assert f"(pid {os.getpid()} on {socket.gethostname()})" in message
    assert message.endswith(f"; wait for it or remove {storage.url_of(KEY)} if it died")
    assert isinstance(refused.value, HotstepError) and "\n" not in message
    first.release()
    assert not storage.exists(KEY)
    with _lock(storage):  # free again
        assert storage.exists(KEY)
    assert not storage.exists(KEY)


def test_locks_are_per_dataset_and_variant(storage):
    with _lock(storage), preprocess_lock(storage, "band", "xl", settle_s=0.01, heartbeat_s=0):
        with label_lock(storage, "band", settle_s=0.01, heartbeat_s=0):
            pass  # different keys: no conflict
        with pytest.raises(LockHeldError, match="another preprocess run holds band/xl"):
            preprocess_lock(storage, "band", "xl", settle_s=0.01).acquire()


def test_released_when_the_run_raises(storage):
    with pytest.raises(RuntimeError, match="encoder on fire"):
        with _lock(storage):
            raise RuntimeError("encoder on fire")
    assert not storage.exists(KEY)


def test_a_lock_of_a_dead_pid_on_this_host_is_taken_over_with_a_warning(storage):
    _plant(storage, _dead_pid(), socket.gethostname(), age_s=5)
    warnings: list[str] = []
    with _lock(storage, warn=warnings.append) as lock:
        record = LockRecord.parse(storage.read_bytes(KEY))
        assert record is not None and record.token == lock.token and record.pid == os.getpid()
    assert (
        len(warnings) == 1
        and "taking over the stale preprocess lock on band/turbo" in (warnings[0])
    )
    assert "is gone" in warnings[0]


def test_an_unrefreshed_lock_of_another_host_is_taken_over_a_fresh_one_is_not(storage):
    _plant(storage, 1, "other-node", age_s=10)
    with pytest.raises(LockHeldError, match=r"\(pid 1 on other-node\)"):
        _lock(storage, stale_after_s=60).acquire()
    _plant(storage, 1, "other-node", age_s=120)
    warnings: list[str] = []
    with _lock(storage, stale_after_s=60, warn=warnings.append):
        pass
    assert warnings and "not refreshed for 2 min" in warnings[0]
    assert not storage.exists(KEY)


def test_a_half_written_record_counts_as_held_until_it_is_old(tmp_path):
    storage = Storage(tmp_path)
    storage.write_bytes(KEY, b'{"tok')  # a holder writing its record this instant
    with pytest.raises(LockHeldError, match="holder unknown"):
        _lock(storage).acquire()
    old = time.time() - 3600
    os.utime(storage.local_path(KEY), (old, old))
    with _lock(storage, stale_after_s=60, warn=lambda _: None):
        assert LockRecord.parse(storage.read_bytes(KEY)) is not None


def test_the_heartbeat_refreshes_and_release_leaves_a_taken_over_lock_alone(storage):
    lock = _lock(storage, heartbeat_s=0.05).acquire()
    first = LockRecord.parse(storage.read_bytes(KEY))
    deadline = time.time() + 5
    while time.time() < deadline:
        now = LockRecord.parse(storage.read_bytes(KEY))
        if now is not None and now.refreshed_at > first.refreshed_at:
            break
        time.sleep(0.02)
    assert now.refreshed_at > first.refreshed_at and now.created_at == first.created_at
    lock._stop.set()  # the heartbeat stops first, so the takeover below is not overwritten
    lock._heartbeat.join()
    _plant(storage, 1, "other-node", age_s=0)  # someone took it over meanwhile
    warnings: list[str] = []
    lock.warn = warnings.append
    lock.release()
    assert json.loads(storage.read_bytes(KEY))["token"] == "old"  # theirs: left in place
    assert len(warnings) == 1 and "was taken over by pid 1 on other-node" in warnings[0]


def test_object_store_race_only_the_later_writer_proceeds():
    """Both runs found no lock and wrote their records; the other run's write lands while this
    one waits to read back. The read-back shows the later record, so this run refuses."""
    storage = Storage(f"memory://locks-{uuid.uuid4().hex}")
    early, late = _lock(storage), _lock(storage)
    write = storage.write_bytes

    def interleaved(key: str, data: bytes) -> str:
        path = write(key, data)
        write(key, late._record().to_json())  # the other run's write, during the settle wait
        return path

    storage.write_bytes = interleaved  # type: ignore[method-assign]
    with pytest.raises(LockHeldError, match="another preprocess run holds band/turbo"):
        early.acquire()
    storage.write_bytes = write  # type: ignore[method-assign]
    assert not early.held
    assert json.loads(storage.read_bytes(KEY))["token"] == late.token  # the later writer's
