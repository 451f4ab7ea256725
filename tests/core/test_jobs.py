"""Jobs: the record follows progress, and a crash always ends in a `failed` status event."""

from __future__ import annotations

import pytest

from hotstep_ray.core.jobs import Job, load_job, read_job_events
from hotstep_ray.core.storage import Storage


def test_job_success_records_progress_and_terminal_status(tmp_path):
    storage = Storage(tmp_path)
    with Job(storage, "build", dataset_id="d1") as job:
        job.events.progress(2, 5, phase="probe")
    summary = load_job(storage, job.id)
    assert (summary.status, summary.done, summary.total, summary.phase) == ("done", 2, 5, "probe")
    assert summary.finished_at >= summary.started_at > 0
    events = read_job_events(storage, job.id)
    assert events[-1].type == "status" and events[-1].status == "done"
    assert [e.type for e in events][:2] == ["job", "progress"]


def test_job_crash_is_recorded_as_failed(tmp_path):
    storage = Storage(tmp_path)
    with pytest.raises(RuntimeError):
        with Job(storage, "scan") as job:
            raise RuntimeError("disk on fire")
    summary = load_job(storage, job.id)
    assert summary.status == "failed" and "disk on fire" in summary.error
    assert read_job_events(storage, job.id)[-1].error == "RuntimeError: disk on fire"


def test_a_running_job_record_follows_its_phase_and_counts(tmp_path, monkeypatch):
    """job.json says how far a run got while it runs (a killed run leaves that behind): each new
    phase at once, the counters at most every PROGRESS_SAVE_S."""
    from hotstep_ray.core import jobs

    storage = Storage(tmp_path)
    with Job(storage, "preprocess", dataset_id="d1") as job:
        job.phase("loading-models")
        assert load_job(storage, job.id).phase == "loading-models"
        job.events.progress(1, 4, phase="preprocess")
        record = load_job(storage, job.id)
        assert (record.status, record.phase, record.done, record.total) == (
            "running",
            "preprocess",
            1,
            4,
        )
        job.events.progress(2, 4, phase="preprocess")  # same phase, too soon: not written yet
        assert load_job(storage, job.id).done == 1
        job.phase("stats")  # a new phase is written at once, with the counts so far
        assert (load_job(storage, job.id).phase, load_job(storage, job.id).done) == ("stats", 2)
        monkeypatch.setattr(jobs, "PROGRESS_SAVE_S", 0.0)
        job.events.progress(3, 4, phase="preprocess", current="s3")
        record = load_job(storage, job.id)
        assert (record.done, record.current_sample_id) == (3, "s3")
    assert load_job(storage, job.id).status == "done"


def test_a_record_ended_elsewhere_is_not_overwritten_by_progress(tmp_path):
    """A studio job cancelled from outside (its runner is killed a moment later): the runner's
    progress saves leave the `cancelled` record alone."""
    from hotstep_ray.core import layout

    storage = Storage(tmp_path)
    job = Job(storage, "preprocess")
    job.set_status("running")
    cancelled = load_job(storage, job.id).model_copy(update={"status": "cancelled"})
    storage.write_json(layout.job_record(job.id), cancelled.to_json_dict())
    job.phase("preprocess")
    job.events.progress(5, 9, phase="stats")
    assert load_job(storage, job.id).status == "cancelled"
