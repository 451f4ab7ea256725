"""Every `Job`, whatever its kind, beats while it runs: `jobs/<id>/heartbeat.json` is written
through the job's own storage from `__enter__` to `__exit__` by a daemon thread that never
raises into the job, so a killed run of any kind reads `lost`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from hotstep_ray.core import jobs
from hotstep_ray.core.events import now_ms
from hotstep_ray.core.jobs import Job, heartbeat_key, load_job, lost_reason, with_liveness
from hotstep_ray.core.storage import Storage


def _threads(job_id: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"heartbeat:{job_id}"]


def _beat_at(storage: Storage, job_id: str) -> int:
    return storage.read_json(heartbeat_key(job_id))["beat_at"]


def _wait_for_a_new_beat(storage: Storage, job_id: str, after: int) -> int:
    deadline = time.monotonic() + 5
    while (at := _beat_at(storage, job_id)) <= after and time.monotonic() < deadline:
        time.sleep(0.01)
    return at


@pytest.mark.parametrize("kind", ["label", "preprocess", "train-lm"])
def test_every_job_beats_through_its_storage_until_it_ends(kind, monkeypatch) -> None:
    # an in-memory root: the beat goes through the job's Storage, not to a local path
    storage = Storage(f"memory://hotstep-heartbeat-{kind}")
    monkeypatch.setattr(jobs, "HEARTBEAT_EVERY_S", 0.01)
    with Job(storage, kind, dataset_id="band") as job:
        beat = storage.read_json(heartbeat_key(job.id))
        assert beat["pid"] == os.getpid() and beat["host"] and beat["every_s"] == 0.01
        (thread,) = _threads(job.id)
        assert thread.daemon  # never keeps a finished process alive
        assert _wait_for_a_new_beat(storage, job.id, beat["beat_at"]) > beat["beat_at"]
        assert lost_reason(storage, load_job(storage, job.id)) == ""  # this process: alive
    assert _threads(job.id) == []
    last = _beat_at(storage, job.id)
    time.sleep(0.05)
    assert _beat_at(storage, job.id) == last  # stopped with the job


def test_a_failed_job_stops_its_heartbeat_too(tmp_path) -> None:
    storage = Storage(tmp_path)
    with pytest.raises(RuntimeError), Job(storage, "scan") as job:
        raise RuntimeError("disk on fire")
    assert storage.exists(heartbeat_key(job.id)) and _threads(job.id) == []
    assert load_job(storage, job.id).status == "failed"


def test_sub_jobs_beat_on_their_own(tmp_path) -> None:
    """The main job's stages are jobs of their own (`main_job._sub_job`): each one beats."""
    storage = Storage(tmp_path)
    with Job(storage, "build") as main, Job(storage, "train-dit") as sub:
        assert storage.exists(heartbeat_key(main.id)) and storage.exists(heartbeat_key(sub.id))
        assert len(_threads(main.id)) == len(_threads(sub.id)) == 1
    assert _threads(main.id) == _threads(sub.id) == []


class _FailingStore(Storage):
    """A root whose heartbeat writes fail as an object store's client would (not an OSError)."""

    def write_json(self, key, value):
        if key.endswith("/heartbeat.json"):
            raise RuntimeError("SlowDown: please reduce your request rate")
        return super().write_json(key, value)


def test_a_heartbeat_that_cannot_be_written_never_fails_the_job(tmp_path, monkeypatch) -> None:
    storage = _FailingStore(tmp_path)
    monkeypatch.setattr(jobs, "HEARTBEAT_EVERY_S", 0.01)
    with Job(storage, "label") as job:
        time.sleep(0.05)  # beats from the thread fail as well
        assert _threads(job.id)[0].is_alive()
    assert load_job(storage, job.id).status == "done"
    assert not storage.exists(heartbeat_key(job.id))


_KILLED_RUN = textwrap.dedent(
    """
    import sys, time
    from hotstep_ray.core.jobs import Job
    from hotstep_ray.core.storage import Storage

    with Job(Storage(sys.argv[1]), "label", dataset_id="band", job_id="killed"):
        print("running", flush=True)
        time.sleep(60)
    """
)


def test_a_killed_job_of_any_kind_reads_lost(tmp_path) -> None:
    """A label run killed with SIGKILL (no `__exit__`): its record says running forever, its
    heartbeat names a process this machine no longer has."""
    storage = Storage(tmp_path)
    run = subprocess.Popen(
        [sys.executable, "-c", _KILLED_RUN, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert run.stdout.readline().strip() == "running"
        assert with_liveness(storage, load_job(storage, "killed")).status == "running"
    finally:
        run.send_signal(signal.SIGKILL)
        run.wait()
        run.stdout.close()
    shown = with_liveness(storage, load_job(storage, "killed"))
    assert load_job(storage, "killed").status == "running"  # the record is left as it was
    assert shown.status == "failed"
    assert shown.error.startswith(f"lost: its process {run.pid} on ")
    assert shown.finished_at == _beat_at(storage, "killed")  # its last sign of life


def _record_from_elsewhere(storage: Storage, job_id: str, beat: dict) -> None:
    """A record another process left running, with the heartbeat it wrote."""
    Job(storage, "train-dit", job_id=job_id).set_status("running")
    storage.write_json(heartbeat_key(job_id), beat)


def _gone_pid() -> int:
    """The id of a process of this machine that has exited (and been reaped)."""
    code = "import os; print(os.getpid())"
    done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return int(done.stdout)


def test_a_record_written_on_another_node_is_judged_by_its_heartbeats_age(tmp_path) -> None:
    """A stage job followed from a Ray worker or runner actor on another node (or another pid
    namespace of this host: a container) names a pid that means nothing here: never lost for
    that, only once its heartbeat is stale."""
    storage = Storage(tmp_path)
    with Job(storage, "label") as alive:  # this machine's own identity, as a heartbeat says it
        here = storage.read_json(heartbeat_key(alive.id))
    gone = _gone_pid()
    fresh = {**here, "pid": gone, "beat_at": now_ms()}
    stale_at = now_ms() - int(jobs.LOST_AFTER_S * 1000) - 1000
    elsewhere = {"other-node": {"host": "worker-7"}, "rebooted": {"boot_id": "another-boot"}}
    elsewhere["container"] = {"pid_ns": "pid:[1]"}
    for name, where in elsewhere.items():
        _record_from_elsewhere(storage, f"{name}-fresh", {**fresh, **where})
        _record_from_elsewhere(storage, f"{name}-stale", {**fresh, **where, "beat_at": stale_at})
    _record_from_elsewhere(storage, "here", fresh)  # the same machine: its pid is asked

    def shown(job_id: str) -> str:
        return with_liveness(storage, load_job(storage, job_id)).error

    for name in elsewhere:
        assert shown(f"{name}-fresh") == "", name
        assert shown(f"{name}-stale").startswith(f"lost: no heartbeat from process {gone}"), name
    assert shown("here").startswith(f"lost: its process {gone} on ")


def test_a_running_job_still_travels_to_another_process(tmp_path) -> None:
    """Ray pickles what a task closes over (a job's event log holds the job): the copy goes
    without the heartbeat, which stays with the process that entered the job."""
    cloudpickle = pytest.importorskip("ray.cloudpickle")
    storage = Storage(tmp_path)
    with Job(storage, "label") as job:
        copy = cloudpickle.loads(cloudpickle.dumps(job))
        assert copy.id == job.id and copy._heartbeat is None
        assert len(_threads(job.id)) == 1  # the original still beats
    assert _threads(job.id) == []
