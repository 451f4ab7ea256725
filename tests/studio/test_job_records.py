"""A cancelled (or crashed) studio job's record keeps the phase and counts it reached, whichever
record saw them last: the server's live view (cancel in the studio) or the runner's `job.json`
(`hotstep-ray jobs cancel` from a shell, whose `_meta.json` is the one written at submit).

No Ray here: the runner's `Job` writes its records in this process, the server's view is fed the
event lines its pump would poll, and the runner "kill" finds nothing to kill.
"""

from __future__ import annotations

from hotstep_ray.core import layout
from hotstep_ray.core.events import ProgressEvent, to_line
from hotstep_ray.core.jobs import Job, load_job
from hotstep_ray.core.storage import Storage
from hotstep_ray.studio.jobs import ActiveJob, JobManager, cancel_stored_job
from hotstep_ray.studio.records import StudioJobMeta, meta_key, read_summary
from hotstep_ray.studio.sse import ReplayBuffer


class _NoRunner:
    """A Ray whose cluster holds no runner actor (it is gone already)."""

    def get_actor(self, name: str, namespace: str = ""):
        raise ValueError(name)


def _submitted(storage: Storage, job_id: str = "j1") -> StudioJobMeta:
    """The records `JobManager.submit` writes: `_meta.json` and a queued `job.json`."""
    meta = StudioJobMeta(id=job_id, kind="preprocess", dataset_id="d1", slug="band", created_at=1)
    storage.write_json(meta_key(job_id), meta.to_json_dict())
    storage.write_json(layout.job_record(job_id), meta.to_json_dict())
    return meta


def _progress(summary) -> tuple:
    return (summary.status, summary.phase, summary.done, summary.total)


def test_cli_cancel_keeps_the_progress_the_runner_recorded(tmp_path):
    storage = Storage(tmp_path)
    _submitted(storage)
    runner = Job(storage, "preprocess", dataset_id="d1", job_id="j1")  # the runner actor's Job
    runner.set_status("running")
    runner.phase("loading-models")
    runner.events.progress(3, 12, phase="preprocess")

    ended = cancel_stored_job(storage, _NoRunner, "j1")
    assert _progress(ended) == ("cancelled", "preprocess", 3, 12)
    assert _progress(read_summary(storage, "j1")) == ("cancelled", "preprocess", 3, 12)
    assert _progress(load_job(storage, "j1")) == ("cancelled", "preprocess", 3, 12)


def test_studio_cancel_keeps_the_progress_the_server_saw(tmp_path):
    storage = Storage(tmp_path)
    manager = JobManager(storage)
    meta = _submitted(storage)
    active = ActiveJob(meta=meta, buffer=ReplayBuffer())
    manager._jobs["j1"] = active
    runner = Job(storage, "preprocess", dataset_id="d1", job_id="j1")
    runner.set_status("running")  # job.json: running, still phase `queued`, 0/0
    lines = [to_line(ProgressEvent(done=5, total=12, phase="preprocess", current_sample_id="s5"))]
    manager._observe(active, lines, [])  # what the pump polled from the runner

    ended = manager.cancel("j1")
    assert _progress(ended) == ("cancelled", "preprocess", 5, 12)
    assert ended.current_sample_id == "s5"
    assert _progress(read_summary(storage, "j1")) == ("cancelled", "preprocess", 5, 12)
    assert _progress(load_job(storage, "j1")) == ("cancelled", "preprocess", 5, 12)
    frames = [event for event in active.buffer.snapshot()[0] if event.type == "job"]
    assert _progress(frames[-1].job) == ("cancelled", "preprocess", 5, 12)


def test_the_further_record_wins_and_a_job_that_never_started_stays_queued(tmp_path):
    storage = Storage(tmp_path)
    manager = JobManager(storage)
    _submitted(storage, "j2")
    runner = Job(storage, "preprocess", job_id="j2")
    runner.set_status("running")
    runner.phase("stats")  # the runner got further than the server's view below
    behind = StudioJobMeta.model_validate(
        {**read_summary(storage, "j2").model_dump(), "phase": "preprocess", "done": 2}
    )
    manager._jobs["j2"] = ActiveJob(meta=behind, buffer=ReplayBuffer())
    assert manager.cancel("j2").phase == "stats"

    _submitted(storage, "j3")  # still queued for resources: nothing was reached
    assert _progress(cancel_stored_job(storage, _NoRunner, "j3")) == ("cancelled", "queued", 0, 0)


class _OneRunner:
    """A Ray whose cluster holds the job's runner actor, which `kill` ends."""

    killed: list = []

    def get_actor(self, name: str, namespace: str = ""):
        return name

    def kill(self, handle, no_restart: bool = True) -> None:
        self.killed.append(handle)


def test_cancelling_a_training_job_frees_what_its_ray_train_job_held(tmp_path, monkeypatch):
    """A killed runner orphans its Ray Train job's placement groups (the helper that removes
    them: tests/distributed/test_orphaned_placement_groups.py); a cancel of a training job asks
    for them to be freed, one of a stage without Ray Train does not."""
    from hotstep_ray.studio import jobs

    freed: list[str] = []
    monkeypatch.setattr(jobs, "free_placement_groups", lambda: freed.append("asked") or [])
    storage = Storage(tmp_path)
    for job_id, kind in (("t1", "train-dit"), ("p1", "preprocess")):
        meta = StudioJobMeta(id=job_id, kind=kind, dataset_id="d1", slug="band", created_at=1)
        storage.write_json(meta_key(job_id), meta.to_json_dict())
        storage.write_json(layout.job_record(job_id), meta.to_json_dict())
    cancel_stored_job(storage, _OneRunner, "p1")
    assert freed == []
    cancel_stored_job(storage, _OneRunner, "t1")
    assert freed == ["asked"]
    assert jobs.holds_placement_groups("make") and jobs.holds_placement_groups("mm3-train-lm")
